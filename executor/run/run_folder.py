"""The run folder of one run, opened and closed in order as one async context manager.

Opened in two moves, because the plan sits between them: `open_source` locks the run a resume continues
(it must not be running, nor resumed twice) and reads its rows; `create` then publishes the new run's
folder (its lock, state.db with every step's row, run.json), its audit log (sealed when a key is
configured), debug.log and events.jsonl. However the body ends, leaving the context closes them in this
order: the audit log's head, the failed cells and `finished_at` before the status (a run whose status says
passed has every write behind it), the RunFinished event, what the run holds on hosts (`release`), then the
audit log, the state, the debug log, the events file, and last the source run's lock. Every step record
goes through `save`, which stores the audit log's position with it: the state never claims more than the log.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING

from executor import diagnostics, durable
from executor.errors import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, DurableWriteError, StateError
from executor.redact import Redactor
from executor.run import audit as audit_mod
from executor.run import event_models, seal
from executor.run.audit import AuditContext, AuditLog
from executor.run.emitter import Emitter, EventStream
from executor.run.events import EVENTS_FILE, EventsFile, RedactingReporter, Reporter
from executor.run.state import SEARCH_KEY, WRITE_FAILED, RunLock, RunMeta, RunState, StepRecord, now, open_state
from executor.runbook.search import Decision

if TYPE_CHECKING:
    from contextvars import Token

    from executor.diagnostics import Log
    from executor.runbook.search import Decision

#: A durable write to the run folder failed (DurableWriteError): the exit code (the status: WRITE_FAILED)
EXIT_WRITE_FAILED = DurableWriteError.exit_code

#: A step's rows by (step, host).
Records = dict[tuple[str, str], StepRecord]


class RunFolder:
    """One run's folder and what writes it. `records` holds every step's row as last saved; `write_failure`
    is the first failed durable write (from then on the run starts nothing); `end` says how the body ended
    when it ended normally. `summary` gives the state keys the run ends with besides its status (the failed
    cells), `release` closes what the run holds on hosts."""

    def __init__(
        self,
        log_dir: Path,
        redactor: Redactor,
        reporter: Reporter,
        *,
        audit_key: seal.AuditKey | None,
        verbose: bool,
        summary: Callable[[], Mapping[str, str]],
        release: Callable[[], Awaitable[None]],
    ) -> None:
        self.log_dir = log_dir
        self.redactor = redactor
        self.reporter = reporter  # masked already (RedactingReporter)
        self.audit_key = audit_key
        self.verbose = verbose
        self._summary = summary
        self._release = release
        self.records: Records = {}
        self.write_failure: DurableWriteError | None = None
        self.status, self.code = "passed", EXIT_OK
        self.source: RunMeta | None = None
        self.source_records: Records = {}
        self.source_search: dict[str, list[Decision]] = {}  # a resumed run's search decisions, by group
        self._source_lock: RunLock | None = None
        self._state: RunState | None = None

    async def __aenter__(self) -> RunFolder:
        return self

    # ---- opening ------------------------------------------------------------------------------

    @property
    def source_dir(self) -> Path | None:
        return None if self.source is None else self.log_dir / self.source.run_id

    def open_source(self, source: RunMeta | None) -> Records:
        """Lock the run a resume continues (a run being resumed must not be running, nor resumed twice) and
        read its rows; held until the context closes."""
        self.source = source
        if self.source_dir is None:
            return self.source_records
        lock = RunLock(self.source_dir)
        lock.acquire()
        self._source_lock = lock
        with open_state(self.source_dir) as source_state:
            self.source_records = {(r.step, r.host): r for r in source_state.records()}
            raw = source_state.get(SEARCH_KEY)
        if raw is not None:  # here, not at the top: reading a run folder imports no runbook part
            from executor.run.searching import source_decisions

            self.source_search = source_decisions(raw, str(self.source_dir))
        return self.source_records

    def source_link(self) -> str:
        """The hash the new audit log chains to: the source run's last record (StateError if unreadable)."""
        return audit_mod.GENESIS if self.source_dir is None else audit_mod.chain_tail(self.source_dir)

    def create(self, meta: RunMeta) -> None:
        """Publish the run folder whole (locked, with its status and every row of `records`, before its
        run.json appears) and open its audit log, debug log and events file."""
        run_dir = self.log_dir / meta.run_id
        state: RunState | None = None
        try:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            state = RunState.create(run_dir, meta, list(self.records.values()))
            link = meta.audit_prev_hash
            sealer = seal.HeadSeal(self.audit_key, meta.run_id, link, meta.resumed_from) if self.audit_key else None
            self.audit = AuditLog(run_dir, meta.run_id, self.redactor, prev_hash=link, seal=sealer)
        except (OSError, sqlite3.Error, DurableWriteError) as exc:  # a full disk, a log dir that is a file, ...
            if state is not None:
                state.close()
            raise self._unwritable(exc, run_dir) from None
        self.run_dir = run_dir
        self.debug = diagnostics.DebugLog(run_dir / diagnostics.DEBUG_FILE, self.redactor, echo=self.verbose)
        self.log: Log = self.debug.log.bind(run_id=meta.run_id)  # every diagnostic line of the run names it
        self._current_run: Token[Log] = diagnostics.CURRENT.set(self.log)  # asyncssh's records from this run
        self._events_file = EventsFile(run_dir / EVENTS_FILE)  # masked as the console is: the same lines as --json
        self.events = Emitter(
            EventStream(
                self.reporter, meta.run_id, self.redactor, tees=[RedactingReporter(self._events_file, self.redactor)]
            )
        )
        self._state = state

    def _unwritable(self, exc: OSError | sqlite3.Error | DurableWriteError, run_dir: Path) -> Exception:
        """What a failed creation of the run folder is: a DurableWriteError (a full, read-only or failing
        disk) or a StateError naming the folder."""
        if isinstance(exc, DurableWriteError):
            return exc
        if isinstance(exc, OSError) and exc.errno in durable.DISK_ERRNOS:
            return durable.failed(exc, self.log_dir, "the run folder")
        reason = getattr(exc, "strerror", None) or str(exc)
        return StateError(f"cannot write the run folder {run_dir}: {reason}", reason=reason)

    # ---- while it runs ------------------------------------------------------------------------

    @property
    def state(self) -> RunState:
        assert self._state is not None, "the run folder is not created yet"
        return self._state

    def save(self, record: StepRecord) -> None:
        """Keep `record` as the step's row, stored with what the audit log holds by now (audit verify checks it)."""
        self.records[(record.step, record.host)] = record
        self.state.save(record, audit=self.audit.position)

    def failed_write(self, exc: DurableWriteError) -> None:
        """Remember the first failed durable write: the run stops, and ends write-failed."""
        self.write_failure = self.write_failure or exc

    def end(self, status: str, code: int) -> None:
        """How the run ended, when its steps ended normally (passed, failed, cells-failed)."""
        self.status, self.code = status, code

    def record_abandoned(self) -> None:
        """Open the log with an `abandoned` record for each step the resumed run's process stopped in
        (killed, or stopped by a failed write), saying what that run's log holds of its last attempt."""
        running = [old for old in self.source_records.values() if old.status == "running"]
        if self.source is None or self.source_dir is None or not running:
            return
        found = audit_mod.attempt_records(self.source_dir, [(old.step, old.host, old.attempts) for old in running])
        for old in running:
            key = (old.step, old.host, old.attempts)
            self.audit.abandoned(AuditContext(*key), self.source.run_id, old.started_at, old.attempts, found[key])

    # ---- closing ------------------------------------------------------------------------------

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, _tb: TracebackType | None
    ) -> bool:
        """Close the run however its body ended: a failed write is never a step failure nor a passed run
        (raised again once all is closed), a cancellation is an interrupted run, anything else a crash."""
        if self._state is None:  # not created: only the source run's lock is held
            self._release_source()
            return False
        cancelled = isinstance(exc, asyncio.CancelledError)
        crashed = exc is not None and not cancelled and not isinstance(exc, DurableWriteError)
        if isinstance(exc, DurableWriteError):
            self.failed_write(exc)
        elif cancelled:
            self.status, self.code = "interrupted", EXIT_INTERRUPTED
        elif crashed:  # the exception goes on to the caller (a traceback: a bug), and the process exits 1
            self.status, self.code = "crashed", EXIT_FAILED
        await self._close()
        if crashed:
            return False
        if self.write_failure is not None:
            raise self.write_failure from None
        return cancelled

    def _finish(self) -> None:
        """The run's last writes: the audit log's head (a finished run's matches its log exactly), the
        summary, `finished_at`, then the status. A failed one leaves the status as it was (running: a resume
        continues it)."""
        if self.write_failure is not None:
            self.status, self.code = WRITE_FAILED, EXIT_WRITE_FAILED
        try:
            if self.write_failure is None:
                self.audit.finish()
            for key, value in self._summary().items():
                self.state.set(key, value)
            self.state.set("finished_at", now())
            self.state.set("status", self.status)
        except DurableWriteError as exc:
            self.failed_write(exc)
            self.status, self.code = WRITE_FAILED, EXIT_WRITE_FAILED

    async def _close(self) -> None:
        """The last writes, the RunFinished event, then each thing closed in the module's order, every one of
        them even when one before it raised: a second cancellation while the hosts' transports close (an API
        caller's timeout after a Ctrl-C) must not leave the run's lock, state or files open."""
        async with contextlib.AsyncExitStack() as closing:  # its callbacks run last pushed, first
            closing.callback(self._release_source)
            closing.callback(diagnostics.CURRENT.reset, self._current_run)
            closing.callback(self._events_file.close)
            closing.callback(self.debug.close)
            closing.callback(lambda: self.log.info("run finished", status=self.status, exit_code=self.code))
            closing.callback(self.state.close)
            closing.callback(self.audit.close)
            closing.push_async_callback(self._release)
            self._finish()
            self.events.emit(
                event_models.RunFinished,
                status=self.status,
                exit_code=self.code,
                audit=str(self.run_dir / audit_mod.AUDIT_FILE),
                error=str(self.write_failure) if self.write_failure else None,
            )

    def _release_source(self) -> None:
        if self._source_lock is not None:
            self._source_lock.release()
