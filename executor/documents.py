"""What every report shows, typed once for its writers and its readers, and the version its documents carry.

report.json (steps/benchmark_report.py's `Report`, steps/campaign_report_document.py's `CampaignReport`) and
the plan document (executor/runbook/planner.py's `PlanDocument`) carry `schema_version`; `runbook schema --report`
and `--plan` print their JSON Schemas. A report's part that `runbook report` prints and report.md shows,
whatever the report is of, is `Shown`: the writers' pydantic models hold these dataclasses as their fields
(pydantic validates them and writes their schema), and `read_shown` reads them back from report.json with
no pydantic, which `runbook report` does not import (it starts fast: tests/executor/test_startup.py).
"""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Final

#: The version of the documents' shape this runbook writes and reads: a reader refuses a larger one (a newer
#: runbook's), and reads a document without one (written before documents carried it) as this one.
SCHEMA_VERSION: Final = 1
VERSION_KEY = "schema_version"
#: A figure's path: a file of the run folder, relative to it: not absolute, no `..` part, not the folder itself
#: (`.`), no NUL. Also the `pattern` of `runbook schema --report` (an ECMA-262 regular expression as well).
FIGURE_PATH = re.compile(r"^(?!/)(?!(\./)*\.?$)(?!([^/]*/)*\.\.(/|$))[^\x00]+$")


@dataclass(frozen=True)
class Table:
    """A table of a report: every cell is display text, formatted once by the writer."""

    title: str
    columns: list[str]
    rows: list[list[str]]

    def __post_init__(self) -> None:
        """A row of another width than the columns would be drawn under the wrong heads (or as new columns)."""
        odd = next((n for n, row in enumerate(self.rows) if len(row) != len(self.columns)), None)
        if odd is not None:
            raise ValueError(f"rows[{odd}] has {len(self.rows[odd])} cells for {len(self.columns)} columns")


@dataclass(frozen=True)
class Figure:
    title: str
    path: str  # relative to the run folder

    def __post_init__(self) -> None:
        """A figure is a file of the run folder: a path that is absolute or climbs out of it (`../../etc/passwd`,
        a tampered report.json's) would name another file as this run's."""
        if not FIGURE_PATH.match(self.path):
            raise ValueError(f"path {self.path!r} is no file of the run folder (a relative path without ..)")


@dataclass(frozen=True)
class Shown:
    """What `runbook report` prints and report.md shows, whatever the report is of (its other keys: the
    writer's business)."""

    title: str
    notes: list[str] = field(default_factory=list)
    tables: list[Table] = field(default_factory=list)
    figures: list[Figure] = field(default_factory=list)


@dataclass(frozen=True)
class Provenance:
    """What a report's `provenance` must hold for `runbook report` to show its numbers: which commits, servers,
    GPUs and commands they are of (steps/provenance.py's `Provenance` writes these and more; a test keeps them
    its fields). Each of the types JSON gives it: `"repos": null` or an empty text says nothing either."""

    generated_at: str
    repos: list[Any]
    deployments: list[Any]
    gpus: dict[str, Any] | None
    benchmarks: list[Any]
    unknown: dict[str, Any]


#: A report's `provenance`: one (a benchmark's), or one per host, keyed by host (a campaign's).
Provenanced = Provenance | dict[str, Provenance]


class NewerDocument(ValueError):
    """A document of a schema_version this runbook does not know: a newer runbook wrote it."""


def version_of(document: dict[str, Any]) -> int:
    """The document's schema_version (SCHEMA_VERSION where it has none); NewerDocument past it."""
    version = document.get(VERSION_KEY, SCHEMA_VERSION)
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise TypeError(f"{VERSION_KEY}: expected a whole number from 1, got {version!r}")
    if version > SCHEMA_VERSION:
        raise NewerDocument(
            f"{VERSION_KEY} {version}, written by a newer runbook (this one reads up to {SCHEMA_VERSION}): "
            "read it with that runbook"
        )
    return version


def read_shown(document: Any) -> Shown:
    """report.json's `Shown` part, typed as the dataclasses say; TypeError or KeyError naming the key (and
    NewerDocument) where the document is not shaped so."""
    if not isinstance(document, dict):
        raise TypeError(f"expected an object, got {type(document).__name__}")
    version_of(document)
    return typing.cast(Shown, _read(Shown, document, "report"))


def provenance_lacks(provenance: Any) -> str | None:
    """What a report's `provenance` lacks of `Provenanced`, in words; None when it says what its numbers are of.
    Read as one first, else (an object of objects) as one per host, whatever their names (a host may be
    named `gpus`)."""
    if provenance is None or provenance == {}:
        return "no provenance" if provenance is None else "an empty provenance"
    one = _lacks(Provenance, provenance)
    if one is None or not isinstance(provenance, dict) or not all(isinstance(v, dict) for v in provenance.values()):
        return one
    said = [f"host {host}: {lacks}" for host, each in provenance.items() if (lacks := _lacks(Provenance, each))]
    return "; ".join(said) or None


def _lacks(kind: type[Any], value: Any) -> str | None:
    """What `value` lacks of the dataclass `kind`: its missing fields, else those of another type (or empty)."""
    if not isinstance(value, dict):
        return f"a provenance that is {type(value).__name__}"
    hints = _hints(kind)
    fields = [f.name for f in dataclasses.fields(kind)]
    if missing := [name for name in fields if name not in value]:
        return f"a provenance without {', '.join(missing)}"
    wrong = [
        f"{name} is {'empty' if value[name] == '' else type(value[name]).__name__}"
        for name in fields
        if value[name] == "" or not _is(hints[name], value[name])
    ]
    return f"a provenance whose {', '.join(wrong)}" if wrong else None


_HINTS: dict[type[Any], dict[str, Any]] = {}


def _hints(kind: type[Any]) -> dict[str, Any]:
    """The types of a dataclass's fields, made once: typing evaluates them from their text (this module's
    annotations are strings) each time it is asked, which for each table of a report took most of its read."""
    if kind not in _HINTS:
        _HINTS[kind] = typing.get_type_hints(kind)
    return _HINTS[kind]


def _is(kind: Any, value: Any) -> bool:
    """Whether JSON data `value` is of the type `kind` (its outer JSON type: what `Provenance` checks)."""
    if typing.get_origin(kind) in (types.UnionType, typing.Union):
        return any(_is(one, value) for one in typing.get_args(kind))
    if kind is type(None):
        return value is None
    return isinstance(value, typing.get_origin(kind) or kind)


def _read(kind: Any, value: Any, where: str) -> Any:
    """`value` checked against `kind` (a dataclass of this module, str, or list of one), built as it: a JSON
    number, boolean or null where text is expected is shown as its text (a stored table's NaN cell, read back
    as a float, shows `nan`, as it did before reports were typed)."""
    if isinstance(kind, type) and dataclasses.is_dataclass(kind):
        if not isinstance(value, dict):
            raise TypeError(f"{where}: expected an object, got {type(value).__name__}")
        hints = _hints(kind)
        read = {
            f.name: _read(hints[f.name], value[f.name], f"{where}.{f.name}")
            for f in dataclasses.fields(kind)
            if f.name in value or _required(f, where)
        }
        try:
            return kind(**read)
        except ValueError as exc:  # its own check (__post_init__)
            raise TypeError(f"{where}: {exc}") from None
    if typing.get_origin(kind) is list:
        if not isinstance(value, list):
            raise TypeError(f"{where}: expected a list, got {type(value).__name__}")
        (item,) = typing.get_args(kind)
        # text as it is, the common case by far (a table's cells), without the walk's cost per item
        return [
            one if item is str and type(one) is str else _read(item, one, f"{where}[{n}]")
            for n, one in enumerate(value)
        ]
    if kind is str and isinstance(value, str | int | float | bool | None):
        return value if isinstance(value, str) else str(value)  # a number where text is expected shows as one
    raise TypeError(f"{where}: expected {getattr(kind, '__name__', kind)}, got {type(value).__name__}")


def _required(f: dataclasses.Field[Any], where: str) -> bool:
    """Raise for a field without a default (the document lacks it); False for one that has a default."""
    if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
        raise KeyError(f"{where}.{f.name}")
    return False
