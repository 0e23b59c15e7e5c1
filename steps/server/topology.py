"""Where a server runs: `OneNode` (steps/server/one_node.py) or a `NodeGroup` (steps/server/node_group.py), as a
step's `nodes` say. `deploy` and `stop_server` ask the topology for what differs instead of asking "is this a
group": the commands planned and shown, how the server is started and found ready, which hosts are stopped, the
facts, what tp_size auto adds up, and the environment the launch sets itself."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from executor.stepkind import Outcome, RenderContext, StepContext
from steps.server.base import Deployment, Server, ServerStep
from steps.server.documents import Choice
from steps.server.one_node import ONE_NODE


class Topology(Protocol):
    @property
    def managed_env(self) -> tuple[str, ...]:
        """The environment variables the launch sets itself (on each node), which `env` may not set."""
        ...

    @property
    def tp_size_note(self) -> str:
        """What `runbook plan` adds to tp_size auto's source."""
        ...

    def tp_size(self, ctx: RenderContext, probe: str, fact: Callable[[RenderContext, str], Any]) -> Choice:
        """tp_size auto: the GPUs the server runs on, from the probe's `gpu_count` (`fact` reads a host's)."""
        ...

    def start_plan(self, step: Deployment, ctx: RenderContext) -> list[tuple[str, str]]: ...

    def start_summary(self, step: Deployment, ctx: RenderContext, drafter: str) -> str: ...

    def commands(self, step: Deployment, ctx: RenderContext) -> list[str]:
        """Each launch as one would paste it on its host, rank 0 first."""
        ...

    async def start(self, step: Deployment, ctx: StepContext) -> Outcome:
        """Start (or reuse) the server and wait until it serves: the attempt of a `deploy`."""
        ...

    def stop_plan(self, step: Server, ctx: RenderContext) -> list[tuple[str, str]]: ...

    async def stop(self, step: Server, ctx: StepContext) -> Outcome:
        """Stop the server on every host it runs on: the attempt of a `stop_server`."""
        ...


def topology(step: ServerStep) -> Topology:
    """A node group for `nodes` of two hosts or more, rank 0 first; one node otherwise: no `nodes`, or nodes of
    one host (a pool of one), which serves exactly as `host:` would. The node group's module (its documents'
    models) is imported for a group only: `validate` and `plan` of a one-node runbook never define them."""
    if step.nodes is None or len(step.nodes) < 2:
        return ONE_NODE
    from steps.server.node_group import NodeGroup

    return NodeGroup(step.nodes)
