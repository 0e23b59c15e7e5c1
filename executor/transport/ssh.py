"""SSH transport: one asyncssh connection per host for the whole run.

Commands go through the host's persistent runner (`runner: persistent`, the default;
executor/transport/runner.py): one channel per connection, started once through the login shell,
carrying every command. Where the runner cannot start (no python3 on the host, say) the host falls
back, with a warning in the log, to the exec path, which `runner: exec` selects outright: one
exec channel per command, running the wrapper of executor/render.py through the login shell.
Both run a step alike; the exec path pays the login shell's start-up (~/.bashrc) for every command,
and whatever that prints is part of the command's output.

Honours the user's OpenSSH config (Host aliases, User, Port, IdentityFile, ProxyJump) and
ssh-agent through asyncssh. Authentication is by key or agent only: a password or keyboard
prompt would wait for a person, so those methods are switched off.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
from pathlib import Path
from typing import Any

import asyncssh

from executor.errors import HostKeyError, TransportError
from executor.model import Host
from executor.render import RenderedCommand
from executor.transport.base import (
    KILL_GRACE_S,
    Collector,
    CommandResult,
    OutputSink,
    Transfer,
    Transport,
    supervise,
)
from executor.transport.runner import HostRunner, RunnerUnavailable

log = logging.getLogger(__name__)


def _trust_hint(host: Host) -> str:
    port = f"-p {host.port} " if host.port else ""
    known = host.known_hosts or "~/.ssh/known_hosts"
    return (
        f"to trust it, check the key with the host's owner and run: ssh-keyscan {port}{host.address} >> {known}"
        " (or set `verify_host_key: false` on the host to turn verification off)"
    )


class SSHTransport(Transport):
    def __init__(self, name: str, host: Host) -> None:
        self.name = name
        self.host = host
        self._conn: asyncssh.SSHClientConnection | None = None
        self._lock = asyncio.Lock()
        self._runner: HostRunner | None = None
        self._runner_lock = asyncio.Lock()
        self._runner_started = False  # once it has run here, a failed restart is a transport error
        #: Why this host uses the exec path although `runner: persistent` asked for the runner.
        self.runner_unavailable: str | None = None
        self._notes: list[str] = []

    def _options(self) -> dict[str, Any]:
        host = self.host
        options: dict[str, Any] = {
            "connect_timeout": host.connect_timeout,
            "login_timeout": host.connect_timeout,
            "keepalive_interval": host.keepalive,
            "keepalive_count_max": 3,
            "password_auth": False,
            "kbdint_auth": False,
        }
        if host.port is not None:
            options["port"] = host.port
        if host.user is not None:
            options["username"] = host.user
        if host.identity_file is not None:
            options["client_keys"] = [os.path.expanduser(host.identity_file)]
        if not host.verify_host_key:
            options["known_hosts"] = None
        elif host.known_hosts is not None:
            options["known_hosts"] = os.path.expanduser(host.known_hosts)
        if host.proxy_jump is not None:
            options["tunnel"] = host.proxy_jump
        if host.ssh_config is not None:
            options["config"] = [os.path.expanduser(host.ssh_config)]
        return options

    async def connect(self) -> None:
        await self._connection()
        if self.host.runner == "persistent":
            await self._host_runner()

    async def _connection(self) -> asyncssh.SSHClientConnection:
        async with self._lock:
            if self._conn is not None and not self._conn.is_closed():
                return self._conn
            self._conn = None
            try:
                self._conn = await asyncssh.connect(self.host.address, **self._options())
            except asyncssh.HostKeyNotVerifiable as exc:
                raise HostKeyError(
                    f"host key of {self.name} ({self.host.address}) not trusted: {exc}; " + _trust_hint(self.host)
                ) from None
            except (OSError, asyncssh.Error, TimeoutError) as exc:
                raise TransportError(f"cannot connect to {self.name} ({self.host.address}): {exc}") from None
            return self._conn

    def _drop(self, conn: asyncssh.SSHClientConnection) -> None:
        """Forget a broken connection so that the next command reconnects."""
        if self._conn is conn:
            conn.abort()
            self._conn = None

    async def run(self, command: RenderedCommand, timeout: float, on_output: OutputSink | None = None) -> CommandResult:
        runner = await self._host_runner() if self.host.runner == "persistent" else None
        if runner is not None:
            return await runner.run(command, timeout, on_output)
        return await self._exec(command, timeout, on_output)

    async def _host_runner(self) -> HostRunner | None:
        """The connection's runner, started (again) when needed; None where the host cannot run one."""
        if self.runner_unavailable is not None:
            return None
        conn = await self._connection()
        async with self._runner_lock:
            if self._runner is not None and self._runner.alive and self._runner.conn is conn:
                return self._runner
            if self._runner is not None:
                self._runner.close()
                self._runner = None
            try:
                self._runner = await HostRunner.start(conn, self.name, self.host.connect_timeout)
            except RunnerUnavailable as exc:
                if self._runner_started:  # it ran here before: this is no property of the host
                    self._drop(conn)
                    raise TransportError(f"cannot restart the runner on {self.name}: {exc}") from None
                self.runner_unavailable = str(exc)
                log.warning("%s: %s; every command uses an exec channel of its own", self.name, exc)
                self._notes.append(f"no persistent runner ({exc}): every command uses an exec channel of its own")
                return None
            except TransportError:
                self._drop(conn)
                raise
            self._runner_started = True
            return self._runner

    async def _exec(self, command: RenderedCommand, timeout: float, on_output: OutputSink | None) -> CommandResult:
        """The exec path: one channel per command, running the wrapper through the login shell."""
        conn = await self._connection()
        collect = Collector(on_output)
        try:  # a host that stopped answering must not hold the command before its own timeout starts
            proc = await asyncio.wait_for(conn.create_process(command.command_line, encoding=None), timeout)
        except (OSError, asyncssh.Error, TimeoutError) as exc:
            self._drop(conn)
            said = str(exc) or f"no answer within {timeout:g}s"
            raise TransportError(f"cannot open a channel to {self.name}: {said}") from None
        with contextlib.suppress(BrokenPipeError, OSError, asyncssh.Error):
            proc.stdin.write(command.stdin)  # buffered by asyncssh; the wait below is under the timeout

        async def finish() -> int | None:
            if await collect.read_until_exit(proc.stdout, proc.stderr, lambda: proc.returncode is not None):
                await proc.wait()
            return proc.exit_status

        try:
            result = await supervise(collect, finish(), timeout, lambda task: self._stop(proc, task))
        except (OSError, asyncssh.Error) as exc:
            self._drop(conn)
            raise TransportError(
                f"connection to {self.name} broke during the command: {exc}",
                bytes(collect.stdout.data),
                bytes(collect.stderr.data),
            ) from None
        if result.exit_code is None and not result.timed_out:  # closed without an exit status: the connection died
            self._drop(conn)
            raise TransportError(
                f"connection to {self.name} closed before the command reported an exit status",
                bytes(collect.stdout.data),
                bytes(collect.stderr.data),
            )
        proc.close()
        return result

    @staticmethod
    async def _stop(proc: asyncssh.SSHClientProcess[bytes], task: asyncio.Future[int | None]) -> int | None:
        """Send EOF (the wrapper then kills the step's group), wait for the exit, then close."""
        with contextlib.suppress(OSError, asyncssh.Error):
            proc.stdin.write_eof()
        try:
            return await asyncio.wait_for(asyncio.shield(task), KILL_GRACE_S)
        except (TimeoutError, OSError, asyncssh.Error):
            return None
        finally:
            proc.close()

    async def put(self, local: Path, remote: str) -> Transfer:
        conn = await self._connection()
        digest = hashlib.sha256(local.read_bytes()).hexdigest()
        try:
            async with conn.start_sftp_client() as sftp:
                await sftp.put(str(local), remote)
                size = (await sftp.stat(remote)).size
        except (OSError, asyncssh.Error) as exc:
            raise TransportError(f"upload of {local} to {self.name}:{remote} failed: {exc}") from None
        return Transfer("put", str(local), remote, int(size or 0), digest)

    async def get(self, remote: str, local: Path) -> Transfer:
        conn = await self._connection()
        try:
            async with conn.start_sftp_client() as sftp:
                await sftp.get(remote, str(local))
        except (OSError, asyncssh.Error) as exc:
            raise TransportError(f"download of {self.name}:{remote} failed: {exc}") from None
        data = local.read_bytes()
        return Transfer("get", str(local), remote, len(data), hashlib.sha256(data).hexdigest())

    def take_notes(self) -> list[str]:
        notes, self._notes = self._notes, []
        return notes

    async def close(self) -> None:
        """Close the connection; a dead network gets the connect timeout, then the socket is dropped."""
        if self._runner is not None:
            self._runner.close()
            self._runner = None
        if self._conn is not None:
            self._conn.close()
            try:
                await asyncio.wait_for(self._conn.wait_closed(), self.host.connect_timeout)
            except (TimeoutError, OSError, asyncssh.Error):
                self._conn.abort()
            self._conn = None
