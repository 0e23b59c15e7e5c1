"""The one transport interface; `ssh` and `local` implement it.

A transport runs a `RenderedCommand` (a fixed wrapper plus a byte payload on stdin, see
executor.render; the SSH transport's persistent runner runs the same vars and script its own
way, alike) and gives back a `CommandResult`. A timeout is a result, not an exception: the
transport stops the command (it closes the wrapper's stdin, or sends the runner STOP), which
kills the step's whole process group, and reports `timed_out=True`. Cancellation (Ctrl-C) does
the same and re-raises `CancelledError` once the remote side is cleaned up (`supervise`).
"""

from __future__ import annotations

import abc
import asyncio
import hashlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol

from executor.render import RenderedCommand

#: Output kept in memory per stream; beyond it only the byte count and sha256 are exact.
OUTPUT_KEEP_BYTES = 32 * 1024 * 1024
#: After stdin is closed on a timeout, how long the wrapper gets to kill and report.
KILL_GRACE_S = 10.0
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
class Captured:
    """One output stream: the kept bytes, plus the full count and hash of everything seen."""

    name: str = "stdout"
    sink: OutputSink | None = None
    data: bytearray = field(default_factory=bytearray)
    total: int = 0
    _hash: hashlib._Hash = field(default_factory=hashlib.sha256)

    def feed(self, chunk: bytes) -> None:
        if self.sink is not None:
            self.sink(self.name, chunk)
        self.total += len(chunk)
        self._hash.update(chunk)
        room = OUTPUT_KEEP_BYTES - len(self.data)
        if room > 0:
            self.data += chunk[:room]

    @property
    def sha256(self) -> str:
        return self._hash.hexdigest()


@dataclass
class CommandResult:
    """What one command attempt produced."""

    exit_code: int | None
    stdout: bytes
    stderr: bytes
    stdout_total: int
    stderr_total: int
    stdout_sha256: str
    stderr_sha256: str
    started_at: str
    duration_s: float
    timed_out: bool = False
    interrupted: bool = False
    timeout_s: float | None = None  # the limit the command ran under (set by the step context)

    @property
    def stdout_text(self) -> str:
        return self.stdout.decode("utf-8", "replace")

    @property
    def stderr_text(self) -> str:
        return self.stderr.decode("utf-8", "replace")


class CommandInterrupted(asyncio.CancelledError):
    """Cancellation that carries the interrupted command's partial result, for the audit log."""

    def __init__(self, result: CommandResult) -> None:
        super().__init__("interrupted")
        self.result = result


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


class Collector:
    """Times a command and gathers its two streams into a `CommandResult`."""

    def __init__(self, on_output: OutputSink | None = None) -> None:
        self.stdout = Captured("stdout", on_output)
        self.stderr = Captured("stderr", on_output)
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

    def result(self, exit_code: int | None, *, timed_out: bool = False, interrupted: bool = False) -> CommandResult:
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
        return collect.result(await stop(task), timed_out=True)
    except asyncio.CancelledError:
        raise CommandInterrupted(collect.result(await stop(task), interrupted=True)) from None
    return collect.result(exit_code)


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while block := handle.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


class Transport(abc.ABC):
    """One host's connection. `run` may be called concurrently; each call is its own command."""

    name: str

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
