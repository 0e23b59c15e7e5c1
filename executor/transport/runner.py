"""The controller's side of the persistent runner (runner_host.py): one per SSH connection.

Every SSH exec request runs through the user's login shell, and Debian's bash sources ~/.bashrc
even for commands sent by sshd: a host with a slow or chatty shell start-up (conda init, pyenv,
module systems, echoes) pays it for every command, and what it prints lands in the command's
output. `HostRunner.start` pays it once: one exec channel whose login shell becomes `bash
--noprofile --norc`, which records its environment (`env -0`, on fd 3) and becomes `python3 -I -S
-u` running a bootstrap that reads the runner program from stdin by length. The runner's first
output is a random token sent by the controller: everything before it is the shell's and is
dropped, the channel's stderr is drained and kept only as the last words for an error message.

After the token, frames (runner_host.HEADER) carry commands both ways, so several commands share
the one channel side by side. A command's end follows the same rules as on an exec channel
(`base.supervise`, `Collector.read_until_exit`): a timeout or interrupt sends STOP (TERM to every
process of the step's session, KILL after a grace until it is empty; the runner's note on the step's
stderr says whether that was confirmed), output a leftover process holds open is abandoned after
OUTPUT_DRAIN_S. A runner that dies or a channel that breaks fails every command in flight with
`TransportError` (with the output that had arrived): no command is ever reported finished that
did not report its exit code.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import secrets
import shlex
import struct
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

import asyncssh

from executor.diagnostics import Log
from executor.errors import RunnerLost, RunnerUnavailable, TransportError, failure_text, transport_error
from executor.redact import NO_SECRETS, Redactor
from executor.render import RenderedCommand
from executor.transport import runner_host as host
from executor.transport.base import KILL_GRACE_S, Collector, CommandResult, OutputSink, supervise

PROGRAM = Path(host.__file__).read_bytes()
#: Reads the runner program from stdin (10 ASCII digits of length, then the program) and runs it.
BOOTSTRAP = (
    "import os,sys\n"
    "def r(n):\n"
    " b=b''\n"
    " while len(b)<n:\n"
    "  c=os.read(0,n-len(b))\n"
    "  if not c:sys.exit(3)\n"
    "  b+=c\n"
    " return b\n"
    "exec(compile(r(int(r(10))),'runbook-runner','exec'))\n"
)
#: The exec request: any POSIX login shell runs it; the runner's environment is bash's, as the wrapper's is.
START_COMMAND = "exec " + shlex.join(
    [
        "bash",
        "--noprofile",
        "--norc",
        "-c",
        'exec python3 -I -S -u -c "$1" 3< <(env -0)',
        "runbook-runner",
        BOOTSTRAP,
    ]
)
STDERR_TAIL_BYTES = 2048


@dataclass
class _Request:
    """One command in flight: its two streams as the frames fill them, and its exit code."""

    stdout: asyncio.StreamReader = field(default_factory=asyncio.StreamReader)
    stderr: asyncio.StreamReader = field(default_factory=asyncio.StreamReader)
    exit: asyncio.Future[int] = field(default_factory=lambda: asyncio.get_running_loop().create_future())


class HostRunner:
    """One running runner on one connection. `run` may be called concurrently."""

    def __init__(
        self, name: str, conn: asyncssh.SSHClientConnection, proc: asyncssh.SSHClientProcess[bytes], log: Log
    ) -> None:
        self.name = name
        self.log = log
        self.conn = conn
        self._proc = proc
        self._requests: dict[int, _Request] = {}
        self._ids = itertools.count(1)
        self._stderr_tail: deque[bytes] = deque()
        self._lost: str | None = None
        self._drain = asyncio.ensure_future(self._drain_stderr())
        self._reader: asyncio.Future[None] | None = None

    @classmethod
    async def start(cls, conn: asyncssh.SSHClientConnection, name: str, timeout: float, log: Log) -> HostRunner:
        """Start the runner; `RunnerUnavailable` where the host cannot run it, `TransportError`
        where the connection failed. `log`: the connection's diagnostics."""
        try:  # a host that stopped answering: bounded here, whatever the keepalive settings
            proc = await asyncio.wait_for(conn.create_process(START_COMMAND, encoding=None), timeout)
        except (OSError, asyncssh.Error, TimeoutError) as exc:
            raise transport_error(exc, f"cannot open a channel to {name}", timeout=timeout) from None
        runner = cls(name, conn, proc, log)
        token = secrets.token_hex(host.TOKEN_BYTES // 2).encode()
        try:
            proc.stdin.write(b"%010d" % len(PROGRAM) + PROGRAM + token)
            await asyncio.wait_for(proc.stdout.readuntil(token), timeout)
        except asyncio.IncompleteReadError:  # the channel ended before the token: no runner here
            with contextlib.suppress(TimeoutError, OSError, asyncssh.Error):
                await asyncio.wait_for(proc.wait(), timeout)
            runner.close()
            if conn.is_closed():
                raise TransportError(f"connection to {name} closed while the runner started") from None
            raise RunnerUnavailable(f"the runner did not start ({runner._ended()})") from None
        except TimeoutError:
            runner.close()
            raise RunnerUnavailable(f"the runner did not answer within {timeout:g}s ({runner._ended()})") from None
        except (OSError, asyncssh.Error) as exc:
            runner.close()
            raise transport_error(exc, f"the runner's channel to {name} broke while it started") from None
        runner._reader = asyncio.ensure_future(runner._read())
        log.info("runner started")
        return runner

    @property
    def alive(self) -> bool:
        return self._lost is None and not self.conn.is_closed()

    async def run(
        self,
        command: RenderedCommand,
        timeout: float,
        on_output: OutputSink | None = None,
        redactor: Redactor = NO_SECRETS,
    ) -> CommandResult:
        request_id, request = next(self._ids), _Request()
        self._requests[request_id] = request
        collect = Collector(on_output, redactor)

        async def finish() -> int:
            if not await collect.read_until_exit(request.stdout, request.stderr, request.exit.done):
                self._send(request_id, host.ABANDON)
            return await request.exit

        try:
            self._send(request_id, host.RUN, host.pack_fields(host.pack_env(command.env), command.script))
            return await supervise(collect, finish(), timeout, lambda task: self._stop(request_id, task))
        except RunnerLost as exc:
            raise TransportError(
                f"{exc} during the command", bytes(collect.stdout.data), bytes(collect.stderr.data)
            ) from None
        finally:
            self._requests.pop(request_id, None)
            if not (request.stdout.at_eof() and request.stderr.at_eof()):
                with contextlib.suppress(RunnerLost):  # given up on: the runner stops forwarding it
                    self._send(request_id, host.ABANDON)

    async def _stop(self, request_id: int, task: asyncio.Future[int | None]) -> int | None:
        """STOP (TERM to the step's session, KILL after the runner's grace), then wait for its exit; None
        when it did not come within KILL_GRACE_S (the kill is then unconfirmed)."""
        try:
            self._send(request_id, host.STOP)
            return await asyncio.wait_for(asyncio.shield(task), KILL_GRACE_S)
        except (TimeoutError, RunnerLost):
            return None

    def _send(self, request_id: int, kind: int, payload: bytes = b"") -> None:
        if self._lost is not None:
            raise RunnerLost(self._lost)
        try:
            self._proc.stdin.write(host.frame(request_id, kind, payload))
        except (OSError, asyncssh.Error) as exc:
            self._fail(f"the runner's channel to {self.name} broke: {failure_text(exc)}")
            raise RunnerLost(self._lost) from None

    async def _read(self) -> None:
        """Deliver every frame to its command, until the channel ends."""
        stdout = self._proc.stdout
        reason = f"the runner on {self.name} ended"
        try:
            while True:
                size, request_id, kind = host.HEADER.unpack(await stdout.readexactly(host.HEADER.size))
                payload = await stdout.readexactly(size) if size else b""
                request = self._requests.get(request_id)
                if request is None:  # a command given up on (interrupted, timed out): late frames
                    continue
                if kind == host.EXIT:
                    if not request.exit.done():
                        request.exit.set_result(struct.unpack(">i", payload)[0])
                    continue
                stream = request.stdout if kind == host.STDOUT else request.stderr
                if payload:
                    stream.feed_data(payload)
                else:
                    stream.feed_eof()
        except asyncio.IncompleteReadError:
            pass
        except (OSError, asyncssh.Error) as exc:
            reason = f"the runner's channel to {self.name} broke: {failure_text(exc)}"
        with contextlib.suppress(TimeoutError, OSError, asyncssh.Error):  # for its exit status in the message
            await asyncio.wait_for(self._proc.wait(), 1.0)
        self._fail(f"{reason} ({self._ended()})")

    async def _drain_stderr(self) -> None:
        """Read the channel's stderr (the shell's noise, a crash's traceback); keep only its tail."""
        kept = 0
        with contextlib.suppress(OSError, asyncssh.Error):
            while chunk := await self._proc.stderr.read(4096):
                self._stderr_tail.append(chunk)
                kept += len(chunk)
                while kept - len(self._stderr_tail[0]) >= STDERR_TAIL_BYTES:
                    kept -= len(self._stderr_tail.popleft())

    def _ended(self) -> str:
        """How the runner's process ended, with its last words on stderr."""
        proc = self._proc
        how = (
            f"killed by signal {proc.exit_signal[0]}"
            if proc.exit_signal
            else f"exit status {proc.exit_status}"
            if proc.exit_status is not None
            else "no exit status"
        )
        words = b"".join(self._stderr_tail).decode("utf-8", "replace").strip()[-STDERR_TAIL_BYTES:]
        return f"{how}; stderr: {words!r}" if words else how

    def _fail(self, reason: str) -> None:
        """Mark the runner lost and fail every command in flight."""
        if self._lost is None:
            self._lost = reason
            self.log.info("runner ended", reason=reason, commands_in_flight=len(self._requests))
        for request in self._requests.values():
            request.stdout.feed_eof()
            request.stderr.feed_eof()
            if not request.exit.done():
                request.exit.set_exception(RunnerLost(self._lost))

    def close(self) -> None:
        """Close the channel: the runner stops whatever still runs and exits."""
        self._fail(f"the runner on {self.name} was closed")
        self._proc.close()
        for task in (self._reader, self._drain):
            if task is not None:
                task.cancel()
