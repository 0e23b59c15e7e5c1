"""How a run starts and what it reuses: the carry-over of `--var`/`--inventory` into a `--resume`, the
steps' fingerprints, and for each step what happens and why.

The planning is a set of functions of the runbook, the source run's meta and records, and the options,
so that the hardest logic of a resume is tested without a host (tests/executor/test_resume_plan.py),
and so that the CLI and an API caller (`Engine(runbook, RunOptions(resume=...))`) resume the same way:
the Engine calls `begin` itself, the CLI only hands it the flags it was given. `begin` reads the log
folder (the one `find_run` of a run) and a carried inventory file; `carry_over` reads nothing, `plan_steps`
nothing but the local files a step's fingerprint covers (an upload's); none of them writes anything.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shlex
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from executor.errors import InvalidRunbook, Problem, ResumeError
from executor.redact import NO_SECRETS, Redactor
from executor.run.run_options import RunOptions
from executor.run.state import NOT_STARTED, ONLY_SKIPPED, RunMeta, StepRecord, find_run, passed_before
from executor.runbook.campaign import Instance, matrix_environment
from executor.runbook.cells import CELL_FAILED, Index
from executor.runbook.loader import Runbook, _did_you_mean, apply_inventory
from executor.runbook.model import VarValue, override_value, var_text
from executor.runbook.planner import render_problems, secrets_redactor
from executor.runbook.search import LEFT_OUT
from executor.stepkind import StepSpec

#: The host settings that say where a step runs. The others (timeouts, keys, jump hosts, the runner)
#: only say how commands get there: changing them, e.g. a longer connect_timeout after a timeout, reruns nothing.
WHERE_A_STEP_RUNS = ("address", "port", "user")

#: A source run's step records by (step, host).
Records = Mapping[tuple[str, str], StepRecord]


# ---- fingerprints ---------------------------------------------------------------------------------


def definition_parts(
    runbook: Runbook,
    spec: StepSpec,
    host: str,
    variables: Mapping[str, Any],
    secrets: Sequence[str] = (),
    peers: Mapping[str, Mapping[str, Any]] | None = None,
) -> dict[str, str]:
    """What a step's result depends on, each part as a digest: its definition (`step`), where it runs
    (`host`), the value of each var that reaches it (`var NAME`, given redacted: those in its environment, see
    `StepSpec.env_names`, and those its gates read), which secrets reach it (`secret NAME`: the name
    only, a value is never kept), the contents of each local file it reads (`file PATH`). Kept per step
    so that a resume can say which part changed."""
    variants = [spec, *runbook.fallbacks.get(spec.id, [])]
    texts = {n: var_text(v) for n, v in variables.items()}
    definition = [v.model_dump(mode="json", exclude={"description"}) for v in variants]
    parts = {
        "step": _digest(definition),
        "host": _digest(runbook.hosts[host].model_dump(mode="json", include=set(WHERE_A_STEP_RUNS))),
    }
    for name in sorted({n for v in variants for n in [*v.env_names(texts), *v.gate_vars(texts)]}):
        parts[f"var {name}"] = _digest(texts[name])
    for name in sorted({n for v in variants for n in v.env_names(secrets)}):
        parts[f"secret {name}"] = _digest("received")
    for file in sorted({f for v in variants for f in v.local_files()}):
        parts[f"file {file}"] = _file_digest(runbook.path.parent / Path(file).expanduser())
    for peer, values in sorted((peers or {}).items()):  # where its peers are and what of their vars reaches it
        shown = {n: var_text(v) for n, v in values.items()}
        where = runbook.hosts[peer].model_dump(mode="json", include=set(WHERE_A_STEP_RUNS))
        names = sorted({n for v in variants for n in v.env_names(shown)})
        parts[f"peer {peer}"] = _digest({"host": where, "vars": {n: shown[n] for n in names}})
    instance = runbook.instances.get(spec.id)
    for name, text in sorted(matrix_environment(instance.values if instance else {}).items()):
        parts[f"matrix {name}"] = _digest(text)  # what its scripts read as $matrix_AXIS
    return parts


def fingerprint(parts: Mapping[str, str]) -> str:
    """Changes when any part of a step's definition changes."""
    return _digest(dict(parts))


def changed_parts(old: Mapping[str, str] | None, new: Mapping[str, str]) -> str:
    """Which parts differ, for the console: `var models_dir, file conf.txt` (`its definition` when the
    old record predates the parts)."""
    if old is None:
        return "its definition"
    names = sorted(name for name in old.keys() | new.keys() if old.get(name) != new.get(name))
    return ", ".join(names) or "its definition"


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()


def _file_digest(path: Path) -> str:
    """The sha256 of a local file, or why there is none (a missing file fails the step when it runs)."""
    from executor.transport.base import file_sha256  # here: validating a runbook imports no transport

    try:
        return file_sha256(path)
    except OSError as exc:
        return f"unreadable: {exc.strerror}"


class Fingerprints:
    """The steps' definition parts on each host for one run, each computed once (it renders the step's
    scripts): the plan compares them with the source run's records, the Engine stores them in the new ones.

    `variables` are the run's vars as the fingerprint counts them: a var holding a secret by its redacted
    text (no digest of a secret is stored); `secrets` the names of the secrets the run has.
    """

    def __init__(
        self,
        runbook: Runbook,
        variables: Mapping[str, str],
        secrets: Sequence[str],
        per_host: Mapping[str, Mapping[str, str]] | None = None,
    ) -> None:
        self.runbook = runbook
        self.variables = variables
        self.secrets = secrets
        #: the vars of each host that has its own (`hosts.NAME.vars`), as `variables` are given
        self.per_host = per_host or {}
        self._parts: dict[tuple[str, str], dict[str, str]] = {}

    def parts(self, spec: StepSpec, host: str) -> dict[str, str]:
        key = (spec.id, host)
        if key not in self._parts:
            variables = self.per_host.get(host, self.variables)
            hosts = {h for v in [spec, *self.runbook.fallbacks.get(spec.id, [])] for h in v.peer_hosts()}
            peers = {h: self.per_host.get(h, self.variables) for h in hosts}
            self._parts[key] = definition_parts(self.runbook, spec, host, variables, self.secrets, peers)
        return self._parts[key]

    def fingerprint(self, spec: StepSpec, host: str) -> str:
        return fingerprint(self.parts(spec, host))

    def same(self, spec: StepSpec, record: StepRecord | None) -> bool:
        """Whether `record` (of the source run) is of the step as it is now, on its host."""
        return record is not None and record.fingerprint == self.fingerprint(spec, record.host)

    def what_changed(self, spec: StepSpec, records: Iterable[StepRecord | None]) -> str:
        """The parts that differ (`var models_dir, file conf.txt`) on the first host where one does."""
        for record in records:
            if record is not None and not self.same(spec, record):
                return changed_parts(record.parts, self.parts(spec, record.host))
        return "its definition"


# ---- the carry-over of --var and --inventory -------------------------------------------------------


def parse_var_args(pairs: Sequence[str], runbook: Runbook, redactor: Redactor = NO_SECRETS) -> dict[str, VarValue]:
    """`--var K=V` pairs as var values: V is the exact text after the first `=` (see `override_value`).
    A problem's message is masked by `redactor`: a pair is where a careless user pastes a token."""
    problems = []
    values: dict[str, VarValue] = {}
    for pair in pairs:
        name, sep, text = pair.partition("=")
        # quoted masked, whole or by its name; never `name` as given, which is all of a pasted base64
        # token but its `=` padding
        masked = redactor.text(pair)
        if not sep:
            problems.append(Problem("--var", 1, 1, f"expected K=V, got {masked!r}"))
        elif name not in runbook.header.vars:
            known = ", ".join(runbook.header.vars) or "none"
            said = masked.partition("=")[0]
            hint = _did_you_mean(said, runbook.header.vars)
            problems.append(Problem("--var", 1, 1, f"unknown var '{said}' (the runbook declares: {known}){hint}"))
        else:
            try:
                values[name] = override_value(name, text, runbook.header.vars[name])
            except ValueError as exc:
                problems.append(Problem("--var", 1, 1, redactor.text(str(exc))))
    if problems:
        raise InvalidRunbook(problems)
    return values


def checked_vars(
    runbook: Runbook, var_args: Sequence[str], values: Mapping[str, Any], redactor: Redactor = NO_SECRETS
) -> dict[str, Any]:
    """The vars of `--var` pairs, under `values` given as such, with every step renderable with them (or
    InvalidRunbook, each problem at its step's line, masked by `redactor`): checked before a run starts,
    so that a bad value stops it at once instead of at step 7; `validate` and `plan` report the same."""
    overrides = {**parse_var_args(var_args, runbook, redactor), **values}
    problems = render_problems(runbook, overrides, redactor)
    if problems:
        raise InvalidRunbook(problems)
    return overrides


@dataclass(frozen=True)
class Carry:
    """How a resume of a run is started: with that run's --inventory and --var pairs under those given now."""

    inventory: Path | None  # the one given now, else the source run's
    carried_inventory: bool  # the source run's: to be laid over the runbook, loaded without one
    var_args: list[str]  # every --var pair the resume runs with, the source's first (the last of a name wins)
    #: the source run's --var values the resume keeps (not given again now, nor dropped), by name, as stored
    carried: dict[str, str] = field(default_factory=dict)
    unset: list[str] = field(default_factory=list)  # the source's --var names dropped by --unset-var


def _check_unset(source: RunMeta, unset: Collection[str], named_now: Collection[str]) -> None:
    """`--unset-var NAME` drops a --var the source run was started with: a name it was not started with (a
    typo, a var that came from the runbook or the inventory) or one given again now is refused (exit 2)."""
    started_with = [*(pair.partition("=")[0] for pair in source.var_args), *source.var_args_withheld]
    for name in unset:
        if name in named_now:
            raise ResumeError(f"--unset-var {name} and --var {name}=... together: give one of them")
        if name not in started_with:
            hint = _did_you_mean(name, started_with).removeprefix("; ")
            given = f"--var {', '.join(started_with)}" if started_with else "no --var"  # not "--var none"
            raise ResumeError(
                f"--unset-var {name}: run {source.run_id} carries no --var {name}{f' ({hint})' if hint else ''}; "
                f"it was started with {given}; a value from the runbook or the inventory is no --var to drop"
            )


def carry_over(
    source: RunMeta,
    runbook_path: Path,
    var_args: Sequence[str],
    inventory: Path | None,
    values_given: Collection[str] = (),
    redactor: Redactor = NO_SECRETS,
    say: Callable[[str], None] = lambda note: None,
    unset: Collection[str] = (),
) -> Carry:
    """The --inventory and --var pairs to resume `source` with: its own, under those given now (`var_args`,
    `inventory`, and `values_given`: the names of the vars an API caller gives as values), but for those
    `unset` drops (`--unset-var`: the runbook's or the inventory's value applies again). ResumeError when
    the source run had a --var holding a secret's value (never stored) that is not given again, or for an
    `unset` name it was not started with.

    `say` gets what the console says (without the `runbook: ` prefix): that the source ran another runbook
    file, and which flags are carried. That line is masked by `redactor`, the secrets of this run (a var
    stored in clear may hold one now: a token moved out of a `--var` into a secret before the resume)."""
    if source.path != str(runbook_path.resolve()):
        say(f"note: run {source.run_id} ran {source.path}; this is {runbook_path.resolve()}")
    named_now = {pair.partition("=")[0] for pair in var_args}
    _check_unset(source, unset, {*named_now, *values_given})
    given = {*named_now, *values_given}
    withheld = [name for name in source.var_args_withheld if name not in given and name not in unset]
    if withheld:
        flags = " ".join(f"--var {name}=..." for name in withheld)
        raise ResumeError(
            f"run {source.run_id} was started with {flags} holding a secret's value, which is never stored; "
            f"give it again: {flags}"
        )
    carried_inventory = inventory is None and bool(source.inventory)
    if carried_inventory:
        inventory = Path(str(source.inventory))
    kept_pairs = [pair for pair in source.var_args if pair.partition("=")[0] not in unset]
    pairs = {pair.partition("=")[0]: pair for pair in [*kept_pairs, *var_args]}  # the last one of a name wins
    values = {name: pair.partition("=")[2] for name, pair in pairs.items() if name not in given}
    carried = [
        *(["--inventory", str(inventory)] if carried_inventory else []),
        *(flag for name, pair in pairs.items() if name not in given for flag in ("--var", pair)),
    ]
    if carried:
        say(f"resuming {source.run_id} as it was started: {redactor.text(shlex.join(carried))}")
    dropped = [pair for pair in source.var_args if pair.partition("=")[0] in unset]
    if dropped or unset:
        names = ", ".join(sorted(unset))
        what = redactor.text(shlex.join(flag for pair in dropped for flag in ("--var", pair)))
        what = what or "a --var holding a secret"
        say(f"not carried (--unset-var {names}): {what}; the runbook's (or the inventory's) value applies again")
    # a var given now as a value (not as a pair) wins over the source's pair, which is not run with
    kept = [pair for name, pair in pairs.items() if name in named_now or name not in values_given]
    return Carry(inventory, carried_inventory, kept, values, sorted(unset))


def find_source(runbook: str, options: RunOptions) -> RunMeta | None:
    """The run a `--resume` continues, or whose facts `--from`/`--only` reuse (None: a fresh run, or
    `--from`/`--only` with no earlier run). A run id, a unique prefix of one, or the latest: never past
    a newer folder it cannot read (see `find_run`)."""
    wanted = options.resume
    if not (wanted or options.from_step or options.only_step):
        return None
    meta = find_run(options.log_dir, None if wanted in (None, "latest") else wanted, runbook)
    if meta is None and wanted:
        raise ResumeError(f"nothing to resume: no earlier run of '{runbook}' in {options.log_dir}")
    return meta


@dataclass(frozen=True)
class Start:
    """What a run starts from: the runbook as it runs (a carried inventory laid over it), the options with
    every var it runs with (`var_overrides`), `resume` the source run's id, and that run (`source`)."""

    runbook: Runbook
    options: RunOptions
    source: RunMeta | None
    notes: list[str] = field(default_factory=list)  # what `say` got
    carry: Carry | None = None  # what a --resume carries over from its source run (None: no resume)


def begin(
    runbook: Runbook,
    options: RunOptions,
    environ: Mapping[str, str],
    say: Callable[[str], None] | None = None,
) -> Start:
    """The run as it starts: its source run found once, a `--resume` continued as that run was started
    (`carry_over`), the --var pairs parsed (under the values an API caller gives in `var_overrides`), and
    every step checked to render with them (InvalidRunbook at the step's line): a bad value stops the run
    at once instead of at step 7. `options.inventory` is the inventory `runbook` was loaded with (None:
    none, and a resume lays the source run's over it). The secrets set in `environ` mask every message."""
    notes: list[str] = []

    def note(text: str) -> None:
        notes.append(text)
        if say is not None:
            say(text)

    redactor = secrets_redactor(runbook, environ)
    source = find_source(runbook.name, options)
    var_args, inventory, carry = list(options.var_args), options.inventory, None
    if options.unset_vars and not options.resume:
        raise ResumeError("--unset-var drops a --var that --resume would carry over: it needs --resume")
    if source is not None and options.resume:
        given = options.var_overrides.keys()
        carry = carry_over(source, runbook.path, var_args, inventory, given, redactor, note, options.unset_vars)
        var_args, inventory = carry.var_args, carry.inventory
        if carry.carried_inventory and inventory is not None:
            runbook = apply_inventory(runbook, inventory)
    overrides = checked_vars(runbook, var_args, options.var_overrides, redactor)
    resume = source.run_id if source is not None and options.resume else options.resume
    started = dataclasses.replace(
        options,
        var_overrides=overrides,
        var_args=var_args,
        inventory=inventory.resolve() if inventory else None,
        resume=resume,
    )
    return Start(runbook, started, source, notes, carry)


# ---- the plan: what runs, what is reused, and why ---------------------------------------------------

#: What a step does in a run: its facts are reused from the source run, it runs, or it is left out.
Action = Literal["reuse", "run", "skip"]


@dataclass(frozen=True)
class StepPlan:
    """One step's part in the run. `why` is what the console says of it (`reused (passed in RUN)`, ...)."""

    step: str
    action: Action
    why: str
    runs_on: tuple[str, ...] = ()  # the hosts it runs on (all of its hosts, or those it did not pass on)
    reused_on: tuple[str, ...] = ()  # the hosts whose record (with its facts) it keeps from the source run


@dataclass(frozen=True)
class Plan:
    """Every step's part in the run, in runbook order."""

    source_id: str | None
    steps: tuple[StepPlan, ...]

    def step(self, step_id: str) -> StepPlan:
        return next(p for p in self.steps if p.step == step_id)

    @property
    def reused(self) -> list[str]:
        return [p.step for p in self.steps if p.action == "reuse"]

    @property
    def to_run(self) -> list[str]:
        return [p.step for p in self.steps if p.action == "run"]

    @property
    def why(self) -> dict[str, str]:
        return {p.step: p.why for p in self.steps}

    @property
    def hosts_to_run(self) -> dict[str, list[str]]:
        """For each step that runs, the hosts it runs on."""
        return {p.step: list(p.runs_on) for p in self.steps if p.action == "run"}


def _no_step(runbook: Runbook, step_id: str) -> str:
    """Why `--from`/`--only` cannot name `step_id`: a matrix step as written names its instances; the steps
    as written (a matrix step as `id[...]`), not each of up to 10 000 instances."""
    instances = [i.id for i in runbook.instances.values() if i.base == step_id]
    if instances:
        group = runbook.instances[instances[0]].group
        return (
            f"no step '{step_id}' in the runbook: '{step_id}' is a matrix step (group '{group}') of "
            f"{len(instances)} instances; name one, such as '{instances[0]}' (`runbook validate` lists the cells)"
        )
    written = dict.fromkeys(
        f"{runbook.instances[s.id].base}[...]" if s.id in runbook.instances else s.id for s in runbook.steps
    )
    return f"no step '{step_id}' in the runbook (steps: {', '.join(written)})"


def plan_steps(
    runbook: Runbook,
    fingerprints: Fingerprints,
    source: Records,
    source_id: str | None,
    from_step: str | None = None,
    only_step: str | None = None,
) -> Plan:
    """What each step does, in runbook order, and why. With no source run, every step runs. A resume
    reuses each step that passed on all its hosts with the fingerprint it has now, up to the first that
    did not; that one and every later step run. A step that passed on some of its hosts and not on the
    others (and is unchanged) runs again only on the others. `--from`/`--only` reuse the facts of every
    earlier step that passed (saying when the step changed since; on the hosts where it passed, or from the
    record an earlier `--only` run kept: `passed_before`), and `--only` skips the later ones, but for the
    instances of a matrix instance's group that a resume would reuse (the other cells): those it reuses.
    Within a matrix group, an instance that runs makes only its dependents run (the later instances of its
    cells, and those that need it), and a reused server instance runs again (a deploy adopts the server
    still running) when an instance against it runs; a step after the group runs again when anything
    in the group does. ResumeError for an unknown step, or a step to run that needs facts of a step that
    never passed."""
    positions = {spec.id: index for index, spec in enumerate(runbook.steps)}
    start_id = only_step or from_step
    if start_id is not None and start_id not in positions:
        raise ResumeError(_no_step(runbook, start_id))
    walk = _Walk(runbook, fingerprints, source, source_id, Index(runbook))
    for spec in runbook.steps:
        if start_id is not None:
            walk.steps.append(walk.started(spec, positions[spec.id] - positions[start_id], only_step))
        elif source_id is None:
            walk.steps.append(StepPlan(spec.id, "run", "runs", tuple(runbook.step_hosts[spec.id])))
        else:
            walk.steps.append(walk.resumed(spec))
    steps = walk.steps
    if source_id is not None and start_id is None:
        steps = _servers_again(runbook, steps, source_id)
    result = Plan(source_id, tuple(steps))
    _check_needs(index=walk.index, plan=result)
    return result


@dataclass
class _Walk:
    """`plan_steps`' walk through the runbook's steps in order, and what it has learnt so far."""

    runbook: Runbook
    fingerprints: Fingerprints
    source: Records
    source_id: str | None
    index: Index
    steps: list[StepPlan] = field(default_factory=list)
    rerun_cause: str | None = None  # once a step runs again, every later step does too
    group_cause: tuple[str, str] | None = None  # (group, its first instance that runs): the steps after it run
    dirty: dict[tuple[str, str], str] = field(default_factory=dict)  # (group, cell) -> its first instance run
    rerun: set[str] = field(default_factory=set)  # the instances that run

    def _runs(self, spec_id: str, instance: Instance) -> None:
        """Instance `spec_id` runs: its cells' later instances, and those that need it, run too."""
        self.rerun.add(spec_id)
        for cell in instance.cells:
            self.dirty.setdefault((instance.group, cell), spec_id)

    def started(self, spec: StepSpec, offset: int, only_step: str | None) -> StepPlan:
        """A step of a `--from`/`--only` run, `offset` steps after the one named (negative: before it)."""
        hosts = tuple(self.runbook.step_hosts[spec.id])
        records = [self.source.get((spec.id, h)) for h in hosts]
        passed = all(passed_before(r) for r in records)  # a step an --only run left out kept its facts
        same = all(self.fingerprints.same(spec, r) for r in records)
        only = self.runbook.instances.get(only_step or "")  # `--only` of an instance keeps its group's other cells
        instance = self.runbook.instances.get(spec.id)
        if offset < 0:
            why = f"facts reused from {self.source_id}" if passed else "skipped (never passed)"
            if passed and not same:  # --from/--only trust the earlier facts; say that they may be stale
                why += (
                    f" although the step changed since ({self.fingerprints.what_changed(spec, records)}; "
                    f"--from {spec.id} runs it again)"
                )
            if passed:
                return StepPlan(spec.id, "reuse", why, reused_on=hosts)
            return _kept(spec, hosts, self.source, self.source_id)
        if only_step and offset > 0:
            independent = (  # a later cell of the group that does not need the instance run
                only is not None
                and instance is not None
                and instance.group == only.group
                and _cell_cause(self.index, spec, instance, self.dirty, self.rerun) is None
            )
            if independent and passed and same:
                return StepPlan(spec.id, "reuse", f"reused (passed in {self.source_id})", reused_on=hosts)
            return StepPlan(spec.id, "skip", ONLY_SKIPPED)
        if only is not None and instance is not None:
            self._runs(spec.id, instance)
        return StepPlan(spec.id, "run", "runs (--only)" if only_step else "runs (--from)", hosts)

    def resumed(self, spec: StepSpec) -> StepPlan:
        """A step of a resumed run: reused, or run again with the cause."""
        assert self.source_id is not None
        hosts = tuple(self.runbook.step_hosts[spec.id])
        instance = self.runbook.instances.get(spec.id)
        if self.group_cause is not None and (instance is None or instance.group != self.group_cause[0]):
            self.rerun_cause, self.group_cause = self.rerun_cause or self.group_cause[1], None
        cause = self.rerun_cause
        if cause is None and instance is not None:
            cause = _cell_cause(self.index, spec, instance, self.dirty, self.rerun)
        step = _resumed(spec, hosts, self.source, self.source_id, self.fingerprints, cause)
        if step.action == "run" and instance is None:
            self.rerun_cause = self.rerun_cause or spec.id
        elif step.action == "run" and instance is not None:
            self._runs(spec.id, instance)
            self.group_cause = self.group_cause or (instance.group, spec.id)
        return step


def _resumed(
    spec: StepSpec,
    hosts: tuple[str, ...],
    source: Records,
    source_id: str,
    fingerprints: Fingerprints,
    cause: str | None,
) -> StepPlan:
    """A resumed step's part: reused when it passed unchanged and `cause` (an earlier step that runs and
    whose results it depends on) is None; on the hosts it did not pass on; or again, saying why."""
    records = [source.get((spec.id, h)) for h in hosts]
    passed = all(r is not None and r.status == "passed" for r in records)
    same = all(fingerprints.same(spec, r) for r in records)
    if cause is None and passed and same:
        return StepPlan(spec.id, "reuse", f"reused (passed in {source_id})", reused_on=hosts)
    if cause is None and same and all(_left_out(r) for r in records):  # its `when:` would be false again
        return StepPlan(spec.id, "reuse", f"reused (skipped in {source_id})", reused_on=hosts)
    if cause is None and (done := _passed_hosts(spec, hosts, source, fingerprints)):
        again = tuple(h for h in hosts if h not in done)
        changed = all((r := source.get((spec.id, h))) is not None and r.status == "passed" for h in again)
        what = fingerprints.what_changed(spec, [source.get((spec.id, h)) for h in again])
        reason = f"changed there since {source_id}: {what}" if changed else f"did not pass there in {source_id}"
        why = f"runs again on {', '.join(again)} ({reason}); reused on {', '.join(done)}"
        return StepPlan(spec.id, "run", why, again, tuple(done))
    started = any(r is not None and r.status not in NOT_STARTED for r in records)
    if not started:
        left_out = any(r is not None and r.status == "skipped" for r in records)
        why = f"runs ({'skipped' if left_out else 'not reached'} in {source_id})"
    elif cause is None:
        why = (
            f"runs again (changed since {source_id}: {fingerprints.what_changed(spec, records)})"
            if passed
            else f"runs again (did not pass in {source_id})"
        )
    else:
        why = f"runs again (after '{cause}')"
    return StepPlan(spec.id, "run", why, hosts)


def _kept(spec: StepSpec, hosts: tuple[str, ...], source: Records, source_id: str | None) -> StepPlan:
    """An earlier step that `--from`/`--only` leaves out because it did not pass on every host: its record is
    kept where it passed (a campaign's baseline that passed on one host of two stays in the report there) and
    where it failed last (the newest outcome: a cell that failed after it passed is reported failed, with the
    failure's message, never `skipped (never passed)` nor with the numbers of its older pass), and where a campaign's
    search left it out (the report's account of the search reads why)."""
    done = tuple(h for h in hosts if passed_before(source.get((spec.id, h))))
    failed = tuple(h for h in hosts if (r := source.get((spec.id, h))) is not None and r.status == "failed")
    searched = tuple(h for h in hosts if (r := source.get((spec.id, h))) is not None and _searched_out(r))
    others = ", ".join(h for h in hosts if h not in done + failed + searched)
    if not done and not failed and not searched:
        return StepPlan(spec.id, "skip", "skipped (never passed)")
    whys = [f"skipped on {others} (never passed there)"] if others else []
    whys += [f"facts reused from {source_id} on {', '.join(done)}"] if done else []
    whys += [f"kept failed on {', '.join(failed)} (as in {source_id})"] if failed else []
    whys += [f"kept left out by the search on {', '.join(searched)} (as in {source_id})"] if searched else []
    kept = done + failed + searched
    return StepPlan(spec.id, "skip", "; ".join(whys), reused_on=tuple(h for h in hosts if h in kept))


def _searched_out(record: StepRecord) -> bool:
    """Whether a campaign's search left the step out (never launched its configuration)."""
    return record.status == "skipped" and (record.message or "").startswith(LEFT_OUT)


def _left_out(record: StepRecord | None) -> bool:
    """Whether a record is of a step the engine skipped for its `when:` (or for a step it needs that was),
    not one a failed cell, `--only` or a campaign's search left out: resuming, it is skipped again unless
    something it reads changed (the search's are its to decide again: its record keeps what it decided)."""
    return (
        record is not None
        and record.status == "skipped"
        and not (record.message or CELL_FAILED).startswith(CELL_FAILED)
        and record.message != ONLY_SKIPPED
        and not _searched_out(record)
    )


def _cell_cause(
    index: Index, spec: StepSpec, instance: Instance, dirty: Mapping[tuple[str, str], str], rerun: Collection[str]
) -> str | None:
    """The earlier instance that runs and makes this one run: one of its cells', or one it needs."""
    for cell in instance.cells:
        if (instance.group, cell) in dirty:
            return dirty[(instance.group, cell)]
    return next((step for step in sorted(index.needed(spec)) if step in rerun), None)


def _servers_again(runbook: Runbook, steps: list[StepPlan], source_id: str) -> list[StepPlan]:
    """Each reused server instance runs again when an instance against it runs: its deploy adopts the
    server still running with the same arguments (or starts it again), so that the instance finds it."""
    runs = {p.step for p in steps if p.action == "run"}
    users: dict[str, str] = {}
    for step in runs:
        instance = runbook.instances.get(step)
        if instance is not None and instance.server is not None and instance.server != step:
            users.setdefault(instance.server, step)
    again: list[StepPlan] = []
    for p in steps:
        if p.action == "reuse" and p.step in users:
            why = f"runs again (reused in {source_id}; '{users[p.step]}' runs against it, a running server is adopted)"
            p = StepPlan(p.step, "run", why, tuple(runbook.step_hosts[p.step]))
        again.append(p)
    return again


def _passed_hosts(spec: StepSpec, hosts: Sequence[str], source: Records, fingerprints: Fingerprints) -> list[str]:
    """The hosts on which an unchanged step passed in the source run."""
    return [
        host
        for host in hosts
        if (record := source.get((spec.id, host))) is not None
        and record.status == "passed"
        and fingerprints.same(spec, record)
    ]


def _check_needs(index: Index, plan: Plan) -> None:
    """Every step to run has the facts it needs: of a step reused, or of one that runs before it."""
    available, to_run = set(plan.reused), set(plan.to_run)  # once: a matrix makes thousands of steps
    for spec in index.runbook.steps:
        if spec.id not in to_run:
            continue
        for need in sorted(index.needed(spec)):
            if need not in available:
                raise ResumeError(
                    f"step '{spec.id}' needs facts from step '{need}', which has never passed; "
                    f"run it first (e.g. --from {need})"
                )
        available.add(spec.id)
