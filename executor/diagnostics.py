"""The controller's diagnostics: what the engine, the transports and the runner did, for whoever debugs a run.

Each run has its own structlog pipeline (`DebugLog`), made with `structlog.wrap_logger` and never with
`structlog.configure`: there is no global state, so runs in one process (the tests run many) never write
into each other's logs, and a program that embeds the engine keeps its own structlog and logging setup.
Each layer binds what it knows once: the run its `run_id`, `HostContext` the `step`, `host`, `attempt` and
`via` of an attempt, a transport its `host`, a connection its number and address (and the runner on it
that logger). So a line says where it comes from without any call site repeating it.

Lines go to `debug.log` in the run folder: one JSON document per line, written with one unbuffered write
(flushed) and never fsynced, since it is a diagnostic and not the audit log. A write that fails (a full
disk) turns it off and never stops the run; the run's durable writes report the disk themselves. Each
line is masked by the run's Redactor (its JSON text, whose escaped forms of a secret the Redactor knows)
before it is written. With `runbook run -v` each line goes to stderr
too, escaped as everything shown is (executor.terminal); never to stdout, which under `--json` holds only
the run's events.

asyncssh logs through the standard `logging` module, at INFO and DEBUG only: with no handler configured,
nothing of it is emitted (the last-resort handler prints WARNING and above). The CLI calls `route_asyncssh`,
which sends its INFO records into the debug log of the run whose task logged them (`CURRENT`, a context
variable each run sets for its own tasks) and nowhere else.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import os
import sys
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any, NoReturn

import structlog
from structlog.typing import FilteringBoundLogger

from executor import strict_json
from executor.redact import Redactor
from executor.terminal import fitted, line_width, shown

DEBUG_FILE = "debug.log"

#: A diagnostic logger: `log.info("connection opened", port=22)`; `bind` adds fields to every line.
Log = FilteringBoundLogger


def _drop(_logger: Any, _method: str, _event: MutableMapping[str, Any]) -> NoReturn:
    raise structlog.DropEvent


#: The logger of whatever runs outside a run (a transport a test made, the bench): it drops every line, at
#: no cost below CRITICAL (each of those methods is a no-op), which diagnostics never use.
NO_LOG: Log = structlog.wrap_logger(
    None, processors=[_drop], wrapper_class=structlog.make_filtering_bound_logger(logging.CRITICAL), context_class=dict
)

#: The logger of the run that the current task belongs to (set by `Engine.run` for its own tasks).
CURRENT: contextvars.ContextVar[Log] = contextvars.ContextVar("runbook_diagnostics", default=NO_LOG)


class DebugLog:
    """One run's `debug.log` and the logger that writes it; `echo` writes each line to stderr too."""

    def __init__(self, path: Path, redactor: Redactor, echo: bool = False) -> None:
        self.path = path
        self._redactor = redactor
        self._fd: int | None
        try:
            self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        except OSError:  # a diagnostic: the run's own writes say what is wrong with the folder
            self._fd = None
        processors: list[Any] = [
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True, key="time"),
        ]
        if echo:
            processors.append(self._echo)
        processors.append(self._render)
        self.log: Log = structlog.wrap_logger(
            self,
            processors=processors,
            wrapper_class=structlog.make_filtering_bound_logger(logging.DEBUG),
            context_class=dict,
            cache_logger_on_first_use=False,
        )

    def _render(self, _logger: Any, _method: str, event: MutableMapping[str, Any]) -> str:
        """The line, masked: one pass over the JSON text, whose escaped forms of a secret the Redactor knows
        (a pass per value would cost ten times as much, on every command)."""
        return self._redactor.text(strict_json.dumps(event, default=_text))

    def _echo(self, _logger: Any, _method: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
        """`-v`: the line on stderr as well, masked and shown safe (stderr looked up now: a live display on
        the console may have wrapped it)."""
        fields = " ".join(f"{key}={_shown(value)}" for key, value in event.items() if key not in ("event", "time"))
        text = self._redactor.text(f"debug: {_text(event.get('event'))}  {fields}")
        with contextlib.suppress(OSError):  # stderr's reader went away; the debug log file still gets the line
            print(fitted(shown(text), line_width(sys.stderr)), file=sys.stderr, flush=True)
        return event

    def msg(self, line: str) -> None:
        """structlog's logger method: append the rendered line in one write."""
        if self._fd is None:
            return
        try:
            os.write(self._fd, (line + "\n").encode("utf-8", "backslashreplace"))
        except OSError:  # a full disk: the debug log stops, the run goes on
            self.close()

    debug = info = warning = error = critical = msg

    def close(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)


def _text(value: Any) -> str:
    """What JSON cannot hold (bytes, a path, an exception, a set) as its text, so that the Redactor sees
    everything that is written."""
    return value.decode("utf-8", "backslashreplace") if isinstance(value, bytes) else str(value)


def _shown(value: Any) -> str:
    """A field's value on `-v`'s stderr: a nested one as JSON with each bytes value decoded (`_text`), whose
    forms of a secret the Redactor knows; Python's repr of it would show a non-ASCII secret's bytes as
    `\\xc3\\xa4...`, a form it does not know."""
    if isinstance(value, dict | list | tuple):
        return json.dumps(value, default=_text, ensure_ascii=False)
    return _text(value)


class _ToCurrentRun(logging.Handler):
    """asyncssh's records into the debug log of the run whose task logged them; elsewhere, nowhere."""

    def emit(self, record: logging.LogRecord) -> None:
        log = CURRENT.get()
        if log is NO_LOG:
            return
        with contextlib.suppress(Exception):  # a diagnostic never fails (nor prints on) the connection that logged it
            log.info(record.getMessage(), logger=record.name)


def route_asyncssh() -> None:
    """Send asyncssh's INFO records to the current run's debug log only, never to the console: the CLI
    calls it (an embedding program keeps its own logging). Calling it again changes nothing."""
    logger = logging.getLogger("asyncssh")
    if not any(isinstance(handler, _ToCurrentRun) for handler in logger.handlers):
        logger.addHandler(_ToCurrentRun())
    logger.setLevel(logging.INFO)
    logger.propagate = False
