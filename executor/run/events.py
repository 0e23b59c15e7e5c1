"""How a run's events are shown: the reporter interface and its two displays.

The engine hands each typed event (executor.run.event_models) to a `Reporter` through its Emitter
(executor.run.emitter). `JsonReporter` prints one JSON event per line on stdout for agents (json.dumps
writes every control character as a JSON escape); `ConsoleReporter` shows humans the step list, the
running step and the elapsed time on stderr with rich, every text of an event first made safe for a
terminal (executor.terminal), one handler per event type. Both print only redacted text.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from pydantic import BaseModel
from rich.console import Console
from rich.status import Status
from rich.text import Text

from executor import strict_json
from executor.command_result import how_it_ended
from executor.consoles import UnattendedConsole
from executor.redact import Redactor
from executor.run.event_models import (
    AttemptFailed,
    CellsProgress,
    CommandFinished,
    Event,
    Note,
    Progress,
    RunFinished,
    RunStarted,
    SearchDecided,
    StepFinished,
    StepStarted,
)
from executor.runbook.durations import format_duration
from executor.terminal import shown

if TYPE_CHECKING:
    from executor.run.event_models import PlannedStep
    from executor.runbook.campaign import MatrixGroup


def with_strings(value: Any, change: Callable[[str], str]) -> Any:
    """`value` with every string in it, however nested (in a model, a list, a dict's keys and values),
    replaced by `change(string)`: the one way a reporter masks (RedactingReporter) or escapes
    (ConsoleReporter) an event's texts, so that no field is forgotten. What `change` leaves as it is
    stays the same object, so that an event without a secret or a control character is not copied."""
    if isinstance(value, str):
        return change(value)
    if isinstance(value, BaseModel):
        update = {name: new for name, item in value.__dict__.items() if (new := with_strings(item, change)) is not item}
        return value.model_copy(update=update) if update else value
    if isinstance(value, list | tuple):
        items = [with_strings(item, change) for item in value]
        return items if any(new is not old for new, old in zip(items, value, strict=True)) else value
    if isinstance(value, dict):
        pairs = [(with_strings(key, change), with_strings(item, change)) for key, item in value.items()]
        if all(
            new_key is key and new is item for (new_key, new), (key, item) in zip(pairs, value.items(), strict=True)
        ):
            return value
        return dict(pairs)
    return value


#: In every run folder: the run's events, one line each, exactly as `--json` prints them (EventsFile).
EVENTS_FILE = "events.jsonl"


class Reporter:
    """Receives run events; the base class ignores them."""

    @property
    def name(self) -> str:
        """What a failure of this reporter calls it on stderr (executor.run.emitter)."""
        return "the reporter"

    def emit(self, event: Event) -> None:
        """One event (executor.run.event_models): run_started, step_started, command_finished, attempt_failed,
        step_finished, progress, note (something about a host worth saying once, e.g. a fallback taken),
        run_finished. An exception here stops this reporter, never the run (executor.run.emitter)."""

    def close(self) -> None:
        """Stop any live display."""


class RedactingReporter(Reporter):
    """Passes every event on with the run's secrets masked in every string of it, so that the console
    and `--json` show exactly what the run stores."""

    def __init__(self, inner: Reporter, redactor: Redactor) -> None:
        self.inner = inner
        self.redactor = redactor

    def emit(self, event: Event) -> None:
        self.inner.emit(with_strings(event, self.redactor.text))

    def close(self) -> None:
        self.inner.close()

    @property
    def name(self) -> str:
        return self.inner.name


def json_line(event: Event) -> str:
    """An event as one line of `--json`, strict JSON (json.dumps escapes every control character, a newline too;
    a host's NaN in a progress field is written as "NaN": executor/strict_json.py)."""
    return strict_json.dumps(event.model_dump(by_alias=True), default=str) + "\n"


class JsonReporter(Reporter):
    def __init__(self, out: TextIO | None = None) -> None:
        self.out: TextIO | None = out or sys.stdout

    def emit(self, event: Event) -> None:
        if self.out is None:
            return
        line = json_line(event)
        try:
            self.out.write(line)
            self.out.flush()
        except BrokenPipeError:  # the reader went away; the run goes on, its state and audit log stay complete
            self.out = None


class EventsFile(Reporter):
    """The run folder's events.jsonl: every event as `--json` prints it, one line each, flushed, so that
    anyone can follow a run by `seq` (the MCP server's `events`), whoever started it and however.

    Opened at the first event (a run folder that cannot take it must not stop the run): a failed open or
    write raises, and the emitter says so once and delivers it nothing more. Not fsynced: the audit log
    and state.db are the run's record; this is its stream."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file: TextIO | None = None

    @property
    def name(self) -> str:
        return f"the events file {self.path}"

    def emit(self, event: Event) -> None:
        if self._file is None:
            self._file = self.path.open("x", encoding="utf-8")
        self._file.write(json_line(event))
        self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


_STATUS_STYLE = {
    "passed": "green",
    "reused": "cyan",
    "failed": "bold red",
    "cells-failed": "red",
    "skipped": "yellow",
    "interrupted": "yellow",
}


#: The widest a step id is padded to in the console's lines (a longer one is written whole, the line after it moved).
ID_WIDTH = 60


class ConsoleReporter(Reporter):
    """One handler per event type (`handlers`); each gets the event with every text as `shown` writes
    it, and prints it as rich Text, never markup: `[red]` and `:smile:` stay as written.

    Its lines fit the console (executor/consoles.py). The step list a run starts with names each step, but a
    matrix group's instances, summed up in one line per group (`groups`: its cells, launches and hosts),
    unless `verbose` (`runbook run -v`); step ids are padded to one width, so that a campaign's lines align."""

    def __init__(
        self, console: Console | None = None, groups: Sequence[MatrixGroup] = (), verbose: bool = False
    ) -> None:
        self.console = console or UnattendedConsole(stderr=True)
        self.groups = {instance: group for group in groups for instance in group.instances}
        self.verbose = verbose
        self._id_width = 0
        self._status: Status | None = None
        self._grid: Text | None = None  # the latest grid line of a matrix still running (CellsProgress)
        self._t0 = time.monotonic()
        self.handlers: dict[type[Event], Callable[[Any], None]] = {
            RunStarted: self._run_started,
            StepStarted: self._step_started,
            CommandFinished: self._command_finished,
            AttemptFailed: self._attempt_failed,
            StepFinished: self._step_finished,
            CellsProgress: self._cells_progress,
            SearchDecided: self._search_decided,
            Progress: self._progress,
            Note: self._note,
            RunFinished: self._run_finished,
        }

    def _elapsed(self) -> str:
        return format_duration(time.monotonic() - self._t0)

    def emit(self, event: Event) -> None:
        self.handlers[type(event)](with_strings(event, shown))  # the console's one seam to the terminal

    def _run_started(self, e: RunStarted) -> None:
        self.console.print(
            Text.assemble(("runbook", "bold"), f" {e.runbook}  run ", (e.run_id, "bold"), f"  -> {e.run_dir}")
        )
        listed = [step for step in e.steps if self.verbose or step.id not in self.groups]
        self._id_width = min(max((len(step.id) for step in e.steps), default=0), ID_WIDTH)
        width = min(max((len(step.id) for step in listed), default=0), ID_WIDTH)
        summed: set[str] = set()
        for step in e.steps:
            group = self.groups.get(step.id)
            if group is not None and not self.verbose:
                if group.name not in summed:
                    summed.add(group.name)
                    self.console.print(Text(f"  {_group_line(group, e.steps)}"))
                continue
            self.console.print(Text(f"  {step.id:<{width}}  {step.kind:<16} {', '.join(step.hosts):<20} {step.plan}"))

    def _id(self, step: str | None) -> str:
        """A step id padded to the run's widest (up to ID_WIDTH), so that the lines of a matrix's steps align."""
        return f"{step or '':<{self._id_width}}"

    def _step_started(self, e: StepStarted) -> None:
        self._live(Text.assemble((self._id(e.step), "bold"), f" on {', '.join(e.hosts)}"))

    def _command_finished(self, e: CommandFinished) -> None:
        if e.exit_code is None and not e.timed_out:
            return  # no exit status: its transport failed or it was interrupted, which the next line says
        if e.exit_code != 0 or e.timed_out:
            how = how_it_ended(e.exit_code, e.timed_out)
            self.console.print(Text(f"    {e.step}@{e.host} attempt {e.attempt}: {how}", style="dim"))

    def _attempt_failed(self, e: AttemptFailed) -> None:
        first_line = e.message.splitlines()[0] if e.message else ""
        self.console.print(
            Text.assemble((f"    {e.step}@{e.host} attempt {e.attempt} failed:", "yellow"), f" {first_line}")
        )

    def _step_finished(self, e: StepFinished) -> None:
        self._stop_live()
        style = _STATUS_STYLE.get(e.status, "default")
        via = f" via {e.via}" if e.via not in (None, "primary") else ""
        self.console.print(
            Text.assemble(
                (f"{e.status:>11}", style),
                f" {self._id(e.step)}  {format_duration(e.duration_s):>6}{via}  ",
                (f"({self._elapsed()} elapsed)", "dim"),
            )
        )
        for failure in e.failures:
            self.console.print(Text(failure, style="red"))

    def _cells_progress(self, e: CellsProgress) -> None:
        """One line per matrix group, each time an instance of it ends: how its grid stands. The live status
        line carries the latest one while the grid runs, so a terminal always shows it."""
        c, launches = e.cells, e.launches
        line = Text.assemble(
            (f"{e.group}", "bold"),
            f"  cells {c.passed + c.failed + c.skipped}/{c.total} done: {c.passed} passed, ",
            (f"{c.failed} failed", "red" if c.failed else "default"),
            f", {c.skipped} skipped, {c.running} running;  launches {launches.done}/{launches.planned}",
        )
        self.console.print(Text.assemble("    ", line))
        done = c.passed + c.failed + c.skipped == c.total
        self._grid = None if done else line

    def _search_decided(self, e: SearchDecided) -> None:
        """One line per decision of a campaign's search: what, for which configuration, and the first reason
        (`runbook report` and the state keep all of it)."""
        style = {"launch": "bold", "prune": "dim", "unexplored": "yellow"}[e.action]
        first = e.reason.partition("; ")[0]
        self.console.print(Text.assemble("    ", (f"{e.group} search {e.action}", style), f" {e.config}: {first}"))

    def _progress(self, e: Progress) -> None:
        self._live(Text.assemble((e.step or "", "bold"), f"@{e.host}: {e.message}"), keep=True)

    def _note(self, e: Note) -> None:
        self.console.print(Text.assemble(("    note", "yellow"), f" {e.host}: {e.message}"))

    def _run_finished(self, e: RunFinished) -> None:
        self._stop_live()
        style = _STATUS_STYLE.get(e.status, "default")
        self.console.print(Text.assemble((f"run {e.status}", style), f" in {self._elapsed()}  (audit log: {e.audit})"))

    def _live(self, text: Text, keep: bool = False) -> None:
        """Show `text` as the live status line; off a terminal, print it (progress only if `keep`
        is false, so that a log file gets step starts but not every progress update). While a matrix
        runs, the live line starts with how its grid stands."""
        if self._grid is not None and self.console.is_terminal:
            text = Text.assemble(self._grid, "  |  ", text)
        if keep and self._status is not None:
            self._status.update(text)
            return
        self._stop_live()
        if keep and not self.console.is_terminal:
            return
        if self.console.is_terminal:
            self._status = self.console.status(text)
            self._status.start()
        else:
            self.console.print(Text.assemble("    running ", text))

    def _stop_live(self) -> None:
        if self._status is not None:
            self._status.stop()
            self._status = None

    def close(self) -> None:
        self._stop_live()


def _group_line(group: MatrixGroup, steps: Sequence[PlannedStep]) -> str:
    """A matrix group in a run's step list: its cells, launches, step instances and hosts, how many of them run
    and how many are reused."""
    instances = set(group.instances)
    mine = [step for step in steps if step.id in instances]
    hosts = sorted({host for step in mine for host in step.hosts})
    runs, reused = sum(step.runs for step in mine), sum(step.reused for step in mine)
    return (
        f"group {group.name}: {len(group.cells)} cells, {len(group.servers)} launches, {len(mine)} step instances "
        f"on {', '.join(hosts)}; {runs} to run, {reused} reused (runbook run -v lists each)"
    )
