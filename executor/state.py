"""The state store of one run: `<run-dir>/state.db` (SQLite), plus `run.json` and a lock.

Each step result is written in one transaction, after its audit records are on disk, so a
kill at any point leaves a store that opens cleanly and never claims more than happened.
A resumed run is a new run folder that names the run it continues (`resumed_from`).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
import sqlite3
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, fields
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from executor.errors import RunLocked

STATE_FILE = "state.db"
META_FILE = "run.json"
LOCK_FILE = "lock"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS steps (
    step TEXT NOT NULL,
    host TEXT NOT NULL,
    position INTEGER NOT NULL,
    status TEXT NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    fingerprint TEXT NOT NULL,
    facts TEXT,
    started_at TEXT,
    duration_s REAL,
    exit_code INTEGER,
    message TEXT,
    via TEXT,
    reused_from TEXT,
    gate TEXT,
    PRIMARY KEY (step, host)
);
CREATE TABLE IF NOT EXISTS run (key TEXT PRIMARY KEY, value TEXT);
"""


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds")


def new_run_id() -> str:
    return datetime.now(UTC).strftime("%Y%m%d-%H%M%S-") + secrets.token_hex(3)


@dataclass
class StepRecord:
    step: str
    host: str
    position: int
    status: str  # pending | running | passed | failed | skipped | interrupted
    fingerprint: str  # of the step's definition when it ran ("" for pending and skipped)
    attempts: int = 0
    facts: Any = None
    started_at: str | None = None
    duration_s: float | None = None
    exit_code: int | None = None
    message: str | None = None
    via: str | None = None  # "primary" or "fallback N"
    reused_from: str | None = None
    gate: str | None = None  # the expression of the gate that failed last


@dataclass
class RunMeta:
    """What `run.json` holds: written once when the run starts."""

    run_id: str
    runbook: str  # the runbook's name
    path: str  # the runbook file, absolute
    started_at: str
    resumed_from: str | None = None
    audit_prev_hash: str = "0" * 64
    vars: dict[str, str] = field(default_factory=dict)
    secrets: list[str] = field(default_factory=list)  # names only: a secret's value is never stored


class RunLock:
    """An exclusive flock on `<run-dir>/lock`: released by the kernel when the holder dies."""

    def __init__(self, run_dir: Path) -> None:
        self.path = run_dir / LOCK_FILE
        self._fd: int | None = None

    def acquire(self) -> None:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 64).decode(errors="replace").strip() or "another process"
            os.close(fd)
            raise RunLocked(
                f"run {self.path.parent.name} is in use by runbook process {holder}; "
                "wait for it to finish or stop it first"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        self._fd = fd

    def held(self) -> bool:
        """Whether a live process holds this lock (a killed holder's lock is free)."""
        if not self.path.exists():
            return False
        fd = os.open(self.path, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)
        return False

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class RunState:
    """Read and write one run's state store."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        db = run_dir / STATE_FILE
        if not db.exists():
            os.close(os.open(db, os.O_WRONLY | os.O_CREAT, 0o600))
        self._db = sqlite3.connect(db, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        # WAL + NORMAL survives a killed process; after a power loss the state may lag the audit log,
        # which only makes a resume run a step again (the audit log itself is fsynced per record)
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(_SCHEMA)
        self._add_missing_columns()

    def _add_missing_columns(self) -> None:
        """A store written by an older `runbook` lacks newer columns: add them (NULL), so it can be resumed."""
        present = {row[1] for row in self._db.execute("PRAGMA table_info(steps)")}
        for name in (f.name for f in fields(StepRecord)):
            if name not in present:
                self._db.execute(f"ALTER TABLE steps ADD COLUMN {name}")

    @classmethod
    def create(cls, run_dir: Path, meta: RunMeta) -> RunState:
        run_dir.mkdir(mode=0o700, parents=True)
        fd = os.open(run_dir / META_FILE, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as handle:
            json.dump(asdict(meta), handle, indent=2)
            handle.flush()
            os.fsync(handle.fileno())
        state = cls(run_dir)
        state.set("status", "running")
        return state

    def set(self, key: str, value: str) -> None:
        self._db.execute("INSERT OR REPLACE INTO run VALUES (?, ?)", (key, value))

    def status(self) -> str:
        """The run's status; a run whose process died shows as `stopped` rather than `running`."""
        status = self.get("status") or "unknown"
        if status == "running" and not RunLock(self.run_dir).held():
            return "stopped (its process is gone; --resume continues it)"
        return status

    def get(self, key: str) -> str | None:
        row = self._db.execute("SELECT value FROM run WHERE key = ?", (key,)).fetchone()
        return None if row is None else str(row[0])

    def save(self, *records: StepRecord) -> None:
        """Write step records in one transaction: all of them or, after a kill, none."""
        with self._db:
            self._db.execute("BEGIN")
            for record in records:
                values = asdict(record)
                values["facts"] = json.dumps(record.facts)
                columns = ", ".join(values)
                marks = ", ".join("?" for _ in values)
                self._db.execute(f"INSERT OR REPLACE INTO steps ({columns}) VALUES ({marks})", tuple(values.values()))

    def records(self) -> list[StepRecord]:
        cursor = self._db.execute("SELECT * FROM steps ORDER BY position, host")
        names = [d[0] for d in cursor.description]
        out = []
        for row in cursor.fetchall():
            values = dict(zip(names, row, strict=True))
            values["facts"] = json.loads(values["facts"]) if values["facts"] else None
            out.append(StepRecord(**values))
        return out

    def close(self) -> None:
        self._db.close()


@contextlib.contextmanager
def open_state(run_dir: Path) -> Iterator[RunState]:
    state = RunState(run_dir)
    try:
        yield state
    finally:
        state.close()


def list_runs(log_dir: Path, runbook: str | None = None) -> list[RunMeta]:
    """Runs in a log folder, newest first; only those of `runbook` when given."""
    runs: list[RunMeta] = []
    if not log_dir.is_dir():
        return runs
    for meta_file in log_dir.glob(f"*/{META_FILE}"):
        try:
            meta = RunMeta(**json.loads(meta_file.read_text()))
        except (OSError, ValueError, TypeError):
            continue
        if runbook is None or meta.runbook == runbook:
            runs.append(meta)
    return sorted(runs, key=lambda m: m.started_at, reverse=True)
