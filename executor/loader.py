"""Load and validate a runbook, reporting every problem as `FILE:LINE:COL: message`.

PyYAML builds a node tree with positions; we turn it into plain data ourselves so that each
value's position is known and duplicate keys (which PyYAML silently collapses) are found.
Pydantic validates the data; its error locations are mapped back to lines and columns.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from executor.errors import InvalidRunbook, Problem
from executor.gates import step_refs, syntax_error
from executor.model import Host, Inventory, RunbookHeader, SecretRef
from executor.redact import MIN_SECRET_CHARS
from executor.stepkind import StepSpec, step_kinds

Loc = tuple[str | int, ...]
LOCAL = "local"
_FALLBACK_FORBIDDEN = {"id", "kind", "host", "hosts", "fallbacks"}


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

    @property
    def name(self) -> str:
        return self.header.name

    @property
    def hosts(self) -> dict[str, Host]:
        return self.header.hosts or {LOCAL: Host(address=LOCAL)}


class _Positions:
    """Where each value (and each mapping key) of the document starts."""

    def __init__(self, file: str) -> None:
        self.file = file
        self.values: dict[Loc, tuple[int, int]] = {}
        self.keys: dict[Loc, tuple[int, int]] = {}
        self.problems: list[Problem] = []

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

    def problem(self, loc: Loc, message: str, *, key: bool = False) -> None:
        line, column = self.at(loc, key=key)
        self.problems.append(Problem(self.file, line, column, message))


def _mark(node: yaml.Node) -> tuple[int, int]:
    return node.start_mark.line + 1, node.start_mark.column + 1


# libyaml's parser where PyYAML was built with it: 40x faster on large scripts, same marks and nodes
_Loader: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _build(loader: yaml.SafeLoader, node: yaml.Node, loc: Loc, pos: _Positions) -> Any:
    pos.values[loc] = _mark(node)
    if isinstance(node, yaml.MappingNode):
        seen: dict[Any, yaml.Node] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = loader.construct_object(key_node)
            if key in seen:
                line = _mark(seen[key])[0]
                pos.problems.append(
                    Problem(pos.file, *_mark(key_node), f"duplicate key '{key}' (first defined at line {line})")
                )
            seen[key] = key_node
        loader.flatten_mapping(node)
        result: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            key = loader.construct_object(key_node)
            pos.keys[(*loc, key)] = _mark(key_node)
            result[key] = _build(loader, value_node, (*loc, key), pos)
        return result
    if isinstance(node, yaml.SequenceNode):
        return [_build(loader, item, (*loc, i), pos) for i, item in enumerate(node.value)]
    return loader.construct_object(node)


def _reader_problem(exc: yaml.reader.ReaderError, text: str, file: str) -> Problem:
    """A character YAML does not allow, at its line and column."""
    before = text[: exc.position]
    line, column = before.count("\n") + 1, len(before) - (before.rfind("\n") + 1) + 1
    return Problem(file, line, column, f"YAML error: {exc.reason} (character {exc.character:#x})")


def _parse(text: str, file: str) -> tuple[Any, _Positions]:
    pos = _Positions(file)
    try:
        loader = _Loader(text)
    except yaml.reader.ReaderError as exc:
        raise InvalidRunbook([_reader_problem(exc, text, file)]) from None
    try:
        node = loader.get_single_node()
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


def _did_you_mean(word: str, choices: typing.Iterable[str]) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f"; did you mean '{close[0]}'?" if close else ""


def _loc_text(loc: Loc) -> str:
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def _report(exc: ValidationError, model: type[BaseModel], prefix: Loc, pos: _Positions) -> None:
    for error in exc.errors():
        loc = tuple(error["loc"])
        full = (*prefix, *loc)
        kind = error["type"]
        if kind == "extra_forbidden":
            owner = _model_at(model, loc[:-1])
            hint = _did_you_mean(str(loc[-1]), owner.model_fields if owner else ())
            pos.problem(full, f"unknown key '{loc[-1]}'{hint}", key=True)
        elif kind == "missing":
            where = _loc_text(full[:-1]) or "the runbook"
            pos.problem(full[:-1], f"{where}: missing required key '{loc[-1]}'")
        else:
            message = str(error["msg"]).removeprefix("Value error, ")
            pos.problem(full, f"{_loc_text(full)}: {message}")


def _read(path: Path, what: str) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidRunbook([Problem(str(path), 1, 1, f"cannot read the {what}: {exc}")]) from None


def load_runbook(path: Path, inventory: Path | None = None) -> Runbook:
    """Read and validate a runbook (and the inventory laid over it); raise InvalidRunbook with every problem."""
    runbook = parse_runbook(_read(path, "runbook"), path)
    return runbook if inventory is None else apply_inventory(runbook, inventory)


def apply_inventory(runbook: Runbook, path: Path) -> Runbook:
    """Replace hosts and vars of the runbook by those of an inventory file; unknown names are errors."""
    data, pos = _parse(_read(path, "inventory"), str(path))
    if not isinstance(data, dict):
        raise InvalidRunbook([Problem(str(path), 1, 1, "expected a mapping with hosts and vars")])
    try:
        inventory = Inventory.model_validate(data)
    except ValidationError as exc:
        _report(exc, Inventory, (), pos)
        raise InvalidRunbook(pos.problems) from None
    for section, known in (("hosts", runbook.hosts), ("vars", runbook.header.vars)):
        for name in getattr(inventory, section):
            if name not in known:
                hint = _did_you_mean(name, known)
                pos.problem((section, name), f"{section}: '{name}' is not in the runbook{hint}", key=True)
    if pos.problems:
        raise InvalidRunbook(pos.problems)
    header = runbook.header.model_copy(
        update={"hosts": {**runbook.hosts, **inventory.hosts}, "vars": {**runbook.header.vars, **inventory.vars}}
    )
    return dataclasses.replace(runbook, header=header)


def parse_runbook(text: str, path: Path) -> Runbook:
    data, pos = _parse(text, str(path))
    if not isinstance(data, dict):
        raise InvalidRunbook([Problem(str(path), 1, 1, "expected a mapping with name, hosts, steps")])
    try:
        header = RunbookHeader.model_validate(data)
    except ValidationError as exc:
        _report(exc, RunbookHeader, (), pos)
        header = None
    kinds = step_kinds()
    steps: list[StepSpec] = []
    indices: list[int] = []  # each valid step's position in the raw list
    broken: set[str] = set()  # ids of steps that did not validate: already reported, not "missing"
    fallbacks: dict[str, list[StepSpec]] = {}
    raw_steps: list[Any] = data["steps"] if isinstance(data.get("steps"), list) else []
    for index, raw in enumerate(raw_steps):
        _check_fallback_keys(raw, ("steps", index, "fallbacks"), pos)
        spec = _step(raw, kinds, ("steps", index), pos)
        if spec is None:
            if isinstance(raw, dict) and isinstance(raw.get("id"), str):
                broken.add(raw["id"])
            continue
        steps.append(spec)
        indices.append(index)
        fallbacks[spec.id] = [
            fb
            for j, override in enumerate(spec.fallbacks)
            if (fb := _fallback(raw, override, type(spec), ("steps", index, "fallbacks", j), pos)) is not None
        ]
    runbook = Runbook(path, header, steps, fallbacks) if header is not None else None
    if runbook is not None:
        runbook.secret_positions = {name: pos.at(("secrets", name), key=True) for name in runbook.header.secrets}
    if runbook is not None:
        _cross_check(runbook, indices, pos, broken)
    if pos.problems or runbook is None:
        raise InvalidRunbook(sorted(pos.problems, key=lambda p: (p.line, p.column)))
    return runbook


def _step(raw: Any, kinds: dict[str, type[StepSpec]], loc: Loc, pos: _Positions) -> StepSpec | None:
    if not isinstance(raw, dict):
        pos.problem(loc, f"{_loc_text(loc)}: expected a mapping with id, kind and the kind's parameters")
        return None
    kind = raw.get("kind")
    if kind is None:
        pos.problem(loc, f"{_loc_text(loc)}: missing required key 'kind' (one of: {', '.join(sorted(kinds))})")
        return None
    model = kinds.get(str(kind))
    if model is None:
        hint = _did_you_mean(str(kind), kinds)
        pos.problem((*loc, "kind"), f"unknown step kind '{kind}'{hint} (known: {', '.join(sorted(kinds))})")
        return None
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        _report(exc, model, loc, pos)
        return None


def _fallback(raw: dict[str, Any], override: Any, model: type[StepSpec], loc: Loc, pos: _Positions) -> StepSpec | None:
    if not isinstance(override, dict) or set(override) & _FALLBACK_FORBIDDEN:
        return None  # reported by _check_fallback_keys
    try:
        return model.model_validate({**raw, **override, "fallbacks": []})
    except ValidationError as exc:
        _report(exc, model, loc, pos)
        return None


def _check_fallback_keys(raw: Any, loc: Loc, pos: _Positions) -> None:
    overrides = raw.get("fallbacks") if isinstance(raw, dict) else None
    for j, override in enumerate(overrides if isinstance(overrides, list) else []):
        if not isinstance(override, dict):
            continue  # the step's own validation reports it
        for key in sorted(set(override) & _FALLBACK_FORBIDDEN):
            pos.problem((*loc, j, key), f"a fallback cannot change '{key}'", key=True)


def _cross_check(runbook: Runbook, indices: list[int], pos: _Positions, broken: set[str]) -> None:
    hosts = runbook.hosts
    seen: dict[str, int] = {}
    for index, spec in zip(indices, runbook.steps, strict=True):
        loc: Loc = ("steps", index, "id")
        if spec.id in seen:
            pos.problem(loc, f"duplicate step id '{spec.id}' (also step {seen[spec.id] + 1})")
        seen.setdefault(spec.id, index)
        runbook.step_positions.setdefault(spec.id, pos.at(loc[:-1]))
        runbook.step_hosts[spec.id] = _hosts_of(spec, hosts, loc[:-1], pos)
        for variant_index, variant in enumerate([spec, *runbook.fallbacks.get(spec.id, [])]):
            for g, gate in enumerate(variant.effective_gates()):
                gate_loc = (*loc[:-1], "gates", g, "that") if variant_index == 0 else (*loc[:-1], "fallbacks")
                problem = syntax_error(gate.that)
                if problem:
                    pos.problem(gate_loc, f"gate '{gate.that}' does not parse: {problem}")
                for ref in step_refs(gate.that):
                    if ref not in seen or ref == spec.id:
                        pos.problem(gate_loc, f"gate refers to step '{ref}', which does not run before '{spec.id}'")
        known = {*runbook.header.vars, *runbook.header.secrets}
        for n, name in enumerate(spec.pass_env or []):
            if not any(c in name for c in "*?[") and name not in known:
                text = f"step '{spec.id}': pass_env names '{name}', which is neither a var nor a secret"
                pos.problem((*loc[:-1], "pass_env", n), text + _did_you_mean(name, known))
        gate_refs = {ref for gate in spec.effective_gates() for ref in step_refs(gate.that)}
        for ref in sorted(spec.needs() - gate_refs - broken):  # a parameter naming a step (server:, ...)
            if ref not in seen or ref == spec.id:
                text = f"step '{spec.id}' uses the facts of step '{ref}', which does not run before it"
                pos.problem(loc[:-1], text + _did_you_mean(ref, seen))


def _hosts_of(spec: StepSpec, hosts: dict[str, Host], loc: Loc, pos: _Positions) -> list[str]:
    if spec.host is not None and spec.hosts is not None:
        pos.problem(loc, f"step '{spec.id}': give either host or hosts, not both")
        return []
    if spec.hosts == "all":
        return list(hosts)
    wanted = [spec.host] if spec.host is not None else spec.hosts
    if wanted is None:
        if len(hosts) == 1:
            return list(hosts)
        pos.problem(loc, f"step '{spec.id}' needs `host:`; the runbook defines {len(hosts)} hosts")
        return []
    key = "host" if spec.host is not None else "hosts"
    for name in wanted:
        if name not in hosts:
            hint = _did_you_mean(name, hosts)
            pos.problem((*loc, key), f"step '{spec.id}': unknown host '{name}'{hint}")
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
    if problems:
        raise InvalidRunbook(problems)
    return values


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
    if not is_utf8(value):
        return (
            f"secret {name}: the value of environment variable {ref.env} is not valid UTF-8 (Python holds its "
            "bytes as lone surrogates); a secret reaches a host, and is redacted, as UTF-8 text"
        )
    return None


def is_utf8(text: str) -> bool:
    """Whether `text` can be written as UTF-8: one read from the environment or argv holds the bytes
    that are not UTF-8 as lone surrogates (surrogateescape), which no encoder writes."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
