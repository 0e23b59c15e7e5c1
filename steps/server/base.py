"""What `deploy` and `stop_server` share, and what a topology reads of them.

`ServerStep`: the server is the one recorded on its port in `state_dir` on the host, and one host program
(hostprograms/deploy.py), run by `python`, starts or stops it (the process-group kill and the GPU-freed check
are its, for both); `nodes` makes it a node group's (steps/server/node_group.py). `Launch`: the SGLang command
as words, each with whether it expands on the host, and its choices. `Deployment`: what a topology reads of a
`deploy` step, typed here so that the topologies, which the kinds call, never import a kind.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Protocol, TypeVar

from pydantic import Field, field_validator

from executor.hostprogram import host_program
from executor.render import pasted_word
from executor.runbook.durations import Duration
from executor.stepkind import FactsError, RenderContext, RunTime, StepSpec, VarRef, resolve_var
from steps.server.documents import Choice, DeployFacts

#: A network interface's name as Linux allows it (`eth0`, `ens1f0np0`, `bond0.100`, `ib0`).
INTERFACE_NAME = re.compile(r"^[A-Za-z0-9_.:@-]{1,15}$")
#: The environment a node group's launch sets per node from `network_interface` (steps/server/node_group.py).
GROUP_ENV = ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "SGLANG_HOST_IP")
#: Nodes of one node group: each rank's commands name every node, so `validate` and `plan` render a group's
#: commands in its nodes squared (one deploy on 3000 nodes took 1.1 GB to validate, 1.9 GB to plan).
MAX_NODES = 32

FactsT = TypeVar("FactsT", bound=DeployFacts)


@dataclass(frozen=True)
class Arg:
    """One word of the launch command, as the runbook reads (`$models_dir/x`); `expands`: `~` and `$vars` in
    it expand on the host (the host program's kit.expand_path, as bash's would: executor.render.host_word)."""

    text: str
    expands: bool


def literal(value: Any) -> Arg:
    return Arg(str(value), False)


def on_host(text: str) -> Arg:
    """A path or word in which `~` and `$vars` expand on the host."""
    return Arg(text, True)


@dataclass(frozen=True)
class Launch:
    """The launch command in groups (the program, then one flag with its value per group) and its choices."""

    groups: list[list[Arg]]
    choices: dict[str, Choice | RunTime]  # a RunTime: chosen from facts known only at run time

    def words(self) -> list[tuple[str, bool]]:
        """The command as the host program's config gives it: each word with whether it expands."""
        return [(arg.text, arg.expands) for group in self.groups for arg in group]

    def comment(self) -> str:
        lines = ["# launch command (~ and $vars expand on the host):"]
        last = len(self.groups) - 1
        for i, group in enumerate(self.groups):
            words = " ".join(arg.text for arg in group)
            lines.append(("#   " if i == 0 else "#       ") + words + (" \\" if i < last else ""))
        lines.append("# choices (value <- where it came from; null: the flag is left out):")
        for name, choice in self.choices.items():
            shown = str(choice) if isinstance(choice, RunTime) else f"{json.dumps(choice.value)} <- {choice.source}"
            lines.append(f"#   {name}: {shown}")
        return "".join(line.replace("\n", "\\n") + "\n" for line in lines)


def argv_value(argv: list[str], option: str) -> str | None:
    """The value after `option` in the argv the host ran: paths as the host expanded them."""
    return argv[argv.index(option) + 1] if option in argv[:-1] else None


def command_line(launch: Launch, env: dict[str, str], variables: Mapping[str, str]) -> str:
    """The launch as one would paste it on the host, its environment first (the readable plan)."""
    assigned = [f"{name}={pasted_word(value, {}, expands=False)}" for name, value in env.items()]
    words = [pasted_word(arg.text, variables, arg.expands) for group in launch.groups for arg in group]
    return " ".join([*assigned, *words])


def _whole_number(text: str) -> int:
    if not text.strip().isdigit():
        raise ValueError("expected a whole number such as 30000")
    return int(text)


class ServerStep(StepSpec):
    """What starting (`deploy`) and stopping (`stop_server`) a server share: the server is the one recorded
    on its port in `state_dir` on the host, and one host program, run by `python`, starts or stops it (the
    process-group kill and the GPU-freed check are its, for both). With `nodes`, the server is a node
    group's (steps/server/node_group.py): one rank on each host, rank 0 on nodes[0], where the step runs."""

    python: str = "python3"  # the SGLang virtualenv's interpreter
    port: Annotated[int, Field(ge=1, le=65535)] | VarRef = 30000  # a number, or a var such as $sglang_port
    #: a port held by a process the run did not start is caused by the port's value: named with its var
    failure_params: ClassVar[Mapping[str, str]] = {"PortInUse": "port"}
    stop_timeout: Duration = 60.0  # how long the server may take to stop (TERM, then KILL) and free its GPUs
    state_dir: str = "~/.runbook/sglang"  # on the host: the record of the server on each port, and its log
    #: a node group, rank 0 first: the step runs on nodes[0], its commands on all (at most 32: MAX_NODES)
    nodes: Annotated[list[str], Field(max_length=MAX_NODES)] | None = None

    #: `nodes:` may name a pool, which stands for its hosts (the loader puts them in): one runbook serves on
    #: one host or across a node group as the site's inventory lists the pool.
    host_list_fields: ClassVar[frozenset[str]] = frozenset({"nodes"})

    @field_validator("nodes")
    @classmethod
    def _group(cls, value: list[str] | None) -> list[str] | None:
        if value is not None and not value:
            raise ValueError("a node group needs at least one host")
        if value is not None and len(set(value)) != len(value):
            raise ValueError(f"a host appears twice in {value}: each node runs one rank")
        return value

    def own_hosts(self) -> list[str] | None:
        return self.nodes[:1] if self.nodes else None

    def peer_hosts(self) -> list[str]:
        return self.nodes[1:] if self.nodes else []

    def deploy_program(self, config: dict[str, Any], words: list[tuple[str, bool]]) -> str:
        """The script running the deploy host program with `config` (`action`: start, launch, watch, stop)."""
        return host_program("deploy", config | {"state_dir": self.state_dir, "launch": words}, self.python)

    def port_number(self, ctx: RenderContext) -> int:
        port = resolve_var(ctx, self.port, "port", _whole_number)
        if not 1 <= port <= 65535:
            raise FactsError(f"port: {port} is not a TCP port (1-65535)")
        return port


class Server(Protocol):
    """What stopping a server reads of its step (a `ServerStep`), and starting one too."""

    stop_timeout: float
    timeout: float | None

    def port_number(self, ctx: RenderContext) -> int: ...

    def deploy_program(self, config: dict[str, Any], words: list[tuple[str, bool]]) -> str: ...


class Deployment(Server, Protocol):
    """What a topology reads of a `deploy` step (steps/deploy.py's DeployStep is one): its server's parameters,
    a node group's, and the launch command it renders from its choices."""

    python: str
    bind: str
    env: dict[str, str]  # the server's, as written
    probe: str | None
    verified: list[str]
    dist_init_addr: str
    dist_init_port: int | str
    dist_timeout: float
    network_interface: str
    stall_timeout: float
    watch_interval: float

    @property
    def model_fields_set(self) -> set[str]: ...

    @property
    def algorithm(self) -> str | None: ...

    def launch(self, ctx: RenderContext) -> Launch:
        """The launch command of one server on one host, which a node group's ranks extend."""
        ...

    def ready_limit(self, ctx: RenderContext) -> float: ...

    def render(self, ctx: RenderContext) -> str:
        """The script of the server on one host (steps/server/one_node.py start_script)."""
        ...


def deploy_facts(
    model: type[FactsT], document: Mapping[str, Any], step: Deployment, launch: Launch, env: dict[str, str], **more: Any
) -> FactsT:
    """A deploy's facts: the host program's `document` and what the step adds: the algorithm, the paths as the
    host expanded them (its argv), the server's environment and every choice (a run knows every fact)."""
    choices = {name: c for name, c in launch.choices.items() if isinstance(c, Choice)}
    assert len(choices) == len(launch.choices)  # a run knows every fact: no RunTime
    argv = document["argv"]
    return model(
        **document,
        speculative_algorithm=step.algorithm,
        model_path=argv_value(argv, "--model-path") or "",
        draft_model_path=argv_value(argv, "--speculative-draft-model-path"),
        env=env,
        choices=choices,
        **more,
    )
