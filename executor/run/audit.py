"""The audit log: one JSON line per remote command attempt (and per file transfer).

A plain durable writer: each record is the run's id, the context it is about (an `AuditContext`:
step, host, attempt, via) and its fields, written in one unbuffered write and fsynced before the next
command starts. Lines form a hash chain: `hash` is the sha256 of
the line's canonical JSON without `hash`, and `prev_hash` is the hash of the line before
(for the first line of a resumed run, the last line of the run it resumes). After every
line the head (count and last hash) is recorded beside the log, so that deleting lines
from the end is found too; with an audit key (executor/run/seal.py) every head also carries an HMAC.

`verify` checks the chain, then the head and the state store against it: a run that finished has
a head that matches the log's end exactly, and the log holds at least the records state.db says
it held when it last saved a step; only a run that did not finish (killed, or stopped by a failed
write) may have a head that lags the log. What each check can and cannot prove: the README's
"What `audit verify` proves".
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Collection, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from executor import durable
from executor.errors import DurableWriteError, StateError
from executor.files import json_data, lines_within, open_run_file, refusal
from executor.redact import Redactor
from executor.run.seal import AuditKey, HeadSeal, is_key_id
from executor.run.state import (
    META_FILE,
    STOPPED,
    WRITE_FAILED,
    RunMeta,
    StepRecord,
    UnreadableRun,
    open_state,
    read_meta,
)

if TYPE_CHECKING:
    from executor.transport.base import CommandResult

GENESIS = "0" * 64
AUDIT_FILE = "audit.jsonl"
HEAD_FILE = "audit.head"
#: Output kept in a record per stream; the full byte count and sha256 are always recorded.
HEAD_MAX_BYTES = 4096  # an audit.head is one short JSON object
#: The longest line read as a record: one is at most a few MiB (its outputs are clipped, KEEP_HEAD and
#: KEEP_TAIL, its command is a runbook value, loader.MAX_SCALAR_CHARS); a longer line is no record.
MAX_RECORD_BYTES = 16 * 1024 * 1024
KEEP_HEAD = 16 * 1024
KEEP_TAIL = 48 * 1024


def canonical(record: dict[str, Any]) -> str:
    return json.dumps(record, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def record_hash(record: dict[str, Any]) -> str:
    body = {k: v for k, v in record.items() if k != "hash"}
    return hashlib.sha256(canonical(body).encode("utf-8")).hexdigest()


def clip(text: str) -> tuple[str, bool]:
    """Keep the head and the tail of a long output."""
    if len(text) <= KEEP_HEAD + KEEP_TAIL:
        return text, False
    omitted = len(text) - KEEP_HEAD - KEEP_TAIL
    return f"{text[:KEEP_HEAD]}\n[... {omitted} characters omitted ...]\n{text[-KEEP_TAIL:]}", True


#: run statuses (state.db) of a run that did not finish: its head may lag the log (written without fsync)
UNFINISHED = ("running", STOPPED, WRITE_FAILED)


#: A head is written padded with spaces to this many bytes (JSON allows them; one is ~100 bytes, ~250 sealed)
HEAD_PAD_BYTES = 512


def write_private(path: Path, text: str, sync: bool = False) -> None:
    """Rewrite the audit head, mode 0600, in place: one write of HEAD_PAD_BYTES at its start, so the
    file never shrinks and a kill leaves the old head or the new one (a write within one page is never
    cut by a signal, and one sector is written whole). No fsync unless `sync`: while a run runs, a head
    that lags the log is tolerated. Replacing it through a renamed file instead cost a step ~0.5 ms
    (ext4 starts writing a file's data when it is renamed over another) and a run writes one per record.

    A failed write raises DurableWriteError (the run stops). It leaves the old head whole: the file's one
    block was allocated by the run's first write, so a later one needs no space, and a write of part of
    one page is copied into it whole or not at all."""
    data = text.encode("utf-8").ljust(HEAD_PAD_BYTES)
    what = f"the audit head ({path.name})"
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            durable.write_all(fd, data)
            if os.fstat(fd).st_size > len(data):  # after a head longer than the padding (a bigger seal)
                os.ftruncate(fd, len(data))
            if sync:
                os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as exc:
        raise durable.failed(exc, path.parent, what) from None


@dataclass(frozen=True)
class AuditContext:
    """What a record is about, bound once (an attempt's step, host, attempt and variant; a host alone for
    a note about it): its fields lead every record written with it, those left None are left out."""

    step: str | None = None
    host: str | None = None
    attempt: int | None = None
    via: str | None = None

    def fields(self) -> dict[str, Any]:
        return {name: value for name, value in vars(self).items() if value is not None}


class _DurableFile:
    """Appends each line in one unbuffered write, then fsyncs.

    A write that fails (a full disk, an I/O error) is rolled back: the file is cut back to the
    last whole line, so that the log never holds part of a record followed by more records, and
    DurableWriteError is raised. When even that fails, the partial line stays last (`verify`
    reports a torn last line, as after a kill) and the log takes no further line.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self._size = os.fstat(self._fd).st_size  # the end of the last whole line
        self._torn: DurableWriteError | None = None

    def append(self, line: str) -> None:
        """Write `line` and its newline, durably (fsynced); DurableWriteError when that fails."""
        if self._torn is not None:
            raise self._torn
        data = (line + "\n").encode("utf-8")
        try:
            durable.write_all(self._fd, data)
            os.fsync(self._fd)
        except OSError as exc:
            error = durable.failed(exc, self.path.parent, f"the audit log ({self.path.name})")
            try:
                os.ftruncate(self._fd, self._size)
                os.fsync(self._fd)
            except OSError:
                self._torn = error
            raise error from None
        self._size += len(data)

    def close(self) -> None:
        os.close(self._fd)


class AuditLog:
    """Appends hash-chained records to `<run-dir>/audit.jsonl`; `seal` seals each head written."""

    def __init__(
        self,
        run_dir: Path,
        run_id: str,
        redactor: Redactor,
        prev_hash: str = GENESIS,
        seal: HeadSeal | None = None,
    ) -> None:
        self.run_dir = run_dir
        self.run_id = run_id
        self._redact = redactor
        self._seal = seal
        self._file = _DurableFile(run_dir / AUDIT_FILE)
        self._prev = prev_hash
        self._count = 0
        self._write_head()

    def _write_head(self, sync: bool = False) -> None:
        head: dict[str, Any] = {"count": self._count, "hash": self._prev}
        if self._seal is not None:
            head["seal"] = self._seal.seal(self._count, self._prev)
        write_private(self.run_dir / HEAD_FILE, json.dumps(head), sync=sync)

    def finish(self) -> None:
        """Make the head durable (fsync) before the run records that it finished: from then on
        `verify` requires the head to match the log's end exactly."""
        self._write_head(sync=True)

    @property
    def position(self) -> tuple[int, str]:
        """(records written, last hash): what the state store keeps with each step save."""
        return self._count, self._prev

    def command(self, context: AuditContext, command: str, result: CommandResult) -> None:
        """Record one command attempt of the step, host and attempt that `context` names."""
        # imported here: `runbook audit show` reads logs, and a run has loaded the transports by now
        from executor.transport.base import OUTPUT_KEEP_BYTES

        fields: dict[str, Any] = {
            "command": command,
            "exit_code": result.exit_code,
            "timed_out": result.timed_out,
            "interrupted": result.interrupted,
            "kill_confirmed": result.kill_confirmed,
            "started_at": result.started_at,
            "duration_s": result.duration_s,
        }
        for name, data, total, digest in (
            ("stdout", result.stdout, result.stdout_total, result.stdout_sha256),
            ("stderr", result.stderr, result.stderr_total, result.stderr_sha256),
        ):
            text, clipped = clip(data.decode("utf-8", "replace"))
            fields[name] = text
            fields[f"{name}_bytes"] = total
            fields[f"{name}_sha256"] = digest
            # `total` and `digest` are of the redacted stream (transport.base.Captured): only the transport's
            # memory cap (or the clip above) truncates
            fields[f"{name}_truncated"] = clipped or total > OUTPUT_KEEP_BYTES
        self._emit(context, "command", fields)

    def transfer(self, context: AuditContext, direction: str, local: str, remote: str, size: int, sha256: str) -> None:
        self._emit(
            context,
            "transfer",
            {"direction": direction, "local": local, "remote": remote, "size": size, "sha256": sha256},
        )

    def abandoned(
        self, context: AuditContext, run_id: str, started_at: str | None, attempts: int, found: Abandoned
    ) -> None:
        """Record, at the start of a resumed run, a step that was running when run `run_id`'s process
        stopped (killed, or stopped by a failed write): what that run's log holds of its last attempt."""
        self._emit(
            context,
            "abandoned",
            {
                "run": run_id,
                "started_at": started_at,
                "attempts": attempts,
                "recorded_lines": found.lines,
                "last_exit_code": found.last_exit_code,
                "torn_tail": found.torn_tail,
                "note": found.note(run_id, attempts),
            },
        )

    def host_key_unverified(self, host: str) -> None:
        """Record, at the start of a run, that `host`'s host key is not verified (`verify_host_key: false`)."""
        self._emit(AuditContext(host=host), "host_key_unverified", {"note": f"host key verification is off for {host}"})

    def _emit(self, context: AuditContext, event: str, fields: dict[str, Any]) -> None:
        """Chain, write (durably) and count one record: the run id, the context, the event, its fields
        (every value redacted; the keys are ours), its sequence number and the hash before it."""
        record = {"run_id": self.run_id, **context.fields(), "event": event, **fields}
        record = {key: self._redact.deep(value) for key, value in record.items()}
        record["seq"] = self._count + 1
        record["prev_hash"] = self._prev
        record["hash"] = digest = record_hash(record)
        self._file.append(canonical(record))
        self._count += 1
        self._prev = digest
        self._write_head()

    @property
    def head(self) -> str:
        return self._prev

    def close(self) -> None:
        self._file.close()


@dataclass
class VerifyReport:
    """The outcome of `runbook audit verify`: `ok` unless the chain is broken."""

    ok: bool = True
    records: int = 0
    runs: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # tampering: makes `ok` false
    notes: list[str] = field(default_factory=list)  # tolerated: a torn last line, a lagging head


def read_records(run_dir: Path) -> Iterator[tuple[int, dict[str, Any] | None, bytes]]:
    """(line number, record or None when unparsable, raw line) for each line of a run's log.

    StateError when the log is no regular file: a FIFO in its place would hang `audit verify` (and a
    resume) waiting for a writer, a link to /dev/zero fill memory with one endless line."""
    path = run_dir / AUDIT_FILE
    if not os.path.lexists(path):
        return
    try:
        handle = open_run_file(path)
    except OSError as exc:
        why = f"{AUDIT_FILE}: {refusal(exc)}"
        raise StateError(f"{run_dir} is unreadable ({why})", reason=why) from None
    with handle:
        # a line longer than any record stands as its head and a newline, a whole line that is no record (a
        # torn write is a record's prefix, never this long), so verify calls it tampering wherever it is
        for number, (raw, too_long) in enumerate(lines_within(handle, MAX_RECORD_BYTES), start=1):
            if too_long:
                yield number, None, raw
                continue
            try:
                record = json_data(raw) if raw.endswith(b"\n") else None
            except ValueError:
                record = None
            yield number, record if isinstance(record, dict) else None, raw


@dataclass(frozen=True)
class Abandoned:
    """What a stopped run's log holds of a step's last attempt on a host (see `AuditLog.abandoned`)."""

    lines: list[int]  # the line numbers of that attempt's records (commands, transfers)
    last_exit_code: int | None  # of the last command among them
    torn_tail: bool  # the log ends with a torn line (an interrupted write), which may be this attempt's

    def note(self, run_id: str, attempt: int) -> str:
        if not self.lines:
            said = f"attempt {attempt}'s command left no record in run {run_id}'s log: it never finished there"
        else:
            where = ", ".join(map(str, self.lines))
            exit_code = "" if self.last_exit_code is None else f", the last with exit code {self.last_exit_code}"
            said = (
                f"run {run_id}'s log holds {len(self.lines)} record(s) of attempt {attempt} (line {where}{exit_code}); "
                "the process stopped after that, before the step's outcome was saved (e.g. in its retry delay)"
            )
        if self.torn_tail:
            said += f"; run {run_id}'s log ends with a torn line (an interrupted write), which may be this step's"
        return said


def attempt_records(run_dir: Path, attempts: Collection[tuple[str, str, int]]) -> dict[tuple[str, str, int], Abandoned]:
    """What `run_dir`'s log holds of each (step, host, attempt), read in one pass."""
    lines: dict[tuple[str, str, int], list[int]] = {key: [] for key in attempts}
    last_exit: dict[tuple[str, str, int], int | None] = dict.fromkeys(attempts)
    torn = False
    for number, record, _raw in read_records(run_dir):
        torn = record is None
        if record is None or record.get("event") not in ("command", "transfer"):
            continue
        key = (record.get("step"), record.get("host"), record.get("attempt"))
        if not all(isinstance(part, str | int) for part in key) or key not in lines:  # a damaged line: no key
            continue
        lines[key].append(number)
        if record.get("event") == "command":
            code = record.get("exit_code")
            last_exit[key] = code if isinstance(code, int) else None
    return {key: Abandoned(lines[key], last_exit[key], torn) for key in lines}


def chain_tail(run_dir: Path) -> str:
    """The hash the next run's first record links to: the last complete record's hash."""
    last = _start_hash(run_dir)
    for _n, record, _raw in read_records(run_dir):
        if record is not None and "hash" in record:
            last = str(record["hash"])
    return last


def _start_hash(run_dir: Path) -> str:
    meta = _meta(run_dir)
    return meta.audit_prev_hash if meta is not None else GENESIS


def _meta(run_dir: Path) -> RunMeta | None:
    """The run's run.json; None without one (a bare log starts at GENESIS); StateError when it is damaged."""
    meta = read_meta(run_dir)
    if isinstance(meta, UnreadableRun):
        if not (run_dir / META_FILE).exists():
            return None
        raise meta.error(run_dir.parent)
    return meta


def history(run_dir: Path) -> list[Path]:
    """`run_dir` and the runs it resumed, oldest first, following each `resumed_from`.

    StateError when a run.json on the way cannot be read or the chain comes back to a run it passed.
    A run it names that is gone ends the chain there (verify reports the broken link).
    """
    chain: list[Path] = []
    folder: Path | None = run_dir
    while folder is not None:
        if folder in chain:
            cycle = " -> ".join(f.name for f in [*reversed(chain), folder])
            why = f"resumed_from goes round in a cycle ({cycle})"
            raise StateError(f"{run_dir} is unreadable: its {why}", reason=why)
        meta = _meta(folder)
        if meta is None and chain and not folder.is_dir():
            break  # a run it resumed is gone: verify reports the broken link
        chain.append(folder)
        folder = run_dir.parent / meta.resumed_from if meta is not None and meta.resumed_from else None
    return list(reversed(chain))


def verify(run_dir: Path, report: VerifyReport | None = None, key: AuditKey | None = None) -> VerifyReport:
    """Check a run's chain, and the chains of the runs it resumed, oldest first; each against its
    head and its state store, and with `key` against the head's seal.

    StateError (not tampering) when a run.json or state.db on the way is damaged or the runs it names go round.
    """
    report = report or VerifyReport()
    previous: Path | None = None
    for folder in history(run_dir):
        meta = _meta(folder)
        expected = meta.audit_prev_hash if meta is not None else GENESIS
        if previous is not None and chain_tail(previous) != expected:
            report.problems.append(f"{folder.name}: does not link to the end of {previous.name}'s log")
        if meta is not None and meta.resumed_from and previous is None:
            report.problems.append(f"{folder.name}: the run it resumes, {meta.resumed_from}, is gone")
        _verify_run(folder, meta, expected, key, report)
        previous = folder
    report.ok = not report.problems
    return report


#: How often a run still running whose checks fail is checked again, and the pause before each time
LIVE_CHECKS = 20
LIVE_PAUSE_S = 0.025


def _verify_run(folder: Path, meta: RunMeta | None, expected: str, key: AuditKey | None, report: VerifyReport) -> None:
    """Check one run's log, then its head, state.db and seal against it, into `report`.

    A run still running rewrites its head in place (`write_private`): a read that meets that write sees
    part of the old head and part of the new, and does so again and again while the writer is paused
    mid-write (a busy host; about once in 25,000 reads against a run that writes without pause). So a
    running run whose checks fail is checked again, up to LIVE_CHECKS times over half a second: a torn
    read passes, tampering stays and is reported. A run that is not running writes nothing more."""
    for left in range(LIVE_CHECKS - 1, -1, -1):
        found = VerifyReport()
        beside = _beside(folder, meta)  # before the log: a live run's later writes then only extend the log
        chain = _verify_log(folder, expected, found)
        _check_run(folder, meta, beside, chain, key, found)
        if not found.problems or beside.status != "running" or not left:
            break
        time.sleep(LIVE_PAUSE_S)
    report.records += found.records
    report.runs += found.runs
    report.problems += found.problems
    report.notes += found.notes


def _verify_log(run_dir: Path, expected: str, report: VerifyReport) -> _Chain:
    """Check the chain of one run's log, every line of it: each break is named with what was done there
    (`_break`: a line edited, added, removed or moved), and the walk goes on past an edit, an added line or a
    removal, so that one edit is named as one and not taken for a cut as well. A move ends the walk."""
    name = run_dir.name
    report.runs.append(name)
    lines = list(read_records(run_dir))
    seqs = [r.get("seq") if r is not None else None for _n, r, _raw in lines]
    chain = _Chain(hashes=[expected])  # hashes[n]: the chain's hash after n records, while it holds
    seq = 1  # the sequence number the next record should carry
    for index, (number, record, raw) in enumerate(lines):
        if record is None and index == len(lines) - 1 and not raw.endswith(b"\n"):
            # a record and its newline go in one write, and JSON escapes any other newline: only a line
            # without its newline can be a write cut short; a whole line that is no record was added
            report.notes.append(
                f"{name}/{AUDIT_FILE}:{number}: torn last line ({len(raw)} bytes, a write cut short: the process "
                "was killed or the disk failed); tolerated, its command may have run"
            )
            continue
        if record is not None and record.get("prev_hash") == expected and record_hash(record) == record.get("hash"):
            expected, seq = str(record["hash"]), seq + 1
            if not chain.broken:
                chain.hashes.append(expected)
            continue
        chain.broken = True
        following = lines[index + 1][1] if index + 1 < len(lines) else None
        added = following is not None and following.get("prev_hash") == expected
        what, goes_on = _break(number, record, seq, seqs, added)
        report.problems.append(f"{name}/{AUDIT_FILE}:{what}")
        if not goes_on:
            break
        if record is not None and not added and not what.endswith(_COPY):  # on from what this line says it is
            expected, seq = str(record.get("hash")), int(record["seq"]) + 1
    # what the log holds: the records of the chain, or after a break every line that is a record
    report.records += sum(r is not None for _n, r, _raw in lines) if chain.broken else len(chain.hashes) - 1
    chain.last_seq = max((s for s in seqs if type(s) is int), default=0) if chain.broken else len(chain.hashes) - 1
    return chain


#: How `_break` ends what it says of a line that repeats a record (the walk goes on from the record before it).
_COPY = "(a copy of a record)"


def _break(number: int, record: dict[str, Any] | None, seq: int, seqs: list[Any], added: bool) -> tuple[str, bool]:
    """What was done at line `number`, where the chain breaks (`seq`: the record it should hold; `seqs`: every
    line's; `added`: the next line links to the record before this one), as `LINE: what`, and whether the walk
    can go on past it."""
    if record is None:
        if added:
            return f"{number}: not a complete JSON record: a line was added here (the next links to the last)", True
        return f"{number}: not a complete JSON record (a line edited beyond JSON, or added)", False
    held = record.get("seq")
    if record_hash(record) != record.get("hash"):
        if added:
            return f"{number}: a line was added here (no record of the chain; the next links to the one before)", True
        edited = f"{number}: content does not match its hash: line {number} (record {held}) was edited"
        missing = _removed(seq, held, seqs)  # an edit does not hide the lines removed before it
        return edited + (f"; {missing} removed before it" if missing else ""), type(held) is int
    if type(held) is not int:
        return f"{number}: chain broken (a line before it was edited, removed or moved)", False
    if seqs.count(held) > 1:
        return f"{number}: chain broken: a line was added here, record {held} again {_COPY}", True
    if held == seq:
        if number == 1:
            return "1: chain broken: the first record does not link to where this run's log starts (run.json)", False
        return f"{number - 1}: edited, its hash computed again: line {number} (record {held}) does not link to it", True
    if missing := _removed(seq, held, seqs):
        return f"{number}: chain broken: {missing} removed before this line (it holds record {held})", True
    return f"{number}: chain broken: record {held} stands where record {seq} belongs (lines were moved)", False


def _removed(seq: int, held: Any, seqs: list[Any]) -> str | None:
    """`record N was` (or `records N to M were`): the records a line holding record `held`, where record `seq`
    belongs, follows upon that no line holds; None where none is missing before it."""
    if type(held) is not int or held <= seq or any(missing in seqs for missing in range(seq, held)):
        return None
    return f"record {seq} was" if held == seq + 1 else f"records {seq} to {held - 1} were"


@dataclass
class _Chain:
    """What verify learnt of one run's log: the chain's hashes while it holds (`hashes[n]`: after n records),
    whether it broke anywhere, and the sequence number of its last record (the highest a line holds, after a
    break)."""

    hashes: list[str]
    broken: bool = False
    last_seq: int = 0


@dataclass(frozen=True)
class _Head:
    """What `audit.head` holds: the record count and last hash the run wrote, and its seal (if any)."""

    count: int
    hash: str
    seal: Any = None


def _read_head(run_dir: Path) -> _Head | None:
    """The run's head; None when it is missing or unreadable (a FIFO or a device in its place too), or
    not as a run writes it: a count that is no whole number from 0 (`4.5` read as 4, `true` as 1, `-1`
    indexing from the end, `1e400` an OverflowError) or a hash that is no text."""
    try:
        with open_run_file(run_dir / HEAD_FILE) as handle:
            head = json_data(handle.read(HEAD_MAX_BYTES))
        count, head_hash = head["count"], head["hash"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if type(count) is not int or count < 0 or not isinstance(head_hash, str):
        return None
    return _Head(count, head_hash, head.get("seal"))


@dataclass(frozen=True)
class _Beside:
    """What a run recorded beside its log: its status, the log's position at the last step save, the step
    rows (state.db) and its head.

    Read before the log, in the order the run writes them backwards (its status last, after the head it
    made durable; the head after each record; a step save after the records it counts): a run that is
    still running then only adds to the log after this was read, which a lagging head tolerates, and
    never makes a head or a saved position lead the log that verify reads (a false "lines were removed")."""

    status: str | None
    position: tuple[int, str] | None
    rows: list[StepRecord]
    head: _Head | None


def _beside(run_dir: Path, meta: RunMeta | None) -> _Beside:
    status, position, rows = None, None, []
    if meta is not None:  # a bare log (no run.json) has only its head
        with open_state(run_dir) as state:
            status, position, rows = state.status(), state.audit_position(), state.records()
    return _Beside(status, position, rows, _read_head(run_dir))


def _check_run(
    run_dir: Path,
    meta: RunMeta | None,
    beside: _Beside,
    chain: _Chain,
    key: AuditKey | None,
    report: VerifyReport,
) -> None:
    """The log against what the run recorded beside it: its head, state.db and, with `key`, the seal. After a
    break in the chain (already named), only what its records say of their own count: records cut from its end."""
    name, position, head, hashes = run_dir.name, beside.position, beside.head, chain.hashes
    if chain.broken:
        recorded = max(head.count if head is not None else 0, position[0] if position is not None else 0)
        if recorded > chain.last_seq:
            report.problems.append(
                f"{name}: its last record is record {chain.last_seq}, but the run recorded {recorded}: "
                f"{_last_removed(recorded - chain.last_seq)}"
            )
    else:
        _check_log_end(run_dir, hashes, beside, report)
    seal = HeadSeal(key, name, hashes[0], meta.resumed_from if meta else None) if key is not None else None
    _check_seal(name, chain.last_seq, head, seal, report)


def _last_removed(count: int) -> str:
    return "the last record was removed" if count == 1 else f"the last {count} records were removed"


def _check_log_end(run_dir: Path, hashes: list[str], beside: _Beside, report: VerifyReport) -> None:
    """An unbroken log's end against its head and the log's length state.db saved with each step."""
    name = run_dir.name
    status, position, rows, head = beside.status, beside.position, beside.rows, beside.head
    _check_head(name, hashes, head, status, report)
    if position is not None:
        if _check_position(name, hashes, position, report):
            _name_unrecorded(run_dir, rows, report)
    elif status is not None and len(hashes) > 1:
        report.notes.append(
            f"{name}: its state.db does not record the log's length (an older runbook wrote it): "
            "records cut from its end are found by its head alone"
        )


def _check_head(name: str, hashes: list[str], head: _Head | None, status: str | None, report: VerifyReport) -> None:
    """The head never leads the log; it may lag it only while the run has not finished (it is written
    after each record, without fsync, and made durable before the run records that it finished)."""
    count = len(hashes) - 1
    if head is None:
        if count:
            report.problems.append(f"{name}: {HEAD_FILE} is missing or unreadable")
        return
    if head.count > count:
        report.problems.append(
            f"{name}: log has {count} records but the run recorded {head.count}: {_last_removed(head.count - count)}"
        )
    elif hashes[head.count] != head.hash:
        report.problems.append(f"{name}: record {head.count} does not match the recorded head: the log was rewritten")
    elif head.count < count:
        lag = count - head.count
        if status is None:
            report.notes.append(f"{name}: the last {lag} record(s) were written just before the run stopped; tolerated")
        elif status in UNFINISHED:
            why = {
                "running": "the run is still running",
                STOPPED: "the run did not finish (crashed?); tolerated",
                WRITE_FAILED: "the run did not finish (a write to its run folder failed); tolerated",
            }[status]
            report.notes.append(f"{name}: head lags by {lag} record(s): {why}")
        else:
            report.problems.append(
                f"{name}: the run finished ({status}), but its head records {head.count} of the log's {count} "
                "records: the head was rolled back (a cut), or records were added after the run finished"
            )


def _check_position(name: str, hashes: list[str], position: tuple[int, str], report: VerifyReport) -> bool:
    """The log holds at least the records state.db says it held when it last saved a step; whether
    records were cut from its end."""
    saved, last = position
    count = len(hashes) - 1
    if saved > count:
        report.problems.append(
            f"{name}: state.db says the log held {saved} records when the run last saved a step, but it holds "
            f"{count}: records were cut from its end"
        )
        return True
    if hashes[saved] != last:
        where = f"record {saved}" if saved else "the hash the log starts from"
        report.problems.append(f"{name}: {where} does not match state.db's record of it: the log was rewritten")
    return False


def _name_unrecorded(run_dir: Path, rows: list[StepRecord], report: VerifyReport) -> None:
    """After a cut, name the attempts state.db says ran a command in this run (it passed, or its command
    exited) that the log no longer holds a record of."""
    ran = [(r.step, r.host, r.attempts) for r in rows if r.reused_from is None and r.attempts and _ran(r)]
    for (step, host, attempt), found in attempt_records(run_dir, ran).items():
        if not found.lines:
            report.problems.append(
                f"{run_dir.name}: state.db records that step {step!r} ran on {host} (attempt {attempt}), "
                "but the log holds no record of it"
            )


def _ran(row: StepRecord) -> bool:
    """Whether a step record's last attempt ran a command (recorded before the record was saved)."""
    return row.status == "passed" or row.exit_code is not None


def _check_seal(name: str, count: int, head: _Head | None, seal: HeadSeal | None, report: VerifyReport) -> None:
    """Without a key, say that a sealed head can be checked; with one, the head must carry its valid seal."""
    if seal is None:
        found = head.seal if head is not None else None
        if isinstance(found, dict) and is_key_id(found.get("key_id")):
            report.notes.append(f"{name}: sealed (key id {found['key_id']}); pass --key to check the seal")
        return
    if head is None:
        report.problems.append(f"{name}: not sealed: {HEAD_FILE} is missing or unreadable")
        return
    why = seal.problem(head.count, head.hash, head.seal)
    if why is not None:
        report.problems.append(f"{name}: {why}")
        return
    if head.count < count:
        report.notes.append(
            f"{name}: the last {count - head.count} record(s) come after its sealed head: the seal does not cover them"
        )
