"""What the run loop tells the outside world, and the two ways of showing it.

`Reporter` is the interface the engine calls. `JsonReporter` prints one JSON event per line
on stdout for agents; `ConsoleReporter` shows humans the step list, the running step and the
elapsed time on stderr with rich. Both print only redacted text.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any, TextIO

from rich.console import Console
from rich.markup import escape
from rich.status import Status

from executor.durations import format_duration
from executor.redact import Redactor


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
        f = {k: escape(v) if isinstance(v, str) else v for k, v in fields.items()}  # data is never markup
        if event == "run_started":
            print_(f"[bold]runbook[/] {f['runbook']}  run [bold]{f['run_id']}[/]  -> {f['run_dir']}")
            for step in fields["steps"]:
                hosts = escape(", ".join(step["hosts"]))
                print_(f"  {escape(step['id']):<24} {step['kind']:<16} {hosts:<20} {escape(step['plan'])}")
        elif event == "step_started":
            self._live(f"[bold]{f['step']}[/] on {escape(', '.join(fields['hosts']))}")
        elif event == "command_finished":
            if fields.get("exit_code") != 0 or fields.get("timed_out"):
                how = "timed out" if fields.get("timed_out") else f"exit {fields.get('exit_code')}"
                print_(f"    [dim]{f['step']}@{f['host']} attempt {f['attempt']}: {how}[/]")
        elif event == "attempt_failed":
            first_line = escape(fields["message"].splitlines()[0]) if fields["message"] else ""
            print_(f"    [yellow]{f['step']}@{f['host']} attempt {f['attempt']} failed:[/] {first_line}")
        elif event == "step_finished":
            self._stop_live()
            style = _STATUS_STYLE.get(fields["status"], "default")
            via = f" via {f['via']}" if fields.get("via") not in (None, "primary") else ""
            print_(
                f"[{style}]{f['status']:>11}[/] {f['step']}{via}  "
                f"{format_duration(fields.get('duration_s') or 0)}  [dim]({self._elapsed()} elapsed)[/]"
            )
            for failure in fields.get("failures", []):
                print_(failure, markup=False, style="red")
        elif event == "note":
            print_(f"    [yellow]note[/] {f['host']}: {f['message']}")
        elif event == "progress":
            self._live(f"[bold]{f['step']}[/]@{f['host']}: {f['message']}", keep=True)
        elif event == "run_finished":
            self._stop_live()
            style = _STATUS_STYLE.get(fields["status"], "default")
            print_(f"[{style}]run {f['status']}[/] in {self._elapsed()}  (audit log: {f['audit']})")

    def _live(self, text: str, keep: bool = False) -> None:
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
            self.console.print(f"    running {text}")

    def _stop_live(self) -> None:
        if self._status is not None:
            self._status.stop()
            self._status = None

    def close(self) -> None:
        self._stop_live()
