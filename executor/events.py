"""What the run loop tells the outside world, and the two ways of showing it.

`Reporter` is the interface the engine calls. `JsonReporter` prints one JSON event per line
on stdout for agents (json.dumps writes every control character as a JSON escape);
`ConsoleReporter` shows humans the step list, the running step and the elapsed time on stderr
with rich, every text of an event first made safe for a terminal (executor.terminal). Both print
only redacted text.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any, TextIO

from rich.console import Console
from rich.status import Status
from rich.text import Text

from executor.durations import format_duration
from executor.redact import Redactor
from executor.terminal import shown


class Reporter:
    """Receives run events; the base class ignores them."""

    def emit(self, event: str, **fields: Any) -> None:
        """One event: run_started, step_started, command_finished, attempt_failed, step_finished, progress,
        note (something about a host worth saying once, e.g. a fallback taken), run_finished."""

    def close(self) -> None:
        """Stop any live display."""


class RedactingReporter(Reporter):
    """Passes every event on with the run's secrets masked in its values (the field names are ours), so
    that the console and `--json` show exactly what the run stores."""

    def __init__(self, inner: Reporter, redactor: Redactor) -> None:
        self.inner = inner
        self.redactor = redactor

    def emit(self, event: str, **fields: Any) -> None:
        self.inner.emit(event, **{name: self.redactor.deep(value) for name, value in fields.items()})

    def close(self) -> None:
        self.inner.close()


class JsonReporter(Reporter):
    def __init__(self, out: TextIO | None = None) -> None:
        self.out: TextIO | None = out or sys.stdout

    def emit(self, event: str, **fields: Any) -> None:
        if self.out is None:
            return
        try:
            self.out.write(json.dumps({"event": event, "time": round(time.time(), 3), **fields}, default=str) + "\n")
            self.out.flush()
        except BrokenPipeError:  # the reader went away; the run goes on, its state and audit log stay complete
            self.out = None


class UnattendedConsole(Console):
    """A rich console that goes quiet when its reader goes away (`runbook run ... 2>&1 | head`).

    rich's default exits the process on a broken pipe, which would stop a deployment half-way
    because nobody is reading its progress; the run goes on, its state and audit log complete.
    """

    def on_broken_pipe(self) -> None:
        self.quiet = True


def shown_fields(value: Any) -> Any:
    """An event's fields with every string in them, however nested, as `shown` writes it: the console
    renderer's one seam, so a host's control sequences never reach the terminal."""
    if isinstance(value, str):
        return shown(value)
    if isinstance(value, list | tuple):
        return [shown_fields(item) for item in value]
    if isinstance(value, dict):
        return {key: shown_fields(item) for key, item in value.items()}
    return value


_STATUS_STYLE = {"passed": "green", "reused": "cyan", "failed": "bold red", "interrupted": "yellow"}


class ConsoleReporter(Reporter):
    def __init__(self, console: Console | None = None) -> None:
        self.console = console or UnattendedConsole(stderr=True, highlight=False, soft_wrap=True)
        self._status: Status | None = None
        self._t0 = time.monotonic()

    def _elapsed(self) -> str:
        return format_duration(time.monotonic() - self._t0)

    def emit(self, event: str, **fields: Any) -> None:
        print_ = self.console.print
        f = shown_fields(fields)  # every text as rich Text, never markup: `[red]` and `:smile:` stay as written
        if event == "run_started":
            print_(
                Text.assemble(
                    ("runbook", "bold"), f" {f['runbook']}  run ", (f["run_id"], "bold"), f"  -> {f['run_dir']}"
                )
            )
            for step in f["steps"]:
                print_(Text(f"  {step['id']:<24} {step['kind']:<16} {', '.join(step['hosts']):<20} {step['plan']}"))
        elif event == "step_started":
            self._live(Text.assemble((f["step"], "bold"), f" on {', '.join(f['hosts'])}"))
        elif event == "command_finished":
            if f.get("exit_code") != 0 or f.get("timed_out"):
                how = "timed out" if f.get("timed_out") else f"exit {f.get('exit_code')}"
                print_(Text(f"    {f['step']}@{f['host']} attempt {f['attempt']}: {how}", style="dim"))
        elif event == "attempt_failed":
            first_line = f["message"].splitlines()[0] if f["message"] else ""
            print_(
                Text.assemble(
                    (f"    {f['step']}@{f['host']} attempt {f['attempt']} failed:", "yellow"), f" {first_line}"
                )
            )
        elif event == "step_finished":
            self._stop_live()
            style = _STATUS_STYLE.get(f["status"], "default")
            via = f" via {f['via']}" if f.get("via") not in (None, "primary") else ""
            print_(
                Text.assemble(
                    (f"{f['status']:>11}", style),
                    f" {f['step']}{via}  {format_duration(f.get('duration_s') or 0)}  ",
                    (f"({self._elapsed()} elapsed)", "dim"),
                )
            )
            for failure in f.get("failures", []):
                print_(Text(failure, style="red"))
        elif event == "note":
            print_(Text.assemble(("    note", "yellow"), f" {f['host']}: {f['message']}"))
        elif event == "progress":
            self._live(Text.assemble((f["step"], "bold"), f"@{f['host']}: {f['message']}"), keep=True)
        elif event == "run_finished":
            self._stop_live()
            style = _STATUS_STYLE.get(f["status"], "default")
            print_(Text.assemble((f"run {f['status']}", style), f" in {self._elapsed()}  (audit log: {f['audit']})"))

    def _live(self, text: Text, keep: bool = False) -> None:
        """Show `text` as the live status line; off a terminal, print it (progress only if `keep`
        is false, so that a log file gets step starts but not every progress update)."""
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
