"""What a step kind is, and how kinds are found.

A step kind is one module in `steps/` defining a subclass of `StepSpec`:

- its parameters are the model's fields (next to the common ones: id, host, gates, ...);
- `render` returns the script it runs (`execute` may run several, through the context);
- `parse_facts` turns the command's output into typed facts (a pydantic model or JSON data);
- `default_gates` says what must hold when the runbook gives no gates.

A kind is found through the entry-point group `runbook.step_kinds` (ENTRY_POINT_GROUP): `name = "module:Class"`
in a distribution's metadata, ours in pyproject.toml like any other package's, so a package outside this
repository adds a kind without touching it (README, "Add a kind"). `step_kinds()` reads the group's names
when first asked and imports a kind's module only when that kind is looked up: a command that runs no step
imports no kind, and a runbook imports the kinds it uses. A class that subclasses StepSpec with a
`kind: Literal["name"]` field in this process (a test's) is a kind too.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import re
import sys
import typing
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from fnmatch import fnmatchcase
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Protocol, TypeVar

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints, ValidationError

from executor import strict_json
from executor.errors import (
    FAILURE_CLASSES,
    AttemptFailed,
    CommandFailed,
    GateFalse,
    GateUndecided,
    StepFailed,
    StepKindPluginError,
)
from executor.errors import FactsError as FactsError  # what a step kind raises (executor.errors)
from executor.files import json_data
from executor.hostprogram import PROGRAM_LINE, PROGRESS_PREFIX
from executor.render import var_names
from executor.runbook.campaign import AxisValue
from executor.runbook.durations import Duration
from executor.runbook.gates import roots, step_refs, var_refs
from executor.runbook.model import Gate, GateSpec, HostsSelector, Model, RetryOverride, RetryPolicy
from executor.runbook.search import Band, Measure, Position

if TYPE_CHECKING:
    from importlib.metadata import EntryPoint

    from executor.redact import Redactor
    from executor.transport.base import CommandResult, OutputSink, Transfer

#: What huggingface_hub and its `hf` CLI read from the environment (HF_ENDPOINT, HF_TOKEN, HF_HOME,
#: HF_HUB_*, the legacy token name): kinds that talk to the Hub receive these vars and secrets.
HUB_ENV = ("HF_*", "HUGGING_FACE_HUB_TOKEN")
MAX_FALLBACKS = 16  # of one step (README, "Limits of a runbook file")

#: How deep facts drawn from host output may nest. Nothing a step reports needs more; a host printing
#: `[[[[...` must fail its attempt with this number, not exhaust the controller's stack.
FACTS_MAX_DEPTH = 64
SUMMARY_LINES = 3  # of a step's default summary: the readable plan fits on a couple of screens


def check_depth(value: Any, limit: int = FACTS_MAX_DEPTH) -> None:
    """Raise FactsError when JSON-like data nests deeper than `limit` (walked without recursion)."""
    if strict_json.nested_deeper(value, limit):
        raise FactsError(f"facts nested deeper than {limit} levels")


#: What a gate reads of the command itself: a gate on these that is false is a CommandFailed, which another
#: run of the command may pass; a gate reading only facts, vars and earlier steps that is false is a GateFalse.
RAW_OUTPUT = frozenset({"exit_code", "stdout", "stderr"})


def fact_field(facts: Any, name: str) -> Any:
    """A top-level field of a kind's facts (a pydantic model or JSON data), None when it has none."""
    return facts.get(name) if isinstance(facts, Mapping) else getattr(facts, name, None)


@dataclass(frozen=True)
class FactHost:
    """The host a step's facts were read on, as an unknown fact's next step names it."""

    address: str  # where it is: an SSH address, or `local`
    #: the runbook's secrets, (name, the controller's environment variable): a next step never says `--var` of one
    secrets: tuple[tuple[str, str], ...] = ()

    def __str__(self) -> str:
        return "this machine" if self.address == "local" else self.address


@dataclass(frozen=True)
class UnknownFact:
    """Why a fact that a failed gate read is unknown (null, empty or false, with a reason next to it), as the
    failure says it (README, "The runbook format"): the reason its kind's facts give, what was tried as the
    host expanded it (`python: $sglang_python -> /opt/sglang/bin/python`: facts are masked, so never a
    secret's value), and the next step: what to check on which host, or which setting to change."""

    reason: str
    tried: str | None = None
    next_step: str | None = None

    def lines(self, names: Iterable[str]) -> list[str]:
        """`  why (NAMES): REASON`, then `tried:` and `next step:` lines where known. Each is the host's text: a
        later line of one is indented under it, never at a column where the console's own lines are."""
        said = [f"  why ({', '.join(names)}): {self.reason}"]
        said += [f"    tried: {self.tried}"] if self.tried else []
        said += [f"    next step: {self.next_step}"] if self.next_step else []
        return [line.replace("\n", "\n      ") for line in said]


#: The keys under which facts keep why a section (or the fact it is) is unknown, besides an `unknown` map.
REASON_KEYS = ("unknown_reason", "reason")
#: The longest reason a failure quotes: a reason the host wrote may carry a whole output.
REASON_MAX = 600
#: The most sections whose reasons one lookup gives (`hub.values()`: one per repo; a host's output may hold more).
SECTIONS_MAX = 16


def _section_reason(node: Mapping[str, Any], key: Any) -> str | None:
    """The reason a section gives for its `key` (its `unknown` map), else for itself (`unknown_reason`, `reason`)."""
    unknown = node.get("unknown")
    named = unknown.get(key) if isinstance(unknown, Mapping) and isinstance(key, str) else None
    reasons = [named, *(node.get(k) for k in REASON_KEYS)]
    return next((r[:REASON_MAX] for r in reasons if isinstance(r, str) and r), None)


def fact_reasons(facts: Any, path: tuple[Any, ...]) -> list[tuple[str, tuple[Any, ...]]]:
    """Why the value at `path` of a kind's facts (JSON data) is unknown, by the convention of facts (README,
    "The runbook format"), each with the path of the section that says it: the `unknown` map of the section holding it,
    else the `unknown_reason` or `reason` of the deepest section on the way. A path that ends at (or goes
    past, as `hub.values()` does) a section gives that section's reason, else those of the sections it holds
    that give one (the probe's `hub`, a section per repo). Nothing when the value is known: present and
    neither null, empty nor false, or no reason said."""
    node, found, walked = _walk(facts, path)
    if walked == len(path) and node and not isinstance(node, Mapping):
        return []
    if isinstance(node, Mapping):
        inside = _reasons_inside(node, path[:walked])
        if inside or (walked == len(path) and node):  # a section read whole that says no reason is known
            return inside
    return [found] if found else []


def _walk(facts: Any, path: tuple[Any, ...]) -> tuple[Any, tuple[str, tuple[Any, ...]] | None, int]:
    """How far `path` leads into `facts`: the value reached, the reason of the deepest section on the way that
    gives one for the key it was left by, and how many keys were walked."""
    node, found = facts, None
    for depth, key in enumerate(path):
        if isinstance(node, Mapping):
            reason = _section_reason(node, key)
            found = (reason, path[:depth]) if reason else found
            if key not in node:
                return node, found, depth
            node = node[key]
        elif isinstance(node, list) and type(key) is int and -len(node) <= key < len(node):
            node = node[key]
        else:
            return node, found, depth
    return node, found, len(path)


def _reasons_inside(node: Mapping[str, Any], at: tuple[Any, ...]) -> list[tuple[str, tuple[Any, ...]]]:
    """The reason a section gives for itself, else those of the sections it holds that give one."""
    own = _section_reason(node, None)
    if own:
        return [(own, at)]
    inner = ((_section_reason(v, None), (*at, k)) for k, v in node.items() if isinstance(v, Mapping))
    return list(itertools.islice(((reason, where) for reason, where in inner if reason), SECTIONS_MAX))


DocumentT = TypeVar("DocumentT", bound=BaseModel)


def host_document(result: CommandResult, model: type[DocumentT], program: str) -> DocumentT:
    """The JSON document a host program printed as its last line of stdout, as `model`.

    A program that printed nothing, or something else, fails the attempt with its exit code and the
    tail of its stderr: an empty answer must never read as facts.
    """
    from hostprograms import kit  # here: the controller reads the kit's documents only after a command ran

    lines = result.stdout_text.strip().splitlines()
    said = "\n".join(_cut(line) for line in result.stderr_text.strip().splitlines()[-10:]) or "(nothing)"
    if result.exit_code == kit.TOO_OLD and not lines:
        raise FactsError(f"{program} cannot run on the host's interpreter: {said}")
    if not lines:
        raise FactsError(f"{program} printed no JSON document ({result.ended}); stderr: {said}")
    wrong = f"{program} printed a document of an unexpected shape"
    try:  # read once, strictly: NaN, Infinity and 1e999 (which pydantic's JSON reader takes) are refused
        data = json_data(lines[-1], FACTS_MAX_DEPTH, loads=kit.loads)  # host output: as deep as facts at most
    except ValueError as exc:
        raise FactsError(f"{wrong}: {exc}; stderr: {said}") from None
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise FactsError(f"{wrong}: {shape_errors(exc)}; stderr: {said}") from None


#: Characters of a line of stderr that a message quotes: a line of a host's can be megabytes.
QUOTED_LINE_MAX = 300


def _cut(line: str) -> str:
    return line if len(line) <= QUOTED_LINE_MAX else line[:QUOTED_LINE_MAX] + " ..."


#: Errors of a document's shape that its message names: a host printing 100000 wrong items must not make a
#: message of megabytes (it goes to the attempt's event, state.json and the console).
SHAPE_ERRORS_SHOWN = 3


def shape_errors(exc: ValidationError) -> str:
    """The first errors of a ValidationError, each `where: what` with its path cut short (a key is host text)."""
    count = exc.error_count()
    shown = [
        f"{'.'.join(map(str, error['loc']))[:120] or '(document)'}: {error['msg'][:200]}"
        for error in exc.errors(include_url=False, include_input=False)[:SHAPE_ERRORS_SHOWN]
    ]
    more = f"; and {count - len(shown)} more" if count > len(shown) else ""
    return f"{count} error{'s' if count != 1 else ''}; " + "; ".join(shown) + more


#: Bytes of an unfinished line kept while waiting for its end. A progress line is short: a longer line is
#: not progress, and keeping all of it would let a chatty program grow the controller's memory.
PROGRESS_LINE_MAX = 65536

_TOO_LONG = b"(a line too long to be progress)"  # stands in for such a line until it ends; not the prefix


class ProgressSink(Protocol):
    """What shows progress: a StepContext, or a test's collector."""

    def progress(self, message: str, /, **fields: Any) -> None: ...


class ProgressLines:
    """Reads `runbook-progress {json}` lines from one output stream of a command (an OutputSink: `feed`).

    Output arrives in chunks cut anywhere, so an unfinished line waits for the next chunk. Every other
    line, and a progress line whose JSON is malformed, nested past FACTS_MAX_DEPTH or not an object, is skipped:
    progress is a display, and a garbled one must never fail the step. `on_fields` gets each line's JSON object, whose
    keys are data (`ProgressSink.progress` takes its message positionally: a key `self` or `message` is a
    field); one whose values it cannot show (a count that is text, 10**400 / 1.0) is skipped the same way.
    """

    def __init__(self, on_fields: Callable[[dict[str, Any]], None], stream: str = "stderr") -> None:
        self.on_fields, self.stream = on_fields, stream
        self.pending = b""

    def feed(self, stream: str, chunk: bytes) -> None:
        if stream != self.stream:
            return
        from hostprograms import kit  # here, as in host_document: no command, no kit

        *lines, rest = (self.pending + chunk).split(b"\n")
        self.pending = rest if len(rest) <= PROGRESS_LINE_MAX else _TOO_LONG
        for line in lines:
            if not line.startswith(PROGRESS_PREFIX):
                continue
            try:
                # NaN, Infinity or 1e999: malformed, skipped; nested deeper than facts: counted before the parser
                fields = json_data(line[len(PROGRESS_PREFIX) :], FACTS_MAX_DEPTH, loads=kit.loads)
                if isinstance(fields, dict):
                    self.on_fields(fields)
            except (ValueError, LookupError, TypeError, ArithmeticError):
                continue


def progress_messages(ctx: ProgressSink) -> ProgressLines:
    """The common case: a line's `message` is the progress text and its other keys are the fields.

    A line without a message is skipped.
    """

    def show(fields: dict[str, Any]) -> None:
        if "message" in fields:
            ctx.progress(str(fields.pop("message")), **fields)

    return ProgressLines(show)


#: A parameter given as a runbook var (`$name` or `${name}`), for parameters the controller needs as a
#: value (a port, a timeout): an inventory or `--var` can then set them per site, like any path.
VAR_REF = re.compile(r"^\$(\{[A-Za-z_][A-Za-z0-9_]*\}|[A-Za-z_][A-Za-z0-9_]*)$")
VarRef = Annotated[str, StringConstraints(pattern=VAR_REF.pattern)]


def _as_written(text: str) -> str:
    if var_names(text):
        raise ValueError(f"{text!r}: a $var does not expand here (the host gets this text as written): give the value")
    return text


#: A parameter the host gets as written (a revision, a file pattern, a flag's value, an address to bind): a
#: `$var` there would reach the host raw (`revision: $rev` asked the Hub for "$rev"), so validate refuses it.
AsWritten = Annotated[str, AfterValidator(_as_written)]


def _as_written_or_var(text: str) -> str:
    if VAR_REF.match(text) or not var_names(text):
        return text
    raise ValueError(
        f"{text!r}: a $var does not expand here (the host gets this text as written): give the value, or a var "
        "alone ($name), which the controller resolves before the host sees it"
    )


#: A parameter the host gets as written that may also be a runbook var alone (`revision: $speed_bench_revision`):
#: the step resolves it on the controller (`resolve_var`) before the host sees it, so a site sets it by --var or
#: an inventory; a var inside other text is refused at validate, as in `AsWritten`.
AsWrittenOrVar = Annotated[str, AfterValidator(_as_written_or_var)]
ValueT = TypeVar("ValueT")


class _StepRefMarker:
    """Marks a parameter that names another step (`StepRef`): the matrix loader rewrites such a name to the
    same cell's instance of a group mate, and refuses one naming a matrix step from outside its group."""

    def __repr__(self) -> str:
        return "STEP_REF"


STEP_REF = _StepRefMarker()
#: A parameter naming another step (`server: deploy_dflash`), typed so, not by its field name, for the loader.
StepRef = Annotated[str, STEP_REF]


@functools.cache
def step_ref_fields(model: type[BaseModel]) -> frozenset[str]:
    """The fields of `model` typed `StepRef` (also as `StepRef | None`)."""
    return frozenset(
        name for name, info in model.model_fields.items() if _marks_step_ref(info.annotation, info.metadata)
    )


def _marks_step_ref(annotation: Any, metadata: Iterable[Any]) -> bool:
    if any(item is STEP_REF for item in metadata):
        return True
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) is Annotated:
        return any(item is STEP_REF for item in args[1:]) or _marks_step_ref(args[0], ())
    return any(_marks_step_ref(arg, ()) for arg in args)


def resolve_var(ctx: RenderContext, value: ValueT | str, what: str, parse: Callable[[str], ValueT]) -> ValueT:
    """A parameter's value: as given, or parsed from the runbook var it names (a `VarRef`).

    A var that is unset or does not parse fails the step, naming the parameter and the var.
    """
    if not isinstance(value, str):
        return value
    name = value.strip("${}")
    text = ctx.vars.get(name)
    try:
        if text is None:
            raise ValueError("it is not set")
        return parse(text)
    except ValueError as exc:
        raise FactsError(f"{what}: runbook var {name} = {text!r} does not fit: {exc}") from None


@dataclass(frozen=True)
class RunTime:
    """A value not known before the run: what `runbook plan` has where a run has a fact.

    `source` names where the value will come from: a fact's path (`steps.probe.facts.gpu_count`) or the
    rule that derives it from facts (`--trust-remote-code if steps.inspect.facts.deploy.trust_remote_code`).
    Kinds tell it from a value with `isinstance`, never by its text: a host may print anything, even this
    text, and what it printed is a value. `str()` is how the plan shows it (`<known at run time: SOURCE>`,
    or `<WHAT, known at run time>` where the value is better named by what it is than by its source).
    """

    source: str
    what: str | None = None

    @classmethod
    def fact(cls, step_id: str, path: str) -> RunTime:
        """An earlier step's fact, by dotted path."""
        return cls(f"steps.{step_id}.facts.{path}")

    def __str__(self) -> str:
        return f"<{self.what}, known at run time>" if self.what else f"<known at run time: {self.source}>"


class RenderContext(ABC):
    """What a step sees while rendering: vars, its host, and earlier steps' facts.

    In `runbook plan` the facts of earlier steps are not known yet; `fact` then returns a `RunTime`
    naming the fact instead of a value.
    """

    host_name: str
    host_address: str  # the host's `address` in the runbook (a node group's rank 0 is reached at it)
    vars: Mapping[str, str]

    @abstractmethod
    def fact(self, step_id: str, path: str) -> Any:
        """A fact of an earlier step on the same host, by dotted path (`gpus.0.name`)."""

    def fetches(self) -> tuple[str, ...]:
        """What the runbook's steps on this host (and their fallbacks) declare they will fetch (`StepSpec.fetches`),
        each once, in runbook order: what a step checks before the downloads begin (the probe asks the Hub for
        each repository: a gated one fails there, not hours into another's download). None by default."""
        return ()

    def screened(self) -> bool:
        """Whether the step runs against a configuration a campaign's search launched (README, "Search"), where a
        kind that ranks nothing runs its short form (an evaluation: the first prompts of each set); the measuring
        step reads `StepContext.screen`. False by default: everything in full."""
        return False

    @abstractmethod
    def peer(self, host: str) -> RenderContext:
        """The same step seen from `host` (one of its `peer_hosts()`, or its own): that host's vars and
        address, and the facts of the steps that passed ON it, strictly: a step that ran on another host
        only has no facts there (a node group must not take one node's verified weights for another's).
        A host the runbook does not have is a FactsError."""


class StepContext(RenderContext):
    """What a step sees while executing: the render context plus audited I/O on its host.

    `base_dir` is the runbook's folder (local paths in a runbook are relative to it);
    `output_dir` is this host's folder inside the run folder, for fetched results; `run_dir` is
    the run folder itself, for what a step produces about the whole run (a report). `redactor` masks the
    run's secrets: what a step writes into the run folder itself (a report) goes through it, as
    everything the engine stores does.
    """

    base_dir: Path
    output_dir: Path
    run_dir: Path
    redactor: Redactor

    @abstractmethod
    async def run(
        self, script: str | bytes, *, timeout: float | None = None, on_output: OutputSink | None = None
    ) -> CommandResult:
        """Run one script on the host, audited; a timeout comes back as a result.

        `on_output` sees the output as it arrives (for progress); the audit log keeps it clipped.
        """

    @abstractmethod
    def progress(self, message: str, /, **fields: Any) -> None:
        """Show live progress of this step (console status line; a `progress` JSON event)."""

    @abstractmethod
    def facts_of_kind(self, kind: str) -> dict[str, Any]:
        """The facts, on this host, of the steps of `kind` before this one that have facts (step id ->
        facts, in runbook order).

        For a step that must describe what it depends on without the runbook naming each step (a
        report's provenance: every download, verify and probe before it).
        """

    @abstractmethod
    def steps_before(self, kinds: Iterable[str] | None = None) -> list[StepView]:
        """Every step (each matrix instance) before this one, of `kinds` (None: all), on every host, in
        run order, whatever its status: for a step that sums up a campaign (which cell ran where, which
        failed and why) and not only the facts of the steps that passed on its own host.
        """

    def screen(self) -> Callable[[Mapping[Band, Measure]], frozenset[Band]] | None:
        """For the measuring step of a configuration a campaign's search launched (README, "Search"): the screen,
        which takes the measure of a first pass (one repeat of each band) and answers the bands where the
        configuration still contends for the answer, to measure in full; None outside a search (measure all)."""
        return None

    @abstractmethod
    def peer(self, host: str) -> StepContext:
        """`run`, `put`, `get`, `fact` and `progress` on `host` (see `RenderContext.peer`): the same step
        and attempt, audited and evented as (step, that host, attempt). The engine has opened the
        transports of the step's `peer_hosts()` before the step started."""

    @abstractmethod
    async def put(self, local: Path, remote: str) -> Transfer: ...

    @abstractmethod
    async def get(self, remote: str, local: Path) -> Transfer: ...


@dataclass(frozen=True)
class StepView:
    """One earlier step on one host as `StepContext.steps_before` shows it: a read-only view of its record."""

    step: str  # its id: a matrix instance's (`benchmark[drafter=tmp-long,tokens=8]`) or the step's own
    base: str  # the id as written (== step outside a matrix)
    kind: str
    host: str
    status: str  # passed | failed | skipped | pending | running | interrupted
    message: str | None  # why it failed or was skipped (a failed cell, a `when:` that was false)
    facts: Any  # as stored (JSON data), None when it produced none
    group: str | None = None  # its matrix group's name, None outside a matrix
    cell: Mapping[str, AxisValue] = dataclass_field(default_factory=dict)  # the axis values of the instance
    duration_s: float | None = None  # how long it ran (all its attempts); None: it did not run


@dataclass
class Outcome:
    """One attempt's result: the last command's output and the facts drawn from it."""

    result: CommandResult
    facts: Any = None


def _no_fallbacks() -> list[dict[str, Any]]:
    """A step's `fallbacks` unless it gives some: `list` as a factory written in Python. pydantic reads a default
    factory's signature each time it builds a model, and a builtin's is parsed from its text through tokenize,
    whose regex compiles at the first (~3 ms of `runbook validate`'s start, then ~0.15 ms per step kind)."""
    return []


class StepSpec(Model):
    """Fields every step has. Subclasses add their parameters and behaviour."""

    model_config = ConfigDict(allow_inf_nan=False)  # a parameter such as request_timeout: .inf is no bound

    id: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_-]*$")  # unique; earlier steps' facts are `steps.ID.facts`
    kind: str  # the step kind: what the step does, and which parameters it takes
    description: str | None = None  # what the step is for (shown by `runbook plan`)
    host: str | None = None  # the one host it runs on (optional where the runbook has one)
    hosts: HostsSelector | None = None  # hosts it runs on: a list, `all` or a pool's name
    timeout: Duration | None = None  # of each command (default: `defaults.timeout`)
    retry: RetryOverride | None = None  # attempts before fallbacks; unset fields from `defaults.retry`
    #: Jinja2 expressions that must all hold (none: `exit_code == 0`, or the kind's default gates).
    gates: list[GateSpec] | None = None
    #: A condition (a gate's Jinja, with `steps`, `vars` and, in a matrix, `matrix`) the engine evaluates
    #: before the step's first attempt on each host: false skips the step, with its message.
    when: GateSpec | None = None
    # each is the step validated again, gates and all: a bound keeps `[{}, {}, ...]` from multiplying a step
    #: Tried in order once the step (with its retries) has failed: each lists the keys of the step it changes.
    fallbacks: list[dict[str, Any]] = Field(default_factory=_no_fallbacks, max_length=MAX_FALLBACKS)
    #: Vars and secrets the step's commands receive besides those its parameters name as `$var`: names
    #: or patterns (`HF_*`, `*` for all). Unset: the kind's `default_pass_env`.
    pass_env: list[str] | None = None

    registry: ClassVar[dict[str, type[StepSpec]]] = {}
    #: Whether a step of the kind starts a long-lived server that the steps after it use and that the next
    #: such step replaces (a deploy on a port). A matrix runs every cell of one server configuration
    #: against one launch, counts launches by these steps, places them on a pool's hosts, and runs such a
    #: step again (it adopts a server still running with the same arguments) before any step of its cell
    #: that a resume runs again.
    starts_server: ClassVar[bool] = False
    #: What the kind's commands read from the environment whatever the runbook says (patterns).
    kind_env: ClassVar[tuple[str, ...]] = ()
    #: What a step of the kind receives when it gives no `pass_env` (a shell script may read anything).
    default_pass_env: ClassVar[tuple[str, ...]] = ()
    #: Keys the kind no longer has, each with what replaces it: `validate` says so instead of a bare
    #: "unknown key" (deploy's `action: stop` became the kind `stop_server`).
    retired_keys: ClassVar[Mapping[str, str]] = {}
    #: The kind's facts are its command's own output as it printed it (a shell step's `parse: json`), not
    #: what a host program read of the host: a false gate on them is a CommandFailed, which running the
    #: command again may pass (a script that polls for a server), never a GateFalse.
    facts_are_output: ClassVar[bool] = False
    #: Parameters holding a script run by a shell: `${{ matrix.X }}` is refused there (the shell would
    #: read `${` itself); a script reads the axis values as environment variables `$matrix_X` instead.
    script_fields: ClassVar[frozenset[str]] = frozenset()
    #: Parameters that reach the host (or the controller) as written, never through a shell: a `$` in them is
    #: text (a server's `env`, a report's title, a local file's path), so `validate` checks no `$name` there.
    literal_fields: ClassVar[frozenset[str]] = frozenset()
    #: Parameters listing hosts where a pool's name may stand for its hosts (the loader puts them in before
    #: validating): the site's inventory then decides how many hosts they are.
    host_list_fields: ClassVar[frozenset[str]] = frozenset()
    #: The fields every kind has: none of them reaches a command, so a `$name` in them names no var.
    COMMON_FIELDS: ClassVar[frozenset[str]] = frozenset(
        {"id", "kind", "description", "host", "hosts", "timeout", "retry", "gates", "when", "fallbacks", "pass_env"}
    )

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        default = cls.model_fields["kind"].default
        if isinstance(default, str):
            StepSpec.registry[default] = cls

    def default_gates(self) -> list[Gate]:
        return [Gate(that="exit_code == 0", message="the command exited with a non-zero status")]

    def failure_class(self, facts: Any) -> type[AttemptFailed] | None:
        """Why an attempt whose gates did not hold failed, when the kind's facts say it better than the gate
        (README, "Retries"): the class a host program recognised (its `failure_class`: AccessDenied, PortInUse,
        ...), else StepFailed when they report an error (`failure`), which another attempt may not meet. None:
        the failed gate decides (`gate_failure`). A kind whose facts name errors otherwise overrides this."""
        named = fact_field(facts, "failure_class")
        if isinstance(named, str):
            return FAILURE_CLASSES.get(named, StepFailed)
        return StepFailed if fact_field(facts, "failure") is not None else None

    #: The parameter of this kind that a failure class blames (deploy: a port held by another process, PortInUse,
    #: blames `port`): where the runbook gives that parameter as a var, the failure names the var and its value
    #: (`failure_var`), and the console, `status` and the MCP tools say how to resume with another value.
    failure_params: ClassVar[Mapping[str, str]] = {}

    def failure_var(self, failure: type[AttemptFailed], facts: Any) -> tuple[str, str] | None:
        """The runbook var whose value caused a failure of class `failure`, and the parameter that holds it: the
        var the facts name (`failure_var`, any kind's host program or script may), else the one the runbook gave
        as the parameter `failure_params` says the class blames. None: no var is known to be the cause."""
        named = fact_field(facts, "failure_var")
        if isinstance(named, str):
            return named, ""
        param = self.failure_params.get(failure.__name__)
        written = getattr(self, param, None) if param else None
        names = var_names(written) if isinstance(written, str) else []
        return (names[0], str(param)) if len(set(names)) == 1 else None

    def gate_failure(self, facts: Any, gate: str, undecided: bool) -> type[AttemptFailed]:
        """The failure class of an attempt whose gate `gate` did not hold (`undecided`: it could not be
        evaluated): the kind's own (`failure_class`) first, then GateUndecided, then CommandFailed for a gate on
        the command's exit code or output (or facts that are its output: `facts_are_output`), else GateFalse: a
        definite value read from facts, vars or earlier steps, which asking again reads the same."""
        known = self.failure_class(facts) if facts is not None else None
        if known is not None:
            return known
        if undecided:
            return GateUndecided
        output = RAW_OUTPUT | {"facts"} if self.facts_are_output else RAW_OUTPUT
        return CommandFailed if roots(gate) & output else GateFalse

    def unknown_facts(self, facts: Any, path: tuple[Any, ...], host: FactHost) -> list[UnknownFact]:
        """Why the fact at `path` of this kind's facts (JSON data, masked), read on `host`, is unknown, for a
        failed gate that read it: the reasons the facts give (`fact_reasons`). A kind that knows what its
        host program tried and what to check then overrides this to say so (steps/probe.py)."""
        return [UnknownFact(reason) for reason, _ in fact_reasons(facts, path)]

    def setting(self, name: str, secrets: Mapping[str, str] | None = None) -> str:
        """How a person changes this step's parameter `name`, for a next step: the vars its value names
        (`$sglang_python`: set by --var or an inventory, the runbook unedited), else the parameter itself. A
        secret's (`secrets`: name to the controller's environment variable) is set there: --var refuses it."""
        value, secrets = getattr(self, name, None), secrets or {}
        named = list(dict.fromkeys(var_names(value))) if isinstance(value, str) else []
        if not named:
            return f"`{name}:` of step '{self.id}'"
        ways = [f"the controller's ${secrets[n]}" if n in secrets else f"--var {n}=..." for n in named]
        inventory = ", or in your inventory" if any(n not in secrets for n in named) else ""
        return f"{' and '.join(f'`{n}`' for n in named)} ({' and '.join(ways)}{inventory})"

    def retry_policy(self, defaults: RetryPolicy) -> RetryPolicy:
        """The runbook's default policy with this step's overrides."""
        return self.retry.over(defaults) if self.retry else defaults

    def effective_gates(self) -> list[Gate]:
        return list(self.gates) if self.gates is not None else self.default_gates()

    def needs(self) -> set[str]:
        """Ids of earlier steps whose facts this step uses: those its gates and `when` name, and those its
        parameters typed `StepRef` (or a list of them) hold (`server:`, `probe:`, `verified:`, ...): a kind
        declares a reference by its type, never again here."""
        gates = [gate.that for gate in self.effective_gates()]
        named = {ref for that in [*gates, *([self.when.that] if self.when else [])] for ref in step_refs(that)}
        held = [getattr(self, name) for name in step_ref_fields(type(self))]
        return named | {ref for value in held for ref in (value if isinstance(value, list) else [value]) if ref}

    def env_names(self, available: Iterable[str]) -> list[str]:
        """Which of the run's vars and secrets (`available`) this step's commands get in their environment.

        Exactly these count for the step's fingerprint (with the vars its gates read): what reaches a
        step and what a resume compares are one set. They are the names its parameters hold as `$name`
        or `${name}`, those its kind reads (`kind_env`), and those its `pass_env` (or the kind's
        `default_pass_env`) matches.
        """
        patterns = [*self.kind_env, *(self.pass_env if self.pass_env is not None else self.default_pass_env)]
        named = self._referenced_vars
        return [n for n in available if n in named or any(fnmatchcase(n, p) for p in patterns)]

    @functools.cached_property
    def _referenced_vars(self) -> frozenset[str]:
        """The names its parameters hold as `$name`: once per step, not per command (the model is frozen)."""
        return frozenset(var_names(self.model_dump_json(exclude=set(self.COMMON_FIELDS))))

    def environment(
        self, variables: Mapping[str, str], secrets: Mapping[str, str]
    ) -> tuple[dict[str, str], dict[str, str]]:
        """The vars and the secrets (name: value) that reach this step's commands (see `env_names`)."""
        return (
            {n: variables[n] for n in self.env_names(variables)},
            {n: secrets[n] for n in self.env_names(secrets)},
        )

    def gate_vars(self, available: Iterable[str]) -> list[str]:
        """The vars (of `available`) this step's gates read as `vars.NAME`; all of them for a bare `vars`."""
        names = {name for gate in self.effective_gates() for name in var_refs(gate.that)}
        return [n for n in available if n in names or "*" in names]

    def check_runbook(self, steps: Mapping[str, StepSpec]) -> list[str]:
        """Problems of this step with the runbook's other steps (`steps`: every step by id), found at `validate`:
        a campaign report whose baseline is launched unlike its cells. None by default."""
        return []

    def plan_notes(self, steps: Mapping[str, StepSpec]) -> list[str]:
        """Lines `runbook plan` adds to this step's summary from the runbook's other steps (a campaign report:
        its baseline's parity with each group's deploys). None by default."""
        return []

    def fetches(self) -> list[str]:
        """What this step will fetch from outside the run, as addresses a step before it may check first
        (`RenderContext.fetches`): a Hub repository as `hf://[datasets/]org/name@revision` (huggingface_hub's
        HfFileSystem form, the revision URL-quoted), with a file pattern as its path where the step fetches only
        those files (`.../name@main/throughput_1k.jsonl`: the probe checks each is there). The engine gathers them
        without knowing any kind; none by default."""
        return []

    def local_files(self) -> list[str]:
        """Files on the controller this step reads (relative to the runbook's folder; `~` allowed).

        Their contents are part of the step's fingerprint: editing one makes a resume run the step again.
        """
        return []

    def peer_hosts(self) -> list[str]:
        """Hosts besides the step's own that its commands also run on (a node group's other ranks),
        through `StepContext.peer`. The loader checks that the runbook has them, the engine connects to
        them before the step starts, `plan` lists them; facts are recorded on the step's own host only."""
        return []

    def own_hosts(self) -> list[str] | None:
        """The step's hosts when its parameters decide them (a node group runs on its rank 0), None when
        `host:`/`hosts:` do; the loader refuses a `host:`/`hosts:` that says otherwise."""
        return None

    def render(self, ctx: RenderContext) -> str:
        """The script this step runs."""
        raise NotImplementedError(f"step kind {self.kind!r} renders no script")

    def plan(self, ctx: RenderContext) -> list[tuple[str, str]]:
        """(label, script) for every command an attempt may run, for `runbook plan`."""
        try:
            return [("", self.render(ctx))]
        except NotImplementedError:
            return [("", f"# step kind {self.kind!r} decides its commands at run time\n")]

    def summary(self, ctx: RenderContext) -> list[str]:
        """What the step does, in a line or two, for the readable `runbook plan` (`plan --full` prints every
        command). The default says what each planned command is: its label, else its script's first comment
        line. A kind whose commands say too little that way (or too much: one per run) says it itself."""
        said = []
        for label, script in self.plan(ctx):
            first = script.lstrip().partition("\n")[0]
            said.append(label or (first[2:] if first.startswith("# ") and not PROGRAM_LINE.match(first) else ""))
        lines = [line for line in dict.fromkeys(said) if line]
        return lines[:SUMMARY_LINES] or [f"runs its {self.kind} script (`runbook plan --full` shows it)"]

    def commands(self, ctx: RenderContext) -> list[str]:
        """The commands a person cares about (the launch command, a bench command), as one would paste them on
        the host; none by default (`plan --full` has every script as sent)."""
        return []

    def ready_limit(self, ctx: RenderContext) -> float | None:
        """For a server-starting step: how long its server may take to be ready (seconds), the upper bound
        of one launch that `runbook plan` multiplies by a matrix's launches; None for other kinds."""
        return None

    def search_position(self) -> Position | None:
        """For a server-starting step: where its launch sits in a campaign's search (`strategy: search`, README
        "Search"): its drafter, algorithm and tokens verified per step. None: the search knows only its measure."""
        return None

    def search_gpus(self, facts: Any) -> int | None:
        """For a server-starting step: the GPUs its launch held (its facts as stored), which a search's `gpu_hours`
        budget multiplies its time by. None: unknown, counted as one."""
        return None

    def search_measures(self, facts: Any) -> dict[Band, Measure]:
        """For a measuring step (a search's `measure:`): its facts (JSON data as stored) as the search ranks
        configurations by, one `Measure` per band; none where the facts hold none (a failed run)."""
        return {}

    def parse_facts(self, result: CommandResult) -> BaseModel | Any:
        """Typed facts from a finished command; raise FactsError when the output is unusable."""
        return None

    async def execute(self, ctx: StepContext) -> Outcome:
        """One attempt. Kinds that run several commands override this."""
        result = await ctx.run(self.render(ctx))
        if result.timed_out or result.interrupted:
            return Outcome(result)
        return Outcome(result, self.parse_facts(result))


#: The entry-point group of step kinds: each entry `NAME = "module:Class"`, NAME the kind's name.
ENTRY_POINT_GROUP = "runbook.step_kinds"
#: The distribution whose kinds are built in: another that registers one of their names is refused.
BUILT_IN = "runbook"


class StepKinds(Mapping[str, type[StepSpec]]):
    """Every step kind by name: the kinds of the entry-point group, then those defined in this process.

    Its names cost no import; looking a kind up imports its module, once (`_load`), and raises
    StepKindPluginError naming the distribution when that fails or gives no such kind.
    """

    def __init__(self, points: Mapping[str, EntryPoint]) -> None:
        self.points = points

    def __getitem__(self, name: str) -> type[StepSpec]:
        point = self.points.get(name)
        return StepSpec.registry[name] if point is None else _load(point)

    def __iter__(self) -> typing.Iterator[str]:
        return iter(dict.fromkeys([*self.points, *StepSpec.registry]))

    def __len__(self) -> int:
        return len(self.points.keys() | StepSpec.registry.keys())


#: What a message lists as the known kinds when there are none: runbook's own are installed metadata, missing
#: where runbook is not installed or was installed (editable) before its kinds became entry points.
NO_KIND_REGISTERED = (
    f"none: no step kind is registered under the entry-point group {ENTRY_POINT_GROUP!r}, not even runbook's own; "
    "run `pip install -e .` again where runbook is checked out (or install runbook)"
)


def known_kinds(kinds: Iterable[str]) -> str:
    """The kinds' names for a message about an unknown or missing kind, or NO_KIND_REGISTERED."""
    return ", ".join(sorted(kinds)) or NO_KIND_REGISTERED


def step_kinds() -> StepKinds:
    """Every step kind (see StepKinds); the entry points are read once per process."""
    return StepKinds(_entry_points())


@functools.cache
def _entry_points() -> dict[str, EntryPoint]:
    """The group's entry points by kind name; StepKindPluginError when two distributions name one kind (a
    built-in one's name taken by another package, or two packages giving one name)."""
    from importlib.metadata import entry_points  # here: a command that runs no step reads no metadata

    by_name: dict[str, list[EntryPoint]] = {}
    for point in entry_points(group=ENTRY_POINT_GROUP):
        by_name.setdefault(point.name, []).append(point)
    return {name: _one_of(points) for name, points in by_name.items()}


def _one_of(points: list[EntryPoint]) -> EntryPoint:
    """The entry point of a kind that one or more entry points name, the built-in one first; StepKindPluginError
    when two distributions name it. A distribution's name is read (its METADATA parsed) only for a name that two
    points share: reading it for every kind was a third of `validate`'s start."""
    if len(points) == 1:
        return points[0]
    held, *others = sorted(points, key=lambda p: _distribution(p) != BUILT_IN)
    for point in others:
        if _distribution(held) != _distribution(point):
            what = "the built-in kind" if _distribution(held) == BUILT_IN else "the kind"
            raise StepKindPluginError(
                f"step kind {point.name!r} of distribution {_distribution(point)!r} ({point.value}) clashes with "
                f"{what} {point.name!r} of distribution {_distribution(held)!r} ({held.value}): rename it in "
                f"its [project.entry-points.{ENTRY_POINT_GROUP!r}] or uninstall one of them"
            )
    return held


def _distribution(point: EntryPoint) -> str:
    return point.dist.name if point.dist is not None else "(unknown distribution)"


_LOADED: dict[tuple[str, str], type[StepSpec]] = {}


def _load(point: EntryPoint) -> type[StepSpec]:
    """The kind an entry point names, its module imported on first use; StepKindPluginError when the import
    fails or the object is no StepSpec whose `kind` is the entry point's name."""
    key = (point.name, point.value)
    if key in _LOADED:
        return _LOADED[key]
    try:
        # stdout is data (`run --json`'s events, `plan --json`, the MCP server's messages): what a plugin prints
        # while imported goes to stderr
        with contextlib.redirect_stdout(sys.stderr):
            loaded = point.load()
    except (Exception, SystemExit) as exc:  # any error of a plugin's import, its sys.exit too: named, never a
        # traceback, nor `validate` ending with the plugin's exit status (0: as if the runbook were valid)
        raise StepKindPluginError(f"{_where(point)} cannot be imported: {type(exc).__name__}: {exc}") from None
    if not (isinstance(loaded, type) and issubclass(loaded, StepSpec)):
        raise StepKindPluginError(f"{_where(point)} is no subclass of executor.stepkind.StepSpec")
    if loaded.model_fields["kind"].default != point.name:
        said = loaded.model_fields["kind"].default
        raise StepKindPluginError(f"{_where(point)} declares kind: Literal[{said!r}], not {point.name!r}")
    _LOADED[key] = loaded
    return loaded


def _where(point: EntryPoint) -> str:
    """An entry point named for a message, with its distribution (read only when there is something to say)."""
    return f"step kind {point.name!r} of distribution {_distribution(point)!r} ({point.value})"
