"""Load and validate a runbook, reporting every problem as `FILE:LINE:COL: message`.

PyYAML's parser gives events with positions; we compose the node tree from them ourselves (without
recursion, so a file nested 100 000 deep is refused, not a crash of libyaml's recursive composer) and
turn it into plain data, so that each value's position is known, duplicate keys (which PyYAML silently
collapses) are found, and a hostile file is refused at its position: every limit below is checked while
reading, before the work or memory it bounds is spent. Pydantic validates the data; its error
locations are mapped back to lines and columns.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import itertools
import re
import types
import typing
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, NoReturn

import yaml
from pydantic import BaseModel, ValidationError

from executor.errors import InvalidRunbook, Problem
from executor.files import open_regular
from executor.redact import MIN_SECRET_CHARS, Redactor
from executor.runbook.campaign import Instance, MatrixGroup, matrix_environment, value_text
from executor.runbook.gates import step_refs, syntax_error, var_refs
from executor.runbook.matrix import _JINJA_FIELDS, Expansion, _fields, _texts, expand
from executor.runbook.model import Host, Inventory, PlacedError, RunbookHeader, SecretRef, env_text_problem, var_text
from executor.runbook.references import is_environment, parameter_names, reference_at, unknown_in_script
from executor.stepkind import StepSpec, known_kinds, step_kinds

Loc = tuple[str | int, ...]
#: Where a host's field is written: ("runbook" or "inventory", "FILE:LINE"). A field with none is a default.
FieldSource = tuple[Literal["runbook", "inventory"], str]
LOCAL = "local"
_FALLBACK_FORBIDDEN = {"id", "kind", "host", "hosts", "fallbacks"}

# Limits of a runbook or inventory file (README, "Limits of a runbook file"): what `validate` refuses,
# each at its position, so that any file is answered within seconds and in bounded memory.
MAX_FILE_BYTES = 1 << 20  # read at most one byte more
MAX_SCALAR_CHARS = 256 << 10  # one value (a script) as written
MAX_NUMBER_CHARS = 100  # a value YAML reads as a number: int() of a long one is quadratic, `1:2:...` worse
MAX_DEPTH = 64  # collections (and merges) nested in one another, aliases expanded
MAX_ALIASES = 1000  # `*name` written in the file
MAX_VALUES = 100_000  # values and keys of the document, aliases expanded (an alias bomb stops here)
MAX_TEXT = 4 << 20  # characters of all values and keys, aliases expanded
MAX_PROBLEMS = 100  # reported; the rest of a file of 50 000 unknown keys is not worth the seconds
MAX_STEP_HOSTS = 10_000  # step-host pairs (a placed instance: one per host of its pool): validate and plan render each
MAX_HINT_CHOICES = 1000  # names a did-you-mean compares with (difflib's cost grows with each); past it, no hint
_MERGE = "tag:yaml.org,2002:merge"


@dataclass
class Runbook:
    """A validated runbook: the header, its steps, their fallbacks and hosts."""

    path: Path
    header: RunbookHeader
    steps: list[StepSpec]
    fallbacks: dict[str, list[StepSpec]] = field(default_factory=dict)
    step_hosts: dict[str, list[str]] = field(default_factory=dict)
    step_positions: dict[str, tuple[int, int]] = field(default_factory=dict)  # (line, column) of each step
    secret_positions: dict[str, tuple[int, int]] = field(default_factory=dict)  # of each secret's declaration
    #: the runbook's name and the names of its hosts, pools, vars and secrets, each with where it is and what
    #: it is: stored and shown as written (run.json, state.db, `status`, `runs`), never masked
    names: list[tuple[str, tuple[int, int], str]] = field(default_factory=list)
    #: the matrices, expanded (executor.runbook.campaign): a matrix's step instances are in `steps`, in run order
    groups: list[MatrixGroup] = field(default_factory=list)
    instances: dict[str, Instance] = field(default_factory=dict)  # instance id -> what it is of which matrix
    #: host -> field (a host var as `vars.NAME`) -> where it is written, the inventory's over the runbook's
    host_sources: dict[str, dict[str, FieldSource]] = field(default_factory=dict)
    #: the text it was read from (an inventory given later, on a resume, is laid over this, not the file)
    text: str = ""
    #: the sha256 of the text this runbook was read from (run.json records it): of what was loaded, not of
    #: the file as it may be by the time a run starts (edited, or gone)
    sha256: str = ""
    #: what `validate` points out without refusing the runbook: a script's `$NAME` that nothing defines
    warnings: list[Problem] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.header.name

    @property
    def hosts(self) -> dict[str, Host]:
        return self.header.hosts or {LOCAL: Host(address=LOCAL)}

    def fetches_on(self, host: str) -> tuple[str, ...]:
        """What the steps that may run on `host` (a placed matrix instance: on any host of its pool) and their
        fallbacks declare they will fetch (`StepSpec.fetches`), each once, in runbook order."""
        found = (
            address
            for spec in self.steps
            if host in self.step_hosts.get(spec.id, ())
            for variant in (spec, *self.fallbacks.get(spec.id, []))
            for address in variant.fetches()
        )
        return tuple(dict.fromkeys(found))


class _Positions:
    """Where each value (and each mapping key) of the document starts, the problems found, and what
    reading the document has cost so far (the limits above)."""

    def __init__(self, file: str, text: str = "") -> None:
        self.file, self.text = file, text
        self.values: dict[Loc, tuple[int, int]] = {}
        #: where in `text` each scalar holding a `$` is written (start, end): a `$name` in it is shown at its own column
        self.spans: dict[Loc, tuple[int, int]] = {}
        self.keys: dict[Loc, tuple[int, int]] = {}
        self.problems: list[Problem] = []
        #: a problem's did-you-mean (the word, the names it may be a typo of), worked out only where reported
        self.hints: dict[Problem, tuple[str, Collection[str]]] = {}
        #: the text as written of each scalar YAML read as something else (a number, a boolean, a date, null)
        self.written: dict[Loc, str] = {}
        self.built = 0  # values and keys built so far, aliases expanded (MAX_VALUES)
        self.built_text = 0  # their characters (MAX_TEXT)

    def at(self, loc: Loc, *, key: bool = False) -> tuple[int, int]:
        """The position of the longest prefix of `loc` found in the document."""
        path: Loc = ()
        best = self.values.get((), (1, 1))
        for part in loc:
            candidate = (*path, part)
            if candidate in self.values:
                path = candidate
                best = self.values[path]
        if key and path in self.keys and len(path) == len(loc):
            return self.keys[path]
        return best

    def problem(
        self, loc: Loc, message: str, *, key: bool = False, near: tuple[str, Collection[str]] | None = None
    ) -> None:
        """Note a problem at `loc`; `near` (a word, the names it may be a typo of) adds a did-you-mean to it."""
        line, column = self.at(loc, key=key)
        problem = Problem(self.file, line, column, message)
        self.problems.append(problem)
        if near is not None:
            self.hints[problem] = near

    def occurrence(self, loc: Loc, value: str, offset: int) -> tuple[int, int]:
        """Where the reference at `offset` of the text at `loc` (`value`) is written: found in the scalar as written
        (the same reference, as often before it), else (an escape, a substituted axis value) the value's start."""
        span, needle = self.spans.get(loc), reference_at(value, offset)
        if span is None:
            return self.at(loc)
        found = span[0] - 1
        for _ in range(value.count(needle, 0, offset) + 1):
            found = self.text.find(needle, found + 1, span[1])
            if found < 0:
                return self.at(loc)
        line_start = self.text.rfind("\n", 0, found) + 1
        return self.text.count("\n", 0, found) + 1, found - line_start + 1

    def invalid(self) -> InvalidRunbook:
        """The error for the problems found, in the order of the file, at most MAX_PROBLEMS of them. Only
        these get their did-you-mean: a file of 30 000 unknown names costs 100 of them, not 30 000."""
        # a matrix step's problem that no axis value causes is found once per instance: reported once
        problems = sorted(dict.fromkeys(self.problems), key=lambda p: (p.line, p.column))
        shown = [self._hinted(p) for p in problems[:MAX_PROBLEMS]]
        if len(problems) <= MAX_PROBLEMS:
            return InvalidRunbook(shown)
        rest = problems[MAX_PROBLEMS]
        more = f"more problems from here on; only the first {MAX_PROBLEMS} are reported (the limit)"
        return InvalidRunbook([*shown, Problem(self.file, rest.line, rest.column, more)])

    def _hinted(self, problem: Problem) -> Problem:
        near = self.hints.get(problem)
        return problem if near is None else dataclasses.replace(problem, message=problem.message + _did_you_mean(*near))

    def refuse(self, mark: tuple[int, int], message: str) -> NoReturn:
        """Stop reading: a limit was passed at `mark` (nothing after it is worth the time)."""
        raise InvalidRunbook([Problem(self.file, *mark, message)])

    def spend(self, node: yaml.Node, via: tuple[int, int] | None) -> None:
        """Count a value (or key) into the document's size; refuse it past MAX_VALUES or MAX_TEXT, at the
        alias being expanded (`via`) where there is one, since that is what made the document grow."""
        self.built += 1
        self.built_text += len(node.value) if isinstance(node, yaml.ScalarNode) else 0
        expanded = " once its aliases are expanded" if via else ""
        if self.built > MAX_VALUES:
            self.refuse(via or _mark(node), f"the document holds more than {MAX_VALUES} values{expanded} (the limit)")
        if self.built_text > MAX_TEXT:
            self.refuse(via or _mark(node), f"the document holds more than {MAX_TEXT} characters{expanded} (the limit)")


def _mark(node: yaml.Node) -> tuple[int, int]:
    return node.start_mark.line + 1, node.start_mark.column + 1


# libyaml's parser where PyYAML was built with it: 40x faster on large scripts, same marks and nodes
_Loader: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _Alias(yaml.Node):
    """An alias where it is written (`*name`), standing for the node its anchor names. `_build` expands it,
    counting what it adds, so a bomb is refused at its alias rather than filling memory."""

    def __init__(self, target: yaml.Node, mark: yaml.Mark) -> None:
        super().__init__(target.tag, target.value, mark, mark)
        self.target = target


class _Open:
    """A collection being composed: its node, its anchor (defined once it is complete, so no value can
    hold an alias of itself) and, in a mapping, the key waiting for its value."""

    def __init__(self, node: yaml.CollectionNode, anchor: str | None) -> None:
        self.node, self.anchor = node, anchor
        self.key: yaml.Node | None = None

    def add(self, child: yaml.Node) -> None:
        if isinstance(self.node, yaml.SequenceNode):
            self.node.value.append(child)
        elif self.key is None:
            self.key = child
        else:
            self.node.value.append((self.key, child))
            self.key = None


class _Composer:
    """The single document's node tree, composed from the parser's events in a loop: PyYAML's composer
    recurses once per level (libyaml's in C, where 100 000 `[` crash the process). Depth, scalar length,
    alias count and node count are checked per event, before the node is made."""

    def __init__(self, loader: yaml.SafeLoader, pos: _Positions) -> None:
        self.loader, self.pos = loader, pos
        self.anchors: dict[str, yaml.Node] = {}
        self.stack: list[_Open] = []
        self.aliases = self.nodes = 0

    def _event(self) -> Any:  # PyYAML's events carry no types
        return self.loader.get_event()  # type: ignore[no-untyped-call]

    def document(self) -> yaml.Node | None:
        self._event()  # the stream's start
        if self.loader.check_event(yaml.StreamEndEvent):
            return None
        self._event()  # the document's start
        while True:
            event = self._event()
            if isinstance(event, yaml.CollectionStartEvent):
                self._open(event)
                continue
            node = self._node(event)
            if not self.stack:
                break
            self.stack[-1].add(node)
        self._event()  # the document's end
        if not self.loader.check_event(yaml.StreamEndEvent):
            text = "expected a single document, found another one"
            raise yaml.composer.ComposerError(None, None, text, self._event().start_mark)
        return node

    def _open(self, event: Any) -> None:
        if len(self.stack) >= MAX_DEPTH:
            self.pos.refuse(_event_mark(event), f"nested more than {MAX_DEPTH} levels deep (the limit)")
        kind = yaml.SequenceNode if isinstance(event, yaml.SequenceStartEvent) else yaml.MappingNode
        node = kind(self._tag(event, kind, None), [], event.start_mark, None, flow_style=event.flow_style)
        self.stack.append(_Open(node, event.anchor))

    def _node(self, event: Any) -> yaml.Node:
        """The node an alias, a scalar or the end of a collection completes, counted and anchored."""
        node: yaml.Node
        anchor = None
        if isinstance(event, yaml.AliasEvent):
            node = self._alias(event)
        elif isinstance(event, yaml.ScalarEvent):
            node, anchor = self._scalar(event), event.anchor
        else:  # the end of the innermost collection
            done = self.stack.pop()
            node, anchor = done.node, done.anchor
            node.end_mark = event.end_mark
        self.nodes += 1
        if self.nodes > MAX_VALUES:
            self.pos.refuse(_mark(node), f"the document holds more than {MAX_VALUES} values (the limit)")
        if anchor is not None:
            self._anchor(anchor, node)
        return node

    def _scalar(self, event: Any) -> yaml.ScalarNode:
        if len(event.value) > MAX_SCALAR_CHARS:
            text = f"a value of {len(event.value)} characters (the limit is {MAX_SCALAR_CHARS})"
            self.pos.refuse(_event_mark(event), text)
        tag = self._tag(event, yaml.ScalarNode, event.value)
        return yaml.ScalarNode(tag, event.value, event.start_mark, event.end_mark, style=event.style)

    def _alias(self, event: Any) -> _Alias:
        self.aliases += 1
        if self.aliases > MAX_ALIASES:
            self.pos.refuse(_event_mark(event), f"more than {MAX_ALIASES} aliases (the limit)")
        if event.anchor not in self.anchors:
            text = f"found undefined alias {event.anchor!r} (an alias names an anchor before it)"
            raise yaml.composer.ComposerError(None, None, text, event.start_mark)
        return _Alias(self.anchors[event.anchor], event.start_mark)

    def _anchor(self, anchor: str, node: yaml.Node) -> None:
        if anchor in self.anchors:
            first = _mark(self.anchors[anchor])[0]
            text = f"found duplicate anchor {anchor!r} (first defined at line {first})"
            raise yaml.composer.ComposerError(None, None, text, node.start_mark)
        self.anchors[anchor] = node

    def _tag(self, event: Any, kind: type[yaml.Node], value: str | None) -> str:
        """The node's tag: as written, or resolved as PyYAML's composer does."""
        if event.tag not in (None, "!"):
            return str(event.tag)
        return str(self.loader.resolve(kind, value, event.implicit))  # type: ignore[no-untyped-call]


def _event_mark(event: Any) -> tuple[int, int]:
    return event.start_mark.line + 1, event.start_mark.column + 1


def _build(
    loader: yaml.SafeLoader,
    node: yaml.Node,
    loc: Loc,
    pos: _Positions,
    depth: int = 0,
    via: tuple[int, int] | None = None,
) -> Any:
    """Plain data from `node`, every value's position kept. `depth` counts nesting with aliases expanded,
    `via` is the outermost alias being expanded (where a limit it passes is reported)."""
    if isinstance(node, _Alias):
        value = _build(loader, node.target, loc, pos, depth, via or _mark(node))  # the outermost alias
        pos.values[loc] = _mark(node)  # a value's problem is shown where it is used
        return value
    pos.spend(node, via)
    pos.values[loc] = _mark(node)
    if isinstance(node, yaml.CollectionNode) and depth >= MAX_DEPTH:
        pos.refuse(
            via or _mark(node), f"nested more than {MAX_DEPTH} levels deep once aliases are expanded (the limit)"
        )
    if isinstance(node, yaml.MappingNode):
        return _mapping(loader, node, loc, pos, depth, via)
    if isinstance(node, yaml.SequenceNode):
        return [_build(loader, item, (*loc, i), pos, depth + 1, via) for i, item in enumerate(node.value)]
    assert isinstance(node, yaml.ScalarNode)  # the one kind of node left
    if "$" in node.value:
        pos.spans[loc] = (node.start_mark.index, node.end_mark.index)
    return _scalar(loader, node, loc, pos)


def _target(node: yaml.Node) -> yaml.Node:
    return node.target if isinstance(node, _Alias) else node


def _mapping(
    loader: yaml.SafeLoader, node: yaml.MappingNode, loc: Loc, pos: _Positions, depth: int, via: tuple[int, int] | None
) -> dict[str, Any]:
    """A mapping's keys are their text as written (`on:` is the key 'on', not true); a key that is no
    scalar (`? [x, y]`) is refused. Merges (`<<: *base`, `<<: [*a, *b]`) give the keys the mapping does
    not, the first merged mapping winning, as in YAML's merge key."""
    merged: list[yaml.Node] = []
    pairs: list[tuple[str, yaml.Node, yaml.Node]] = []
    seen: dict[str, yaml.Node] = {}
    for key_node, value_node in node.value:
        written = _target(key_node)
        if written.tag == _MERGE:
            merged.extend(_merged(value_node, pos))
        elif not isinstance(written, yaml.ScalarNode):
            what = "sequence (`? [x, y]`)" if isinstance(written, yaml.SequenceNode) else "mapping (`? {a: 1}`)"
            pos.problems.append(Problem(pos.file, *_mark(key_node), f"a key must be text, not a {what}"))
        else:
            pos.spend(written, via)
            if written.value in seen:
                line = _mark(seen[written.value])[0]
                text = f"duplicate key '{written.value}' (first defined at line {line})"
                pos.problems.append(Problem(pos.file, *_mark(key_node), text))
            seen[written.value] = key_node
            pairs.append((written.value, key_node, value_node))
    result: dict[str, Any] = {}
    for source in reversed(merged):  # the first one's keys are set last: it wins
        result.update(_build(loader, source, loc, pos, depth + 1, via))
    pos.values[loc] = _mark(node)
    for key, key_node, value_node in pairs:
        pos.keys[(*loc, key)] = _mark(key_node)
        result[key] = _build(loader, value_node, (*loc, key), pos, depth + 1, via)
    return result


def _merged(value: yaml.Node, pos: _Positions) -> list[yaml.Node]:
    """The mappings a merge key names: one, or a sequence of them."""
    target = _target(value)
    items = target.value if isinstance(target, yaml.SequenceNode) else [value]
    if all(isinstance(_target(item), yaml.MappingNode) for item in items):
        return list(items)
    pos.problems.append(Problem(pos.file, *_mark(value), "a merge (`<<:`) takes a mapping or a list of mappings"))
    return []


#: what PyYAML's safe constructors raise on text that is not of the type its tag (`!!bool "abc"`) says
_UNREADABLE = (ValueError, ArithmeticError, LookupError, AttributeError, TypeError)


def _scalar(loader: yaml.SafeLoader, node: yaml.ScalarNode, loc: Loc, pos: _Positions) -> Any:
    """The scalar's value as YAML reads it; where that is no text, its text as written is noted (vars
    must reach a step as written). A value YAML cannot read as its type (`2026-13-45`) is a problem."""
    kind = node.tag.rpartition(":")[2]
    if kind in ("int", "float") and len(node.value) > MAX_NUMBER_CHARS:
        text = f"a number of {len(node.value)} characters (the limit is {MAX_NUMBER_CHARS}; quote it if it is text)"
        pos.problems.append(Problem(pos.file, *_mark(node), text))
        return node.value
    try:
        value = loader.construct_object(node)
    except _UNREADABLE as exc:  # `!!bool abc` is a KeyError, `!!int ""` an IndexError, `!!timestamp x` ...
        why = f": {exc}" if isinstance(exc, ValueError) else ""  # the others say nothing a person could use
        pos.problems.append(Problem(pos.file, *_mark(node), f"YAML cannot read {node.value!r} as {kind}{why}"))
        return node.value
    if not isinstance(value, str):
        pos.written[loc] = node.value
    elif "\x00" in value:  # `"\0"` in double quotes: YAML's escape for the one byte no host can be given
        text = "a NUL byte (\\0) in text: no path, command line or environment variable can hold one"
        pos.problems.append(Problem(pos.file, *_mark(node), text))
    return value


def _reader_problem(exc: yaml.reader.ReaderError, text: str, file: str) -> Problem:
    """A character YAML does not allow, at its line and column."""
    before = text[: exc.position]
    line, column = before.count("\n") + 1, len(before) - (before.rfind("\n") + 1) + 1
    return Problem(file, line, column, f"YAML error: {exc.reason} (character {exc.character:#x})")


def _parse(text: str, file: str) -> tuple[Any, _Positions]:
    pos = _Positions(file, text)
    try:
        loader = _Loader(text)
    except yaml.reader.ReaderError as exc:
        raise InvalidRunbook([_reader_problem(exc, text, file)]) from None
    try:
        node = _Composer(loader, pos).document()
        if node is None:
            raise InvalidRunbook([Problem(file, 1, 1, "the file is empty; expected a runbook mapping")])
        data = _build(loader, node, (), pos)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line, column = (mark.line + 1, mark.column + 1) if mark else (1, 1)
        raise InvalidRunbook([Problem(file, line, column, f"YAML syntax error: {exc.problem or exc}")]) from None
    except yaml.reader.ReaderError as exc:
        raise InvalidRunbook([_reader_problem(exc, text, file)]) from None
    except yaml.YAMLError as exc:
        raise InvalidRunbook([Problem(file, 1, 1, f"YAML error: {exc}")]) from None
    finally:
        loader.dispose()
    return data, pos


def _model_at(model: type[BaseModel], loc: Loc) -> type[BaseModel] | None:
    """The model class that holds the value at `loc` (for did-you-mean on unknown keys)."""
    current: Any = model
    for part in loc:
        if isinstance(current, tuple):  # a container: this part is its index or key
            current = current[0]
            continue
        if not (isinstance(current, type) and issubclass(current, BaseModel)):
            return None
        if not isinstance(part, str) or part not in current.model_fields:
            return None
        current = _unwrap(current.model_fields[part].annotation)
    return current if isinstance(current, type) and issubclass(current, BaseModel) else None


def _unwrap(annotation: Any) -> Any:
    """Strip Optional/Annotated; for list[X] and dict[str, X] return (X,)."""
    while True:
        origin = typing.get_origin(annotation)
        args = typing.get_args(annotation)
        if origin is typing.Annotated:
            annotation = args[0]
        elif origin in (typing.Union, types.UnionType):
            models = [a for a in args if isinstance(a, type) and issubclass(a, BaseModel)]
            others = [a for a in args if a is not type(None)]
            annotation = models[0] if models else (others[0] if len(others) == 1 else None)
        elif origin is list:
            return (args[0],) if args else None
        elif origin is dict:
            return (args[1],) if args else None
        else:
            return annotation


def _did_you_mean(word: str, choices: Collection[str]) -> str:
    """ "; did you mean 'x'?" where one of `choices` is close to `word`; none among more than
    MAX_HINT_CHOICES names (each costs difflib a comparison; such a list is no typo's neighbourhood)."""
    if len(choices) > MAX_HINT_CHOICES:
        return ""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f"; did you mean '{close[0]}'?" if close else ""


def _loc_text(loc: Loc) -> str:
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def _report(
    exc: ValidationError, model: type[BaseModel], prefix: Loc, pos: _Positions, instance: str | None = None
) -> None:
    """Map pydantic's errors to positions. A matrix step's `instance` (its id) names the cell in a value's
    error (an axis value may be what breaks it), the parameter's path then relative to the step."""
    for error in exc.errors():
        if len(pos.problems) > MAX_PROBLEMS:
            break  # `invalid` reports no more
        loc = tuple(error["loc"])
        full = (*prefix, *loc)
        kind = error["type"]
        if kind == "extra_forbidden":
            owner = _model_at(model, loc[:-1])
            retired = owner.retired_keys.get(str(loc[-1])) if owner and issubclass(owner, StepSpec) else None
            if retired:
                pos.problem(full, f"unknown key '{loc[-1]}': {retired}", key=True)
                continue
            near = (str(loc[-1]), owner.model_fields if owner else ())
            pos.problem(full, f"unknown key '{loc[-1]}'", key=True, near=near)
        elif kind == "missing":
            where = _loc_text(full[:-1]) or "the runbook"
            pos.problem(full[:-1], f"{where}: missing required key '{loc[-1]}'")
        else:
            cause = error.get("ctx", {}).get("error")
            if isinstance(cause, PlacedError):  # a model's check about one place below it: reported there
                loc = (*loc, *cause.loc)
                full = (*prefix, *loc)
            message = str(error["msg"]).removeprefix("Value error, ")
            if kind == "tuple_type":  # an immutable list of the model's (`non_retryable`): a YAML list
                message = "Input should be a list"
            where = ": ".join(filter(None, (instance, _loc_text(loc)))) if instance else _loc_text(full)
            pos.problem(full, f"{where}: {message}")


def _read(path: Path, what: str) -> str:
    """The file's text, at most MAX_FILE_BYTES of it; never a FIFO (its open would wait for a writer) or
    a device (/dev/zero never ends)."""
    try:
        with open_regular(path) as handle:
            data = handle.read(MAX_FILE_BYTES + 1)
        if len(data) > MAX_FILE_BYTES:
            text = f"the {what} is larger than {MAX_FILE_BYTES} bytes (the limit of a file `runbook` reads)"
            raise InvalidRunbook([Problem(str(path), 1, 1, text)])
        return data.decode("utf-8")
    except UnicodeDecodeError:  # said without the byte: a binary's content is never quoted
        raise InvalidRunbook([Problem(str(path), 1, 1, f"cannot read the {what}: not UTF-8 text")]) from None
    except OSError as exc:
        raise InvalidRunbook([Problem(str(path), 1, 1, f"cannot read the {what}: {exc}")]) from None


def _check_var_texts(data: dict[str, Any], pos: _Positions) -> None:
    """A var reaches a step as text: one YAML reads as something else whose text differs from what was
    written (`0123` is 83, `12:30` is 750, `yes` is true, `2026-12-01` a date, `~` null) is refused with a
    hint to quote it. Its text takes its place, so the schema does not report it a second time."""
    hosts = data.get("hosts")
    places: list[tuple[Loc, Any]] = [(("vars",), data.get("vars"))]
    if isinstance(hosts, dict):  # a host's own vars (`hosts.NAME.vars`) reach its steps the same way
        places += [(("hosts", h, "vars"), host.get("vars")) for h, host in hosts.items() if isinstance(host, dict)]
    for loc, variables in places:
        if not isinstance(variables, dict):
            continue
        for name, value in variables.items():
            written = pos.written.get((*loc, name))
            if written is None or (isinstance(value, bool | int | float) and var_text(value) == written):
                continue
            read = "null (no value)" if value is None else f"the {type(value).__name__} {_shown(value)}"
            text = f"{_loc_text((*loc, name))}: YAML reads {written} as {read}; quote it to keep the text: '{written}'"
            pos.problem((*loc, name), text)
            variables[name] = written


def _check_host_vars(hosts: Mapping[str, Host], declared: Collection[str], pos: _Positions) -> None:
    """A host's `vars` may only give its own value of a var the runbook declares: a typo would
    otherwise reach nothing, silently."""
    for host, spec in hosts.items():
        for name in spec.vars:
            if name not in declared:
                text = f"hosts.{host}.vars: '{name}' is not a var of the runbook (declare it under `vars:`)"
                pos.problem(("hosts", host, "vars", name), text, key=True, near=(name, declared))


def _shown(value: Any) -> str:
    return var_text(value) if isinstance(value, bool | int | float) else str(value)


def load_runbook(path: Path, inventory: Path | None = None) -> Runbook:
    """Read and validate a runbook (and the inventory laid over it); raise InvalidRunbook with every problem."""
    text = _read(path, "runbook")
    return parse_runbook(text, path, None if inventory is None else read_inventory(inventory))


#: The keys one of which a runbook (an inventory) has at its top: a file with none of them is neither.
SHAPE_KEYS = {"runbook": ("steps",), "inventory": ("hosts", "vars", "pools")}


def not_a_runbook(path: Path, inventory: bool = False) -> str | None:
    """Why the file is no runbook (with `inventory`: no inventory) at all, in one line quoting none of it, or
    None when it is shaped as one (its problems, if any, are then a runbook's). For a reader that must not
    show other files' content (the MCP server): the loader's problems name the keys and values of any YAML
    mapping. A file that cannot be read or is no YAML raises InvalidRunbook as `load_runbook` does."""
    what = "inventory" if inventory else "runbook"
    text, keys = _read(path, what), SHAPE_KEYS[what]
    expected = f"not a{'n' if inventory else ''} {what} (expected a YAML mapping with " + (
        "hosts, vars or pools" if inventory else "name, hosts and steps"
    )
    try:
        data, _ = _parse(text, str(path))
    except InvalidRunbook as exc:  # a YAML error's message may quote a piece (an alias, a tag): only its place
        if any(re.search(rf"^{key}\s*:", text, re.M) for key in keys):
            raise  # a runbook being written: its error as the loader says it
        where = exc.problems[0]
        return f"{path}:{where.line}:{where.column}: {expected}; a YAML error here): refused"
    if isinstance(data, dict) and (any(key in data for key in keys) or (inventory and not data)):
        return None
    return f"{path}: {expected}): refused"


def apply_inventory(runbook: Runbook, path: Path) -> Runbook:
    """The runbook as loaded, read again with an inventory file laid over it (a resumed run's carried one)."""
    return parse_runbook(runbook.text, runbook.path, read_inventory(path))


@dataclass(frozen=True)
class InventoryOverlay:
    """An inventory file, validated on its own: its data as written and where each value is in it."""

    path: Path
    data: dict[str, Any]
    model: Inventory
    pos: _Positions


def read_inventory(path: Path) -> InventoryOverlay:
    """Read and validate an inventory (hosts, vars and pools of one site); its own problems at its own lines."""
    data, pos = _parse(_read(path, "inventory"), str(path))
    if not isinstance(data, dict):
        raise InvalidRunbook([Problem(str(path), 1, 1, "expected a mapping with hosts, vars and pools")])
    _check_var_texts(data, pos)
    try:
        inventory = Inventory.model_validate(data)
    except ValidationError as exc:
        _report(exc, Inventory, (), pos)
        raise pos.invalid() from None
    return InventoryOverlay(path, data, inventory, pos)


def _lay_over(data: dict[str, Any], overlay: InventoryOverlay) -> dict[str, Any]:
    """The runbook's data with the inventory's hosts, vars and pools in place of its own, before anything
    is validated or expanded (a placed matrix spreads over the inventory's pool). An inventory names
    only what the runbook has (a typo reaches nothing, so it is refused), except the hosts that its own
    pools list: a site's pool has the hosts the site has."""
    inventory, pos = overlay.model, overlay.pos
    sections: dict[str, dict[str, Any]] = {
        key: value if isinstance(value := data.get(key), dict) else {} for key in ("hosts", "vars", "pools")
    }
    known_hosts: dict[str, Any] = sections["hosts"] or {LOCAL: None}
    pooled = {host for members in inventory.pools.values() for host in members}
    for section, known in (("hosts", known_hosts), ("vars", sections["vars"]), ("pools", sections["pools"])):
        for name in getattr(inventory, section):
            if name not in known and not (section == "hosts" and name in pooled):
                text = f"{section}: '{name}' is not in the runbook"
                if section == "hosts":
                    text += " (a host the runbook does not name is added by listing it in one of the inventory's pools)"
                pos.problem((section, name), text, key=True, near=(name, known))
    for pool, members in inventory.pools.items():
        for n, host in enumerate(members):
            if host not in known_hosts and host not in inventory.hosts:
                text = f"pools.{pool}: '{host}' is a host of neither the runbook nor this inventory"
                pos.problem(("pools", pool, n), text, near=(host, [*known_hosts, *inventory.hosts]))
    _check_host_vars(inventory.hosts, sections["vars"], pos)
    hosts = {
        name: _host_over(sections["hosts"].get(name), entry) for name, entry in overlay.data.get("hosts", {}).items()
    }
    for name, merged in hosts.items():
        if merged.get("address") is None:
            nulled = "address" in overlay.data["hosts"][name]
            why = (
                "`address: null` leaves the host without one"
                if nulled
                else "a host the runbook does not have needs its `address`"
            )
            pos.problem(("hosts", name, "address") if nulled else ("hosts", name), f"hosts.{name}: {why}", key=True)
    if pos.problems:
        raise pos.invalid()
    laid = {key: {**sections[key], **(overlay.data.get(key) or {})} for key in ("vars", "pools")}
    return {**data, **laid, "hosts": {**sections["hosts"], **hosts}}


def _host_over(base: Any, entry: dict[str, Any]) -> dict[str, Any]:
    """An inventory's host laid over the runbook's of that name, field by field, its `vars` name by name: a site
    file of `{address, user}` keeps the runbook's `identity_file`, `known_hosts` and `connect_timeout`."""
    base = base if isinstance(base, dict) else {}
    host = {**base, **entry}
    if isinstance(base.get("vars"), dict) and isinstance(entry.get("vars"), dict):
        host["vars"] = {**base["vars"], **entry["vars"]}
    return host


def _host_sources(
    data: dict[str, Any],
    pos: _Positions,
    origin: Literal["runbook", "inventory"],
    into: dict[str, dict[str, FieldSource]],
) -> None:
    """Note in `into` where each field of each host of `data` (a runbook's or an inventory's) is written, as
    (`origin`, FILE:LINE); a host var as `vars.NAME`. Noted later, an inventory's field takes the runbook's place."""
    hosts = data.get("hosts")
    for name, host in hosts.items() if isinstance(hosts, dict) else ():
        fields = into.setdefault(name, {})
        for key, value in host.items() if isinstance(host, dict) else ():
            if key == "vars" and isinstance(value, dict):
                fields |= {f"vars.{var}": (origin, _line(pos, ("hosts", name, key, var))) for var in value}
            else:
                fields[key] = (origin, _line(pos, ("hosts", name, key)))


def _line(pos: _Positions, loc: Loc) -> str:
    """`FILE:LINE` of the key at `loc`."""
    return f"{pos.file}:{pos.at(loc, key=True)[0]}"


def parse_runbook(text: str, path: Path, inventory: InventoryOverlay | None = None) -> Runbook:
    """Validate a runbook's text (with an inventory laid over it); raise InvalidRunbook with every problem."""
    data, pos = _parse(text, str(path))
    if not isinstance(data, dict):
        raise InvalidRunbook([Problem(str(path), 1, 1, "expected a mapping with name, hosts, steps")])
    _check_var_texts(data, pos)
    sources: dict[str, dict[str, FieldSource]] = {}
    _host_sources(data, pos, "runbook", sources)
    if inventory is not None:
        data = _lay_over(data, inventory)
        _host_sources(inventory.data, inventory.pos, "inventory", sources)
    try:
        header = RunbookHeader.model_validate(data)
    except ValidationError as exc:
        _report(exc, RunbookHeader, (), pos)
        header = None
    kinds = step_kinds()
    steps: list[StepSpec] = []
    locs: list[Loc] = []  # each valid step's position in the raw data
    raws: list[dict[str, Any]] = []  # each valid step's data as written (an instance's: substituted)
    broken: set[str] = set()  # ids of steps that did not validate: already reported, not "missing"
    fallbacks: dict[str, list[StepSpec]] = {}
    raw_steps: list[Any] = data["steps"] if isinstance(data.get("steps"), list) else []
    names = [name for section in ("vars", "secrets") if isinstance(data.get(section), dict) for name in data[section]]
    host_names = list(data["hosts"]) if isinstance(data.get("hosts"), dict) and data["hosts"] else [LOCAL]
    pools = _pools(data)
    pools = {**pools, "all": host_names}  # `all`, a reserved host name, is every host in the runbook's order
    expansion = expand(raw_steps, kinds, names, pools, pos)
    for entry in expansion.entries:
        raw, loc = _pool_hosts(entry.raw, kinds, pools), entry.loc
        label = entry.instance.id if entry.instance is not None else None
        _check_fallback_keys(raw, (*loc, "fallbacks"), pos)
        spec = _step(raw, kinds, loc, pos, label)
        if spec is None:
            if isinstance(raw, dict) and isinstance(raw.get("id"), str):
                broken.add(label or raw["id"])
            continue
        variants = [
            fb
            for j, override in enumerate(spec.fallbacks)
            if (fb := _fallback(raw, override, type(spec), (*loc, "fallbacks", j), pos, label)) is not None
        ]
        if label is not None:  # validated under the id as written; an instance's id holds its values
            spec, variants = (
                spec.model_copy(update={"id": label}),
                [v.model_copy(update={"id": label}) for v in variants],
            )
        steps.append(spec)
        locs.append(loc)
        raws.append(raw)
        fallbacks[spec.id] = variants
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
    runbook = Runbook(path, header, steps, fallbacks, sha256=digest, text=text) if header is not None else None
    if runbook is not None:
        runbook.secret_positions = {name: pos.at(("secrets", name), key=True) for name in runbook.header.secrets}
        runbook.names = _header_names(runbook.header, pos)
        runbook.host_sources = sources
        runbook.groups, runbook.instances = expansion.groups, expansion.instances
    if runbook is not None:
        _check_host_vars(runbook.hosts, runbook.header.vars, pos)
        _cross_check(runbook, locs, pos, broken, expansion)
        _check_with_runbook(runbook, locs, pos)
        runbook.warnings = _check_references(runbook, raws, locs, pos)
    if pos.problems or runbook is None:
        raise pos.invalid()
    return runbook


def _step(
    raw: Any, kinds: Mapping[str, type[StepSpec]], loc: Loc, pos: _Positions, instance: str | None = None
) -> StepSpec | None:
    if not isinstance(raw, dict):
        pos.problem(loc, f"{_loc_text(loc)}: expected a mapping with id, kind and the kind's parameters")
        return None
    kind = raw.get("kind")
    if kind is None:
        pos.problem(loc, f"{_loc_text(loc)}: missing required key 'kind' (one of: {known_kinds(kinds)})")
        return None
    model = kinds.get(str(kind))
    if model is None:
        hint = _did_you_mean(str(kind), kinds)
        pos.problem((*loc, "kind"), f"unknown step kind '{kind}'{hint} (known: {known_kinds(kinds)})")
        return None
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        _report(exc, model, loc, pos, instance)
        return None


def _fallback(
    raw: dict[str, Any], override: Any, model: type[StepSpec], loc: Loc, pos: _Positions, instance: str | None = None
) -> StepSpec | None:
    if not isinstance(override, dict) or set(override) & _FALLBACK_FORBIDDEN:
        return None  # reported by _check_fallback_keys
    try:
        return model.model_validate({**raw, **override, "fallbacks": []})
    except ValidationError as exc:
        _report(exc, model, loc, pos, instance)
        return None


def _check_fallback_keys(raw: Any, loc: Loc, pos: _Positions) -> None:
    overrides = raw.get("fallbacks") if isinstance(raw, dict) else None
    for j, override in enumerate(overrides if isinstance(overrides, list) else []):
        if not isinstance(override, dict):
            continue  # the step's own validation reports it
        for key in sorted(set(override) & _FALLBACK_FORBIDDEN):
            pos.problem((*loc, j, key), f"a fallback cannot change '{key}'", key=True)


def _mate_before(mates: Mapping[str, int], ref: str, base: str) -> bool:
    """Whether group mate `ref` comes before `base` (`mates`: the group's bases by place; one lookup each, where
    a list of those before each step made a 9000-step group quadratic)."""
    return ref in mates and mates[ref] < mates[base]


def _cross_check(runbook: Runbook, locs: list[Loc], pos: _Positions, broken: set[str], expansion: Expansion) -> None:
    """What each step says of the others, in run order: ids unique, hosts known and within the step-host pairs'
    limit, conditions and facts naming only steps that run before it."""
    hosts = runbook.hosts
    known = {*runbook.header.vars, *runbook.header.secrets}
    seen: dict[str, Loc] = {}
    bases: dict[str, Loc] = {}  # ids as written: two instances of one step share one
    done: dict[str, dict[str, int]] = {}  # group -> its bases seen so far, each with its place (`steps.MATE`)
    pairs = 0
    for step_loc, spec in zip(locs, runbook.steps, strict=True):
        loc: Loc = (*step_loc, "id")
        instance = runbook.instances.get(spec.id)
        base = instance.base if instance is not None else spec.id
        if bases.get(base, step_loc) != step_loc:
            pos.problem(loc, f"duplicate step id '{base}' (also step {int(bases[base][1]) + 1})")
        bases.setdefault(base, step_loc)
        seen.setdefault(spec.id, step_loc)
        mates = done.setdefault(instance.group, {}) if instance is not None else {}
        if instance is not None:
            mates.setdefault(base, len(mates))
        runbook.step_positions.setdefault(spec.id, pos.at(step_loc))
        runbook.step_hosts[spec.id] = _hosts_of(spec, hosts, runbook.header.pools, step_loc, pos)
        # each fallback renders again, a node group on each node: 150 instances of 16 fallbacks on 64 nodes took 70 s
        variants = [spec, *runbook.fallbacks.get(spec.id, [])]
        pairs += len(runbook.step_hosts[spec.id]) * sum(1 + len(v.peer_hosts()) for v in variants)
        if pairs > MAX_STEP_HOSTS:  # before anything renders them: `hosts: all` of 10 000 hosts x 10 000 steps
            counted = "each fallback and node counted"
            text = f"the steps run on more than {MAX_STEP_HOSTS} step-host pairs ({counted}; the limit)"
            pos.refuse(pos.at(step_loc), text)
        _check_peers(spec, runbook.fallbacks.get(spec.id, []), hosts, step_loc, pos)
        _check_conditions(spec, runbook.fallbacks.get(spec.id, []), step_loc, pos, expansion, mates, seen)
        _check_uses(spec, step_loc, pos, expansion, known, seen, broken)


def _check_conditions(
    spec: StepSpec,
    fallbacks: list[StepSpec],
    step_loc: Loc,
    pos: _Positions,
    expansion: Expansion,
    mates: dict[str, int],
    seen: Mapping[str, Loc],
) -> None:
    """Each gate and `when` of the step and its fallbacks parses, and names only steps that run before it
    (earlier steps, earlier group mates), none inside another group."""
    instance = expansion.instances.get(spec.id)
    base = instance.base if instance is not None else spec.id
    checked: set[str] = set()  # a fallback's gates are mostly the step's own: each text is checked once
    for variant_index, variant in enumerate([spec, *fallbacks]):
        conditions = [
            (f"gate '{g.that}'", g.that, (*step_loc, "gates", g_index, "that"))
            for g_index, g in enumerate(variant.effective_gates())
        ]
        if variant.when is not None:
            conditions.append((f"when '{variant.when.that}'", variant.when.that, (*step_loc, "when")))
        for what, that, where in conditions:
            if that in checked:
                continue
            checked.add(that)
            where = where if variant_index == 0 else (*step_loc, "fallbacks")
            problem = syntax_error(that)
            if problem:
                pos.problem(where, f"{what} does not parse: {problem}")
            for ref in step_refs(that):
                if (why := _into_group(ref, expansion, instance)) is not None:
                    pos.problem(where, why)
                elif not _mate_before(mates, ref, base) and (ref not in seen or ref in (spec.id, base)):
                    text = f"{what.split(' ')[0]} refers to step '{ref}', which does not run before '{base}'"
                    pos.problem(where, text)


def _check_uses(
    spec: StepSpec,
    step_loc: Loc,
    pos: _Positions,
    expansion: Expansion,
    known: set[str],
    seen: Mapping[str, Loc],
    broken: set[str],
) -> None:
    """The vars and secrets a step's `pass_env` names exist, and the steps its parameters use the facts of
    (`needs`, those its conditions name aside) run before it."""
    instance = expansion.instances.get(spec.id)
    for n, name in enumerate(spec.pass_env or []):
        if not any(c in name for c in "*?[") and name not in known:
            text = f"step '{spec.id}': pass_env names '{name}', which is neither a var nor a secret"
            pos.problem((*step_loc, "pass_env", n), text, near=(name, known))
    conditions_refs = {ref for gate in spec.effective_gates() for ref in step_refs(gate.that)}
    conditions_refs |= set(step_refs(spec.when.that)) if spec.when is not None else set()
    for ref in sorted(spec.needs() - conditions_refs - broken):  # a parameter naming a step (server:, ...)
        if (why := _into_group(ref, expansion, instance)) is not None:
            pos.problem(step_loc, why)
        elif ref not in seen or ref == spec.id:
            text = f"step '{spec.id}' uses the facts of step '{ref}', which does not run before it"
            pos.problem(step_loc, text, near=(ref, list(seen) if len(seen) <= MAX_HINT_CHOICES else ()))


def _check_with_runbook(runbook: Runbook, locs: list[Loc], pos: _Positions) -> None:
    """Each step's problems with the other steps (`StepSpec.check_runbook`), at the step."""
    by_id = {spec.id: spec for spec in runbook.steps}
    for step_loc, spec in zip(locs, runbook.steps, strict=True):
        for text in spec.check_runbook(by_id):
            pos.problem(step_loc, f"step '{spec.id}': {text}")


def _check_references(runbook: Runbook, raws: list[dict[str, Any]], locs: list[Loc], pos: _Positions) -> list[Problem]:
    """Every `$name` of a step's parameters names a var or secret of the runbook (its inventory's and `--var`
    set only those), the step's `matrix_*` environment or the host's (`$HOME`): another is a problem, with the
    names it may be a typo of. A gate's or `when`'s `vars.NAME` names a var. A script's `$NAME` that none of
    these is, nor set by the script itself, is a warning (returned, in the order of the file)."""
    header = runbook.header
    warnings: dict[Problem, None] = {}
    scripts_checked: set[tuple[Loc, frozenset[str]]] = set()  # a matrix's instances share their scripts
    for raw, step_loc, spec in zip(raws, locs, runbook.steps, strict=True):
        instance = runbook.instances.get(spec.id)
        base = instance.base if instance is not None else spec.id
        defined = {*header.vars, *header.secrets, *matrix_environment(instance.values if instance else {})}
        scripts, where = type(spec).script_fields, (step_loc, f"step '{base}'")
        script_key = (step_loc, frozenset(defined))
        new_scripts = script_key not in scripts_checked
        scripts_checked.add(script_key)
        for key, value, loc in _fields(raw, step_loc):
            if key in _JINJA_FIELDS:
                _check_gate_vars(value, loc, where, header.vars, pos)
            elif key in scripts:
                warnings.update(dict.fromkeys(_script_warnings(value, loc, where, defined, pos) if new_scripts else ()))
            elif key not in StepSpec.COMMON_FIELDS and key not in type(spec).literal_fields:
                _check_parameter_vars(value, loc, where, defined, pos)
    found = sorted(warnings, key=lambda p: (p.line, p.column))
    if len(found) <= MAX_PROBLEMS:
        return found
    more = f"warning: more warnings from here on; only the first {MAX_PROBLEMS} are shown (the limit)"
    return [*found[:MAX_PROBLEMS], dataclasses.replace(found[MAX_PROBLEMS], message=more)]


#: A step's position and how a message names it (`step 'deploy'`: an instance by its id as written).
_StepAt = tuple[Loc, str]


def _check_parameter_vars(value: Any, key_loc: Loc, step: _StepAt, defined: set[str], pos: _Positions) -> None:
    """A parameter's `$name`s: each a var or secret (or the host's environment), else a problem at its column.
    A text's first MAX_PROBLEMS + 1 are all a report can show (each later one is past them in the file): finding
    where each of 20 000 is written took a minute."""
    for text, loc in _texts(value, key_loc):
        found = (ref for ref in parameter_names(text) if ref[1] not in defined and not is_environment(ref[1]))
        for offset, name in itertools.islice(found, MAX_PROBLEMS + 1) if "$" in text else ():
            said = f"{step[1]}: {_loc_text(loc[len(step[0]) :])}: ${name} is not a var or secret of the runbook"
            problem = Problem(pos.file, *pos.occurrence(loc, text, offset), f"{said} (declare it under `vars:`)")
            pos.problems.append(problem)
            pos.hints[problem] = (name, defined)


def _check_gate_vars(value: Any, key_loc: Loc, step: _StepAt, declared: Collection[str], pos: _Positions) -> None:
    """A gate's or `when`'s `vars.NAME`: a var of the runbook (a gate sees no secret)."""
    for text, loc in _texts(value, key_loc):
        if "vars" not in text or syntax_error(text):  # one that does not parse is reported as such
            continue
        for name in var_refs(text):
            if name != "*" and name not in declared:
                said = f"{step[1]}: {_loc_text(loc[len(step[0]) :])}: vars.{name} is not a var of the runbook"
                pos.problem(loc, said, near=(name, declared))


def _script_warnings(value: Any, key_loc: Loc, step: _StepAt, defined: set[str], pos: _Positions) -> Iterator[Problem]:
    """A script's `$NAME`s that are neither defined (`defined`, the environment) nor set by the script: the first
    MAX_PROBLEMS + 1 of a text, as `_check_parameter_vars` takes."""
    for text, loc in _texts(value, key_loc):
        for offset, name in unknown_in_script(text, defined)[: MAX_PROBLEMS + 1] if "$" in text else ():
            said = f"warning: {step[1]}: {_loc_text(loc[len(step[0]) :])}: ${name} is neither a var or secret of "
            said += "the runbook nor set in the script"
            yield Problem(pos.file, *pos.occurrence(loc, text, offset), said + _did_you_mean(name, defined))


def _into_group(ref: str, expansion: Expansion, instance: Instance | None) -> str | None:
    """Why a step cannot name step `ref`, a matrix step of another group (or of a group, from outside one),
    or None: a matrix step is one instance per cell, so only its group mates name it (each then gets the
    same cell's instance)."""
    group = expansion.member_of.get(ref) or (expansion.instances[ref].group if ref in expansion.instances else None)
    if group is None or (instance is not None and instance.group == group):
        return None
    return f"'{ref}' is a matrix step of group '{group}': only its group mates can refer to it"


def _pools(data: dict[str, Any]) -> dict[str, list[str]]:
    """The pools as written, where they are well formed (the header's validation reports the rest)."""
    pools = data.get("pools")
    if not isinstance(pools, dict):
        return {}
    return {
        name: members
        for name, members in pools.items()
        if isinstance(members, list) and all(isinstance(m, str) for m in members)
    }


def _pool_hosts(raw: Any, kinds: Mapping[str, type[StepSpec]], pools: Mapping[str, list[str]]) -> Any:
    """A step's data with a pool's name in a host-list parameter (`StepSpec.host_list_fields`) replaced by
    the pool's hosts; any other text stays, and is refused as a host the runbook does not have."""
    model = kinds.get(str(raw.get("kind"))) if isinstance(raw, dict) else None
    if model is None:
        return raw
    named = {key: raw[key] for key in model.host_list_fields if isinstance(raw.get(key), str)}
    return {**raw, **{key: pools.get(name, [name]) for key, name in named.items()}}


def _where_named(spec: StepSpec, host: str) -> Loc:
    """Where in the step a parameter names `host` (`("nodes", 1)`): the key a problem with it is reported at."""
    for name in type(spec).model_fields:
        if name in StepSpec.COMMON_FIELDS:
            continue
        value = getattr(spec, name)
        if value == host:
            return (name,)
        if isinstance(value, list) and host in value:
            return (name, value.index(host))
    return ()


def _check_peers(spec: StepSpec, fallbacks: list[StepSpec], hosts: dict[str, Host], loc: Loc, pos: _Positions) -> None:
    """The hosts a step's parameters name (`peer_hosts`, `own_hosts`) are the runbook's, each refused at the key
    that names it; a fallback keeps the step's own hosts (it cannot move the step)."""
    own = spec.own_hosts()
    for name in dict.fromkeys([*(own or []), *spec.peer_hosts()]):
        if name not in hosts:
            pos.problem(
                (*loc, *_where_named(spec, name)), f"step '{spec.id}': unknown host '{name}'", near=(name, hosts)
            )
    for j, fallback in enumerate(fallbacks):
        if fallback.own_hosts() != own:
            pos.problem((*loc, "fallbacks", j), f"step '{spec.id}': a fallback cannot change the hosts it runs on")
        for name in fallback.peer_hosts():
            if name not in hosts:
                text = f"step '{spec.id}': unknown host '{name}' (fallback {j + 1})"
                pos.problem((*loc, "fallbacks", j, *_where_named(fallback, name)), text, near=(name, hosts))


def _hosts_of(
    spec: StepSpec, hosts: dict[str, Host], pools: Mapping[str, list[str]], loc: Loc, pos: _Positions
) -> list[str]:
    own = spec.own_hosts()
    if own is not None:  # the step's parameters decide: `host:`/`hosts:` may only say the same
        given = [spec.host] if spec.host is not None else spec.hosts
        if given is not None and given != own:
            key = "host" if spec.host is not None else "hosts"
            where = _loc_text(_where_named(spec, own[0])) if own else "its parameters"
            shown = given if isinstance(given, str) else ", ".join(given)
            text = (
                f"step '{spec.id}' runs on {', '.join(own)} ({where}); `{key}: {shown}` says otherwise "
                f"(leave `{key}:` out)"
            )
            pos.problem((*loc, key), text, key=True)
        return [name for name in own if name in hosts]
    if spec.host is not None and spec.hosts is not None:
        pos.problem(loc, f"step '{spec.id}': give either host or hosts, not both")
        return []
    if spec.hosts == "all":
        return list(hosts)
    if isinstance(spec.hosts, str):
        if spec.hosts in pools:
            return [name for name in pools[spec.hosts] if name in hosts]  # members are checked with the pools
        hint = f"; '{spec.hosts}' is a host: `host: {spec.hosts}`" if spec.hosts in hosts else ""
        text = f"step '{spec.id}': hosts: '{spec.hosts}' is neither `all` nor a pool of the runbook{hint}"
        pos.problem((*loc, "hosts"), text, near=(spec.hosts, pools) if not hint else None)
        return []
    wanted = [spec.host] if spec.host is not None else spec.hosts
    if wanted is None:
        if len(hosts) == 1:
            return list(hosts)
        pos.problem(loc, f"step '{spec.id}' needs `host:`; the runbook defines {len(hosts)} hosts")
        return []
    key = "host" if spec.host is not None else "hosts"
    for name in wanted:
        if name not in hosts:
            pos.problem((*loc, key), f"step '{spec.id}': unknown host '{name}'", near=(name, hosts))
    return [name for name in wanted if name in hosts]


def secret_values(runbook: Runbook, environ: Mapping[str, str], *, required: bool = True) -> dict[str, str]:
    """The values of the runbook's secrets, read from `environ` (the controller's environment).

    Read at the start of a run, before anything connects or a run folder is written; every problem is
    at its secret's declaration (FILE:LINE:COL), and no message holds a value. A value shorter than
    MIN_SECRET_CHARS (without surrounding whitespace) is refused: redacting it by value would mask
    ordinary text and spell it out. An empty variable counts as unset: a required secret that is
    unset or empty is refused, an optional one is absent. `required=False` (`runbook plan`, which
    runs nothing) leaves out every secret that has no value instead of refusing it.
    """
    values: dict[str, str] = {}
    problems: list[Problem] = []
    for name, ref in runbook.header.secrets.items():
        value = environ.get(ref.env)
        why = _secret_problem(name, ref, value, required and ref.required)
        if why is not None:
            problems.append(Problem(str(runbook.path), *runbook.secret_positions.get(name, (1, 1)), why))
        elif value is not None and value.strip():
            values[name] = value
            problems.extend(_secret_in_ids(runbook, name, value))
    if problems:
        raise InvalidRunbook(problems)
    return values


def _secret_in_ids(runbook: Runbook, name: str, value: str) -> list[Problem]:
    """The first step id, matrix cell id, matrix value or name (of the runbook, a host, pool, var or secret)
    holding the secret (a value pasted from it): ids and names are stored in state.db and run.json and shown
    by `runbook status` and `runs` as written, and a matrix value, each field of a mapping and each item of a
    list too, is written as it is into the campaign report (report.json, report.md, the figures' labels) and
    the events' `cell`: none is masked, so such a run is refused."""
    redactor = Redactor([value])
    named = [(spec.id, runbook.step_positions.get(spec.id, (1, 1)), "step id") for spec in runbook.steps]
    named += [(f"{g.name}[{cell.id}]", g.position, "matrix cell") for g in runbook.groups for cell in g.cells]
    named += [(text, g.position, what) for g in runbook.groups for text, what in _matrix_texts(g)]
    named += runbook.names
    for text, (line, col), what in named:
        if (shown := redactor.text(text)) != text:
            why = f"secret {name}: its value is in the {what} '{shown}' (ids, names, matrix values are shown unmasked)"
            return [Problem(str(runbook.path), line, col, redactor.text(why))]
    return []


def _header_names(header: RunbookHeader, pos: _Positions) -> list[tuple[str, tuple[int, int], str]]:
    """The runbook's name and each host, pool, var and secret name, with its position and what it is."""
    named = [(header.name, pos.at(("name",)), "runbook name")]
    for section, what in (("hosts", "host"), ("pools", "pool"), ("vars", "var"), ("secrets", "secret")):
        named += [(name, pos.at((section, name), key=True), f"{what} name") for name in getattr(header, section)]
    return named


def _matrix_texts(group: MatrixGroup) -> list[tuple[str, str]]:
    """Every text of a matrix's values, each with what it is (`matrix axis 'drafter' value 'zlab', field
    'repo'`): a scalar's text, and of a mapping each field's name, its scalar's text or each list item's."""
    texts: list[tuple[str, str]] = []
    for axis, axis_values in group.axes.items():
        for item in axis_values:
            where = f"matrix axis '{axis}' value"
            texts.append((value_text(item), where))
            if not isinstance(item, Mapping):
                continue
            for field_name, field_value in item.items():
                texts.append((field_name, f"{where} '{value_text(item)}', a field name"))
                for part in field_value if isinstance(field_value, list) else [field_value]:
                    if part is not None:
                        texts.append((value_text(part), f"{where} '{value_text(item)}', field '{field_name}'"))
    return texts


def _secret_problem(name: str, ref: SecretRef, value: str | None, required: bool) -> str | None:
    """Why a secret's value (None: its variable is unset) cannot be used, or None."""
    if value is None or not value.strip():
        if not required:
            return None
        said = "is not set" if value is None else "is empty"
        return f"secret {name}: environment variable {ref.env} {said} (`required: false` allows it to be absent)"
    if len(value.strip()) < MIN_SECRET_CHARS:
        return (
            f"secret {name}: the value of environment variable {ref.env} has fewer than {MIN_SECRET_CHARS} "
            "characters (surrounding whitespace left out); a secret that short cannot be redacted by value "
            "without masking ordinary text and so spelling itself out"
        )
    if env_text_problem(value) is not None:
        return (
            f"secret {name}: the value of environment variable {ref.env} is not valid UTF-8 (Python holds its "
            "bytes as lone surrogates); a secret reaches a host, and is redacted, as UTF-8 text"
        )
    return None
