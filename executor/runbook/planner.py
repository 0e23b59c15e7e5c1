"""`runbook plan`: every command exactly as it would run, with run-time values marked (`RunTime`)."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Literal, TypeVar

from pydantic import SerializerFunctionWrapHandler, model_serializer

from executor.documents import SCHEMA_VERSION
from executor.errors import Problem
from executor.hostprogram import Shipped, shipped_programs
from executor.redact import NO_SECRETS, Redactor
from executor.render import render_command
from executor.runbook import cells
from executor.runbook.campaign import MatrixGroup
from executor.runbook.durations import format_duration, parse_duration
from executor.runbook.loader import Runbook, secret_values
from executor.runbook.model import DataModel, Host, host_variables, var_text
from executor.runbook.placement import place
from executor.stepkind import FactsError, RenderContext, RunTime, StepSpec

#: Of each matrix group, the readable plan and `plan --json` detail the first this many instances, cells and
#: server configurations and count the rest (`KEY_left_out`): a 10 000-cell grid is a summary, not 10 000
#: renderings of one step (`plan --full` prints every command, `validate` every cell id).
PLAN_SHOWN = 50

#: A host of the runbook as a plan context sees another: (its address, the vars of a step on it).
HostView = Callable[[str], tuple[str, Mapping[str, str]]]


class PlanContext(RenderContext):
    """Renders without running: facts of earlier steps are not known yet. `hosts` gives the other hosts
    of the runbook (for `peer`); `address` is the host's own (its name where none is given)."""

    def __init__(
        self,
        host: str,
        variables: Mapping[str, str],
        address: str | None = None,
        hosts: HostView | None = None,
        fetches_on: Callable[[str], tuple[str, ...]] | None = None,
    ) -> None:
        self.host_name = host
        self.host_address = address or host
        self.vars = variables
        self.hosts = hosts
        self.fetches_on = fetches_on  # the runbook's `Runbook.fetches_on`
        self.strict = False  # a peer's view: its facts are named by host (`steps.ID.hosts.HOST.facts.PATH`)
        self.launched_by_search = False  # the step runs against a searched launch (`screened`)

    def fact(self, step_id: str, path: str) -> RunTime:
        if self.strict:
            return RunTime(f"steps.{step_id}.hosts.{self.host_name}.facts.{path}")
        return RunTime.fact(step_id, path)

    def fetches(self) -> tuple[str, ...]:
        return self.fetches_on(self.host_name) if self.fetches_on is not None else ()

    def screened(self) -> bool:
        return self.launched_by_search

    def peer(self, host: str) -> PlanContext:
        try:
            address, variables = (self.host_address, self.vars) if host == self.host_name else self._other(host)
        except KeyError:
            raise FactsError(f"no host '{host}' in the runbook") from None
        seen = copy.copy(self)  # a copy shares what a subclass notes (`_Recording.asked`)
        seen.host_name, seen.host_address, seen.vars, seen.strict = host, address, variables, True
        return seen

    def _other(self, host: str) -> tuple[str, Mapping[str, str]]:
        if self.hosts is None:
            raise KeyError(host)
        return self.hosts(host)


ContextT = TypeVar("ContextT", bound=PlanContext)


def plan_context(
    kind: type[ContextT],
    runbook: Runbook,
    host: str,
    overrides: Mapping[str, Any],
    shown: Callable[[dict[str, str]], dict[str, str]] = dict,
) -> ContextT:
    """The plan context of a step on `host`, its peers' vars and addresses at hand (each worked out when asked:
    a matrix renders thousands of steps); `shown` masks a host's vars as the caller shows them."""

    def view(name: str) -> tuple[str, Mapping[str, str]]:
        return runbook.hosts[name].address, shown(host_env(runbook, name, overrides))

    address, variables = view(host)
    return kind(host, variables, address, view, runbook.fetches_on)


def screened_steps(runbook: Runbook) -> frozenset[str]:
    """The instances a whole run screens (`RenderContext.screened`): those run against a searched group's launch."""
    return frozenset(i for group in runbook.groups for i in group.screened(runbook.instances))


def host_env(runbook: Runbook, host: str, overrides: Mapping[str, Any]) -> dict[str, str]:
    """The vars of a step on `host` as its environment gets them (`host_variables`)."""
    return {k: var_text(v) for k, v in host_variables(runbook.header.vars, runbook.hosts[host], overrides).items()}


def secrets_redactor(runbook: Runbook, environ: Mapping[str, str]) -> Redactor:
    """Masks the values of the runbook's secrets that `environ` holds, as a run masks them (a value that
    is too short is refused as a run refuses it; one that is unset is left out: nothing runs)."""
    return Redactor(secret_values(runbook, environ, required=False).values())


def render_problems(runbook: Runbook, overrides: Mapping[str, Any], redactor: Redactor = NO_SECRETS) -> list[Problem]:
    """Steps that cannot render with these vars (a port var holding `abc`, say), each at its line.

    Checked before a run starts, so that a bad value stops it at once instead of at step 7 after
    hours of downloads; `validate` and `plan` report the same. A message never shows a secret's value
    (a `--var` may hold one): `redactor` masks it.
    """
    problems = []
    for spec in runbook.steps:
        for host in runbook.step_hosts[spec.id]:
            ctx = plan_context(PlanContext, runbook, host, overrides)
            for variant in [spec, *runbook.fallbacks.get(spec.id, [])]:
                try:
                    variant.plan(ctx)
                except FactsError as exc:
                    line, column = runbook.step_positions.get(spec.id, (1, 1))
                    message = redactor.text(f"step '{spec.id}': {exc}")
                    problems.append(Problem(str(runbook.path), line, column, message))
    return list(dict.fromkeys(problems))


def matrix_summary(group: MatrixGroup) -> str:
    """One line about a matrix: its cells (excluded, included), instances and launches."""
    launches = len(group.servers)
    return (
        f"group {group.name}: {len(group.cells)} cells ({group.excluded} excluded, {group.included} included), "
        f"{len(group.instances)} step instances, {launches} server configurations = {launches} launches"
    )


def search_lines(group: MatrixGroup, hosts: Mapping[str, list[str]]) -> list[str]:
    """A searched group's budget and worst case, as `plan` says them (nothing for a grid). `hosts`: each step's
    (a placed group's instance on one host of its pool, an unplaced one's on each of its hosts)."""
    if group.search is None:
        return []
    search, grid, worst = group.search, len(group.servers), group.most_launches
    budget = search.budget
    spent = [s for s in (f"{budget.launches} launches" if budget.launches else "",
                         f"{budget.gpu_hours:g} GPU-hours" if budget.gpu_hours else "") if s]  # fmt: skip
    first = ", whichever is spent first" if len(spent) > 1 else ""
    # server starts, as the report counts them: each launch on each of its hosts, the baseline's on each of its own
    each = max((len(hosts.get(s, [])) for s in group.servers), default=1) or 1
    base = len(hosts.get(search.baseline, [])) if search.baseline else 0
    with_baseline = f" ({worst * each + base} of {grid * each + base} with the baseline's)" if base else ""
    cap = "" if budget.launches else " (no launch cap: the GPU-hours, checked before each launch, stop it)"
    return [
        f"#   strategy: search (README, 'Search'), measured by {search.measure}"
        f"{f' against {search.baseline}' if search.baseline else ''}: budget {' or '.join(spent)}{first}; "
        f"worst case {worst} of the grid's {grid} launches{with_baseline}{cap}"
    ]


def placed_hosts(
    runbook: Runbook, previous: Mapping[str, str] | None = None, index: cells.Index | None = None
) -> dict[str, list[str]]:
    """Each step's hosts, a placed group's instances where `placement` puts them: on a fresh run, or kept
    where the run being resumed had them (`previous`: step id -> its host there). One rule for the plan
    and the run."""
    hosts = dict(runbook.step_hosts)
    index = index or cells.Index(runbook)
    for group in runbook.groups:
        if group.placement is not None:
            hosts.update(place(group, runbook.instances, previous or {}, index.needs(group)))
    return hosts


def _group_header(
    runbook: Runbook,
    group: MatrixGroup,
    overrides: Mapping[str, Any],
    hosts: Mapping[str, list[str]],
    shown: int | None = None,
) -> list[str]:
    """What a matrix costs before anything runs: its cells, launches, an upper bound of their start-up
    time and where each server configuration goes; with `shown`, only that many servers and cells, and
    how many instances the plan leaves out."""
    launches = group.most_launches
    lines = [f"\n# {matrix_summary(group)}", *search_lines(group, hosts)]
    server = next((s for s in runbook.steps if s.id in group.servers), None)
    limit = None
    if server is not None:
        try:
            first_host = runbook.step_hosts[server.id][0]
            limit = server.ready_limit(plan_context(PlanContext, runbook, first_host, overrides))
        except (FactsError, IndexError):
            limit = None
    if limit is not None:
        total = format_duration(launches * limit)
        lines.append(
            f"#   roughly how long: at most {total} of server start-up ({launches} launches x ready_timeout "
            f"{format_duration(limit)}), plus the steps' own time"
        )
    if group.placement is None:
        lines.append("#   placement: none (each instance runs on its step's hosts)")
    else:
        lines.append(f"#   placement: {group.placement} over {', '.join(group.pool)}")
        lines.extend(f"#     {unit} on {', '.join(hosts.get(unit, []))}" for unit in group.servers[:shown])
        lines += _more(len(group.servers), shown, "server configurations", "#     ", "runbook plan --full")
    lines.extend(f"#   cell {cell.id}" for cell in group.cells[:shown])
    lines += _more(len(group.cells), shown, "cells", "#   ", "runbook validate")
    lines += _more(len(group.instances), shown, "step instances", "#   ", "runbook plan --full")
    return lines


def _more(total: int, shown: int | None, what: str, indent: str, where: str) -> list[str]:
    """The line saying what a summarised group leaves out and which command shows it, if it leaves any out."""
    if shown is None or total <= shown:
        return []
    return [f"{indent}... and {total - shown} more {what} (the plan shows the first {shown}; `{where}` every one)"]


def variants(runbook: Runbook, spec: StepSpec) -> list[tuple[str, StepSpec]]:
    """The step and its fallbacks, each with how the plan names it (`primary`, `fallback 1`, ...)."""
    fallbacks = runbook.fallbacks.get(spec.id, [])
    return [("primary", spec)] + [(f"fallback {i}", fallback) for i, fallback in enumerate(fallbacks, start=1)]


def plan_text(runbook: Runbook, overrides: Mapping[str, Any], redactor: Redactor = NO_SECRETS) -> str:
    """The plan, masked by `redactor` exactly as a run masks what it records (a `--var` holding a secret)."""
    return "\n".join(plan_blocks(runbook, overrides, redactor))


def plan_blocks(runbook: Runbook, overrides: Mapping[str, Any], redactor: Redactor = NO_SECRETS) -> Iterator[str]:
    """`plan_text` one block at a time (the head, then each step on each host), each masked by `redactor`:
    `plan --full` prints each as it comes, where the whole text of 10 000 instances of a 256 kB script
    (2.6 GB) took 5 GB to build before a line was printed."""
    for lines in _plan_lines(runbook, overrides):
        yield redactor.text("\n".join(lines))


def _plan_lines(runbook: Runbook, overrides: Mapping[str, Any]) -> Iterator[list[str]]:
    secrets = dict.fromkeys(runbook.header.secrets, "<secret>")
    lines = [f"# runbook {runbook.name}: {len(runbook.steps)} steps; nothing is run"]
    if secrets:
        lines.append(
            "# secrets are shown as '***'; their values (and so the environment's byte count) come at run time"
        )
    hosts = placed_hosts(runbook)
    by_id = {spec.id: spec for spec in runbook.steps}
    first = {group.instances[0]: group for group in runbook.groups if group.instances}
    screened = screened_steps(runbook)
    for number, spec in enumerate(runbook.steps, start=1):
        if spec.id in first:
            lines.extend(_group_header(runbook, first[spec.id], overrides, hosts))
        for host in hosts[spec.id]:
            ctx = plan_context(PlanContext, runbook, host, overrides)
            ctx.launched_by_search = spec.id in screened  # rendered as a whole run sends it
            env = dict(ctx.vars)
            for via, variant in variants(runbook, spec):
                yield lines
                address = runbook.hosts[host].address
                lines = [f"\n## step {number} '{spec.id}' ({spec.kind}) on {host} [{address}], {via}"]
                if peers := variant.peer_hosts():
                    lines.append(f"#   also on {', '.join(f'{p} [{runbook.hosts[p].address}]' for p in peers)}")
                for gate in variant.effective_gates():
                    lines.append(f"#   gate: {gate.that}")
                lines.extend(f"#   {note}" for note in variant.plan_notes(by_id))
                for label, script in variant.plan(ctx):
                    if label:
                        lines.append(f"# {label}")
                    variables, shown_secrets = variant.environment(env, secrets)
                    variables |= cells.instance_environment(runbook, spec.id)
                    lines.append(render_command(script, variables, shown_secrets).display.rstrip("\n"))
    yield lines


class _Recording(PlanContext):
    """A plan context that notes every fact asked of it: what the step learns only at run time, and from whom."""

    def __init__(
        self,
        host: str,
        variables: Mapping[str, str],
        address: str | None = None,
        hosts: HostView | None = None,
        fetches_on: Callable[[str], tuple[str, ...]] | None = None,
    ) -> None:
        super().__init__(host, variables, address, hosts, fetches_on)
        self.asked: dict[str, str] = {}  # fact source -> the step it comes from, in the order asked

    def fact(self, step_id: str, path: str) -> RunTime:
        value = super().fact(step_id, path)
        self.asked.setdefault(value.source, step_id)
        return value


class PlanGate(DataModel):
    that: str
    message: str | None


class RunTimeValue(DataModel):
    value: str  # the fact's source, `steps.ID.facts.PATH`
    step: str  # the step it comes from


class PlanVariant(DataModel):
    """What one variant (the step or a fallback) does on one host, in summary: never a program's body."""

    via: str  # primary | fallback N
    peers: list[str]  # hosts besides its own its commands also run on
    summary: list[str]
    commands: list[str]
    gates: list[PlanGate]
    run_time: list[RunTimeValue]  # what it learns only at run time, and from which step
    programs: list[Shipped]  # the host programs it ships: name, size, sha256


class PlanHost(DataModel):
    host: str
    address: str
    variants: list[PlanVariant]


class PlanStep(DataModel):
    id: str
    kind: str
    number: int  # in runbook order, from 1
    description: str | None
    hosts: list[str]
    group: str | None  # the matrix group of an instance
    cell: dict[str, Any] | None  # its cell's values
    on: list[PlanHost]


class PlanCell(DataModel):
    id: str
    values: dict[str, Any]


class PlanGroup(DataModel):
    """A matrix group: its cells, launches and placement, and its header as `plan` prints it; each of its long
    parts cut to its first PLAN_SHOWN items, `KEY_left_out` saying how many it left out (written only when
    some are: the MCP `plan` cuts further and adds to them)."""

    name: str
    cells: list[PlanCell]
    excluded: int
    included: int
    instances: list[str]
    launches: int
    placement: str | None
    pool: list[str]
    servers: dict[str, list[str]]  # a server configuration -> its hosts
    header: list[str]
    cells_left_out: int = 0
    instances_left_out: int = 0
    servers_left_out: int = 0
    header_left_out: int = 0

    @model_serializer(mode="wrap")
    def _left_out_only_when_cut(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        written: dict[str, Any] = handler(self)
        return {key: value for key, value in written.items() if not (key.endswith("_left_out") and value == 0)}


class HostField(DataModel):
    """One field of a host as a run uses it, and where it comes from: the runbook, the inventory laid over it
    (field by field), or the default (`at` None)."""

    name: str  # a host's field (`identity_file`), or `vars.NAME` for one of the host's own vars
    value: Any  # as the run reads it (a duration in seconds); null: unset (the ssh config, else ssh's default)
    shown: str  # the value as `runbook plan` prints it (`15s`, `true`, `unset`)
    source: Literal["runbook", "inventory", "default"]
    at: str | None  # FILE:LINE where it is written


class PlanHostFields(DataModel):
    """A host of the runbook: each of its fields with where it comes from."""

    host: str
    fields: list[HostField]


class CampaignVar(DataModel):
    """A var laid over the runbook from a campaign's schedule (`--from-campaign RUN --band C`), and where it comes
    from: the campaign's run, band, configuration and file; `overridden` when a --var given sets it instead."""

    name: str
    value: str
    source: str  # `from campaign RUN, band 1-15: CELL, schedule.json`
    overridden: bool = False

    @property
    def pair(self) -> str:
        return f"{self.name}={self.value}"

    @property
    def shown(self) -> str:
        """`speculative_num_draft_tokens = 8  (from campaign RUN, band 1-15: CELL, schedule.json)`."""
        return f"{self.name} = {self.value}  ({self.source}){'; a --var overrides it' if self.overridden else ''}"


class PlanDocument(DataModel):
    """The plan as data: `runbook plan --json`, the MCP `plan` and the readable plan (executor/runbook/plan_summary.py)
    read it; `runbook schema --plan` prints its JSON Schema."""

    schema_version: Literal[1] = SCHEMA_VERSION
    runbook: str
    secrets: list[str]  # their names; a value never appears in the plan
    steps: list[PlanStep]  # a group's instances past its first PLAN_SHOWN left out (its instances_left_out)
    groups: list[PlanGroup]
    hosts: list[PlanHostFields]  # each host's fields and where each comes from (runbook, inventory, default)
    campaign: list[CampaignVar] = []  # the vars --from-campaign lays over the runbook, with their sources


def host_fields(runbook: Runbook) -> list[PlanHostFields]:
    """Each host's fields as a run uses them, each with where it comes from: what an inventory changed, kept
    or left to a default shows at a glance (a local host has only its address and vars)."""
    durations = {key for key, info in Host.model_fields.items() if _is_duration(info.metadata)}
    hosts = []
    for name, host in runbook.hosts.items():
        values: dict[str, Any] = host.model_dump(mode="json", include={"address"} if host.is_local else None)
        values |= {f"vars.{key}": value for key, value in values.pop("vars", host.vars).items()}
        fields = []
        for key, value in values.items():
            shown = "unset" if value is None else f"{value:g}s" if key in durations else var_text(value)
            written = runbook.host_sources.get(name, {}).get(key)
            source, at = written or ("default", None)
            fields.append(HostField.model_construct(name=key, value=value, shown=shown, source=source, at=at))
        hosts.append(PlanHostFields.model_construct(host=name, fields=fields))
    return hosts


def _is_duration(metadata: list[Any]) -> bool:
    """Whether a field's metadata is a Duration's (parsed by `parse_duration`): shown as `15s`, not 15.0."""
    return any(getattr(item, "func", None) is parse_duration for item in metadata)


def _variant(variant: StepSpec, ctx: _Recording, via: str) -> PlanVariant:
    """What one variant (the step or a fallback) does on one host, in summary: never a program's body."""
    ctx = copy.copy(ctx)
    ctx.asked = {}
    scripts = "".join(script for _, script in variant.plan(ctx))
    return PlanVariant.model_construct(
        via=via,
        peers=variant.peer_hosts(),
        summary=variant.summary(ctx),
        commands=variant.commands(ctx),
        gates=[PlanGate.model_construct(that=gate.that, message=gate.message) for gate in variant.effective_gates()],
        run_time=[RunTimeValue.model_construct(value=source, step=step) for source, step in ctx.asked.items()],
        programs=shipped_programs(scripts),
    )


def _group(
    runbook: Runbook, group: MatrixGroup, overrides: Mapping[str, Any], hosts: Mapping[str, list[str]]
) -> PlanGroup:
    """A matrix group as data, its long parts cut to their first PLAN_SHOWN items (PlanGroup)."""
    header = _group_header(runbook, group, overrides, hosts, PLAN_SHOWN)
    left_out: dict[str, Any] = {  # typed Any: model_construct takes its `_fields_set` by keyword too
        f"{key}_left_out": len(items) - PLAN_SHOWN
        for key, items in (("cells", group.cells), ("instances", group.instances), ("servers", group.servers))
        if len(items) > PLAN_SHOWN
    }
    return PlanGroup.model_construct(
        name=group.name,
        cells=[PlanCell.model_construct(id=cell.id, values=dict(cell.values)) for cell in group.cells[:PLAN_SHOWN]],
        excluded=group.excluded,
        included=group.included,
        instances=list(group.instances[:PLAN_SHOWN]),
        launches=len(group.servers),
        placement=group.placement,
        pool=list(group.pool),
        servers={unit: hosts.get(unit, []) for unit in group.servers[:PLAN_SHOWN]},
        header=[line.strip("\n") for line in header],
        **left_out,
    )


def plan_model(runbook: Runbook, overrides: Mapping[str, Any], redactor: Redactor = NO_SECRETS) -> PlanDocument:
    """The plan as data, for `plan --json`, the readable plan (`executor.runbook.plan_summary`) and agents: per step
    and host (and fallback) what it does in summary, the commands a person cares about, its gates, what it
    learns only at run time and from which step, and the host programs it ships (name, size, sha256); the
    matrix groups with their cells, launches and placement. A group's instances past its first PLAN_SHOWN are
    left out of `steps` (its `instances_left_out` counts them). Every string is masked by `redactor` as
    `plan_text` masks its text (one by one: a secret holding `"` or `\\` is masked as written). Its parts are made
    unvalidated (`model_construct`: each of the 9 part models built its validator to check values made here, a
    few percent of `plan`'s start, bench/RESULTS.md 9d); the document is validated whole, once, from its dump."""
    by_id = {spec.id: spec for spec in runbook.steps}
    hosts = placed_hosts(runbook)
    left_out = {i for group in runbook.groups for i in group.instances[PLAN_SHOWN:]}
    screened = screened_steps(runbook)
    steps = []
    for number, spec in enumerate(runbook.steps, start=1):
        if spec.id in left_out:
            continue
        instance = runbook.instances.get(spec.id)
        on = []
        for host in hosts[spec.id]:
            # masked before a kind quotes or wraps a value: `'` quoted by the shell would split a secret
            ctx = plan_context(_Recording, runbook, host, overrides, redactor.deep)
            ctx.launched_by_search = spec.id in screened  # rendered as a whole run sends it
            runs = [_variant(variant, ctx, via) for via, variant in variants(runbook, spec)]
            for run in runs:
                run.summary += spec.plan_notes(by_id)
            on.append(PlanHost.model_construct(host=host, address=runbook.hosts[host].address, variants=runs))
        steps.append(
            PlanStep.model_construct(
                id=spec.id,
                kind=spec.kind,
                number=number,
                description=spec.description,
                hosts=hosts[spec.id],
                group=instance.group if instance else None,
                cell=dict(instance.values) if instance else None,
                on=on,
            )
        )
    groups = [_group(runbook, group, overrides, hosts) for group in runbook.groups]
    document = PlanDocument(
        runbook=runbook.name,
        secrets=list(runbook.header.secrets),
        steps=steps,
        groups=groups,
        hosts=host_fields(runbook),
    )
    return PlanDocument.model_validate(redactor.deep(document.model_dump()))


def plan_document(runbook: Runbook, overrides: Mapping[str, Any], redactor: Redactor = NO_SECRETS) -> dict[str, Any]:
    """`plan_model` as JSON data (`plan --json`, the MCP `plan`)."""
    return plan_model(runbook, overrides, redactor).model_dump(mode="json")
