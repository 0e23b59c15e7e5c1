"""What a runbook's matrices expand to: cells, step instances and their groups.

A step (or a group of consecutive steps) may carry a `matrix:` of named axes. The loader
(`executor.runbook.matrix`) expands it into one *instance* of each step per distinct combination of the axes
that step uses, so a step that does not use an axis is not repeated over it: `deploy_dflash` over
`drafter` and `tokens` is one instance per (drafter, tokens), whatever concurrency the benchmark after
it sweeps. Instances are ordinary steps of `Runbook.steps` (in the order they run), with ids such as
`deploy_dflash[drafter=tmp-long,tokens=8]`; this module holds what the engine, the planner and the
report need to know about them beyond that: which cell each belongs to and which server it runs
against. It is data only (no parsing, no running), the one seam between the loader and its readers.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:  # a reader of run folders imports this module, and no pydantic
    from executor.runbook.search import SearchSpec

#: One value of an axis: a scalar, or a mapping with a `name` (what cell ids show) and scalar or
#: list-of-scalar fields (`{name: tmp-long, repo: SubSir/Kimi-K2.6-DFlash-tmp-long}`).
Scalar = str | int | float | bool
AxisValue = Scalar | Mapping[str, Scalar | list[Scalar]]

OnFailure = Literal["stop", "continue"]
Placement = Literal["spread"]


def value_text(value: AxisValue) -> str:
    """How a value appears in a cell id and in `$matrix_AXIS`: a scalar as a var's text, a mapping by name."""
    if isinstance(value, Mapping):
        return str(value["name"])
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def matrix_environment(values: Mapping[str, AxisValue]) -> dict[str, str]:
    """`matrix_AXIS` (the value's text) and, for a mapping value, `matrix_AXIS_FIELD` for each scalar field
    (null as empty text): what a script reads, in the environment, for the axes its instance uses."""
    env: dict[str, str] = {}
    for axis, value in values.items():
        env[f"matrix_{axis}"] = value_text(value)
        if isinstance(value, Mapping):
            for name, item in value.items():
                if item is None:
                    env[f"matrix_{axis}_{name}"] = ""
                elif not isinstance(item, list):
                    env[f"matrix_{axis}_{name}"] = value_text(item)
    return env


def cell_text(values: Mapping[str, AxisValue]) -> str:
    """`drafter=tmp-long,tokens=8`: the axes in the order the matrix declares them."""
    return ",".join(f"{axis}={value_text(value)}" for axis, value in values.items())


def instance_id(base: str, values: Mapping[str, AxisValue]) -> str:
    """The id of a step's instance: its id as written, with the values of the axes it uses."""
    return f"{base}[{cell_text(values)}]" if values else base


@dataclass(frozen=True)
class Cell:
    """One combination of every axis of a matrix (after `exclude:` and `include:`)."""

    values: Mapping[str, AxisValue]

    @functools.cached_property
    def id(self) -> str:
        """Made once: every instance of the cell's steps holds this one text (`Instance.cells`), not a copy."""
        return cell_text(self.values)


@dataclass(frozen=True)
class Instance:
    """One expanded step of a matrix group (an entry of `Runbook.instances`, keyed by its id)."""

    id: str  # `deploy_dflash[drafter=tmp-long,tokens=8]`; the base id itself when it uses no axis
    base: str  # the step's id as written: `deploy_dflash`
    group: str  # the name of its MatrixGroup
    values: Mapping[str, AxisValue]  # the axes this instance uses, in the matrix's axis order
    cells: tuple[str, ...]  # ids of the cells it belongs to (Cell.id), in run order
    #: the id of the instance of a server-starting step (`StepSpec.starts_server`) this one runs against:
    #: its own id for that step, None for a step before it or a group without one
    server: str | None


@dataclass(frozen=True)
class MatrixGroup:
    """A matrix as written, expanded: its axes, cells and instances, and how failures and hosts are handled."""

    name: str  # the group's `group:` name, or the step's id for a matrix on one step
    axes: Mapping[str, tuple[AxisValue, ...]]  # as declared, in order
    cells: tuple[Cell, ...]  # in the order they run (cells sharing a server configuration together)
    bases: tuple[str, ...]  # the group's step ids as written, in order
    instances: tuple[str, ...]  # instance ids in the order they run (as in Runbook.steps)
    on_failure: OnFailure = "stop"  # `continue`: a failed cell is recorded and the others still run
    placement: Placement | None = None  # `spread`: each server configuration on one host of `pool`
    pool: tuple[str, ...] = ()  # the group's hosts when placement is set
    position: tuple[int, int] = (1, 1)  # (line, column) of the matrix in the file
    #: the axes the group's server-starting step uses (server-side: a new value is a new launch), in order
    server_axes: tuple[str, ...] = ()
    #: the ids of the server-starting instances, in run order: one per server configuration (a launch each)
    servers: tuple[str, ...] = ()
    excluded: int = 0  # combinations of the axes that `exclude:` took out
    included: int = 0  # cells that `include:` added back (combinations `exclude:` took out)
    #: `strategy: search`: which server configurations to launch is decided as the run goes (executor.runbook.search);
    #: None: the grid, every one
    search: SearchSpec | None = None

    @property
    def most_launches(self) -> int:
        """The most server launches the group may make: every configuration, or a search's launch budget where
        lower (a budget of GPU-hours alone caps none)."""
        cap = self.search.budget.launches if self.search is not None else None
        return len(self.servers) if cap is None else min(cap, len(self.servers))

    def screened(self, instances: Mapping[str, Instance]) -> frozenset[str]:
        """The instances a search's launch screens: each run against a server instance of a searched group, the
        server's own step not among them (a grid screens nothing)."""
        if self.search is None:
            return frozenset()
        return frozenset(i for i in self.instances if instances[i].server not in (None, i))


#: The run's exit status when every step outside a matrix passed but some cells failed (README, "Commands").
EXIT_CELLS_FAILED = 5
