"""Expand a runbook's matrices into step instances, before any step is validated (README, "Matrices").

The loader hands the raw steps (plain data, every value's position known) to `expand`; it returns one
`Entry` per step to validate: a plain step as written, or a matrix step's instance for its cell, with
`${{ matrix.X }}` substituted, step references to group mates pointing at the same cell's instance and
the group's hosts inherited. Problems are reported at their position; limits (cells per matrix,
instances per runbook, characters of expanded text) are checked before the work they bound is done.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, NoReturn, Protocol

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, model_validator
from pydantic_core import PydanticCustomError

from executor.runbook.campaign import (
    AxisValue,
    Cell,
    Instance,
    MatrixGroup,
    OnFailure,
    Placement,
    instance_id,
    matrix_environment,
    value_text,
)
from executor.runbook.gates import step_refs
from executor.runbook.model import env_text_problem
from executor.runbook.search import SearchSpec
from executor.stepkind import StepSpec, step_ref_fields

Loc = tuple[str | int, ...]

MAX_CELLS = 10_000  # of one matrix, counted (the product of its axes) before any is made
MAX_INSTANCES = 10_000  # of a runbook: step instances of all matrices
#: Server configurations of a searched group: its decisions are quadratic in them (400 take ~20 s in all)
SEARCH_MAX_LAUNCHES = 500
MAX_EXPANDED_TEXT = 64 << 20  # characters of parameters written by substitution, all instances together
#: values of all step instances (items of their lists and mappings; a fallback counts as the step again): each
#: instance is its step's data validated anew, so a list of 20 000 items in a 10 000-cell step would be 2e8
MAX_INSTANCE_VALUES = 1_000_000
MAX_AXES = 32  # of one matrix: each instance keeps the values of the axes it uses
MAX_VALUE_TEXT = 64  # characters of an axis's name or a value's text: what cell and instance ids show
MAX_VALUE_CHARS = 4096  # characters of one value, a mapping's fields included (its `$matrix_AXIS_FIELD`s)
MAX_CELL_CHARS = 16_384  # characters of one cell's axes and values (fields included), counted before any is made
MAX_RULES = 1000  # `exclude:` and `include:` entries of one matrix
MAX_ID = 128  # characters of a matrix step's id or a group's name: each instance id (and cell name) repeats it
MAX_CELL_STEPS = 100_000  # a matrix's cells x its steps: each cell's instance of each step is kept (cells.Index)

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_GROUP_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*$")  # as a step id
_VALUE_TEXT = re.compile(r"^[A-Za-z0-9_.+-]+$")
_EXPR = re.compile(r"\$\{\{(.*?)\}\}", re.DOTALL)
_MATRIX_EXPR = re.compile(r"^\s*matrix\.([A-Za-z_][A-Za-z0-9_]*)(?:\.([A-Za-z_][A-Za-z0-9_]*))?\s*$")
_SCRIPT_VAR = re.compile(r"\$\{?(matrix_[A-Za-z0-9_]+)")
_JINJA_AXIS = re.compile(r"\bmatrix\s*\.\s*([A-Za-z_][A-Za-z0-9_]*)")
_GROUP_KEYS = {"group", "description", "matrix", "on_failure", "hosts", "placement", "strategy", "search", "steps"}
_MATRIX_STEP_KEYS = ("matrix", "on_failure", "placement")  # a matrix on one step: not the kind's parameters
_JINJA_FIELDS = ("gates", "when")
_FIXED_FIELDS = {"id", "kind", "description"}  # never substituted


class Reporter(Protocol):
    """Where problems go (the loader's positions): `problem` notes one, `refuse` stops at a limit; `written`
    holds the text as written of each scalar YAML read as something else."""

    written: dict[Loc, str]

    def problem(self, loc: Loc, message: str, *, key: bool = False) -> None: ...

    def at(self, loc: Loc, *, key: bool = False) -> tuple[int, int]: ...

    def refuse(self, mark: tuple[int, int], message: str) -> NoReturn: ...


@dataclass
class Entry:
    """One step to validate: its raw data, where it is written, and (in a matrix) which instance it is."""

    raw: Any
    loc: Loc
    instance: Instance | None = None


@dataclass
class Expansion:
    entries: list[Entry] = field(default_factory=list)
    groups: list[MatrixGroup] = field(default_factory=list)
    instances: dict[str, Instance] = field(default_factory=dict)
    #: base id -> the group it belongs to (for the loader's cross-checks: references into a group)
    member_of: dict[str, str] = field(default_factory=dict)


@dataclass
class _Member:
    raw: dict[str, Any]
    loc: Loc
    base: str
    model: type[StepSpec] | None
    axes: set[str] = field(default_factory=set)
    mates: set[str] = field(default_factory=set)  # group mates it refers to


@dataclass
class _Budget:
    instances: int = 0
    text: int = 0
    values: int = 0


def expand(
    raw_steps: list[Any],
    kinds: Mapping[str, type[StepSpec]],
    names: Collection[str],
    selectors: Mapping[str, list[str]],
    pos: Reporter,
) -> Expansion:
    """The steps to validate, in run order, and the matrix groups they expand; `names` are the runbook's
    vars and secrets (an axis's `matrix_*` variable must not shadow one); `selectors` the hosts of each
    name a `hosts:` may give instead of a list (`all`, the pools)."""
    out = Expansion()
    budget = _Budget()
    written: list[Any] = []  # every step as written, in groups too: a group's name must not be one's id
    for raw in raw_steps:
        inner = raw.get("steps") if isinstance(raw, dict) and "group" in raw else None
        written.extend(inner if isinstance(inner, list) else [raw])
    taken = {step["id"] for step in written if isinstance(step, dict) and isinstance(step.get("id"), str)}
    before: dict[str, type[StepSpec] | None] = {}  # the steps written before this one: id -> its kind
    for index, raw in enumerate(raw_steps):
        loc: Loc = ("steps", index)
        if isinstance(raw, dict) and isinstance(raw.get("hosts"), str) and raw["hosts"] in selectors:
            raw = {**raw, "hosts": list(selectors[raw["hosts"]])}  # a pool's (or all) hosts, for placement
        if isinstance(raw, dict) and "group" in raw:
            _group(raw, loc, kinds, names, taken, pos, out, budget, before)
        elif isinstance(raw, dict) and "matrix" in raw:
            step = {k: v for k, v in raw.items() if k not in _MATRIX_STEP_KEYS}
            name = raw.get("id")
            options = {"matrix": raw["matrix"], "on_failure": raw.get("on_failure"), "placement": raw.get("placement")}
            if "hosts" in raw:
                options["hosts"] = raw["hosts"]
            _expand_group(
                str(name), options, loc, [(step, loc)], kinds, names, pos, out, budget, own_hosts=True, before=before
            )
        else:
            _refuse_outside(raw, loc, kinds, pos)
            out.entries.append(Entry(raw, loc))
        inner = raw.get("steps") if isinstance(raw, dict) and "group" in raw else None
        for step in inner if isinstance(inner, list) else [raw]:
            if isinstance(step, dict) and isinstance(step.get("id"), str):
                before[step["id"]] = kinds.get(str(step.get("kind")))
    return out


def _group(
    raw: dict[str, Any],
    loc: Loc,
    kinds: Mapping[str, type[StepSpec]],
    names: Collection[str],
    taken: set[str],
    pos: Reporter,
    out: Expansion,
    budget: _Budget,
    before: Mapping[str, type[StepSpec] | None],
) -> None:
    for key in raw:
        if key not in _GROUP_KEYS:
            pos.problem(
                (*loc, key), f"unknown key '{key}' of a group (known: {', '.join(sorted(_GROUP_KEYS))})", key=True
            )
    name = raw["group"]
    _refuse_long_id(name, (*loc, "group"), pos)
    if not isinstance(name, str) or not _GROUP_NAME.fullmatch(name):
        pos.problem((*loc, "group"), "group: a name such as sweep_1 (letters, digits, _ and -)")
        name = str(name)
    elif name in taken:
        pos.problem((*loc, "group"), f"group '{name}': the name is taken by a step or another group")
    taken.add(name)
    if "matrix" not in raw:
        pos.problem(loc, f"group '{name}': missing required key 'matrix'")
        return
    steps = raw.get("steps")
    if not isinstance(steps, list) or not steps:
        pos.problem((*loc, "steps"), f"group '{name}': steps: a list of one or more steps")
        return
    members: list[tuple[Any, Loc]] = []
    for j, step in enumerate(steps):
        step_loc: Loc = (*loc, "steps", j)
        if isinstance(step, dict) and ("group" in step or "matrix" in step):
            pos.problem(step_loc, f"group '{name}': a group's step cannot carry its own matrix or group")
            continue
        members.append((step, step_loc))
    _expand_group(name, raw, loc, members, kinds, names, pos, out, budget, own_hosts=False, before=before)


class GroupOptions(BaseModel):
    """A matrix group's options (a group's keys, or a matrix step's own), each checked by its type here;
    `_group_options` turns each refusal into its problem at the option's position (`_OPTION_PROBLEMS`)."""

    model_config = ConfigDict(strict=True, extra="ignore", frozen=True)

    #: none written (or an empty value) is `stop`
    on_failure: Annotated[OnFailure, BeforeValidator(lambda value: value or "stop")] = "stop"
    placement: Placement | None = None
    hosts: Annotated[list[str], Field(min_length=1)] | None = None
    strategy: Literal["grid", "search"] = "grid"
    search: SearchSpec | None = None

    @model_validator(mode="after")
    def _spread_over_hosts(self) -> GroupOptions:
        if self.placement is not None and self.hosts is None:
            raise PydanticCustomError("placement_needs_hosts", "placement needs the hosts to spread over")
        if self.strategy == "search" and self.search is None:
            raise PydanticCustomError("search_needs_both", "strategy: search needs search: {budget, measure}")
        return self

    def listed_twice(self) -> str | None:
        """The first host listed twice: two lanes on one host would run two servers there at once (pools
        refuse this too)."""
        listed = self.hosts or []
        return next((h for i, h in enumerate(listed) if h in listed[:i]), None)


#: What each refusal of `GroupOptions` says, by the option (or the error's type), given the value as written.
_OPTION_PROBLEMS: dict[str, Callable[[Any], str]] = {
    "on_failure": lambda value: f"on_failure: 'stop' or 'continue', not {value!r}",
    "placement": lambda value: f"placement: 'spread' (each server configuration on one host), not {value!r}",
    "hosts": lambda _: "hosts: a list of host names, `all` or a pool's name (the group's hosts)",
    "placement_needs_hosts": lambda _: "placement needs the hosts to spread over: give `hosts: [gpu1, gpu2]`",
    "strategy": lambda value: f"strategy: 'grid' (every configuration, the default) or 'search', not {value!r}",
    "search": lambda _: (
        "search: {budget: {launches: N} or {gpu_hours: H}, measure: STEP_ID, baseline: STEP_ID, tolerance: 0.02}"
        " (README, 'Search')"
    ),
    "search_needs_both": lambda _: (
        "strategy: search needs its `search:`: {budget: {launches: N}, measure: STEP_ID} (README, 'Search')"
    ),
}


def _group_options(options: Mapping[str, Any], loc: Loc, pos: Reporter, *, own_hosts: bool) -> GroupOptions:
    """The group's options, each refused one reported at its position and read as not given (its default), so
    that one bad option does not hide the problems of the others. A matrix step's own `hosts` (`own_hosts`) are
    checked by its kind's validation: not reported here."""
    given = dict(options)
    if given.get("search") is not None and not _search_checked(given["search"], (*loc, "search"), pos):
        given.pop("search")
        given.pop("strategy", None)  # refused above: a second problem that it lacks its `search:` would mislead
    for _ in range(len(GroupOptions.model_fields) + 1):  # each round drops one refused option at least
        try:
            return GroupOptions.model_validate(given)
        except ValidationError as exc:
            refused: dict[str, str] = {}  # option -> what its problem is keyed by, each once, in field order
            for error in exc.errors():
                # the model's own check (a placement without hosts) names no field: the placement's
                whole = "strategy" if error["type"] == "search_needs_both" else "placement"
                option = str(error["loc"][0]) if error["loc"] else whole
                refused.setdefault(option, error["type"] if error["type"] in _OPTION_PROBLEMS else option)
            for option, problem in refused.items():
                if not (option == "hosts" and own_hosts):
                    pos.problem((*loc, option), _OPTION_PROBLEMS[problem](given.get(option)))
                given.pop(option, None)
    return GroupOptions()


def _search_checked(search: Any, loc: Loc, pos: Reporter) -> bool:
    """Whether a group's `search:` is valid; each problem reported at its field, with pydantic's reason."""
    try:
        SearchSpec.model_validate(search)
    except ValidationError as exc:
        for error in exc.errors():
            at = tuple(error["loc"])
            named = ".".join(["search", *map(str, at)])
            pos.problem((*loc, *at), f"{named}: {error['msg'].removeprefix('Value error, ')}")
        return False
    return True


def _expand_group(
    name: str,
    options: Mapping[str, Any],
    loc: Loc,
    written: list[tuple[Any, Loc]],
    kinds: Mapping[str, type[StepSpec]],
    names: Collection[str],
    pos: Reporter,
    out: Expansion,
    budget: _Budget,
    *,
    own_hosts: bool,
    before: Mapping[str, type[StepSpec] | None],
) -> None:
    """Expand one matrix over its steps (`written`), appending its entries, instances and group to `out`;
    `before`: the steps written before it, by id, with their kinds (a search's baseline is one)."""
    matrix_loc = (*loc, "matrix")
    parsed = _axes(options["matrix"], matrix_loc, names, pos)
    checked = _group_options(options, loc, pos, own_hosts=own_hosts)
    twice = checked.listed_twice()
    if twice is not None:
        pos.problem((*loc, "hosts"), f"hosts: host '{twice}' is listed twice")
    hosts = None if own_hosts else checked.hosts
    members, passthrough = _members(name, written, kinds, hosts, checked.placement is not None, pos)
    out.entries.extend(passthrough)
    out.member_of.update((member.base, name) for member in members)
    if parsed is None:
        return
    axes = parsed.axes
    _uses(members, axes, pos)
    if members and not passthrough:
        _refuse_unused(name, axes, members, matrix_loc, pos)
    server = _server(name, members, pos)
    if checked.search is not None:
        _check_search(name, checked.search, members, server, loc, pos, before)
    server_axes = tuple(a for a in axes if server is not None and a in server.axes)
    cells = _ordered(parsed.cells, axes, server_axes)
    _count(members, cells, axes, matrix_loc, pos, budget)
    made = _instances(name, members, cells, axes, server, pos, out, budget)
    launches = sum(1 for member in made.values() if server is not None and member is server)
    if checked.search is not None and launches > SEARCH_MAX_LAUNCHES:
        text = f"group '{name}': {launches} server configurations; a search judges at most {SEARCH_MAX_LAUNCHES}"
        pos.problem((*loc, "search"), text + " (its bounds are quadratic in them): split the matrix, or grid")
    out.groups.append(
        MatrixGroup(
            name=name,
            axes={a: tuple(v for v, _ in axis) for a, axis in axes.items()},
            cells=tuple(cells),
            bases=tuple(m.base for m in members),
            instances=tuple(made),
            on_failure=checked.on_failure,
            placement=checked.placement,
            search=checked.search if checked.strategy == "search" else None,
            pool=tuple(checked.hosts or ()) if checked.placement is not None else (),
            position=pos.at(matrix_loc),
            server_axes=server_axes,
            servers=tuple(i for i, member in made.items() if server is not None and member is server),
            excluded=parsed.excluded,
            included=parsed.included,
        )
    )


def _check_search(
    name: str,
    search: SearchSpec,
    members: list[_Member],
    server: _Member | None,
    loc: Loc,
    pos: Reporter,
    before: Mapping[str, type[StepSpec] | None],
) -> None:
    """A search needs a server-starting step (a launch is what it saves), a step of the group whose kind measures
    (`StepSpec.search_measures`), and a baseline, where named, that measures and runs before the group."""
    if server is None:
        pos.problem((*loc, "search"), f"group '{name}': a search chooses server launches: the group starts none")
    measure = next((m for m in members if m.base == search.measure), None)
    if measure is None:
        bases = [m.base for m in members]
        pos.problem(
            (*loc, "search", "measure"), f"search.measure: '{search.measure}' is no step of group '{name}' ({bases})"
        )
    elif not _measures(measure.model):
        pos.problem((*loc, "search", "measure"), f"search.measure: step '{search.measure}' measures nothing to rank by")
    if search.baseline is None:
        return
    if search.baseline not in before:
        where = "in the group" if search.baseline in {m.base for m in members} else "of the runbook before the group"
        pos.problem((*loc, "search", "baseline"), f"search.baseline: '{search.baseline}' is no step {where}")
    elif not _measures(before[search.baseline]):
        pos.problem((*loc, "search", "baseline"), f"search.baseline: step '{search.baseline}' measures nothing")


def _measures(kind: type[StepSpec] | None) -> bool:
    """Whether a kind's facts give a search measures (it overrides `search_measures`)."""
    return kind is not None and kind.search_measures is not StepSpec.search_measures


def _members(
    name: str,
    written: list[tuple[Any, Loc]],
    kinds: Mapping[str, type[StepSpec]],
    hosts: list[str] | None,
    placed: bool,
    pos: Reporter,
) -> tuple[list[_Member], list[Entry]]:
    """The group's steps as members (each given the group's `hosts` unless it names its own, which a placed
    group refuses), and the steps that are no step at all, passed through for the loader's validation."""
    members: list[_Member] = []
    passthrough: list[Entry] = []
    number: dict[str, int] = {}  # base id -> its place among the members
    for raw, step_loc in written:
        if not isinstance(raw, dict) or not isinstance(raw.get("id"), str):
            passthrough.append(Entry(raw, step_loc))  # the loader's validation reports it
            continue
        _refuse_long_id(raw["id"], (*step_loc, "id"), pos)
        twin = number.get(raw["id"])
        if twin is not None:  # both would expand to the same instance ids: one would vanish
            text = f"duplicate step id '{raw['id']}' (also step {twin + 1} of group '{name}')"
            pos.problem((*step_loc, "id"), text)
            continue
        model = kinds.get(str(raw.get("kind")))
        raw = dict(raw)
        if hosts is not None:
            if placed and ("host" in raw or "hosts" in raw):
                key = "host" if "host" in raw else "hosts"
                text = f"step '{raw['id']}': a step of a placed group runs where the placement puts it: remove '{key}'"
                pos.problem((*step_loc, key), text, key=True)
            elif "host" not in raw and "hosts" not in raw:
                raw["hosts"] = list(hosts)
        number[raw["id"]] = len(members)
        members.append(_Member(raw, step_loc, raw["id"], model))
    return members, passthrough


def _server(name: str, members: list[_Member], pos: Reporter) -> _Member | None:
    """The group's server-starting step, if any: one per group (a second is reported)."""
    servers = [m for m in members if m.model is not None and m.model.starts_server]
    for extra in servers[1:]:
        text = (
            f"group '{name}': a second server-starting step ('{extra.base}' after '{servers[0].base}'); one per group"
        )
        pos.problem(extra.loc, text)
    return servers[0] if servers else None


def _count(members: list[_Member], cells: list[Cell], axes: Axes, loc: Loc, pos: Reporter, budget: _Budget) -> None:
    """Refuse the matrix, before any instance is made, past the limits of cell steps, instances and values."""
    if len(cells) * len(members) > MAX_CELL_STEPS:
        text = f"{len(cells)} cells x {len(members)} steps is more than {MAX_CELL_STEPS} cell steps (the limit)"
        pos.refuse(pos.at(loc), text)
    counts = [min(len(cells), math.prod(len(axes[a]) for a in m.axes)) for m in members]
    budget.instances += sum(counts)
    if budget.instances > MAX_INSTANCES:
        pos.refuse(pos.at(loc), f"the matrices expand to more than {MAX_INSTANCES} step instances (the limit)")
    budget.values += sum(count * _weight(m.raw) for count, m in zip(counts, members, strict=True))
    if budget.values > MAX_INSTANCE_VALUES:
        text = f"the matrices' step instances hold more than {MAX_INSTANCE_VALUES} values (the limit)"
        pos.refuse(pos.at(loc), text)


def _instances(
    name: str,
    members: list[_Member],
    cells: list[Cell],
    axes: Axes,
    server: _Member | None,
    pos: Reporter,
    out: Expansion,
    budget: _Budget,
) -> dict[str, _Member]:
    """Each member's instances, in run order (cell by cell, a member's instance once for all the cells that
    share its axes' values), added to `out`; returns each instance id's member."""
    made: dict[str, tuple[_Member, Cell]] = {}
    cell_lists: dict[str, list[str]] = {}
    server_of: dict[str, str | None] = {}
    after_server = {m.base for m in members[members.index(server) :]} if server is not None else set()
    for cell in cells:
        cell_server = _own_id(server, cell) if server is not None else None
        for member in members:
            iid = _own_id(member, cell)
            if iid not in made:
                made[iid] = (member, cell)
                cell_lists[iid] = []
                server_of[iid] = cell_server if member.base in after_server else None
            cell_lists[iid].append(cell.id)
    by_base = {m.base: m for m in members}
    for iid, (member, cell) in made.items():
        values = {a: cell.values[a] for a in axes if a in member.axes}
        instance = Instance(iid, member.base, name, values, tuple(cell_lists[iid]), server_of[iid])
        out.instances[iid] = instance
        raw = _instance_raw(member, cell, by_base, budget, pos)
        out.entries.append(Entry(raw, member.loc, instance))
    return {iid: member for iid, (member, _) in made.items()}


# ---- axes and cells ----------------------------------------------------------------------------------

#: an axis: its values, each with its text (what ids, excludes and `$matrix_X` show)
Axes = dict[str, list[tuple[AxisValue, str]]]


@dataclass
class _Cells:
    axes: Axes
    cells: list[Cell]  # after exclude/include, not yet ordered
    excluded: int
    included: int


def _axes(matrix: Any, loc: Loc, names: Collection[str], pos: Reporter) -> _Cells | None:
    """The axes and the cells, or None when the matrix is broken."""
    if not isinstance(matrix, dict) or not matrix:
        pos.problem(loc, "matrix: a mapping of axes, each a list of values (and optional exclude/include)")
        return None
    declared = [axis for axis in matrix if axis not in ("exclude", "include")]
    if len(declared) > MAX_AXES:
        text = f"the matrix has {len(declared)} axes; the limit is {MAX_AXES}"
        pos.refuse(pos.at((*loc, declared[MAX_AXES]), key=True), text)
    axes: Axes = {}
    broken = False
    given_by: dict[str, str] = {}  # script variable -> the axis giving it: `a`'s field `b` and axis `a_b` clash
    for axis in declared:
        if not _NAME.fullmatch(axis) or len(axis) > MAX_VALUE_TEXT:
            text = f"matrix axis '{axis[:MAX_VALUE_TEXT]}': a name such as draft_tokens (letters, digits, _; "
            pos.problem((*loc, axis), text + f"at most {MAX_VALUE_TEXT} characters)", key=True)
            broken = True
            continue
        parsed = _values(axis, matrix[axis], (*loc, axis), names, pos)
        if parsed is None:
            broken = True
            continue
        variables = _script_names(axis, parsed)
        clash = sorted(name for name in variables if name in given_by)
        if clash:
            text = f"matrix axis '{axis}': its script variable ${clash[0]} is also one of axis '{given_by[clash[0]]}'"
            pos.problem((*loc, axis), text, key=True)
            broken = True
        given_by |= dict.fromkeys(variables, axis)
        axes[axis] = parsed
    if not axes and not broken:
        pos.problem(loc, "matrix: no axes (an axis is a name with a list of values)")
    if broken or not axes:
        return None
    _check_sizes(matrix, axes, loc, pos)
    size = math.prod(len(v) for v in axes.values())
    include = matrix.get("include") or []
    excludes = _combinations(matrix.get("exclude"), "exclude", axes, (*loc, "exclude"), pos, full=False)
    includes = _combinations(include, "include", axes, (*loc, "include"), pos, full=True)
    if excludes is None or includes is None:
        return None
    taken_out = _excluded(excludes, axes)
    combos = itertools.product(*(range(len(v)) for v in axes.values()))
    cells = [combo for i, combo in enumerate(combos) if not taken_out[i]]
    present = set(cells)
    excluded = size - len(cells)
    for rule in includes:
        combo = tuple(rule[a] for a in axes)
        if combo not in present:
            present.add(combo)
            cells.append(combo)
    if not cells:
        pos.problem(loc, "matrix: every combination is excluded; no cell is left")
        return None
    made = [Cell({a: axes[a][i][0] for a, i in zip(axes, combo, strict=True)}) for combo in cells]
    return _Cells(axes, made, excluded, len(cells) - (size - excluded))


def _check_sizes(matrix: Mapping[str, Any], axes: Axes, loc: Loc, pos: Reporter) -> None:
    """Refuse a matrix past its limits before any cell is made: its combinations (with its includes), the
    characters of its largest cell (every cell id, `$matrix_*` environment and plan line is at most that) and
    its `exclude:`/`include:` entries (each the next past the limit's position)."""
    size = math.prod(len(v) for v in axes.values())
    include = matrix.get("include") or []
    if size + (len(include) if isinstance(include, list) else 0) > MAX_CELLS:
        pos.refuse(pos.at(loc), f"the matrix has {size} combinations; the limit is {MAX_CELLS} cells")
    largest = sum(len(axis) + 2 + max(_chars(value, text) for value, text in values) for axis, values in axes.items())
    if largest > MAX_CELL_CHARS:
        text = f"a cell of the matrix holds {largest} characters of axes and values; the limit is {MAX_CELL_CHARS}"
        pos.refuse(pos.at(loc), text)
    seen = 0
    for what in ("exclude", "include"):
        rules = matrix.get(what)
        if isinstance(rules, list) and seen + len(rules) > MAX_RULES:
            text = f"the matrix has more than {MAX_RULES} exclude and include entries (the limit)"
            pos.refuse(pos.at((*loc, what, MAX_RULES - seen)), text)
        seen += len(rules) if isinstance(rules, list) else 0


def _chars(value: AxisValue, text: str) -> int:
    """A value's size: its text, and a mapping's field names and texts."""
    if not isinstance(value, Mapping):
        return len(text)
    return sum(len(name) + len(_field_text(item)) for name, item in value.items())


def _field_text(item: Any) -> str:
    """A field's text, as `${{ matrix.AXIS.FIELD }}` inside a text gives it (a list's items with spaces)."""
    if item is None:
        return ""
    return " ".join(value_text(v) for v in item) if isinstance(item, list) else value_text(item)


def _excluded(rules: list[dict[str, int]], axes: Axes) -> bytearray:
    """For each combination (in `itertools.product` order), whether a rule takes it out. Each distinct rule
    marks the combinations it matches, enumerated from its own values: work in proportion to what the rules
    match, never cells x rules."""
    sizes = [len(values) for values in axes.values()]
    strides = [math.prod(sizes[k + 1 :]) for k in range(len(sizes))]
    out = bytearray(math.prod(sizes))
    for rule in {tuple(sorted(rule.items())) for rule in rules}:
        fixed = dict(rule)
        offsets = [sum(strides[k] * fixed[axis] for k, axis in enumerate(axes) if axis in fixed)]
        for k, axis in enumerate(axes):
            if axis not in fixed:
                offsets = [offset + i * strides[k] for offset in offsets for i in range(sizes[k])]
        for offset in offsets:
            out[offset] = 1
    return out


def _values(
    axis: str, values: Any, loc: Loc, names: Collection[str], pos: Reporter
) -> list[tuple[AxisValue, str]] | None:
    if not isinstance(values, list) or not values:
        pos.problem(loc, f"matrix axis '{axis}': a list of one or more values")
        return None
    out: list[tuple[AxisValue, str]] = []
    seen: set[str] = set()
    ok = True
    for i, value in enumerate(values):
        where = (*loc, i)
        if isinstance(value, dict):
            if not _mapping_value(axis, value, where, pos):
                ok = False
                continue
        elif value is None or not isinstance(value, str | int | float | bool):
            pos.problem(where, f"matrix axis '{axis}': a value is a scalar or a mapping with a name, not {value!r}")
            ok = False
            continue
        text = value_text(value)
        if retyped := _retyped(value, where, pos):
            pos.problem(where, f"matrix axis '{axis}': {retyped}")
            ok = False
        elif not _VALUE_TEXT.fullmatch(text) or len(text) > MAX_VALUE_TEXT:  # whole: `$` matches before a newline
            shown = text[:MAX_VALUE_TEXT].encode("unicode_escape").decode("ascii")
            pos.problem(
                where,
                f"matrix axis '{axis}': value '{shown}' is not readable in a cell id (letters, digits, _ . + -; "
                f"at most {MAX_VALUE_TEXT} characters)",
            )
            ok = False
        elif _chars(value, text) > MAX_VALUE_CHARS:
            text_of = f"{_chars(value, text)} characters with its fields"
            pos.problem(where, f"matrix axis '{axis}': value '{text}' holds {text_of}; the limit is {MAX_VALUE_CHARS}")
            ok = False
        elif text in seen:
            pos.problem(where, f"matrix axis '{axis}': value '{text}' appears twice")
            ok = False
        seen.add(text)
        out.append((value, text))
    for clash in sorted(_script_names(axis, out) & set(names)):
        pos.problem(loc, f"matrix axis '{axis}': its script variable ${clash} would shadow the var or secret '{clash}'")
        ok = False
    return out if ok else None


def _mapping_value(axis: str, value: dict[str, Any], where: Loc, pos: Reporter) -> bool:
    """Whether a mapping value is one: a `name`, and fields named as names holding what an environment
    variable can carry (a NUL is refused as in a var's value, never dropped)."""
    if not isinstance(value.get("name"), str | int | float) or isinstance(value.get("name"), bool):
        pos.problem(where, f"matrix axis '{axis}': a mapping value needs a `name` (what cell ids show)")
        return False
    fine = True
    for key, item in value.items():
        if not _NAME.fullmatch(key):
            pos.problem((*where, key), f"matrix axis '{axis}': field '{key}': a name (letters, digits, _)", key=True)
            fine = False
        elif not _field_value(item):
            pos.problem((*where, key), f"matrix axis '{axis}': field '{key}': a scalar, null or a list of scalars")
            fine = False
        elif problem := env_text_problem(_field_text(item)):
            pos.problem((*where, key), f"matrix axis '{axis}': field '{key}' {problem}")
            fine = False
        elif retyped := _retyped(item, (*where, key), pos):
            pos.problem((*where, key), f"matrix axis '{axis}': field '{key}': {retyped}")
            fine = False
    return fine


def _retyped(value: Any, loc: Loc, pos: Reporter) -> str | None:
    """Why a value is not what was written, or None: it reaches ids and `$matrix_*` as text, so one YAML
    reads as something whose text differs (`0123` is 83, `12:30` is 750, `yes` is true) is refused as a
    var's value is, with the hint to quote it."""
    written = pos.written.get(loc)
    if written is None or value is None or (isinstance(value, bool | int | float) and value_text(value) == written):
        return None  # a field may be null (`$matrix_AXIS_FIELD` is then empty); a value may not (said elsewhere)
    shown = value_text(value) if isinstance(value, bool | int | float) else str(value)
    return f"YAML reads {written} as the {type(value).__name__} {shown}; quote it to keep the text: '{written}'"


def _script_names(axis: str, values: list[tuple[AxisValue, str]]) -> set[str]:
    """The environment variables an axis gives scripts, as the engine exports them (`matrix_environment`)."""
    return {name for value, _ in values for name in matrix_environment({axis: value})}


def _field_value(item: Any) -> bool:
    scalar = (str, int, float, bool)
    return (
        item is None
        or isinstance(item, scalar)
        or (isinstance(item, list) and all(isinstance(x, scalar) for x in item))
    )


def _combinations(
    rules: Any, what: str, axes: Axes, loc: Loc, pos: Reporter, *, full: bool
) -> list[dict[str, int]] | None:
    """`exclude:`/`include:` entries as axis -> value index; `full`: each must name every axis."""
    if rules is None:
        return []
    if not isinstance(rules, list):
        pos.problem(loc, f"matrix {what}: a list of combinations ({{axis: value, ...}})")
        return None
    out: list[dict[str, int]] = []
    ok = True
    index = {a: {text: i for i, (_, text) in enumerate(values)} for a, values in axes.items()}
    for i, rule in enumerate(rules):
        if not isinstance(rule, dict) or not rule:
            pos.problem((*loc, i), f"matrix {what}: a combination is a mapping of axis to value")
            ok = False
            continue
        chosen: dict[str, int] = {}
        for axis, value in rule.items():
            if axis not in axes:
                pos.problem(
                    (*loc, i, axis), f"matrix {what}: unknown axis '{axis}' (axes: {', '.join(axes)})", key=True
                )
                ok = False
                continue
            text = value_text(value) if isinstance(value, str | int | float | bool | dict) and _named(value) else None
            if text not in index[axis]:
                shown = (text if text is not None else repr(value))[:MAX_VALUE_TEXT]
                listed = ", ".join(itertools.islice(index[axis], 20)) + (", ..." if len(index[axis]) > 20 else "")
                pos.problem((*loc, i, axis), f"matrix {what}: axis '{axis}' has no value '{shown}' (values: {listed})")
                ok = False
                continue
            chosen[axis] = index[axis][text]
        missing = [a for a in axes if a not in rule]
        if full and missing and ok:
            pos.problem((*loc, i), f"matrix include: a combination names every axis; missing: {', '.join(missing)}")
            ok = False
        out.append(chosen)
    return out if ok else None


def _named(value: Any) -> bool:
    return not isinstance(value, dict) or "name" in value


def _ordered(cells: list[Cell], axes: Axes, server_axes: tuple[str, ...]) -> list[Cell]:
    """Cells sharing a server configuration together: the server axes vary slowest (in declaration order,
    by value index), then the others; so each server configuration is one launch."""
    index = {a: {text: i for i, (_, text) in enumerate(values)} for a, values in axes.items()}
    order = [*server_axes, *(a for a in axes if a not in server_axes)]
    return sorted(cells, key=lambda cell: tuple(index[a][value_text(cell.values[a])] for a in order))


def _weight(raw: dict[str, Any]) -> int:
    """The values validating one instance of a step makes: the items of its lists and mappings, all of it
    again for each fallback (a fallback is the step validated with its overrides)."""
    fallbacks = raw.get("fallbacks")
    count, stack = 0, [raw]
    while stack:
        item = stack.pop()
        if isinstance(item, dict | list):
            count += len(item)
            stack.extend(item.values() if isinstance(item, dict) else item)
    return count * (1 + (len(fallbacks) if isinstance(fallbacks, list) else 0))


def _own_id(member: _Member, cell: Cell) -> str:
    return instance_id(member.base, {a: v for a, v in cell.values.items() if a in member.axes})


# ---- which axes a step uses --------------------------------------------------------------------------


def _uses(members: list[_Member], axes: Axes, pos: Reporter) -> None:
    """Fill each member's axes (its own, then those of the earlier mates it refers to) and mates; report
    `${{ }}` that is not `matrix.AXIS[.FIELD]`, and `${{` where it does not belong."""
    bases: dict[str, _Member] = {}  # the earlier members, by base id
    for member in members:
        scripts = member.model.script_fields if member.model is not None else frozenset()
        refs = step_ref_fields(member.model) if member.model is not None else frozenset()
        for key, value, loc in _fields(member.raw, member.loc):
            if key in _FIXED_FIELDS:
                continue
            if key in _JINJA_FIELDS:
                _condition_uses(key, value, loc, axes, member, bases, pos)
            elif key in scripts:
                _script_uses(key, value, loc, axes, member, pos)
            else:
                _parameter_uses(key, value, loc, axes, member, pos)
                if key in refs and isinstance(value, str) and value in bases:
                    member.mates.add(value)
        for mate in member.mates:
            member.axes |= bases[mate].axes
        bases[member.base] = member


def _condition_uses(
    key: str, value: Any, loc: Loc, axes: Axes, member: _Member, bases: Mapping[str, _Member], pos: Reporter
) -> None:
    """A gate or `when` (Jinja): the axes it reads as `matrix.AXIS`, the earlier mates it names."""
    for text, where in _texts(value, loc):
        if "${{" in text:
            pos.problem(where, f"{key}: the matrix is the variable `matrix` here: write matrix.AXIS, not ${{{{ }}}}")
        for axis in _JINJA_AXIS.findall(text):
            _axis_used(axis, None, axes, member, where, pos)
        member.mates.update(r for r in step_refs(text) if r in bases)


def _script_uses(key: str, value: Any, loc: Loc, axes: Axes, member: _Member, pos: Reporter) -> None:
    """A script: the axes it reads from its environment (`$matrix_AXIS`, `$matrix_AXIS_FIELD`)."""
    for text, where in _texts(value, loc):
        if "${{" in text:
            pos.problem(
                where, f"{key}: a script reads the matrix from its environment: use $matrix_AXIS, not ${{{{ }}}}"
            )
        for name in set(_SCRIPT_VAR.findall(text)):
            member.axes.update(a for a in axes if name == f"matrix_{a}" or name.startswith(f"matrix_{a}_"))


def _parameter_uses(key: str, value: Any, loc: Loc, axes: Axes, member: _Member, pos: Reporter) -> None:
    """Any other parameter: the axes it substitutes (`${{ matrix.AXIS[.FIELD] }}`), nothing else in `${{ }}`."""
    for text, where in _texts(value, loc):
        for expr in _EXPR.findall(text):
            match = _MATRIX_EXPR.match(expr)
            if match is None:
                pos.problem(where, f"{key}: ${{{{{expr}}}}} is not matrix.AXIS or matrix.AXIS.FIELD")
            else:
                _axis_used(match.group(1), match.group(2), axes, member, where, pos)


def _refuse_long_id(name: Any, loc: Loc, pos: Reporter) -> None:
    """A matrix step's id or a group's name past MAX_ID, refused before any instance id repeats it."""
    if isinstance(name, str) and len(name) > MAX_ID:
        pos.refuse(pos.at(loc), f"an id of {len(name)} characters in a matrix (the limit is {MAX_ID})")


def _refuse_unused(name: str, axes: Axes, members: list[_Member], loc: Loc, pos: Reporter) -> None:
    """An axis no step uses would multiply the cells, not the work: every cell would run the same commands
    once, and the run would count them as many cells passed. Refused at the axis."""
    used = set().union(*(member.axes for member in members))
    for axis in axes:
        if axis not in used:
            text = (
                f"matrix axis '{axis}': no step of '{name}' uses it, so its cells would all run the same commands; "
                f"name it in a step (${{{{ matrix.{axis} }}}}, $matrix_{axis}, matrix.{axis} in a gate or when:) "
                "or remove it"
            )
            pos.problem((*loc, axis), text, key=True)


def _axis_used(axis: str, name: str | None, axes: Axes, member: _Member, loc: Loc, pos: Reporter) -> None:
    if axis not in axes:
        pos.problem(loc, f"step '{member.base}': the matrix has no axis '{axis}' (axes: {', '.join(axes)})")
        return
    if name is not None and not any(isinstance(v, dict) and name in v for v, _ in axes[axis]):
        pos.problem(loc, f"step '{member.base}': no value of axis '{axis}' has a field '{name}'")
        return
    member.axes.add(axis)


def _fields(raw: dict[str, Any], loc: Loc) -> Iterator[tuple[str, Any, Loc]]:
    """(key, value, position) of a step's fields, and of the fields of each of its fallbacks."""
    for key, value in raw.items():
        if key == "fallbacks" and isinstance(value, list):
            for j, override in enumerate(value):
                if isinstance(override, dict):
                    yield from ((k, v, (*loc, key, j, k)) for k, v in override.items())
        else:
            yield key, value, (*loc, key)


def _texts(value: Any, loc: Loc) -> Iterator[tuple[str, Loc]]:
    """Every text in a value (nested lists and mappings' values), with its position; no recursion."""
    stack = [(value, loc)]
    while stack:
        item, where = stack.pop()
        if isinstance(item, str):
            yield item, where
        elif isinstance(item, dict):
            stack.extend((v, (*where, k)) for k, v in item.items())
        elif isinstance(item, list):
            stack.extend((v, (*where, i)) for i, v in enumerate(item))


def _refuse_outside(raw: Any, loc: Loc, kinds: Mapping[str, type[StepSpec]], pos: Reporter) -> None:
    """`${{ }}`, or `matrix.X` in a gate or `when:`, in a step that has no matrix."""
    if not isinstance(raw, dict):
        return
    model = kinds.get(str(raw.get("kind")))
    scripts = model.script_fields if model is not None else frozenset()
    for key, value, where in _fields(raw, loc):
        if key in _JINJA_FIELDS:
            for text, at in _texts(value, where):
                if _JINJA_AXIS.search(text):
                    pos.problem(
                        at, f"{key}: `matrix` in a step without a matrix (give it `matrix:`, or put it in a group)"
                    )
            continue
        if key in _FIXED_FIELDS or key in scripts:
            continue
        for text, at in _texts(value, where):
            if _EXPR.search(text):
                pos.problem(
                    at,
                    f"{key}: ${{{{ matrix... }}}} in a step without a matrix (give it `matrix:`, or put it in a group)",
                )


# ---- substitution ------------------------------------------------------------------------------------


def _instance_raw(
    member: _Member, cell: Cell, members: Mapping[str, _Member], budget: _Budget, pos: Reporter
) -> dict[str, Any]:
    """The member's raw data for `cell`: parameters substituted, references to mates pointing at the
    same cell's instance (fallbacks likewise); `members` by base id."""
    mates = {base: _own_id(members[base], cell) for base in member.mates}
    scripts = member.model.script_fields if member.model is not None else frozenset()
    refs = step_ref_fields(member.model) if member.model is not None else frozenset()

    def fields(raw: dict[str, Any], loc: Loc) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in raw.items():
            if key == "fallbacks" and isinstance(value, list):
                out[key] = [fields(o, (*loc, key, j)) if isinstance(o, dict) else o for j, o in enumerate(value)]
            elif key in refs and isinstance(value, str) and value in mates:
                out[key] = mates[value]
            elif key in _FIXED_FIELDS or key in _JINJA_FIELDS or key in scripts:
                out[key] = value
            else:
                out[key] = _substitute(value, cell, budget, pos, (*loc, key))
        return out

    return fields(member.raw, member.loc)


def _substitute(value: Any, cell: Cell, budget: _Budget, pos: Reporter, loc: Loc) -> Any:
    if isinstance(value, list):
        return [_substitute(v, cell, budget, pos, (*loc, i)) for i, v in enumerate(value)]
    if isinstance(value, dict):
        return {k: _substitute(v, cell, budget, pos, (*loc, k)) for k, v in value.items()}
    if not isinstance(value, str) or "${{" not in value:
        return value
    whole = _EXPR.fullmatch(value)
    if whole is not None and (match := _MATRIX_EXPR.match(whole.group(1))) is not None:
        return _lookup(cell, match.group(1), match.group(2))
    text = _EXPR.sub(lambda m: _text_of(cell, m.group(1)), value)
    budget.text += len(text)
    if budget.text > MAX_EXPANDED_TEXT:
        pos.refuse(
            pos.at(loc), f"the matrices expand to more than {MAX_EXPANDED_TEXT} characters of parameters (the limit)"
        )
    return text


def _lookup(cell: Cell, axis: str, name: str | None) -> Any:
    value = cell.values.get(axis)  # an unknown axis is reported by _uses
    if name is None:
        return value_text(value) if isinstance(value, Mapping) else value
    return value.get(name) if isinstance(value, Mapping) else None


def _text_of(cell: Cell, expr: str) -> str:
    """An expression's value inside a text: a value's text; a list's items with spaces; null as nothing."""
    match = _MATRIX_EXPR.match(expr)
    if match is None:  # reported by _uses
        return ""
    value = _lookup(cell, match.group(1), match.group(2))
    if value is None:
        return ""
    if isinstance(value, list):
        return " ".join(value_text(v) for v in value)
    return value_text(value)
