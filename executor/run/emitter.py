"""The engine's one seam to its reporters: typed events stamped with seq, run id and time, and a reporter
that fails kept away from the run.

A reporter is a display (or the run folder's events.jsonl, a `tee`): an exception in one (a bug in the
console's rendering, a `--json` stdout or an events file on a full disk) must never fail an attempt, a step
or the run. The seam catches it, says so once on stderr (never stdout, which `--json` owns), closes that
reporter and delivers no further event to it; the others go on, and so does the run, its state and audit
log complete.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, TextIO

from executor.redact import Redactor
from executor.run.event_models import Event
from executor.run.events import Reporter
from executor.terminal import shown


@dataclass
class EventStream:
    """What every emitter of one run shares: the reporters, the sequence and which reporters failed."""

    reporter: Reporter
    run_id: str
    redactor: Redactor
    stderr: TextIO | None = None  # None: sys.stderr as it is when a failure is said
    seq: int = 0
    tees: list[Reporter] = field(default_factory=list)  # get every event too (the run's events.jsonl)
    failed: list[Reporter] = field(default_factory=list)  # those that raised: they get nothing more
    lock: threading.Lock = field(default_factory=threading.Lock)


class Emitter:
    """Builds one run's events and hands them to its reporter, in `seq` order.

    `bind(step=..., host=..., attempt=...)` gives an emitter for one attempt (a HostContext), so that
    its call sites name only the event's own fields; all of them share one sequence.
    """

    def __init__(self, stream: EventStream, **context: Any) -> None:
        self._stream = stream
        self._context = context

    def bind(self, **context: Any) -> Emitter:
        """An emitter whose events belong to `context` (step, host, attempt) too."""
        return Emitter(self._stream, **{**self._context, **context})

    def emit(self, event_type: type[Event], /, **fields: Any) -> None:
        """Build the next event of the run and deliver it; a field given here wins over the bound ones.

        The sequence number is taken and the event delivered under one lock, so the reporter sees them
        in `seq` order, from 1 without gaps, whichever host's task emits."""
        stream = self._stream
        with stream.lock:
            stream.seq += 1
            event = event_type(
                seq=stream.seq, run_id=stream.run_id, time=round(time.time(), 3), **{**self._context, **fields}
            )
            for reporter in (stream.reporter, *stream.tees):
                if reporter in stream.failed:
                    continue
                try:
                    reporter.emit(event)
                except Exception as exc:
                    self._reporter_failed(reporter, event, exc)

    def _reporter_failed(self, reporter: Reporter, event: Event, exc: Exception) -> None:
        """Say once why the reporter stopped, close it, and deliver it nothing more."""
        stream = self._stream
        stream.failed.append(reporter)
        with contextlib.suppress(Exception):
            reporter.close()
        reason = stream.redactor.text(f"{type(exc).__name__}: {exc}")
        message = (
            f"runbook: {reporter.name} failed on event {event.seq} ({event.event}) and shows nothing more of this"
            f" run (the run goes on; its state and audit log stay complete): {reason}"
        )
        with contextlib.suppress(Exception):  # even a closed stderr must not stop the run
            print(shown(message), file=stream.stderr or sys.stderr, flush=True)
