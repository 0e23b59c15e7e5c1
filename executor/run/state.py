"""The state store of one run: `<run-dir>/state.db` (SQLite), plus `run.json` and a lock.

Each step result is written in one transaction, after its audit records are on disk, so a
kill at any point leaves a store that opens cleanly and never claims more than happened.
A resumed run is a new run folder that names the run it continues (`resumed_from`).

Only `RunState.create` makes a store, and it writes `run.json` last (atomically), so a folder
with a `run.json` always has a whole store; reading a run never writes to it (but for adding
the columns an older `runbook` did not know). A run folder that cannot be read (its `run.json`
or `state.db` missing, damaged, or naming another run) raises `StateError`, and `scan_runs`
reports such folders instead of skipping them.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
import sqlite3
import stat
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field, fields
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from executor import durable
from executor.errors import ResumeError, RunLocked, StateError
from executor.files import json_data, odd_file, open_run_file, refusal

STATE_FILE = "state.db"
#: The files SQLite keeps beside state.db (its rollback journal, write-ahead log and shared memory).
SQLITE_SIDECARS = ("-journal", "-wal", "-shm")
META_FILE = "run.json"
#: A run.json is a few KiB; one past this is damaged, and is not read whole.
META_MAX_BYTES = 1024 * 1024
LOCK_FILE = "lock"
#: written after `run.json` by the run itself: a folder holding one of these without a `run.json` was a run
_RUN_FILES = ("audit.head", "audit.jsonl")
#: what `RunState.status` returns for a run whose process died while it ran, and why
STOPPED, STOPPED_NOTE = "stopped", "its process is gone; --resume continues it"
#: the status of a run stopped by a failed write to its run folder (when that status could be written)
WRITE_FAILED = "write-failed"
#: the statuses of a step that has not run in this run: it has no facts, and resuming runs it
NOT_STARTED = ("pending", "skipped")

#: the run key under which each step save records the audit log's (count, last hash) at that moment
AUDIT_POSITION = "audit_position"

#: the length of a run id's time stamp, `YYYYMMDD-HHMMSS` (UTC): run folders sort by it
STAMP_LEN = len("YYYYMMDD-HHMMSS")
#: step-record columns stored as JSON text
_JSON_COLUMNS = ("facts", "parts", "cause")
#: How deep a stored JSON column may nest: a run stores facts bounded by executor.stepkind.FACTS_MAX_DEPTH (the
#: same 64; not imported here, that module would cost every `status` a tenth of a second), parts less. One
#: nested deeper was not written by a run, and walking it (status, a resume) would exhaust the stack.
JSON_COLUMN_MAX_DEPTH = 64

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
    parts TEXT,
    cause TEXT,
    PRIMARY KEY (step, host)
);
CREATE TABLE IF NOT EXISTS run (key TEXT PRIMARY KEY, value TEXT);
"""


#: The run key holding a campaign's search decisions, by group (executor.run.searching writes and reads it).
SEARCH_KEY = "search"


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
    parts: dict[str, str] | None = None  # digests of what the fingerprint covers (resume.definition_parts)
    cause: dict[str, str] | None = None  # the var whose value caused the last failure: {var, value, param}


#: How `RunState.save` writes a record: its columns in field order, the JSON ones, the statement (made once)
_STEP_COLUMNS = tuple(f.name for f in fields(StepRecord))
_JSON_INDEXES = tuple(_STEP_COLUMNS.index(name) for name in _JSON_COLUMNS)
_MARKS = ", ".join("?" * len(_STEP_COLUMNS))
_INSERT_STEP = f"INSERT OR REPLACE INTO steps ({', '.join(_STEP_COLUMNS)}) VALUES ({_MARKS})"


#: Why `--only` leaves out a step after the one it runs: a record with it keeps the facts of the step's last pass.
ONLY_SKIPPED = "skipped (--only)"


def passed_before(record: StepRecord | None) -> bool:
    """Whether `record` passed, or is of a step an `--only` run left out that had passed before it (the record keeps
    that pass: its facts, fingerprint and `reused_from`, the run it passed in), so that a later `--only REPORT`
    reports it rather than `skipped (never passed)`. A `--resume` runs such a step again: it may depend on the step
    the `--only` run ran."""
    if record is None:
        return False
    return record.status == "passed" or (
        record.status == "skipped" and record.message == ONLY_SKIPPED and record.reused_from is not None
    )


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
    runbook_sha256: str | None = None  # of the runbook file as this run read it
    var_args: list[str] = field(default_factory=list)  # its --var K=V, as given
    var_args_withheld: list[str] = field(default_factory=list)  # names of --var whose value held a secret
    inventory: str | None = None  # its --inventory, absolute
    host_key_unverified: list[str] = field(default_factory=list)  # hosts run with `verify_host_key: false`


class RunLock:
    """An exclusive flock on `<run-dir>/lock`: released by the kernel when the holder dies.

    The holder writes who it is into the file (`LockRecord`: its pid, the start time of that pid's process
    and the run id), so that `stop` can prove the pid is still the process that took the lock before it
    signals it (a pid is reused once its process ends). The file is opened without following a symlink or
    waiting on a FIFO, and only as a regular file."""

    def __init__(self, run_dir: Path) -> None:
        self.path = run_dir / LOCK_FILE
        self._fd: int | None = None

    def acquire(self) -> None:
        fd = self._open(os.O_RDWR | os.O_CREAT)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            record = LockRecord.parse(os.read(fd, LOCK_RECORD_MAX))
            os.close(fd)
            holder = record.pid if record else "another process"
            raise RunLocked(
                f"run {self.path.parent.name} is in use by runbook process {holder}; "
                "wait for it to finish or stop it first"
            ) from None
        with contextlib.suppress(OSError):  # who holds it, for the message above and `stop`: the flock is the lock
            os.ftruncate(fd, 0)
            record = LockRecord(os.getpid(), process_start(os.getpid()), self.path.parent.name)
            os.write(fd, record.text().encode())
        self._fd = fd

    def _open(self, flags: int) -> int:
        """The lock file's descriptor; StateError naming it when it is no regular file (a symlink, a FIFO)."""
        try:
            fd = os.open(self.path, flags | os.O_NOFOLLOW | os.O_NONBLOCK, 0o600)
        except OSError as exc:
            raise _odd(self.path, refusal(exc)) from None
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise _odd(self.path, "not a regular file (a FIFO, device or folder is never read)")
        return fd

    def held(self) -> bool:
        """Whether a live process holds this lock (a killed holder's lock is free)."""
        if not os.path.lexists(self.path):
            return False
        fd = self._open(os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)
        return False

    def holder(self) -> LockRecord | None:
        """What the holder wrote into the lock; None when it is not a record (written by an older `runbook`)."""
        fd = self._open(os.O_RDONLY)
        try:
            return LockRecord.parse(os.read(fd, LOCK_RECORD_MAX))
        finally:
            os.close(fd)

    def taken_by(self, pid: int) -> bool:
        """Whether process `pid` is the one holding this lock, as the kernel lists it (/proc/locks: a flock's
        pid is the process that took it), which no file in the run folder can forge: the record in the file
        only says who should."""
        fd = self._open(os.O_RDONLY)
        try:
            inode = os.fstat(fd).st_ino
        finally:
            os.close(fd)
        try:
            with open("/proc/locks", "rb") as handle:
                listed = handle.read(LOCKS_MAX_BYTES).splitlines()
        except OSError:
            return False
        # `1: FLOCK  ADVISORY  WRITE PID MAJ:MIN:INODE 0 EOF`; a waiter's line has `->` after its number
        return any(
            fields[1:2] == [b"FLOCK"] and fields[4:5] == [str(pid).encode()] and fields[5].endswith(b":%d" % inode)
            for fields in map(bytes.split, listed)
            if len(fields) > 5
        )

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


#: A lock's record is one short line of JSON: past this many bytes it is no record.
LOCK_RECORD_MAX = 256
#: The most of /proc/locks read (a line per lock held on the machine, ~50 bytes each).
LOCKS_MAX_BYTES = 4 << 20


@dataclass(frozen=True)
class LockRecord:
    """Who took a run's lock: its pid, when that process started (`process_start`) and the run id."""

    pid: int
    started: int | None
    run_id: str

    def text(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def parse(cls, raw: bytes) -> LockRecord | None:
        try:
            data = json_data(raw)
            record = cls(data["pid"], data["started"], data["run_id"])
        except (ValueError, TypeError, KeyError):
            return None
        shapes_fit = _fits(record.pid, "integer") and _fits(record.started, "integer or null")
        return record if shapes_fit and record.pid > 0 and isinstance(record.run_id, str) else None


def process_start(pid: int) -> int | None:
    """When process `pid` started, in clock ticks since boot (/proc/PID/stat, field 22); None when there is
    no such process (or no /proc). With the pid, it names one process: a pid is reused, never both."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            stat_line = handle.read()
        # the command name (field 2) is in parentheses and may hold anything: the fields after its last `)`
        return int(stat_line[stat_line.rindex(b")") + 2 :].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def _odd(path: Path, why: str) -> StateError:
    return StateError(f"{path} is unreadable ({why})", reason=f"{path.name}: {why}")


class RunState:
    """Read and write one run's state store."""

    def __init__(self, run_dir: Path) -> None:
        """Open the store of an existing run: StateError when it is missing or unreadable.

        Nothing is created and the schema is left as it is, but for adding the columns a store
        written by an older `runbook` lacks (so that it can be resumed).
        """
        self.run_dir = run_dir
        self._lock: RunLock | None = None  # only a store this process creates holds its run's lock
        db = run_dir / STATE_FILE
        for path in (db, *(db.with_name(db.name + suffix) for suffix in SQLITE_SIDECARS)):
            odd = odd_file(path)  # SQLite opens each itself: it would follow a symlink, and wait on a FIFO
            if odd:
                raise _odd(path, odd)
        if not db.is_file():
            raise StateError(
                f"{db} is missing: nothing of run {run_dir.name} can be reused; run without --resume to start over",
                reason=f"{STATE_FILE} is missing",
            )
        try:
            # mode=rw: never create the file (a deleted store must not come back empty)
            self._db = sqlite3.connect(f"{db.absolute().as_uri()}?mode=rw", uri=True, isolation_level=None)
        except sqlite3.Error as exc:
            raise _unreadable(db, exc) from None
        try:
            with self._reading():
                self._db.execute("PRAGMA synchronous=NORMAL")  # this connection's setting, not the file's
                tables = {row[0] for row in self._db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
                if not {"steps", "run"} <= tables:
                    raise _unreadable(db, "no steps or run table: not a runbook state store")
                self._add_missing_columns()
        except BaseException:
            self._db.close()
            raise

    def _add_missing_columns(self) -> None:
        """A store written by an older `runbook` lacks newer columns: add them (NULL), so it can be opened.

        Its steps' fingerprints were computed another way, so a resume runs them again (saying
        "changed since RUN: its definition"): never a step reused on a stale definition."""
        present = {row[1] for row in self._db.execute("PRAGMA table_info(steps)")}
        for name in (f.name for f in fields(StepRecord)):
            if name not in present:
                self._db.execute(f"ALTER TABLE steps ADD COLUMN {name}")

    @contextlib.contextmanager
    def _reading(self) -> Iterator[None]:
        """A damaged store (sqlite's error, or rows that are no step records) raises StateError."""
        try:
            yield
        except sqlite3.DatabaseError as exc:
            raise _unreadable(self.run_dir / STATE_FILE, exc) from None

    @classmethod
    def create(cls, run_dir: Path, meta: RunMeta, records: Sequence[StepRecord] = ()) -> RunState:
        """A new run folder, published whole: its lock taken (held until `close`), its store written
        (status `running`, the first step rows), then `run.json` (atomically). A folder without a
        `run.json` is no run: a process killed before then leaves nothing a resume could pick."""
        run_dir.mkdir(mode=0o700, parents=True)
        lock = RunLock(run_dir)
        lock.acquire()
        db = run_dir / STATE_FILE
        state = cls.__new__(cls)
        state.run_dir, state._lock = run_dir, lock
        published = False
        try:
            try:
                os.close(os.open(db, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
                state._db = sqlite3.connect(db, isolation_level=None)
            except OSError as exc:
                raise durable.failed(exc, run_dir, f"the state store ({STATE_FILE})") from None
            except sqlite3.Error as exc:
                raise durable.from_sqlite(exc, run_dir) from None
            try:
                with state._writing():
                    state._db.execute("PRAGMA journal_mode=WAL")
                    # WAL + NORMAL survives a killed process; after a power loss the state may lag the audit
                    # log, which only makes a resume run a step again (the audit log is fsynced per record)
                    state._db.execute("PRAGMA synchronous=NORMAL")
                    state._db.executescript(_SCHEMA)
                state.set("status", "running")
                state.save(*records, audit=(0, meta.audit_prev_hash))  # the log is empty yet
                partial = run_dir / f"{META_FILE}.partial"
                try:
                    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                    try:
                        durable.write_all(fd, json.dumps(asdict(meta), indent=2).encode("utf-8"))
                        os.fsync(fd)
                    finally:
                        os.close(fd)
                    os.rename(partial, run_dir / META_FILE)  # a kill leaves no run.json or a whole one
                    published = True
                    directory = os.open(run_dir, os.O_RDONLY)
                    try:
                        os.fsync(directory)
                    finally:
                        os.close(directory)
                except OSError as exc:
                    raise durable.failed(exc, run_dir, META_FILE) from None
            except BaseException:
                state._db.close()
                raise
        except BaseException:
            # a folder whose run.json could not be made durable is no run: never one a resume could pick
            with contextlib.suppress(OSError):
                (run_dir / (META_FILE if published else f"{META_FILE}.partial")).unlink(missing_ok=True)
            lock.release()
            raise
        return state

    def set(self, key: str, value: str) -> None:
        """Write a run key (`status`, `finished_at`); a failed write raises DurableWriteError."""
        with self._writing():
            self._db.execute("INSERT OR REPLACE INTO run VALUES (?, ?)", (key, value))

    @contextlib.contextmanager
    def _writing(self) -> Iterator[None]:
        """A write SQLite could not make (a full disk, an I/O error, a read-only file system) raises
        DurableWriteError: the run stops, and the store keeps what it held before the write."""
        try:
            yield
        except sqlite3.Error as exc:
            if self._db.in_transaction:  # a failed COMMIT can leave it open: never let a later write join it
                with contextlib.suppress(sqlite3.Error):
                    self._db.execute("ROLLBACK")
            raise durable.from_sqlite(exc, self.run_dir) from None

    def status(self) -> str:
        """The run's status: one word; a run whose process died is `stopped` (STOPPED_NOTE says why)."""
        status = self.get("status") or "unknown"
        if status == "running" and not RunLock(self.run_dir).held():
            return STOPPED
        return status

    def get(self, key: str) -> str | None:
        with self._reading():
            row = self._db.execute("SELECT value FROM run WHERE key = ?", (key,)).fetchone()
        return None if row is None else str(row[0])

    def save(self, *records: StepRecord, audit: tuple[int, str] | None = None) -> None:
        """Write step records in one transaction: all of them or, after a kill or a failed write, none.

        `audit`: the audit log's (record count, last hash) at this moment, kept with them, so that
        `audit verify` finds records cut from the log's end (the step records are saved after
        their audit records are on disk: the log holds at least that much)."""
        with self._writing(), self._db:
            self._db.execute("BEGIN")
            if audit is not None:
                position = json.dumps({"count": audit[0], "hash": audit[1]})
                self._db.execute("INSERT OR REPLACE INTO run VALUES (?, ?)", (AUDIT_POSITION, position))
            for record in records:
                # the fields as they are (asdict would deep-copy the facts only for json.dumps to read them)
                values = [getattr(record, name) for name in _STEP_COLUMNS]
                for index in _JSON_INDEXES:
                    values[index] = json.dumps(values[index])
                self._db.execute(_INSERT_STEP, values)

    def audit_position(self) -> tuple[int, str] | None:
        """What the last `save` recorded of the audit log (None for a store written before it did so);
        StateError when it is damaged."""
        raw = self.get(AUDIT_POSITION)
        if raw is None:
            return None
        try:
            position = json_data(raw)
            count, last = position["count"], position["hash"]
            if not (_fits(count, "integer") and count >= 0 and _fits(last, "hash")):
                raise TypeError(f"expected a count and a hash, got {raw[:80]!r}")
        except (ValueError, TypeError, KeyError) as exc:
            raise _unreadable(self.run_dir / STATE_FILE, f"run key {AUDIT_POSITION!r}: {exc}") from None
        return count, last

    def records(self) -> list[StepRecord]:
        with self._reading():
            cursor = self._db.execute("SELECT * FROM steps ORDER BY position, host")
            names = [d[0] for d in cursor.description]
            rows = cursor.fetchall()
        out = []
        for row in rows:
            values = dict(zip(names, row, strict=True))
            try:
                for name in _JSON_COLUMNS:
                    if not isinstance(values[name], str | None):
                        raise TypeError(f"field {name!r} must be JSON text, not {_shown(values[name])}")
                    values[name] = _json_column(name, values[name]) if values[name] else None
                why = _misshapen(values, _RECORD_SHAPES)
                if why:
                    raise TypeError(why)
                out.append(StepRecord(**values))
            except (ValueError, TypeError) as exc:
                raise _unreadable(self.run_dir / STATE_FILE, f"step {values.get('step')!r}: {exc}") from None
        return out

    def close(self) -> None:
        self._db.close()
        if self._lock is not None:
            self._lock.release()


@contextlib.contextmanager
def open_state(run_dir: Path) -> Iterator[RunState]:
    state = RunState(run_dir)
    try:
        yield state
    finally:
        state.close()


def _json_column(name: str, text: str) -> Any:
    """A step record's JSON column, read; ValueError when it is no JSON or nests deeper than
    JSON_COLUMN_MAX_DEPTH (json.loads itself gives up, with a RecursionError, only past about 1000 levels)."""
    try:
        return json_data(text, JSON_COLUMN_MAX_DEPTH)
    except ValueError as exc:
        raise ValueError(f"field {name!r}: {exc}") from None


def _unreadable(db: Path, why: object) -> StateError:
    return StateError(f"{db} is unreadable ({why})", reason=f"{db.name}: {why}")


@dataclass(frozen=True)
class UnreadableRun:
    """A run folder that cannot be read: its `run.json` is missing or damaged, or names another run."""

    run_id: str  # the folder's name
    reason: str
    runbook: str | None = None  # when run.json could be read
    named: str | None = None  # the run id run.json holds, when it is not the folder's name

    def error(self, log_dir: Path, hint: str = "") -> StateError:
        return StateError(f"{log_dir / self.run_id} is unreadable ({self.reason}){hint}", reason=self.reason)


@dataclass
class RunFolders:
    """The run folders of a log folder, newest first: the readable runs and the unreadable folders."""

    runs: list[RunMeta]
    unreadable: list[UnreadableRun]


#: What each field of `run.json` must hold: a value of another type makes the folder unreadable (named, exit 2)
_META_SHAPES: dict[str, str] = {
    "run_id": "text",
    "runbook": "text",
    "path": "text",
    "started_at": "text",
    "resumed_from": "run id or null",
    "audit_prev_hash": "hash",
    "vars": "object of texts",
    "secrets": "list of texts",
    "runbook_sha256": "text or null",
    "var_args": "list of texts",
    "var_args_withheld": "list of texts",
    "inventory": "text or null",
    "host_key_unverified": "list of texts",
}
#: A step's recorded duration is below this (about 31 years): an infinite or NaN one of a damaged state.db made
#: `runbook status` raise OverflowError formatting it, a 1e308 one print 300 digits.
SECONDS_MAX = 1e9
#: ... and each column of a step's row in `state.db` (`facts` is any JSON value)
_RECORD_SHAPES: dict[str, str] = {
    "step": "text",
    "host": "text",
    "position": "integer",
    "status": "text",
    "fingerprint": "text",
    "attempts": "integer",
    "started_at": "text or null",
    "duration_s": "seconds (0 to 1e9) or null",
    "exit_code": "integer or null",
    "message": "text or null",
    "via": "text or null",
    "reused_from": "text or null",
    "gate": "text or null",
    "parts": "object of texts or null",
    "cause": "object of texts with var and value or null",
}
_HEX = frozenset("0123456789abcdef")


def _fits(value: Any, shape: str) -> bool:
    """Whether a value read from run.json or state.db has the shape a field needs."""
    if shape.endswith(" or null"):
        return value is None or _fits(value, shape.removesuffix(" or null"))
    if shape == "text":
        return isinstance(value, str)
    if shape == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if shape == "number":
        return isinstance(value, int | float) and not isinstance(value, bool)
    if shape == "seconds (0 to 1e9)":  # compared, never converted: NaN and infinities fail both bounds
        return _fits(value, "number") and 0 <= value < SECONDS_MAX
    if shape == "hash":
        return isinstance(value, str) and len(value) == 64 and set(value) <= _HEX
    if shape == "run id":  # a folder beside this one: never a path
        return isinstance(value, str) and value not in ("", ".", "..") and "/" not in value and "\0" not in value
    if shape == "list of texts":
        return isinstance(value, list) and all(isinstance(v, str) for v in value)
    if shape == "object of texts":
        return isinstance(value, dict) and all(isinstance(v, str) for v in value.values())
    if shape == "object of texts with var and value":  # a cause: what status and the console name
        return _fits(value, "object of texts") and {"var", "value"} <= value.keys()
    raise AssertionError(shape)


def _misshapen(values: dict[str, Any], shapes: dict[str, str]) -> str | None:
    """Why `values` do not fit `shapes` (the first field that does not), or None."""
    for name, shape in shapes.items():
        if name in values and not _fits(values[name], shape):
            return f"field {name!r} must be {shape}, not {_shown(values[name])}"
    return None


def _shown(value: Any) -> str:
    text = json.dumps(value, default=str) if not isinstance(value, bytes) else repr(value)
    return f"{type(value).__name__} {text[:40]}{'...' if len(text) > 40 else ''}"


def read_meta(folder: Path) -> RunMeta | UnreadableRun | None:
    """The folder's run.json, each field of the type it must have; None when the folder is no run
    (or one cut short before its run.json)."""
    meta_file = folder / META_FILE
    if not os.path.lexists(meta_file):
        if any((folder / name).exists() for name in _RUN_FILES):
            return UnreadableRun(folder.name, f"{META_FILE} is missing")
        return None
    try:
        with open_run_file(meta_file) as handle:  # a FIFO or /dev/zero in its place must not hang a listing
            raw = handle.read(META_MAX_BYTES + 1)
        if len(raw) > META_MAX_BYTES:
            raise TypeError(f"larger than {META_MAX_BYTES // 1024} KiB: no run.json is")
        data = json_data(raw.decode("utf-8"))
        if not isinstance(data, dict):
            raise TypeError(f"expected an object, got {type(data).__name__}")
        why = _misshapen(data, _META_SHAPES)
        if why:
            raise TypeError(why)
        meta = RunMeta(**data)
    except OSError as exc:
        return UnreadableRun(folder.name, f"{META_FILE}: {refusal(exc)}")
    except (ValueError, TypeError) as exc:
        return UnreadableRun(folder.name, f"{META_FILE}: {exc}")
    if meta.run_id != folder.name:
        why = f"its {META_FILE} names run {meta.run_id}, not {folder.name}"
        return UnreadableRun(folder.name, why, runbook=meta.runbook, named=meta.run_id)
    if meta.resumed_from == meta.run_id:
        return UnreadableRun(folder.name, f"its {META_FILE} says it resumed itself", runbook=meta.runbook)
    return meta


def _folder_meta(folder: Path) -> RunMeta | UnreadableRun | None:
    """`read_meta` of a folder of a log folder; one that is a symlink is never followed (its files would be
    shown as a run of this log folder): it is unreadable, saying so."""
    if folder.is_symlink():
        return UnreadableRun(folder.name, "a symlink, not a run folder (never followed)")
    return read_meta(folder)


def _cycles(metas: Sequence[RunMeta]) -> dict[str, str]:
    """The runs whose `resumed_from` links go round in a cycle, each with the cycle as text."""
    by_id = {m.run_id: m for m in metas}
    found: dict[str, str] = {}
    settled: set[str] = set()  # runs whose chain ends (or enters a cycle already found)
    for meta in metas:
        walk: list[str] = []
        current: RunMeta | None = meta
        while current is not None and current.run_id not in settled:
            if current.run_id in walk:
                cycle = walk[walk.index(current.run_id) :]
                text = " -> ".join([*cycle, current.run_id])
                found.update(dict.fromkeys(cycle, text))
                break
            walk.append(current.run_id)
            current = by_id.get(current.resumed_from) if current.resumed_from else None
        settled.update(walk)
    return found


def scan_runs(log_dir: Path, runbook: str | None = None) -> RunFolders:
    """Runs in a log folder, newest first, and the folders that cannot be read; only those of `runbook`
    when given (an unreadable folder whose runbook is unknown is listed for every runbook). Runs whose
    `resumed_from` links go round in a cycle are unreadable."""
    found = RunFolders([], [])
    if not os.path.isdir(log_dir):  # False, not pathlib's OSError, for a name too long (ENAMETOOLONG)
        return found
    entries = [entry for folder in log_dir.iterdir() if folder.is_dir() and (entry := _folder_meta(folder)) is not None]
    metas = [entry for entry in entries if isinstance(entry, RunMeta)]
    cycles = _cycles(metas)
    for entry in entries:
        if runbook is not None and entry.runbook not in (runbook, None):
            continue
        if isinstance(entry, RunMeta) and entry.run_id in cycles:
            why = f"its {META_FILE} resumed_from goes round in a cycle ({cycles[entry.run_id]})"
            entry = UnreadableRun(entry.run_id, why, runbook=entry.runbook)
        if isinstance(entry, UnreadableRun):
            found.unreadable.append(entry)
        else:
            found.runs.append(entry)
    found.runs.sort(key=lambda m: m.started_at, reverse=True)
    found.unreadable.sort(key=lambda u: u.run_id, reverse=True)  # run ids start with their UTC start time
    return found


def find_run(
    log_dir: Path,
    wanted: str | None = None,
    runbook: str | None = None,
    naming: str = "give the run to resume (--resume RUN_ID)",
) -> RunMeta | None:
    """The run `wanted` names (a run id, or a prefix of exactly one), or the latest run when None.

    None only when `wanted` is None and there is no run (of `runbook`, when given). ResumeError when
    no run or several match `wanted`; StateError when the run named is an unreadable folder, or when
    the latest would be picked while a folder at least as new cannot be read (it may be the latest
    run): `naming` says how to pick a run instead.
    """
    found = scan_runs(log_dir, runbook)
    of = f" of runbook '{runbook}'" if runbook else ""
    if wanted is None:
        latest = found.runs[0] if found.runs else None
        for folder in found.unreadable:  # newest first
            if latest is None or folder.run_id[:STAMP_LEN] >= latest.run_id[:STAMP_LEN]:
                raise folder.error(log_dir, f"; {naming} or move that folder away")
        return latest
    exact = [m for m in found.runs if m.run_id == wanted]
    if exact:
        return exact[0]
    broken = [u for u in found.unreadable if wanted in (u.run_id, u.named)]
    if broken:
        raise broken[0].error(log_dir)
    matches: list[RunMeta | UnreadableRun] = [m for m in found.runs if m.run_id.startswith(wanted)]
    matches += [u for u in found.unreadable if u.run_id.startswith(wanted)]
    if not matches:
        others = [m for m in scan_runs(log_dir).runs if m.run_id.startswith(wanted)] if runbook else []
        if len(others) == 1:
            raise ResumeError(f"run {others[0].run_id} is a run of runbook '{others[0].runbook}', not '{runbook}'")
        raise ResumeError(f"no run {wanted}{of} in {log_dir}")
    if len(matches) > 1:
        names = ", ".join(sorted((m.run_id for m in matches), reverse=True))
        raise ResumeError(f"run id prefix '{wanted}' is ambiguous{of} in {log_dir}: it matches {names}")
    (match,) = matches
    if isinstance(match, UnreadableRun):
        raise match.error(log_dir)
    return match
