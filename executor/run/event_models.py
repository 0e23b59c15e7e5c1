"""The events a run reports, one frozen pydantic model each: the `--json` contract for agents and CI.

Every event carries the schema version, its name (`event`, the union's discriminator), `seq` (1, 2, ...
per run, without gaps, in the order they are printed), `run_id`, `time` (Unix seconds) and the step, host
and attempt it belongs to (None where it belongs to none). README.md's "Events" section documents each
one; tests/executor/test_events.py keeps that table and these models in step. A change that would make
a reader of this schema misread a line (a field removed, renamed or retyped) raises SCHEMA_VERSION.
"""

from __future__ import annotations

from typing import Annotated, Any, Final, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

#: The version of the event schema, in every line as `schema`.
SCHEMA_VERSION: Final = 1


class Event(BaseModel):
    """What every event carries; the engine's Emitter stamps `seq`, `run_id` and `time`."""

    model_config = ConfigDict(frozen=True, populate_by_name=True, extra="forbid")

    schema_: Literal[1] = Field(default=SCHEMA_VERSION, alias="schema")
    event: str
    seq: int = Field(ge=1)
    run_id: str
    time: float
    step: str | None = None
    host: str | None = None
    attempt: int | None = Field(default=None, ge=1)


class PlannedStep(BaseModel):
    """One step of the run as planned: what `run_started.steps` lists, in runbook order."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str
    kind: str
    hosts: list[str]
    reused: bool
    runs: bool
    plan: str  # what happens and why: `reused (passed in RUN)`, `runs again (changed since RUN: var x)`, ...


class HostOutcome(BaseModel):
    """How a step ended on one host: `step_finished.hosts` maps each host to one."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    status: str
    attempts: int
    via: str | None


class Carried(BaseModel):
    """What a resume carries over from the run it continues: `run_started.carried`."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    inventory: str | None  # the source run's --inventory, when none is given now
    vars: dict[str, str]  # the source run's --var values kept (not given again now, nor dropped), by name
    unset: list[str]  # the source run's --var names dropped by --unset-var


class RunStarted(Event):
    """Once, first (`seq` 1), before anything connects: the run folder and every step's plan."""

    event: Literal["run_started"] = "run_started"
    run_dir: str
    runbook: str
    resumed_from: str | None
    steps: list[PlannedStep]
    carried: Carried | None = None  # a resume's: what it carries over from `resumed_from` (null otherwise)


class StepStarted(Event):
    """A step starts on the hosts it runs on in this run."""

    event: Literal["step_started"] = "step_started"
    kind: str
    hosts: list[str]
    group: str | None = None  # a matrix instance's group (None outside a matrix)
    cell: dict[str, str] | None = None  # its axis values as text (`{"drafter": "zlab", "tokens": "4"}`)


class CommandFinished(Event):
    """One command of an attempt ended (also when it timed out or its transport failed)."""

    event: Literal["command_finished"] = "command_finished"
    exit_code: int | None
    timed_out: bool
    duration_s: float


class VarCause(BaseModel):
    """The runbook var whose value caused a failure (a port held by another process): `attempt_failed.cause`."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    var: str
    value: str  # as the run stores it (a secret masked)
    param: str  # the step's parameter that holds it (`port`); "" when the step's facts named the var


class AttemptFailed(Event):
    """An attempt did not pass: why, with the gate's values and the output's tail."""

    event: Literal["attempt_failed"] = "attempt_failed"
    message: str
    cause: VarCause | None = None  # the var whose value caused it, where the step kind knows


class StepFinished(Event):
    """A step ended on all its hosts: how on each, and each failure's message."""

    event: Literal["step_finished"] = "step_finished"
    status: str
    via: str | None
    duration_s: float
    hosts: dict[str, HostOutcome]
    failures: list[str]
    group: str | None = None  # as in step_started
    cell: dict[str, str] | None = None


class CellCounts(BaseModel):
    """How a matrix group's cells stand: `cells_progress.cells`."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    total: int
    passed: int
    failed: int
    skipped: int
    running: int


class LaunchCounts(BaseModel):
    """A matrix group's server launches: `cells_progress.launches`."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    done: int
    planned: int  # one per distinct server configuration (a search's launch budget where lower)


class CellsProgress(Event):
    """After each instance of a matrix group ends (or is skipped): how the group's cells and launches stand."""

    event: Literal["cells_progress"] = "cells_progress"
    group: str
    cells: CellCounts
    launches: LaunchCounts


class SearchDecided(Event):
    """A campaign's search decided (executor.runbook.search): to launch a configuration, to prune it (the bound
    that excluded it), or to leave it unexplored (the budget was spent)."""

    event: Literal["search_decided"] = "search_decided"
    group: str
    decision: int  # its number among the group's decisions (the state's record)
    action: Literal["launch", "prune", "unexplored"]
    config: str  # the server instance
    reason: str


class Progress(Event):
    """Live progress of an attempt (a status line on the console)."""

    event: Literal["progress"] = "progress"
    message: str
    fields: dict[str, Any]  # the step kind's own: bytes done, a prompt's acceptance length, ...


class Note(Event):
    """Something about a host worth saying once: a host key not verified, a runner fallback."""

    event: Literal["note"] = "note"
    message: str


class RunFinished(Event):
    """Once, last: the run's status and exit code."""

    event: Literal["run_finished"] = "run_finished"
    status: str
    exit_code: int
    audit: str
    error: str | None = None  # why a write to the run folder failed (status write-failed)


AnyEvent = Annotated[
    RunStarted
    | StepStarted
    | CommandFinished
    | AttemptFailed
    | StepFinished
    | CellsProgress
    | SearchDecided
    | Progress
    | Note
    | RunFinished,
    Field(discriminator="event"),
]

#: Every event type, in the order a run emits them first.
EVENT_TYPES: tuple[type[Event], ...] = get_args(get_args(AnyEvent)[0])

#: Reads one `--json` line (`EVENTS.validate_json(line)`) into its model; its `json_schema()` is the contract.
EVENTS: TypeAdapter[AnyEvent] = TypeAdapter(AnyEvent)
