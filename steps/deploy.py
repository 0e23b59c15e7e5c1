"""`deploy`: start an SGLang server on the host (DFlash, another speculative algorithm, or a plain
baseline), wait until it really serves, reuse it when it already does (`stop_server` stops it).

The launch command is rendered here from the step's parameters and earlier steps' facts. Every choice
that is not spelled out in the runbook is made from a fact and recorded with where it came from
(`facts.choices`): the tensor-parallel size from the GPU count (`probe`), the attention backend from the
GPU architecture and the target's attention (`probe`, `inspect`): the seeds' trtllm_mla needs SM100/SM103
and stops SGLang with "Unsupported architecture" on SM120, FA3 is Hopper-only; the drafter's attention
backend (never trtllm_mha, which the draft rejects); the draft token count from the drafter's block size
and `--trust-remote-code` from custom code in the configs (`inspect`). Each is overridable. `runbook
plan` shows the full command, values chosen at run time marked `<known at run time: ...>` (`RunTime`).

One command does the rest on the host, hostprograms/deploy.py (stdlib only, run by the SGLang virtualenv's
python): a server already recorded on the port with the same arguments is reused; one with other
arguments is stopped first (process group: TERM, wait, KILL, so its GPUs are free); anything else on the
port is refused, named. A new server gets its own session (it outlives SSH) and log file, recorded in
`<state_dir>/<port>.json`. Ready means /health 200 and then a real one-token /generate; if the process
exits meanwhile the step fails at once with the error line of its log in the gate's message.

`ServerStep` holds what `deploy` and `stop_server` (steps/stop_server.py) share: the server is found by
its port in `state_dir`, and the same host program stops it (process group, GPUs freed).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, PositiveInt, field_validator, model_validator

from executor.durations import Duration, format_duration, parse_duration
from executor.hostprogram import host_program
from executor.model import DataModel, Gate, Model
from executor.render import pasted_word, with_vars
from executor.stepkind import (
    VAR_REF,
    AsWritten,
    FactsError,
    Outcome,
    RenderContext,
    RunTime,
    StepContext,
    StepRef,
    StepSpec,
    VarRef,
    host_document,
    progress_messages,
    resolve_var,
)
from steps import sglang_flags

#: Attention backends for an MLA target (DeepSeek-V3, Kimi K2.x), best first; the probe says which of the
#: installed ones run on the GPU architecture (steps/probe.py MLA_BACKEND_ARCHS). SGLang's own defaults
#: on Blackwell (trtllm_mla) and Hopper (fa3) lead; flashinfer and triton run on SM120.
MLA_PREFERENCE = ("trtllm_mla", "fa3", "flashmla", "cutedsl_mla", "flashinfer", "triton")
#: Attention backends for a target without MLA, by GPU architecture (FA3 is Hopper-only).
MHA_BACKEND = {"sm90": "fa3"}
MHA_DEFAULT = "flashinfer"
#: The drafter's attention backend by GPU architecture, best first. SGLang rejects trtllm_mha for it.
DRAFT_PREFERENCE = {"sm90": ("fa3", "flashinfer", "triton"), "sm100": ("fa4", "flashinfer", "triton")}
DRAFT_PREFERENCE["sm103"] = DRAFT_PREFERENCE["sm100"]
DRAFT_DEFAULT = ("flashinfer", "triton")
DRAFT_REJECTED = ("trtllm_mha",)
#: A network interface's name as Linux allows it (`eth0`, `ens1f0np0`, `bond0.100`, `ib0`).
INTERFACE_NAME = re.compile(r"^[A-Za-z0-9_.:@-]{1,15}$")
#: A host name or an IPv4 address, as `dist_init_addr` names rank 0.
HOST_NAME = re.compile(r"^[A-Za-z0-9_](?:[A-Za-z0-9_.-]{0,251}[A-Za-z0-9])?$")
#: A word that, its runbook vars replaced, still starts with a `$name`: the host expands it from its own environment.
UNKNOWN_VAR_FIRST = re.compile(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)")
#: The environment a node group's launch sets per node from `network_interface` (steps/node_group.py).
GROUP_ENV = ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "SGLANG_HOST_IP")

ChoiceValue = str | int | float | bool | list[str] | None


class Choice(Model):
    """One decision of the launch command: its value (None: the flag is left out) and where it came from."""

    value: ChoiceValue
    source: str


class HttpAnswer(DataModel):
    status: int | None  # None: no answer (the body says why: connection refused, timed out)
    body: str


class PreviousServer(DataModel):
    """The server recorded on the port before this step: stopped (arguments differ) or forgotten (dead)."""

    pid: int
    action: Literal["stopped", "forgotten"]
    reason: str
    argv: list[str] | None = None
    pids: list[int] = []
    killed: bool = False
    left: list[int] = []
    gpu_freed: bool | None = None


class Stopped(DataModel):
    pids: list[int]
    killed: bool  # SIGTERM was not enough
    left: list[int]
    gpu_freed: bool  # no process of the server's group is left to hold GPU memory


class StartReport(DataModel):
    """The document hostprograms/deploy.py prints for `start`, and for `launch` (a node group's rank: started
    or adopted, not waited for: `ready` false, `health` and `generate` null)."""

    action: Literal["start", "launch"]
    port: int
    bind: str
    base_url: str  # what a client ON THE HOST uses
    argv: list[str]  # as the host expanded it
    state_file: str
    pid: int | None
    log_file: str | None
    reused: bool  # a server with these arguments was running already
    previous: PreviousServer | None
    ready: bool
    ready_s: float | None  # seconds until /health and /generate answered (for a reused one: the check)
    exit_code: int | None  # the server's, when it exited during start-up
    health: HttpAnswer | None
    generate: HttpAnswer | None
    error_line: str | None  # the line of its log that says what went wrong
    log_tail: list[str]
    failure: str | None
    #: The failure's class when retrying cannot fix it (PortInUse, ConfigRefused, OutOfMemory: executor/errors.py)
    failure_class: str | None = None
    port_holder: str | None = None  # who holds the port, when it is not our server
    server_version: str | None = None  # what /server_info says once the server is ready (provenance)
    server_version_unknown: str | None = None  # why server_version is None
    stopped: Stopped | None = None  # the server stopped after a failed start-up


class StopFacts(DataModel):
    """The document hostprograms/deploy.py prints for `stop` (the facts of `stop_server`)."""

    action: Literal["stop"]
    port: int
    state_file: str
    stopped: bool  # a running server was stopped
    pid: int | None
    argv: list[str] | None
    log_file: str | None
    pids: list[int]
    killed: bool
    gpu_freed: bool | None  # None: there was no server
    note: str | None  # why nothing was stopped
    failure: str | None


class DeployFacts(StartReport):
    speculative_algorithm: str | None  # None: a baseline, no speculative decoding
    model_path: str
    draft_model_path: str | None
    env: dict[str, str]
    choices: dict[str, Choice]


class _NotYet(Exception):
    """A fact `runbook plan` cannot know yet."""


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


def _asked(ctx: RenderContext, facts: list[tuple[str, str]]) -> str:
    """Asks `ctx` for each of `facts` (step id, path), so that the plan records them all, and names them:
    `steps.probe.facts.gpu_count`, or `by steps.probe.facts.gpu_arch, sglang.attention_backends and ...`."""
    by_step: dict[str, list[str]] = {}
    for step, path in facts:
        ctx.fact(step, path)
        by_step.setdefault(step, []).append(path)
    named = " and ".join(f"steps.{step}.facts.{', '.join(paths)}" for step, paths in by_step.items())
    return named if len(facts) == 1 else f"by {named}"


#: Nodes of one node group: each rank's commands name every node, so `validate` and `plan` render a group's
#: commands in its nodes squared (one deploy on 3000 nodes took 1.1 GB to validate, 1.9 GB to plan).
MAX_NODES = 32


class ServerStep(StepSpec):
    """What starting (`deploy`) and stopping (`stop_server`) a server share: the server is the one recorded
    on its port in `state_dir` on the host, and one host program, run by `python`, starts or stops it (the
    process-group kill and the GPU-freed check are its, for both). With `nodes`, the server is a node
    group's (steps/node_group.py): one rank on each host, rank 0 on nodes[0], where the step runs."""

    python: str = "python3"  # the SGLang virtualenv's interpreter
    port: Annotated[int, Field(ge=1, le=65535)] | VarRef = 30000  # a number, or a var such as $sglang_port
    stop_timeout: Duration = 60.0
    state_dir: str = "~/.runbook/sglang"
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

    @property
    def group(self) -> list[str] | None:
        """The node group, rank 0 first; None for one server on one host: no `nodes`, or nodes of one host
        (a pool of one), which serves exactly as `host:` would."""
        return self.nodes if self.nodes is not None and len(self.nodes) > 1 else None

    def own_hosts(self) -> list[str] | None:
        return self.nodes[:1] if self.nodes else None

    def peer_hosts(self) -> list[str]:
        return self.nodes[1:] if self.nodes else []

    def _program(self, config: dict[str, Any], words: list[tuple[str, bool]]) -> str:
        return host_program("deploy", config | {"state_dir": self.state_dir, "launch": words}, self.python)

    def port_number(self, ctx: RenderContext) -> int:
        port = resolve_var(ctx, self.port, "port", _whole_number)
        if not 1 <= port <= 65535:
            raise FactsError(f"port: {port} is not a TCP port (1-65535)")
        return port


class DeployStep(ServerStep):
    """Start (or reuse) an SGLang server."""

    kind: Literal["deploy"] = "deploy"
    starts_server: ClassVar[bool] = True
    #: the server inherits its step's environment and reads what it likes (SGLANG_*, NCCL_*, HF_*, CUDA_*)
    default_pass_env: ClassVar[tuple[str, ...]] = ("*",)
    #: what `action: stop` was: the loader's "unknown key 'action'" says so
    retired_keys: ClassVar[dict[str, str]] = {
        "action": "deploy only starts a server; to stop one, use a step of `kind: stop_server` (same port)"
    }
    model_path: str  # `~` and `$vars` expand on the host
    draft_model_path: str | None = None  # None: a baseline without speculative decoding
    speculative_algorithm: AsWritten | None = None  # DFLASH when a drafter is given
    probe: StepRef | None = None  # probe step: GPU count and architecture, SGLang's backends
    inspect: StepRef | None = None  # inspect_config step: draft token count, custom code, MLA
    tp_size: Literal["auto"] | PositiveInt = "auto"
    attention_backend: str = "auto"
    draft_attention_backend: str = "auto"
    speculative_num_draft_tokens: Literal["auto"] | PositiveInt = "auto"
    #: DDTREE's tree budget (SGLang pull request #29907, in no release up to 0.5.23: the probe's sglang.ddtree)
    speculative_ddtree_budget: PositiveInt | None = None
    trust_remote_code: Literal["auto"] | bool = "auto"
    mem_fraction_static: float | None = Field(default=None, gt=0, le=1)
    bind: AsWritten = "127.0.0.1"
    extra_args: list[str] = []
    env: dict[str, str] = {}  # for the server, as written (no expansion), recorded in facts: no secrets here
    ready_timeout: VarRef | Duration = 1800.0  # a duration, or a var such as $sglang_ready_timeout
    # ---- a node group's (with `nodes`; steps/node_group.py) -------------------------------------------
    #: verify steps that passed on every node, each with the same commit everywhere (checked before launching)
    verified: list[StepRef] = []
    dist_init_addr: str = "auto"  # auto: rank 0's address as the other nodes resolve it; or a host name or IP
    dist_init_port: Annotated[int, Field(ge=1, le=65535)] | VarRef = 20000  # checked free and reachable
    dist_timeout: Duration = 3600.0  # --dist-timeout: nodes finish loading weights at different times
    network_interface: str = "auto"  # auto: per node, the one routing to rank 0; or a name, or a $var per host
    stall_timeout: Duration = 600.0  # a rank whose log is silent this long while the group is not ready fails it
    watch_interval: Duration = 5.0  # how often every rank is looked at while waiting for readiness

    #: the parameters that mean something only for a node group
    GROUP_FIELDS: ClassVar[frozenset[str]] = frozenset(
        {"verified", "dist_init_addr", "dist_init_port", "dist_timeout", "network_interface", "stall_timeout"}
        | {"watch_interval"}
    )

    @field_validator("network_interface")
    @classmethod
    def _interface(cls, value: str) -> str:
        if value != "auto" and not INTERFACE_NAME.match(value) and not VAR_REF.match(value):
            raise ValueError(f"expected `auto`, an interface name such as eth0, or a $var, got {value!r}")
        return value

    @field_validator("dist_init_addr")
    @classmethod
    def _address(cls, value: str) -> str:
        if not HOST_NAME.match(value):  # `$var` too: taken as written, it failed only at the preflight, hours in
            raise ValueError(f"expected `auto`, a host name or an IPv4 address (no $var), got {value!r}")
        return value

    @field_validator("attention_backend", "draft_attention_backend")
    @classmethod
    def _backend_name(cls, value: str) -> str:
        if not value.replace("_", "").isalnum():
            raise ValueError(f"expected `auto` or a backend name such as flashinfer, got {value!r}")
        return value

    @field_validator("env")
    @classmethod
    def _env_names(cls, value: dict[str, str]) -> dict[str, str]:
        for name in value:
            if not name.replace("_", "").isalnum() or name[0].isdigit():
                raise ValueError(f"env: {name!r} is not a variable name")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> DeployStep:
        if self.algorithm in ("DFLASH", "DDTREE") and self.draft_model_path is None:
            raise ValueError(
                f"speculative_algorithm {self.algorithm} needs draft_model_path (SGLang refuses it without a drafter)"
            )
        if self.speculative_ddtree_budget is not None and self.algorithm != "DDTREE":
            raise ValueError(
                "speculative_ddtree_budget is DDTREE's tree budget: it needs `speculative_algorithm: DDTREE`"
                f" (this step's is {self.algorithm or 'none, a baseline'})"
            )
        if self.tp_size == "auto" and self.probe is None:
            raise ValueError("tp_size: auto takes the GPU count from a probe step: set `probe: <step id>` or a number")
        if self.draft_attention_backend in DRAFT_REJECTED:
            raise ValueError(f"draft_attention_backend {self.draft_attention_backend}: SGLang rejects it for the draft")
        if clashes := [why for word in self.extra_args if (why := sglang_flags.managed_clash(word))]:
            raise ValueError(f"extra_args: {'; '.join(clashes)}: use its parameters")
        if self.nodes is None and (alone := sorted(self.GROUP_FIELDS & self.model_fields_set)):
            raise ValueError(f"{', '.join(alone)}: a node group's parameters, for a deploy with `nodes:`")
        if self.nodes is not None and self.probe is None:
            raise ValueError("a node group needs `probe: <step id>`: the probe that ran on every node")
        if self.group is not None and (managed := [name for name in GROUP_ENV if name in self.env]):
            raise ValueError(
                f"env sets {', '.join(managed)}, which a node group's launch sets on each node: use `network_interface`"
            )
        return self

    @property
    def algorithm(self) -> str | None:
        """The speculative algorithm: as given, else DFLASH when a drafter is given, else None (a baseline)."""
        if self.speculative_algorithm is None and self.draft_model_path is not None:
            return "DFLASH"
        return self.speculative_algorithm

    def default_gates(self) -> list[Gate]:
        return [Gate(that="facts.failure is none", message="the SGLang server is not serving")]

    # ---- choices ---------------------------------------------------------------------------------------

    def _fact(self, ctx: RenderContext, step: str, path: str) -> Any:
        try:
            value = ctx.fact(step, path)
        except (KeyError, IndexError, TypeError):
            raise FactsError(f"step '{step}' has no fact `{path}` on host {ctx.host_name}") from None
        if isinstance(value, RunTime):
            raise _NotYet
        return value

    def choices(self, ctx: RenderContext) -> dict[str, Choice | RunTime]:
        """Each decision of the launch command; in `runbook plan` a `RunTime` for one that waits on facts.

        A rule stops at the first fact not known yet, so the facts each rule may consult are listed here, and
        the plan asks for every one of them (its context records what a step learns only at run time, and
        from which step): the command depends on all of them, not only on the first.
        """
        probe, inspect = self.probe, self.inspect
        rules: dict[str, tuple[Callable[[RenderContext], Choice], list[tuple[str | None, str]], str]] = {
            "speculative_algorithm": (self._algorithm, [], ""),
            "tp_size": (self._tp_size, [(probe, "gpu_count")], f" (summed over {self._on()})" if self.group else ""),
            "attention_backend": (
                self._attention_backend,
                [
                    (probe, "gpu_arch"),
                    (probe, "mla_backends_usable_on_gpu"),
                    (probe, "sglang.attention_backends"),
                    (inspect, "deploy.attention_arch"),
                ],
                "",
            ),
            "draft_attention_backend": (
                self._draft_attention_backend,
                [(probe, "gpu_arch"), (probe, "sglang.draft_attention_backends")],
                "",
            ),
            "speculative_num_draft_tokens": (
                self._num_draft_tokens,
                [(inspect, "deploy.speculative_num_draft_tokens")],
                " (its value; left out when unknown)",
            ),
            "trust_remote_code": (self._trust_remote_code, [(inspect, "deploy.trust_remote_code")], ""),
            "mem_fraction_static": (self._mem_fraction, [], ""),
        }
        if self.algorithm == "DDTREE":
            rules["speculative_ddtree_budget"] = (self._ddtree_budget, [], "")
        if self.extra_args:
            rules["extra_args"] = (self._extra_args, [(probe, "sglang.launch_options")], "")
        chosen: dict[str, Choice | RunTime] = {}
        for name, (rule, facts, note) in rules.items():
            try:
                chosen[name] = rule(ctx)
            except _NotYet:
                chosen[name] = RunTime(_asked(ctx, [(step, path) for step, path in facts if step is not None]) + note)
        return chosen

    def _on(self) -> str:
        return ", ".join(self.nodes or [])

    def _algorithm(self, ctx: RenderContext) -> Choice:
        if self.algorithm is None:
            return Choice(value=None, source="baseline: no draft_model_path, no speculative decoding")
        given = "runbook" if self.speculative_algorithm else "default with a draft_model_path"
        return Choice(value=self.algorithm, source=given)

    def _tp_size(self, ctx: RenderContext) -> Choice:
        if self.tp_size != "auto":
            return Choice(value=self.tp_size, source="runbook")
        assert self.probe is not None  # the validator requires it for auto
        if self.group:  # every node's GPUs (the preflight checked that each has as many)
            counts = [self._fact(ctx.peer(node), self.probe, "gpu_count") for node in self.group]
            each = " + ".join(map(str, counts))
            return Choice(value=sum(counts), source=f"steps.{self.probe}.facts.gpu_count on {self._on()} = {each}")
        count = self._fact(ctx, self.probe, "gpu_count")
        if not count:
            reason = self._fact(ctx, self.probe, "gpu.reason")
            raise FactsError(f"tp_size auto: the probe found no GPUs ({reason}); nothing to deploy on")
        return Choice(value=count, source=f"steps.{self.probe}.facts.gpu_count = {count}")

    def _gpu_arch(self, ctx: RenderContext, what: str) -> str:
        assert self.probe is not None
        arch = self._fact(ctx, self.probe, "gpu_arch")
        if arch is None:
            reason = self._fact(ctx, self.probe, "unknown").get("gpu_arch")
            raise FactsError(f"{what} auto: the GPU architecture is unknown ({reason}); set {what} in the runbook")
        return str(arch)

    def _attention_backend(self, ctx: RenderContext) -> Choice:
        if self.attention_backend != "auto":
            return Choice(value=self.attention_backend, source="runbook")
        if self.probe is None:
            return Choice(value=None, source="left out: SGLang chooses (no probe step gave the GPU architecture)")
        arch = self._gpu_arch(ctx, "attention_backend")
        arch_src = f"steps.{self.probe}.facts.gpu_arch = {arch}"
        attention = None
        if self.inspect is not None:
            attention = self._fact(ctx, self.inspect, "deploy.attention_arch").get("value")
        if attention == "MLA":
            usable = self._fact(ctx, self.probe, "mla_backends_usable_on_gpu")
            if usable is None:
                reason = self._fact(ctx, self.probe, "unknown").get("mla_backends_usable_on_gpu")
                raise FactsError(f"attention_backend auto: the MLA backends usable on {arch} are unknown ({reason})")
            ranked = [b for b in MLA_PREFERENCE if b in usable] + [b for b in usable if b not in MLA_PREFERENCE]
            if not ranked:
                raise FactsError(
                    f"attention_backend auto: no MLA attention backend of this SGLang runs on {arch} "
                    f"(steps.{self.probe}.facts.mla_backends_usable_on_gpu is empty); set attention_backend"
                )
            return Choice(
                value=ranked[0],
                source=f"MLA target (steps.{self.inspect}.facts.deploy.attention_arch) on {arch_src}: first of "
                f"{list(MLA_PREFERENCE)} in steps.{self.probe}.facts.mla_backends_usable_on_gpu = {usable}",
            )
        backend = MHA_BACKEND.get(arch, MHA_DEFAULT)
        installed = self._fact(ctx, self.probe, "sglang.attention_backends")
        if installed is not None and backend not in installed:
            raise FactsError(f"attention_backend auto: {backend} (for {arch}) is not among this SGLang's {installed}")
        target = "target attention unknown (no inspect step)" if attention is None else f"{attention} target"
        return Choice(value=backend, source=f"{target} on {arch_src}: {backend}")

    def _draft_attention_backend(self, ctx: RenderContext) -> Choice:
        if self.draft_model_path is None:
            return Choice(value=None, source="baseline: no drafter")
        if self.draft_attention_backend != "auto":
            return Choice(value=self.draft_attention_backend, source="runbook")
        if self.probe is None:
            return Choice(value=None, source="left out: SGLang chooses (no probe step gave the GPU architecture)")
        arch = self._gpu_arch(ctx, "draft_attention_backend")
        preference = DRAFT_PREFERENCE.get(arch, DRAFT_DEFAULT)
        installed = self._fact(ctx, self.probe, "sglang.draft_attention_backends")
        source = f"steps.{self.probe}.facts.gpu_arch = {arch}: first of {list(preference)}"
        if installed is None:
            return Choice(value=preference[0], source=source + " (the probe could not list the installed ones)")
        usable = [b for b in preference if b in installed]
        if not usable:
            raise FactsError(
                f"draft_attention_backend auto: none of {list(preference)} (for {arch}) is among this SGLang's "
                f"draft attention backends {installed}; set draft_attention_backend"
            )
        return Choice(value=usable[0], source=f"{source} in steps.{self.probe}.facts.sglang.draft_attention_backends")

    def _num_draft_tokens(self, ctx: RenderContext) -> Choice:
        if self.draft_model_path is None:
            return Choice(value=None, source="baseline: no drafter")
        if self.speculative_num_draft_tokens != "auto":
            return Choice(value=self.speculative_num_draft_tokens, source="runbook")
        sglang_default = "left out: SGLang reads block_size from the drafter's config.json, else 16"
        if self.algorithm != "DFLASH" or self.inspect is None:
            return Choice(value=None, source=sglang_default)
        known = self._fact(ctx, self.inspect, "deploy.speculative_num_draft_tokens")
        where = f"steps.{self.inspect}.facts.deploy.speculative_num_draft_tokens"
        if known.get("value") is None:
            return Choice(value=None, source=f"{sglang_default} ({where}: {known.get('unknown_reason')})")
        return Choice(value=known["value"], source=f"{where} = {known['value']} ({known.get('source')})")

    def _trust_remote_code(self, ctx: RenderContext) -> Choice:
        if self.trust_remote_code != "auto":
            return Choice(value=self.trust_remote_code, source="runbook")
        if self.inspect is None:
            return Choice(value=False, source="off: no inspect step looked for custom code")
        value = bool(self._fact(ctx, self.inspect, "deploy.trust_remote_code"))
        why = "a config's auto_map names custom code" if value else "no config names custom code"
        return Choice(value=value, source=f"steps.{self.inspect}.facts.deploy.trust_remote_code = {value} ({why})")

    def _ddtree_budget(self, ctx: RenderContext) -> Choice:
        if self.speculative_ddtree_budget is None:
            return Choice(value=None, source="left out: SGLang's default tree budget")
        return Choice(value=self.speculative_ddtree_budget, source="runbook")

    def _extra_args(self, ctx: RenderContext) -> Choice:
        """extra_args as the SGLang on the host reads them: each option resolved against the option table the
        probe read from its parser, an abbreviation or alias written as the flag it sets (so the argv recorded,
        and a report's provenance, name the flags the server ran with); one that would set a flag this step
        renders, or that the parser refuses as ambiguous, fails the step before anything starts."""
        for word in self.extra_args:  # a runbook var's value, as the host will expand it: no var hides a flag
            shown = with_vars(word, ctx.vars)
            if host_var := UNKNOWN_VAR_FIRST.match(shown):
                raise FactsError(
                    f"extra_args: `{word}` starts with ${host_var[1]}, no runbook var: the host's environment gives "
                    "its value, which could be a flag this step renders: declare it in `vars` (the home folder: ~/)"
                )
            if (clash := sglang_flags.managed_clash(shown)) is not None:
                raise FactsError(f"extra_args: {clash} (`{word}` on this host): use its parameters")
        table, why = self._launch_options(ctx)
        if table is None:
            return Choice(value=list(self.extra_args), source=f"as written: {why}")
        read = [self._as_read(word, with_vars(word, ctx.vars), table) for word in self.extra_args]
        said = "; ".join(note for _, note in read if note) or "every option as written"
        return Choice(
            value=[word for word, _ in read], source=f"{said} (steps.{self.probe}.facts.sglang.launch_options)"
        )

    def _as_read(self, word: str, shown: str, table: Mapping[str, str]) -> tuple[str, str | None]:
        """One word of extra_args (`shown`: its runbook vars' values) as the host's parser (`table`) reads it:
        (the word to launch, `ABBREVIATION -> FLAG` when it is rewritten as its flag); FactsError when it would
        set a managed flag or the parser would refuse it as ambiguous."""
        found = sglang_flags.resolve(shown, table) if sglang_flags.is_option(shown) else None
        if found is not None and found.kind == "ambiguous":
            raise FactsError(
                f"extra_args: ambiguous option: {found.name} could match {', '.join(found.matches)} "
                f"(steps.{self.probe}.facts.sglang.launch_options): SGLang's parser refuses it"
            )
        if found is not None and (managed := sglang_flags.managed_of(found.flag, table)):
            raise FactsError(
                f"extra_args: this SGLang reads {found.name} as {found.flag}, which "
                f"{sglang_flags.rendered_from(managed)}: use its parameters"
            )
        if found is None or found.flag in (None, found.name) or word.partition("=")[0] != found.name:
            return word, None  # an option as written, a value, or one named through a var: as written
        return found.flag + word[len(found.name) :], f"{found.name} -> {found.flag}"

    def _launch_options(self, ctx: RenderContext) -> tuple[dict[str, str] | None, str]:
        """The host's SGLang option table (option string -> its flag) from the probe, or None and why not."""
        if self.probe is None:
            return None, "no probe step read the SGLang's launch options"
        try:
            groups = self._fact(ctx, self.probe, "sglang.launch_options")
        except FactsError:  # a probe's facts from before the probe read them (a resumed run)
            return None, f"steps.{self.probe}.facts has no sglang.launch_options"
        if groups is None:
            reason = self._fact(ctx, self.probe, "sglang.unknown").get("launch_options")
            return None, f"steps.{self.probe}.facts.sglang.launch_options is unknown ({reason})"
        return sglang_flags.canonical_table(groups), ""

    def _mem_fraction(self, ctx: RenderContext) -> Choice:
        if self.mem_fraction_static is None:
            return Choice(value=None, source="left out: SGLang's default")
        return Choice(value=self.mem_fraction_static, source="runbook")

    # ---- the command -----------------------------------------------------------------------------------

    def launch(self, ctx: RenderContext) -> Launch:
        chosen = self.choices(ctx)

        def flag(name: str, option: str) -> list[list[Arg]]:
            choice = chosen[name]
            value = choice if isinstance(choice, RunTime) else choice.value
            return [] if value is None else [[literal(option), literal(value)]]

        groups = [[on_host(self.python), literal("-m"), literal("sglang.launch_server")]]
        groups.append([literal("--model-path"), on_host(self.model_path)])
        groups += flag("speculative_algorithm", "--speculative-algorithm")
        if self.draft_model_path is not None:
            groups.append([literal("--speculative-draft-model-path"), on_host(self.draft_model_path)])
        groups += flag("speculative_num_draft_tokens", "--speculative-num-draft-tokens")
        groups += flag("speculative_ddtree_budget", "--speculative-ddtree-budget") if self.algorithm == "DDTREE" else []
        groups += flag("tp_size", "--tp-size")
        groups += flag("attention_backend", "--attention-backend")
        groups += flag("draft_attention_backend", "--speculative-draft-attention-backend")
        groups += flag("mem_fraction_static", "--mem-fraction-static")
        trust = chosen["trust_remote_code"]
        if isinstance(trust, RunTime):  # the flag itself is known only at run time
            groups.append([literal(RunTime(f"--trust-remote-code if {trust.source}"))])
        elif trust.value:
            groups.append([literal("--trust-remote-code")])
        groups.append([literal("--host"), literal(self.bind), literal("--port"), literal(self.port_number(ctx))])
        extra = chosen.get("extra_args")
        if self.extra_args:  # at run time as resolved against the host's SGLang (_extra_args), in a plan as written
            words = extra.value if isinstance(extra, Choice) and isinstance(extra.value, list) else self.extra_args
            groups.append([on_host(arg) for arg in words])
        return Launch(groups, chosen)

    def ready_limit(self, ctx: RenderContext) -> float:
        return resolve_var(ctx, self.ready_timeout, "ready_timeout", parse_duration)

    def start_script(self, launch: Launch, port: int, ready_timeout: float) -> str:
        config = {"action": "start", "port": port, "bind": self.bind, "env": self.env}
        config |= {"ready_timeout": ready_timeout, "stop_timeout": self.stop_timeout}
        return (
            f"# start the SGLang server on {self.bind}:{port}, or reuse the one running there with the same "
            "arguments\n" + launch.comment() + self._program(config, launch.words())
        )

    def render(self, ctx: RenderContext) -> str:
        return self.start_script(self.launch(ctx), self.port_number(ctx), self.ready_limit(ctx))

    def plan(self, ctx: RenderContext) -> list[tuple[str, str]]:
        if self.group:
            from steps import node_group  # here: it builds on this module

            return node_group.plan(self, ctx)
        label = (
            f"start or reuse the SGLang server on port {self.port_number(ctx)}; "
            f"'{RunTime('...')}' marks values chosen from earlier steps' facts"
        )
        return [(label, self.render(ctx))]

    def summary(self, ctx: RenderContext) -> list[str]:
        drafter = "no drafter"
        if self.draft_model_path is not None:
            drafter = f"{self.algorithm}, drafter {with_vars(self.draft_model_path, ctx.vars)}"
        if self.group:
            ranks = ", ".join(f"rank {rank} on {node}" for rank, node in enumerate(self.group))
            return [
                f"preflight every node (same SGLang, GPUs, verified weights; interfaces; dist-init port), then start "
                f"(or adopt, same arguments on every node) SGLang across {len(self.group)} nodes ({drafter}), rank 0 "
                f"serving {self.bind}:{self.port_number(ctx)}, ready within {format_duration(self.ready_limit(ctx))}; "
                f"the launches of {ranks}:"
            ]
        return [
            f"start (or reuse, same arguments) SGLang on {self.bind}:{self.port_number(ctx)} ({drafter}), ready within "
            f"{format_duration(self.ready_limit(ctx))}:"
        ]

    def commands(self, ctx: RenderContext) -> list[str]:
        if self.group:
            from steps import node_group  # here: it builds on this module (its models), so not at the top

            return node_group.commands(self, ctx)
        return [command_line(self.launch(ctx), self.env, ctx.vars)]

    # ---- running ---------------------------------------------------------------------------------------

    async def execute(self, ctx: StepContext) -> Outcome:
        if self.group:
            from steps import node_group  # here: it builds on this module

            return await node_group.deploy(self, ctx)
        launch = self.launch(ctx)
        ready = self.ready_limit(ctx)
        script = self.start_script(launch, self.port_number(ctx), ready)
        limit = self.timeout or ready + 2 * self.stop_timeout + 60
        result = await ctx.run(script, timeout=limit, on_output=progress_messages(ctx).feed)
        if result.timed_out or result.interrupted:
            return Outcome(result)
        report = host_document(result, StartReport, "the deploy program")
        choices = {name: c for name, c in launch.choices.items() if isinstance(c, Choice)}
        assert len(choices) == len(launch.choices)  # a run knows every fact: no RunTime
        draft = argv_value(report.argv, "--speculative-draft-model-path")
        facts = DeployFacts(
            **dict(report),
            speculative_algorithm=self.algorithm,
            model_path=argv_value(report.argv, "--model-path") or "",
            draft_model_path=draft,
            env=self.env,
            choices=choices,
        )
        return Outcome(result, facts)
