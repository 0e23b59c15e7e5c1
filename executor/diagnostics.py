"""The controller's diagnostics: what the engine, the transports and the runner did, for whoever debugs a run.

Each run has its own structlog pipeline (`DebugLog`), made with `structlog.wrap_logger` and never with
`structlog.configure`: there is no global state, so runs in one process (the tests run many) never write
into each other's logs, and a program that embeds the engine keeps its own structlog and logging setup.
Each layer binds what it knows once: the run its `run_id`, `HostContext` the `step`, `host`, `attempt` and
`via` of an attempt, a transport its `host`, a connection its number and address (and the runner on it
that logger). So a line says where it comes from without any call site repeating it.

Lines go to `debug.log` in the run folder: one JSON document per line, written with one unbuffered write
(flushed) and never fsynced, since it is a diagnostic and not the audit log. A write that fails (a full
disk) turns it off and never stops the run; the run's durable writes report the disk themselves. Every
value is masked by the run's Redactor before it is written. With `runbook run -v` each line goes to stderr
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
import logging
import os
import sys
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any, NoReturn

import structlog
from structlog.typing import FilteringBoundLogger

from executor.redact import Redactor
from executor.terminal import shown

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
            self._redact,
        ]
        if echo:
            processors.append(_echo)
        processors.append(structlog.processors.JSONRenderer())
        self.log: Log = structlog.wrap_logger(
            self,
            processors=processors,
            wrapper_class=structlog.make_filtering_bound_logger(logging.DEBUG),
            context_class=dict,
            cache_logger_on_first_use=False,
        )

    def _redact(self, _logger: Any, _method: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
        redacted: MutableMapping[str, Any] = self._redactor.deep(_plain(dict(event)))
        return redacted

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


def _plain(value: Any) -> Any:
    """`value` as JSON data, every other value (bytes, a path, an exception) as its text: what the Redactor
    masks is all that is written."""
    if value is None or isinstance(value, str | int | float | bool):
        return value
    if isinstance(value, dict):
        return {str(key): _plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_plain(item) for item in value]
    if isinstance(value, bytes):
        return value.decode("utf-8", "backslashreplace")
    return str(value)


def _echo(_logger: Any, _method: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """`-v`: the line on stderr as well (looked up now: a live display on the console may have wrapped it)."""
    fields = " ".join(f"{key}={value}" for key, value in event.items() if key not in ("event", "time", "level"))
    with contextlib.suppress(OSError):  # stderr's reader went away; the debug log file still gets the line
        print(shown(f"debug: {event.get('event')}  {fields}"), file=sys.stderr, flush=True)
    return event


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
