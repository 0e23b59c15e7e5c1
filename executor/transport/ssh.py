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
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncssh

from executor.diagnostics import Log
from executor.errors import HostKeyError, RunnerUnavailable, TransportError, transport_error
from executor.render import RenderedCommand
from executor.runbook.model import Host
from executor.transport.base import (
    KILL_GRACE_S,
    Collector,
    CommandResult,
    Digest,
    OutputSink,
    Transfer,
    Transport,
    check_arrived,
    supervise,
)
from executor.transport.runner import HostRunner
from executor.transport.transfer import CHECK_TIMEOUT_S, check_command, parse_check, sftp_download, sftp_upload

#: Host keys are verified unless the runbook (or inventory) sets `verify_host_key: false` on the host. An
#: ssh config that would take checking off (`UserKnownHostsFile none` or `/dev/null`, which asyncssh reads
#: as "trust every key"; `StrictHostKeyChecking no`, which it ignores) is overridden: its known hosts files
#: are used where they are real files, ~/.ssh/known_hosts where it named none.
TURN_OFF = "set `verify_host_key: false` on the host (runbook or --inventory) to turn verification off on purpose"
DEFAULT_KNOWN_HOSTS = "~/.ssh/known_hosts"


def _trust_hint(address: str, port: int | None, known: str) -> str:
    port_arg = f"-p {port} " if port else ""
    return (
        f"to trust it, check the key with the host's owner and run: ssh-keyscan {port_arg}{address} >> {known}"
        f" (or {TURN_OFF}; an ssh config's StrictHostKeyChecking or UserKnownHostsFile never does)"
    )


def _null_known_hosts(entry: str) -> bool:
    """An ssh config's known hosts entry that means "no file": `none`, or /dev/null under any name."""
    return entry.lower() == "none" or os.path.realpath(os.path.expanduser(entry)) == os.devnull


@dataclass(frozen=True)
class _Hop:
    """One SSH connection on the way to a host: the host itself, or a jump host (ProxyJump) before it."""

    address: str
    port: int | None
    user: str | None
    label: str  # how messages name it: "gpu (gpu-box.example)", "jump host bastion of gpu"


def _jump_hops(spec: str, name: str) -> list[_Hop]:
    """`[user@]host[:port],...` as OpenSSH's ProxyJump (and asyncssh's tunnel) spell it."""
    hops = []
    for part in spec.split(","):
        user, _, address = part.strip().rpartition("@")
        port: int | None = None
        if ":" in address:
            address, _, port_text = address.rpartition(":")
            port = int(port_text)
        hops.append(_Hop(address, port, user or None, f"jump host {address} of {name}"))
    return hops


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
        self._config_notes: list[str] = []  # what the ssh config asked of host keys and did not get, said once
        self._tunnels: list[asyncssh.SSHClientConnection] = []  # the jump hosts of `_conn`, in order
        self._connections = 0  # opened so far: a connection's number in the diagnostics
        self._conn_log: Log = self.log  # the diagnostics of the current connection (bound when it opens)

    def _config(self) -> Any:
        """The ssh config files asyncssh reads: the host's `ssh_config`, else () for ~/.ssh/config."""
        return [os.path.expanduser(self.host.ssh_config)] if self.host.ssh_config is not None else ()

    def _options(self) -> dict[str, Any]:
        """The host's own connection options; host keys and jump hosts are settled in `_open`."""
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
        if host.ssh_config is not None:
            options["config"] = self._config()
        return options

    def _known_hosts(self, hop: _Hop, probe: Any, final: bool) -> tuple[list[str] | bytes | None, str]:
        """What `hop`'s host key is checked against (None: nothing, with `verify_host_key: false` only),
        and the file to name in a refusal's hint. The host's `known_hosts` is used as given (a file that
        does not exist is a refusal); otherwise the ssh config's files, less those that mean "no file"."""
        host = self.host
        if not host.verify_host_key:
            return None, ""
        own = [os.path.expanduser(host.known_hosts)] if host.known_hosts is not None else []
        for path in own:
            if not os.path.isfile(path):
                what = "is not a file" if os.path.exists(path) else "does not exist"
                raise HostKeyError(
                    f"host key of {hop.label} cannot be verified: its known_hosts file {path} {what}"
                    f" (create it with the host's key: ssh-keyscan, or {TURN_OFF})"
                )
        if final and own:
            return own, host.known_hosts or ""
        user_files = probe.config.get("UserKnownHostsFile", ())
        listed = [*(user_files or [DEFAULT_KNOWN_HOSTS]), *probe.config.get("GlobalKnownHostsFile", ())]
        dropped = [entry for entry in listed if _null_known_hosts(entry)]
        if user_files == [] or dropped:
            said = "none" if user_files == [] else " ".join(dropped)
            note = (
                f"the ssh config says `UserKnownHostsFile {said}` for {hop.label}: not honoured, its host key is"
                f" verified ({TURN_OFF})"
            )
            if note not in self._config_notes:
                self._config_notes.append(note)
                self._notes.append(note)
                self.log.warning("ssh config not honoured", note=note)
        files = [os.path.expanduser(entry) for entry in listed if not _null_known_hosts(entry)]
        files = files or [os.path.expanduser(DEFAULT_KNOWN_HOSTS)]
        hint = (own or files)[0]
        present = [*own, *(path for path in files if os.path.isfile(path) and path not in own)]
        return (present or b""), hint

    async def _open(
        self, hop: _Hop, options: dict[str, Any], via: asyncssh.SSHClientConnection | None, depth: int = 0
    ) -> asyncssh.SSHClientConnection:
        """Connect to `hop` (through `via`), opening the jump hosts that its ProxyJump names ourselves, so
        that each one's host key is checked as the host's is (asyncssh would take them from the ssh config)."""
        # what asyncssh makes of the ssh config for this hop (`config=()` reads ~/.ssh/config, as connect does)
        probe_args = {k: v for k, v in options.items() if k in ("port", "username")}
        config = options.get("config", ())
        probe = asyncssh.SSHClientConnectionOptions(host=hop.address, client_keys=None, config=config, **probe_args)
        known_hosts, hint_file = self._known_hosts(hop, probe, final=depth == 0)
        jump = self.host.proxy_jump if depth == 0 and self.host.proxy_jump is not None else probe.tunnel
        if via is None and isinstance(jump, str) and jump and jump.lower() != "none":
            if depth > 8:
                raise TransportError(f"cannot connect to {self.name}: its ProxyJump chain is longer than 8 hosts")
            for jump_hop in _jump_hops(jump, self.name):
                jump_options = {
                    k: v for k, v in options.items() if k not in ("port", "username", "client_keys", "config")
                }
                if jump_hop.port is not None:
                    jump_options["port"] = jump_hop.port
                if jump_hop.user is not None:
                    jump_options["username"] = jump_hop.user
                jump_options["config"] = self._config()
                via = await self._open(jump_hop, jump_options, via, depth + 1)
                self._tunnels.append(via)
        try:
            return await asyncssh.connect(hop.address, known_hosts=known_hosts, tunnel=via or (), **options)
        except (OSError, asyncssh.Error, TimeoutError) as exc:
            where = "" if depth == 0 else f" through {hop.label}"
            raise transport_error(
                exc,
                f"cannot connect to {self.name} ({self.host.address}){where}",
                timeout=options["connect_timeout"],
                untrusted_key=(
                    f"host key of {hop.label} not trusted",
                    _trust_hint(hop.address, options.get("port"), hint_file),
                ),
            ) from None

    async def connect(self) -> None:
        await self._connection()
        if self.host.runner == "persistent":
            await self._host_runner()

    async def _connection(self) -> asyncssh.SSHClientConnection:
        async with self._lock:
            if self._conn is not None and not self._conn.is_closed():
                return self._conn
            self._conn = None
            self._close_tunnels()
            hop = _Hop(self.host.address, self.host.port, self.host.user, f"{self.name} ({self.host.address})")
            try:
                self._conn = await self._open(hop, self._options(), None)
            except TransportError as exc:
                self._close_tunnels()
                self.log.warning("connection failed", address=self.host.address, error=str(exc))
                raise
            except BaseException:
                self._close_tunnels()
                raise
            self._connections += 1
            self._conn_log = self.log.bind(connection=self._connections, address=self.host.address)
            self._conn_log.info("connection opened", port=self.host.port, jump_hosts=len(self._tunnels))
            return self._conn

    def _close_tunnels(self) -> None:
        """Close the jump host connections of the last connection (asyncssh does not: we opened them)."""
        for tunnel in reversed(self._tunnels):
            tunnel.abort()
        self._tunnels.clear()

    def _drop(self, conn: asyncssh.SSHClientConnection) -> None:
        """Forget a broken connection so that the next command reconnects."""
        if self._conn is conn:
            self._conn_log.warning("connection dropped: the next command reconnects")
            conn.abort()
            self._conn = None

    async def run(self, command: RenderedCommand, timeout: float, on_output: OutputSink | None = None) -> CommandResult:
        reach = min(self.host.connect_timeout, timeout)  # connecting never outlives the command's own timeout
        try:
            if self.host.runner == "persistent":
                runner = await asyncio.wait_for(self._host_runner(), reach)
            else:
                runner = None
                await asyncio.wait_for(self._connection(), reach)
        except TimeoutError as exc:
            raise transport_error(exc, f"could not connect to {self.name}", timeout=reach) from None
        if runner is not None:
            return await runner.run(command, timeout, on_output, self.redactor)
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
                self._runner = await HostRunner.start(conn, self.name, self.host.connect_timeout, self._conn_log)
            except RunnerUnavailable as exc:
                if self._runner_started:  # it ran here before: this is no property of the host
                    self._drop(conn)
                    raise TransportError(f"cannot restart the runner on {self.name}: {exc}") from None
                self.runner_unavailable = str(exc)
                self._conn_log.warning(
                    "fallback to the exec path: every command uses an exec channel of its own", reason=str(exc)
                )
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
        collect = Collector(on_output, self.redactor)
        try:  # a host that stopped answering must not hold the command before its own timeout starts
            proc = await asyncio.wait_for(conn.create_process(command.command_line, encoding=None), timeout)
        except (OSError, asyncssh.Error, TimeoutError) as exc:
            self._drop(conn)
            raise transport_error(exc, f"cannot open a channel to {self.name}", timeout=timeout) from None
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
            raise transport_error(
                exc,
                f"connection to {self.name} broke during the command",
                partial=(bytes(collect.stdout.data), bytes(collect.stderr.data)),
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
        """Send EOF (the wrapper then kills the step's session), wait for the exit, then close; None
        when no exit came within the grace (the kill is then unconfirmed)."""
        with contextlib.suppress(OSError, asyncssh.Error):
            proc.stdin.write_eof()
        try:
            return await asyncio.wait_for(asyncio.shield(task), KILL_GRACE_S)
        except (TimeoutError, OSError, asyncssh.Error):
            return None
        finally:
            proc.close()

    async def put(self, local: Path, remote: str) -> Transfer:
        """Stream `local` to the host over SFTP (executor/transport/transfer.py), then check on the host
        that the file there has the source's size and sha256."""
        conn = await self._connection()
        what = f"upload of {local} to {self.name}:{remote}"
        try:
            async with conn.start_sftp_client() as sftp:
                sent, path = await sftp_upload(sftp, local, remote)
        except (OSError, asyncssh.Error) as exc:
            raise transport_error(exc, f"{what} failed") from None
        await self._check_arrived(what, path, sent)
        return Transfer("put", str(local), remote, sent.size, sent.sha256)

    async def get(self, remote: str, local: Path) -> Transfer:
        """Stream the host's file into `local` over SFTP, then check that what arrived has the size and
        sha256 the host computes for its file."""
        conn = await self._connection()
        what = f"download of {self.name}:{remote}"
        try:
            async with conn.start_sftp_client() as sftp:
                received, path = await sftp_download(sftp, remote, local)
        except (ConnectionError, asyncssh.Error) as exc:  # the host's side; an OSError of `local` is the caller's
            raise transport_error(exc, f"{what} failed") from None
        await self._check_arrived(what, path, received)
        return Transfer("get", str(local), remote, received.size, received.sha256)

    async def _check_arrived(self, what: str, path: str, streamed: Digest) -> None:
        """The host's size and sha256 of its file at `path` against what the controller streamed."""
        size, sha256 = parse_check(await self.run(check_command(path), CHECK_TIMEOUT_S), what)
        check_arrived(what, streamed, size, sha256)

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
            self._conn_log.info("connection closed")
        self._close_tunnels()
