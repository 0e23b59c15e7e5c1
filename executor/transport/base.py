"""The one transport interface; `ssh` and `local` implement it.

A transport runs a `RenderedCommand` (a fixed wrapper plus a byte payload on stdin, see
executor.render; the SSH transport's persistent runner runs the same vars and script its own
way, alike) and gives back a `CommandResult`. A timeout is a result, not an exception: the
transport stops the command (it closes the wrapper's stdin, or sends the runner STOP), which
kills every process of the step's session, whatever process group it moved to, and reports
`timed_out=True`; `kill_confirmed` says whether the host confirmed that (its note, the last line of
the step's stderr, `kill_note`). Cancellation (Ctrl-C) does the same and re-raises `CancelledError`
once the remote side is cleaned up (`supervise`).

Output is redacted as it arrives; beyond OUTPUT_KEEP_BYTES, it keeps its head and its tail (`Captured`).
File transfers stream in TRANSFER_CHUNK pieces, hashing as they go, and `check_arrived` compares the
source's size and sha256 with what the destination's side computed from the file that arrived.
"""

from __future__ import annotations

import abc
import asyncio
import hashlib
import os
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import BinaryIO, Protocol

from executor.command_result import CommandResult as CommandResult  # the interface's result (executor.command_result)
from executor.diagnostics import NO_LOG, Log
from executor.errors import CommandInterrupted as CommandInterrupted  # supervise raises it (executor.errors)
from executor.errors import TransportError
from executor.files import open_regular as open_regular  # here too for transfer.py (base.open_regular)
from executor.redact import NO_SECRETS, Redactor, StreamRedactor
from executor.render import KILLED_NOTE, UNCONFIRMED_NOTE, RenderedCommand

#: Output kept in memory per stream: its first half and its last half (an error is printed last);
#: between them a line says how much was dropped. The byte count and sha256 cover everything (redacted).
OUTPUT_KEEP_BYTES = 32 * 1024 * 1024
DROPPED_NOTE = b"\n[runbook] %d bytes of output dropped here (the first %d and the last %d of %d bytes are kept)\n"
#: After stdin is closed on a timeout, how long the wrapper gets to kill and report (it needs at
#: most ~2 s of TERM's grace and ~2 s of KILL rounds).
KILL_GRACE_S = 10.0
#: File transfers move this much at a time: memory stays bounded whatever a file's size.
TRANSFER_CHUNK = 4 * 1024 * 1024
#: After a command has exited, how long its output may stay open (a background process holding it).
OUTPUT_DRAIN_S = 2.0
_EXIT_POLL_S = 0.2
HELD_OPEN_NOTE = (
    b"\n[runbook] the script exited, but a process it left running still holds its output open; "
    b"stopped reading after %gs (a daemon must redirect its stdout and stderr)\n" % OUTPUT_DRAIN_S
)


#: Called with ("stdout" | "stderr", chunk) as output arrives, for live progress.
OutputSink = Callable[[str, bytes], None]


@dataclass
class Digest:
    """Size and sha256 of a byte stream, computed as it passes."""

    size: int = 0
    _hash: hashlib._Hash = field(default_factory=hashlib.sha256)

    def update(self, chunk: bytes) -> None:
        self.size += len(chunk)
        self._hash.update(chunk)

    @property
    def sha256(self) -> str:
        return self._hash.hexdigest()


@dataclass
class Captured:
    """One output stream: its first `head_limit` bytes and its last `tail_limit` bytes (`data`), plus
    the full count and hash of everything seen. Memory stays within the two limits and a chunk.

    The stream is redacted as it arrives (`redactor`), before anything else sees it: the live sink,
    the count and the hash (so neither is a digest of a secret that could be checked offline), and the
    cut between head and tail (so no cut leaves a part of a secret). The redactor holds back the last
    few bytes of the stream, which may start a secret; reading what is kept (`data`, `end`, `total`,
    `sha256`) first takes them in, as it is done once the stream has ended.
    """

    name: str = "stdout"
    sink: OutputSink | None = None
    head_limit: int = field(default_factory=lambda: OUTPUT_KEEP_BYTES // 2)
    tail_limit: int = field(default_factory=lambda: OUTPUT_KEEP_BYTES - OUTPUT_KEEP_BYTES // 2)
    redactor: Redactor = NO_SECRETS
    _seen: Digest = field(default_factory=Digest)  # everything, kept or not (redacted)
    _head: bytearray = field(default_factory=bytearray)
    _tail: deque[bytes] = field(default_factory=deque)  # chunks; only the last `tail_limit` bytes count
    _tail_size: int = 0
    _stream: StreamRedactor = field(init=False)

    def __post_init__(self) -> None:
        self._stream = self.redactor.stream()

    def feed(self, chunk: bytes) -> None:
        self._keep(self._stream.feed(chunk))

    def _settle(self) -> None:
        """Take in what the redactor holds back (the stream has ended, or its end is being read)."""
        self._keep(self._stream.flush())

    def _keep(self, chunk: bytes) -> None:
        if not chunk:
            return
        if self.sink is not None:
            self.sink(self.name, chunk)
        self._seen.update(chunk)
        room = self.head_limit - len(self._head)
        if room > 0:
            self._head += chunk[:room]
            chunk = chunk[room:]
        if chunk and self.tail_limit > 0:
            self._tail.append(bytes(chunk))
            self._tail_size += len(chunk)
            while self._tail_size - len(self._tail[0]) >= self.tail_limit:
                self._tail_size -= len(self._tail.popleft())

    @property
    def dropped(self) -> int:
        """Bytes seen but not kept (between the head and the tail)."""
        return self.total - len(self._head) - min(self._tail_size, self.tail_limit)

    @property
    def data(self) -> bytes:
        """What is kept: everything, or the head, a line saying how much was dropped, and the tail."""
        self._settle()
        tail = b"".join(self._tail)[-self.tail_limit :] if self.tail_limit > 0 else b""
        dropped = self.dropped
        if dropped <= 0:
            return bytes(self._head) + tail
        note = DROPPED_NOTE % (dropped, len(self._head), len(tail), self.total)
        return bytes(self._head) + note + tail

    def end(self, size: int = 4096) -> bytes:
        """The last `size` bytes of what is kept (the note between head and tail left out), without
        joining the whole tail."""
        self._settle()
        from_tail = min(size, self._tail_size, self.tail_limit)
        kept: list[bytes] = []
        need = from_tail
        for chunk in reversed(self._tail):
            if need <= 0:
                break
            kept.append(chunk[-need:])
            need -= len(kept[-1])
        if size > from_tail:
            kept.append(bytes(self._head[-(size - from_tail) :]))
        return b"".join(reversed(kept))

    @property
    def total(self) -> int:
        self._settle()
        return self._seen.size

    @property
    def sha256(self) -> str:
        self._settle()
        return self._seen.sha256


def kill_report(result: CommandResult) -> str:
    """What a stopped command's messages may say of its processes: only what the host confirmed."""
    if result.kill_confirmed:
        return "every process it started was killed (the host confirmed its session empty)"
    return "could not confirm that the step's processes were killed"


@dataclass
class Transfer:
    """An audited file transfer."""

    direction: str  # "put" or "get"
    local: str
    remote: str
    size: int
    sha256: str


class ByteReader(Protocol):
    async def read(self, n: int = -1) -> bytes: ...


def kill_note(stderr_end: bytes) -> bool | None:
    """What the last line of a step's stderr says of its kill, as the wrapper or the runner wrote it
    (a note of the controller's about output held open may follow): True confirmed, False not, None
    no such line."""
    text = stderr_end.removesuffix(HELD_OPEN_NOTE).rstrip(b"\n")
    last = text[text.rfind(b"\n") + 1 :].decode("utf-8", "replace")
    if last == KILLED_NOTE:
        return True
    if last.startswith(UNCONFIRMED_NOTE):
        return False
    return None


class Collector:
    """Times a command and gathers its two streams into a `CommandResult`."""

    def __init__(self, on_output: OutputSink | None = None, redactor: Redactor = NO_SECRETS) -> None:
        self.stdout = Captured("stdout", on_output, redactor=redactor)
        self.stderr = Captured("stderr", on_output, redactor=redactor)
        self.started_at = datetime.now(UTC).isoformat(timespec="milliseconds")
        self._t0 = time.monotonic()

    @staticmethod
    async def pump(reader: ByteReader, into: Captured) -> None:
        while chunk := await reader.read(65536):
            into.feed(chunk)

    async def read_until_exit(self, stdout: ByteReader, stderr: ByteReader, exited: Callable[[], bool]) -> bool:
        """Read both streams to their end, but once the command has exited give them only
        OUTPUT_DRAIN_S more: a process the script left running must not turn a finished command
        into a timeout. False when reading was cut short (a note on stderr says so)."""
        pumps = asyncio.ensure_future(asyncio.gather(self.pump(stdout, self.stdout), self.pump(stderr, self.stderr)))
        try:
            while not pumps.done():
                await asyncio.wait({pumps}, timeout=_EXIT_POLL_S)
                if not pumps.done() and exited():
                    await asyncio.wait({pumps}, timeout=OUTPUT_DRAIN_S)
                    if not pumps.done():
                        self.stderr.feed(HELD_OPEN_NOTE)
                        return False
            pumps.result()  # a reader's error, if any
            return True
        finally:
            pumps.cancel()
            pumps.add_done_callback(lambda f: f.cancelled() or f.exception())  # nobody else will read it

    def stopped(self, exit_code: int | None) -> bool:
        """After a stop: whether the host confirmed the kill; where it said nothing, a note on stderr
        says that it could not be confirmed, and why."""
        said = kill_note(self.stderr.end())
        if exit_code is not None and said is not None:
            return said
        why = (
            f"no answer from the host within {KILL_GRACE_S:g}s of stopping it"
            if exit_code is None
            else "the host did not report it"
        )
        self.stderr.feed(f"\n{UNCONFIRMED_NOTE}: {why}\n".encode())
        return False

    def result(
        self,
        exit_code: int | None,
        *,
        timed_out: bool = False,
        interrupted: bool = False,
        kill_confirmed: bool | None = None,
    ) -> CommandResult:
        return CommandResult(
            exit_code=exit_code,
            stdout=bytes(self.stdout.data),
            stderr=bytes(self.stderr.data),
            stdout_total=self.stdout.total,
            stderr_total=self.stderr.total,
            stdout_sha256=self.stdout.sha256,
            stderr_sha256=self.stderr.sha256,
            started_at=self.started_at,
            duration_s=round(time.monotonic() - self._t0, 6),
            timed_out=timed_out,
            interrupted=interrupted,
            kill_confirmed=kill_confirmed,
        )


#: Stops a command whose time ran out or which was interrupted, given the task waiting for its exit
#: code; returns the exit code, or None when it could not be had within the grace.
Stopper = Callable[["asyncio.Future[int | None]"], Awaitable[int | None]]


async def supervise(collect: Collector, finish: Awaitable[int | None], timeout: float, stop: Stopper) -> CommandResult:
    """Wait up to `timeout` for `finish` (the command's exit code); every transport's one rule for
    the end of a command. A timeout stops the command and is a result (`timed_out`); a cancellation
    stops it too, then raises `CommandInterrupted` with the partial result. Other errors of
    `finish` propagate for the transport to name."""
    task = asyncio.ensure_future(finish)
    try:
        exit_code = await asyncio.wait_for(asyncio.shield(task), timeout)
    except TimeoutError:
        code = await stop(task)
        return collect.result(code, timed_out=True, kill_confirmed=collect.stopped(code))
    except asyncio.CancelledError:
        code = await stop(task)
        raise CommandInterrupted(collect.result(code, interrupted=True, kill_confirmed=collect.stopped(code))) from None
    # the host notes what the script left running that would not die
    return collect.result(exit_code, kill_confirmed=False if kill_note(collect.stderr.end()) is False else None)


def is_hole(chunk: bytes) -> bool:
    """All zeros: a copy leaves a hole there (seek past it) and the destination stays sparse."""
    return chunk.count(0) == len(chunk)


def read_hashed(source: BinaryIO, digest: Digest) -> bytes:
    """The next TRANSFER_CHUNK of `source`, counted into `digest` (in a thread: hashing frees the GIL)."""
    chunk = source.read(TRANSFER_CHUNK)
    digest.update(chunk)
    return chunk


def write_piece(target: BinaryIO, chunk: bytes) -> None:
    """Write a chunk at the file's position, or seek past it where it is a hole."""
    if is_hole(chunk):
        target.seek(len(chunk), os.SEEK_CUR)
    else:
        target.write(chunk)


def copy_file(source: Path, target: Path) -> Digest:
    """Copy in TRANSFER_CHUNK pieces, hashing what was read; holes stay holes, and the copy has the
    source's full size (a trailing hole included)."""
    digest = Digest()
    with open_regular(source) as src, target.open("wb") as dst:
        while chunk := read_hashed(src, digest):
            write_piece(dst, chunk)
        dst.truncate(digest.size)
    return digest


def file_digest(path: Path) -> Digest:
    """Size and sha256 of a file as read back (the bytes a reader gets, holes as zeros)."""
    digest = Digest()
    with open_regular(path) as handle:  # never a FIFO (its open blocks) or a device (it never ends)
        while read_hashed(handle, digest):
            pass
    return digest


def file_sha256(path: Path) -> str:
    return file_digest(path).sha256


def check_arrived(what: str, sent: Digest, size: int, sha256: str) -> None:
    """A transfer's source against what its destination's side computed; TransportError on a difference."""
    if (size, sha256) != (sent.size, sent.sha256):
        raise TransportError(
            f"{what} did not arrive whole: the source is {sent.size} bytes (sha256 {sent.sha256}), "
            f"what arrived is {size} bytes (sha256 {sha256})"
        )


class Transport(abc.ABC):
    """One host's connection. `run` may be called concurrently; each call is its own command."""

    name: str
    #: Masks the run's secrets in every command's output as it arrives (set by `transport_for`).
    redactor: Redactor = NO_SECRETS
    #: The run's diagnostics with this host bound (set by `transport_for`; outside a run, nowhere).
    log: Log = NO_LOG

    async def connect(self) -> None:
        """Open the connection ahead of the first command (optional; `run` connects lazily)."""

    @abc.abstractmethod
    async def run(
        self, command: RenderedCommand, timeout: float, on_output: OutputSink | None = None
    ) -> CommandResult: ...

    @abc.abstractmethod
    async def put(self, local: Path, remote: str) -> Transfer: ...

    @abc.abstractmethod
    async def get(self, remote: str, local: Path) -> Transfer: ...

    def take_notes(self) -> list[str]:
        """What the user should hear about this host once (a fallback taken), since the last call."""
        return []

    async def close(self) -> None:
        """Release the connection."""
