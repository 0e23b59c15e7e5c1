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

Where the server runs is its topology (steps/server/): one host, or a node group's ranks with `nodes:`.
This module renders the one-node launch command from the choices; the topology plans, starts, waits for
and reports the server, rendering each rank's launch from this one.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, PositiveInt, PrivateAttr, ValidationError, field_validator, model_validator

from executor.render import with_vars
from executor.runbook.durations import Duration, parse_duration
from executor.runbook.model import Gate
from executor.runbook.search import Position
from executor.stepkind import (
    VAR_REF,
    AsWritten,
    AsWrittenOrVar,
    FactsError,
    Outcome,
    RenderContext,
    RunTime,
    StepContext,
    StepRef,
    VarRef,
    fact_field,
    resolve_var,
    shape_errors,
    step_ref_fields,
)
from steps import sglang_flags
from steps.server.base import INTERFACE_NAME, Arg, Launch, ServerStep, literal, on_host
from steps.server.documents import Choice
from steps.server.one_node import start_script
from steps.server.topology import topology

#: Attention backends for an MLA target (DeepSeek-V3, Kimi K2.x), best first; the probe says which of the
#: installed ones run on the GPU architecture (steps/probe_facts.py MLA_BACKEND_ARCHS). SGLang's own defaults
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
#: A host name or an IPv4 address, as `dist_init_addr` names rank 0.
HOST_NAME = re.compile(r"^[A-Za-z0-9_](?:[A-Za-z0-9_.-]{0,251}[A-Za-z0-9])?$")
#: A word that, its runbook vars replaced, still starts with a `$name`: the host expands it from its own environment.
UNKNOWN_VAR_FIRST = re.compile(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)")


class _NotYet(Exception):
    """A fact `runbook plan` cannot know yet."""


def _asked(ctx: RenderContext, facts: list[tuple[str, str]]) -> str:
    """Asks `ctx` for each of `facts` (step id, path), so that the plan records them all, and names them:
    `steps.probe.facts.gpu_count`, or `by steps.probe.facts.gpu_arch, sglang.attention_backends and ...`."""
    by_step: dict[str, list[str]] = {}
    for step, path in facts:
        ctx.fact(step, path)
        by_step.setdefault(step, []).append(path)
    named = " and ".join(f"steps.{step}.facts.{', '.join(paths)}" for step, paths in by_step.items())
    return named if len(facts) == 1 else f"by {named}"


def _word_or_count(text: str, word: str) -> str | int:
    """A speculative var's text: `word` (auto, none) as itself, else a positive whole number."""
    if text == word:
        return text
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"expected {word} or a positive whole number")
    return int(text)


#: The parameters a search places a launch by (Position's drafter, algorithm and tokens); the others are its `rest`
_SEARCH_PLACED = frozenset(
    {"draft_model_path", "speculative_algorithm", "speculative_num_draft_tokens", "speculative_ddtree_budget"}
)


class DeployStep(ServerStep):
    """Start (or reuse) an SGLang server."""

    kind: Literal["deploy"] = "deploy"
    starts_server: ClassVar[bool] = True
    literal_fields: ClassVar[frozenset[str]] = frozenset({"env"})  # the server's, as written
    #: the server inherits its step's environment and reads what it likes (SGLANG_*, NCCL_*, HF_*, CUDA_*)
    default_pass_env: ClassVar[tuple[str, ...]] = ("*",)
    #: what `action: stop` was: the loader's "unknown key 'action'" says so
    retired_keys: ClassVar[dict[str, str]] = {
        "action": "deploy only starts a server; to stop one, use a step of `kind: stop_server` (same port)"
    }
    model_path: str  # `~` and `$vars` expand on the host
    draft_model_path: str | None = None  # None: a baseline without speculative decoding
    speculative_algorithm: AsWrittenOrVar | None = None  # DFLASH when a drafter is given; or a var alone (below)
    probe: StepRef | None = None  # probe step: GPU count and architecture, SGLang's backends
    inspect: StepRef | None = None  # inspect_config step: draft token count, custom code, MLA
    tp_size: Literal["auto"] | PositiveInt = "auto"  # tensor parallel size; auto: the GPUs the probe found
    attention_backend: str = "auto"  # SGLang's --attention-backend; auto: by the GPU architecture and the model
    draft_attention_backend: str = "auto"  # the drafter's; auto: the best for the GPU that SGLang accepts there
    #: tokens the drafter proposes per step; auto: the drafter's block size (inspect_config)
    speculative_num_draft_tokens: Literal["auto"] | PositiveInt | VarRef = "auto"
    #: DDTREE's tree budget (SGLang pull request #29907, in no release up to 0.5.23: the probe's sglang.ddtree)
    speculative_ddtree_budget: PositiveInt | VarRef | None = None
    trust_remote_code: Literal["auto"] | bool = "auto"  # auto: when the model's config ships custom code
    mem_fraction_static: float | None = Field(default=None, gt=0, le=1)  # SGLang's --mem-fraction-static
    bind: AsWritten = "127.0.0.1"  # the address the server listens on
    #: --enable-metrics: Prometheus /metrics, whose counters give each eval and benchmark run its exact acceptance
    #: length (steps/server_metrics.py); false: those runs say why they have none
    metrics: bool = True
    extra_args: list[str] = []  # more launch flags; one that a parameter sets is refused (`$vars` expand on the host)
    env: dict[str, str] = {}  # for the server, as written (no expansion), recorded in facts: no secrets here
    ready_timeout: VarRef | Duration = 1800.0  # a duration, or a var such as $sglang_ready_timeout
    # ---- a node group's (with `nodes`; steps/server/node_group.py) ------------------------------------
    #: verify steps that passed on every node, each with the same commit everywhere (checked before launching)
    verified: list[StepRef] = []
    dist_init_addr: str = "auto"  # auto: rank 0's address as the other nodes resolve it; or a host name or IP
    dist_init_port: Annotated[int, Field(ge=1, le=65535)] | VarRef = 20000  # checked free and reachable
    dist_timeout: Duration = 3600.0  # --dist-timeout: nodes finish loading weights at different times
    network_interface: str = "auto"  # auto: per node, the one routing to rank 0; or a name, or a $var per host
    stall_timeout: Duration = 600.0  # a rank whose log is silent this long while the group is not ready fails it
    watch_interval: Duration = 5.0  # how often every rank is looked at while waiting for readiness

    #: the speculative parameters that may be a runbook var alone (a campaign's schedule sets them: `--from-campaign`),
    #: each with how its var's text is read; the step resolves them on the controller and checks them as written
    SPECULATIVE_VARS: ClassVar[dict[str, Callable[[str], Any]]] = {
        "speculative_algorithm": lambda text: None if text.lower() == "none" else text,
        "speculative_num_draft_tokens": lambda text: _word_or_count(text, "auto"),
        "speculative_ddtree_budget": lambda text: None if text == "none" else _word_or_count(text, "none"),
    }
    _from_vars: dict[str, str] = PrivateAttr(default_factory=dict)  # parameter -> the var it was resolved from

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
        if not self._speculative_vars():  # with a var, checked once it is resolved (`at`)
            self._speculation_consistent()
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
        if managed := [name for name in topology(self).managed_env if name in self.env]:
            raise ValueError(
                f"env sets {', '.join(managed)}, which a node group's launch sets on each node: use `network_interface`"
            )
        return self

    def _speculation_consistent(self) -> None:
        if self.speculative_algorithm is not None and not self.speculative_algorithm.strip():
            # `--var speculative_algorithm=` launched `--speculative-algorithm ''`, which SGLang refuses at start
            raise ValueError("speculative_algorithm is empty: expected an algorithm's name (DFLASH, DDTREE) or none")
        if self.algorithm in ("DFLASH", "DDTREE") and self.draft_model_path is None:
            raise ValueError(
                f"speculative_algorithm {self.algorithm} needs draft_model_path (SGLang refuses it without a drafter)"
            )
        if self.speculative_ddtree_budget is not None and self.algorithm != "DDTREE":
            raise ValueError(
                "speculative_ddtree_budget is DDTREE's tree budget: it needs `speculative_algorithm: DDTREE`"
                f" (this step's is {self.algorithm or 'none, a baseline'})"
            )

    def _speculative_vars(self) -> dict[str, str]:
        """The speculative parameters given as a var alone: parameter -> var name."""
        given = {name: getattr(self, name) for name in self.SPECULATIVE_VARS}
        return {name: v.strip("${}") for name, v in given.items() if isinstance(v, str) and VAR_REF.match(v)}

    def at(self, ctx: RenderContext) -> DeployStep:
        """This step with its speculative vars resolved from ctx's (checked as if written so: DDTREE's budget needs
        DDTREE, an algorithm needs a drafter), or FactsError naming the vars; itself when it has none. Every entry
        point (render, plan, summary, commands, execute) renders from it."""
        named = self._speculative_vars()
        if not named:
            return self
        update = {p: resolve_var(ctx, getattr(self, p), p, self.SPECULATIVE_VARS[p]) for p in named}
        try:
            step = type(self).model_validate(self.model_dump(exclude_unset=True) | update)
        except ValidationError as exc:
            shown = ", ".join(f"{p} = ${v} = {update[p]!r}" for p, v in named.items())
            raise FactsError(f"{shown}: {shape_errors(exc)}") from None
        step._from_vars = named
        return step

    def _given(self, name: str) -> str:
        """Where a parameter's value comes from: the runbook as written, or the runbook var it was resolved from."""
        var = self._from_vars.get(name)
        return "runbook" if var is None else f"runbook var {var}"

    @property
    def algorithm(self) -> str | None:
        """The speculative algorithm: as given, else DFLASH when a drafter is given, else None (a baseline).
        Upper case, as SGLang reads it (`SpeculativeAlgorithm.from_string` ignores case): a runbook's `dflash`
        is launched as DFLASH, so it must meet DFLASH's checks too, not slip past them."""
        if self.speculative_algorithm is None:
            return "DFLASH" if self.draft_model_path is not None else None
        return self.speculative_algorithm.upper()

    def default_gates(self) -> list[Gate]:
        return [Gate(that="facts.failure is none", message="the SGLang server is not serving")]

    def search_gpus(self, facts: Any) -> int | None:
        """tp x pp (x dp) of the argv the server was launched with."""
        from steps.provenance import gpus_of  # at run time only: validate and plan do not import it

        argv = fact_field(facts, "argv")
        return gpus_of([str(word) for word in argv]) if isinstance(argv, list) else None

    def search_position(self) -> Position | None:
        """Drafter, algorithm and tokens verified per request and step: DFLASH's draft tokens, DDTREE's tree budget
        and its root, one for a baseline; unknown for `auto` draft tokens without a budget or a var's value. The
        cost is the campaign report's tie order (speculation, draft tokens, budget)."""
        algorithm = self.algorithm
        tokens = self.speculative_num_draft_tokens if isinstance(self.speculative_num_draft_tokens, int) else None
        budget = self.speculative_ddtree_budget if isinstance(self.speculative_ddtree_budget, int) else None
        verified = 1 if algorithm is None else budget + 1 if budget is not None else tokens
        if algorithm is not None and algorithm.startswith("$"):
            algorithm, verified = None, None  # a var's value: where it sits is not known before the run
        cost = (0.0 if algorithm is None else 1.0, math.inf if tokens is None else float(tokens), float(budget or 0))
        setting = " ".join(str(part) for part in (algorithm or "no speculation", tokens, budget) if part is not None)
        # the steps it reads (its drafter's inspect) name no launch parameter: two drafters' launches share a place
        rest = self.model_dump_json(exclude=set(self.COMMON_FIELDS) | _SEARCH_PLACED | step_ref_fields(type(self)))
        return Position(self.draft_model_path, algorithm, verified, cost, setting, rest)

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
            "tp_size": (self._tp_size, [(probe, "gpu_count")], topology(self).tp_size_note),
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
            "metrics": (self._metrics, [], ""),
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

    def _algorithm(self, ctx: RenderContext) -> Choice:
        if self.algorithm is None:
            return Choice(value=None, source="baseline: no draft_model_path, no speculative decoding")
        given = (
            self._given("speculative_algorithm") if self.speculative_algorithm else "default with a draft_model_path"
        )
        return Choice(value=self.algorithm, source=given)

    def _tp_size(self, ctx: RenderContext) -> Choice:
        if self.tp_size != "auto":
            return Choice(value=self.tp_size, source="runbook")
        probe = self.probe
        assert probe is not None  # the validator requires it for auto
        return topology(self).tp_size(ctx, probe, lambda host, path: self._fact(host, probe, path))

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
            return Choice(value=self.speculative_num_draft_tokens, source=self._given("speculative_num_draft_tokens"))
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
        return Choice(value=self.speculative_ddtree_budget, source=self._given("speculative_ddtree_budget"))

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

    def _metrics(self, ctx: RenderContext) -> Choice:
        if "metrics" in self.model_fields_set:
            return Choice(value=self.metrics, source="runbook")
        return Choice(value=True, source="default: /metrics counters give each run its exact acceptance length")

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
        if self.metrics:
            groups.append([literal("--enable-metrics")])
        groups.append([literal("--host"), literal(self.bind), literal("--port"), literal(self.port_number(ctx))])
        extra = chosen.get("extra_args")
        if self.extra_args:  # at run time as resolved against the host's SGLang (_extra_args), in a plan as written
            words = extra.value if isinstance(extra, Choice) and isinstance(extra.value, list) else self.extra_args
            groups.append([on_host(arg) for arg in words])
        return Launch(groups, chosen)

    def ready_limit(self, ctx: RenderContext) -> float:
        return resolve_var(ctx, self.ready_timeout, "ready_timeout", parse_duration)

    def render(self, ctx: RenderContext) -> str:
        """The script of a server on one host (a node group's ranks run theirs: `plan`)."""
        step = self.at(ctx)
        return start_script(step, step.launch(ctx), step.port_number(ctx), step.ready_limit(ctx))

    def plan(self, ctx: RenderContext) -> list[tuple[str, str]]:
        step = self.at(ctx)
        return topology(step).start_plan(step, ctx)

    def summary(self, ctx: RenderContext) -> list[str]:
        step = self.at(ctx)
        drafter = "no drafter"
        if step.draft_model_path is not None:
            drafter = f"{step.algorithm}, drafter {with_vars(step.draft_model_path, ctx.vars)}"
        return [topology(step).start_summary(step, ctx, drafter)]

    def commands(self, ctx: RenderContext) -> list[str]:
        step = self.at(ctx)
        return topology(step).commands(step, ctx)

    # ---- running ---------------------------------------------------------------------------------------

    async def execute(self, ctx: StepContext) -> Outcome:
        step = self.at(ctx)
        return await topology(step).start(step, ctx)
