"""`stop_server`: stop the SGLang server a `deploy` step started on a port, so that its GPUs are free.

The server is the one recorded on the port in `state_dir` on the host; the deploy step's host program
(hostprograms/deploy.py, `stop`) stops its process group (TERM, wait `stop_timeout`, KILL) and checks that
no process of it is left to hold GPU memory. No server recorded, or one no longer running, is no failure:
the facts say so (`stopped: false` and a `note`). With `nodes`, its topology (steps/server/) stops every
rank of the node group. Kept apart from `deploy` so that each kind has one job, its own parameters and its
own facts.
"""

from __future__ import annotations

from typing import Literal

from executor.runbook.model import Gate
from executor.stepkind import Outcome, RenderContext, StepContext
from steps.server.base import ServerStep
from steps.server.documents import StopFacts
from steps.server.one_node import stop_script
from steps.server.topology import topology

__all__ = ["StopFacts", "StopServerStep"]  # StopFacts: the stop program's document, in steps.server.documents


class StopServerStep(ServerStep):
    """Stop the server recorded on `port` (any python3 runs the host program: it is stdlib only)."""

    kind: Literal["stop_server"] = "stop_server"

    def default_gates(self) -> list[Gate]:
        return [Gate(that="facts.failure is none", message="the SGLang server did not stop")]

    def render(self, ctx: RenderContext) -> str:
        return stop_script(self, ctx)

    def plan(self, ctx: RenderContext) -> list[tuple[str, str]]:
        return topology(self).stop_plan(self, ctx)

    async def execute(self, ctx: StepContext) -> Outcome:
        return await topology(self).stop(self, ctx)
