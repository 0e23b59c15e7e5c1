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
import shlex
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncssh

from executor.diagnostics import Log
from executor.errors import HostKeyError, IdentityFileError, RunnerUnavailable, TransportError, transport_error
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


def _trust_hint(name: str, address: str, port: int | None, known: str) -> str:
    """How to trust a host's key: `runbook trust-host`, which shows its fingerprint first, or the OpenSSH command
    to paste, which works on a controller that has no ~/.ssh yet."""
    return (
        f"to trust it, compare its fingerprint with the host's owner's: `runbook trust-host RUNBOOK {name}` (with"
        " the run's --inventory) shows it and records it with --fingerprint; or run:"
        f" {keyscan_command(address, port, known)}"
        f" (or {TURN_OFF}; an ssh config's StrictHostKeyChecking or UserKnownHostsFile never does)"
    )


def keyscan_command(address: str, port: int | None, known: str) -> str:
    """The OpenSSH command that appends the host's keys to `known`, its folder made first (a fresh controller has
    no ~/.ssh, and `>>` does not make one)."""
    port_arg = f"-p {port} " if port and port != 22 else ""
    folder = os.path.dirname(known) or "."
    return f"mkdir -p {_shell_path(folder)} && ssh-keyscan {port_arg}{shlex.quote(address)} >> {_shell_path(known)}"


def _shell_path(path: str) -> str:
    """`path` as a shell word, a leading `~/` left for the shell to expand."""
    return "~/" + shlex.quote(path[2:]) if path.startswith("~/") else shlex.quote(path)


def reach_check(
    exc: BaseException, name: str, where: tuple[str, int], user: str | None = None, jump: bool = False
) -> str:
    """What to check when a connection to `where` (address, port) could not be made, by what stopped it; `jump`:
    `where` is one of host `name`'s jump hosts."""
    address, port = where
    at = f"{address}:{port}"
    fields = (
        f"the ProxyJump of host {name}"
        if jump
        else f"`address:`/`port:` of host {name}, or its ssh config's HostName/Port"
    )
    if isinstance(exc, socket.gaierror):
        return f"to check: {address} does not resolve: the address ({fields}) and this machine's DNS"
    if isinstance(exc, ConnectionRefusedError):
        return (
            f"to check: nothing accepts connections on {at}: that sshd runs on the host and listens on port {port}"
            f" ({fields}), and that no firewall rejects it"
        )
    if isinstance(exc, asyncssh.PermissionDenied):
        return (
            f"to check: {user or 'the user'}@{at} refused this machine's keys: `user:` and `identity_file:` of host"
            f" {name} (or the ssh agent's keys), and that the key's .pub is in that user's ~/.ssh/authorized_keys"
        )
    return (
        f"to check: {at} did not let this machine in: the address and port ({fields}), that the host is up and"
        " sshd runs there, DNS, and that no firewall drops SSH between here and there"
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


def _probe(hop: _Hop, options: dict[str, Any]) -> asyncssh.SSHClientConnectionOptions:
    """What asyncssh makes of the ssh config for `hop` (`config=()` reads ~/.ssh/config, as connect does): its
    resolved host name, port and user, its ProxyJump and known hosts files."""
    probe_args = {k: v for k, v in options.items() if k in ("port", "username")}
    config = options.get("config", ())
    return asyncssh.SSHClientConnectionOptions(host=hop.address, client_keys=None, config=config, **probe_args)


@dataclass(frozen=True)
class OfferedKey:
    """A host's key as it presents it (`SSHTransport.offered_key`): where it was read, and the file to record it in."""

    key: asyncssh.SSHKey
    address: str  # the host name asyncssh checks known_hosts for (the ssh config's HostName where it has one)
    port: int
    file: str  # the known_hosts file a run checks it against first (expanded)

    @property
    def fingerprint(self) -> str:
        return str(self.key.get_fingerprint("sha256"))

    def has_fingerprint(self, given: str | None) -> bool:
        """Whether `given` is this key's fingerprint, in SHA256 or in the older MD5 form (`ssh-keygen -E md5`)."""
        return given in (self.fingerprint, str(self.key.get_fingerprint("md5")))

    @property
    def pattern(self) -> str:
        """The host as a known_hosts line names it: `address`, or `[address]:port` off port 22."""
        return self.address if self.port == 22 else f"[{self.address}]:{self.port}"

    def line(self) -> str:
        """The known_hosts line that trusts this key for this host."""
        algorithm, data = self.key.export_public_key("openssh").decode("ascii").split()[:2]
        return f"{self.pattern} {algorithm} {data}"

    def trusted(self) -> bool | None:
        """Whether `file` trusts this key for this host: True, False where it trusts another key for it (the host's
        key changed, or this is not the host), None where it names none for it (or does not exist)."""
        if not os.path.isfile(self.file):
            return None
        keys = asyncssh.read_known_hosts(self.file).match(self.address, "", self.port)[0]
        return any(key.public_data == self.key.public_data for key in keys) if keys else None

    def record(self) -> None:
        """Append `line()` to `file`, making its folder (0700) and the file (0600) where missing; TransportError
        saying why where it cannot be written (a folder or a FIFO in its place, which would block the open, a
        file where its folder should be), not the OSError's traceback."""
        folder = os.path.dirname(self.file)
        try:
            if os.path.exists(self.file) and not os.path.isfile(self.file):
                raise OSError("not a regular file (a folder, a FIFO or a device)")
            if folder:
                os.makedirs(folder, mode=0o700, exist_ok=True)
            fd = os.open(self.file, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK, 0o600)
        except OSError as exc:
            raise TransportError(f"cannot record the key in {self.file}: {exc.strerror or exc}") from None
        with os.fdopen(fd, "a", encoding="ascii") as known:
            ends_line = known.tell() == 0 or _ends_with_newline(self.file)
            known.write(("" if ends_line else "\n") + self.line() + "\n")


def _ends_with_newline(path: str) -> bool:
    with open(path, "rb") as known:
        known.seek(-1, os.SEEK_END)
        return known.read(1) == b"\n"


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
                    f" (create it with the host's key: `runbook trust-host RUNBOOK {self.name}`, or"
                    f" {keyscan_command(hop.address, hop.port, host.known_hosts or path)}; or {TURN_OFF})"
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

    def _check_identity_file(self) -> None:
        """Refuse, before connecting, an `identity_file` that is no file here: a fresh controller has no
        ~/.ssh/id_ed25519, and no retry or look at the network can mend that."""
        given = self.host.identity_file
        if given is None or os.path.isfile(os.path.expanduser(given)):
            return
        path = os.path.expanduser(given)
        what = "is not a file" if os.path.exists(path) else "does not exist"
        raise IdentityFileError(
            f"cannot log in to {self.name} ({self.host.address}): its identity_file {path} {what} on this machine"
            f" (set `identity_file:` of host {self.name} in the runbook or --inventory to the private key that"
            f" {self.host.user or 'its user'}@{self.host.address} accepts; `identity_file: null` uses the ssh"
            " agent's and ~/.ssh's default keys)"
        )

    async def _open(
        self, hop: _Hop, options: dict[str, Any], via: asyncssh.SSHClientConnection | None, depth: int = 0
    ) -> asyncssh.SSHClientConnection:
        """Connect to `hop` (through `via`), opening the jump hosts that its ProxyJump names ourselves, so
        that each one's host key is checked as the host's is (asyncssh would take them from the ssh config)."""
        probe = _probe(hop, options)
        known_hosts, hint_file = self._known_hosts(hop, probe, final=depth == 0)
        if depth == 0:  # the host's own identity_file, which its jump hosts are logged in with too
            self._check_identity_file()
        via = via or await self._jumps(probe, options, depth)
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
                    _trust_hint(self.name, hop.address, options.get("port"), hint_file),
                ),
                check=reach_check(exc, self.name, (probe.host, probe.port), probe.username, jump=depth > 0),
            ) from None

    async def _jumps(
        self, probe: asyncssh.SSHClientConnectionOptions, options: dict[str, Any], depth: int
    ) -> asyncssh.SSHClientConnection | None:
        """The connection through the jump hosts of the hop `probe` reads (the host's `proxy_jump`, else the ssh
        config's ProxyJump), each opened by `_open` and its key checked as the host's is; None where there are none."""
        jump = self.host.proxy_jump if depth == 0 and self.host.proxy_jump is not None else probe.tunnel
        if not (isinstance(jump, str) and jump and jump.lower() != "none"):
            return None
        if depth > 8:
            raise TransportError(f"cannot connect to {self.name}: its ProxyJump chain is longer than 8 hosts")
        via = None
        for jump_hop in _jump_hops(jump, self.name):
            jump_options = {k: v for k, v in options.items() if k not in ("port", "username", "client_keys", "config")}
            if jump_hop.port is not None:
                jump_options["port"] = jump_hop.port
            if jump_hop.user is not None:
                jump_options["username"] = jump_hop.user
            jump_options["config"] = self._config()
            via = await self._open(jump_hop, jump_options, via, depth + 1)
            self._tunnels.append(via)
        return via

    async def offered_key(self) -> OfferedKey:
        """The key the host presents now, read without logging in (`runbook trust-host`), through its jump hosts
        (their keys checked as a run checks them), with the known_hosts file a run checks it against first."""
        hop = _Hop(self.host.address, self.host.port, self.host.user, f"{self.name} ({self.host.address})")
        options = self._options()
        probe = _probe(hop, options)
        try:
            via = await self._jumps(probe, options, 0)
            asked = asyncssh.get_server_host_key(
                hop.address, options.get("port", ()), tunnel=via or (), config=options.get("config", ())
            )
            key = await asyncio.wait_for(asked, self.host.connect_timeout)
        except (OSError, asyncssh.Error, TimeoutError) as exc:
            check = reach_check(exc, self.name, (probe.host, probe.port), probe.username)
            what = f"cannot read the host key of {self.name} ({self.host.address})"
            raise transport_error(exc, what, timeout=self.host.connect_timeout, check=check) from None
        finally:
            self._close_tunnels()
        if key is None:
            raise TransportError(f"{self.name} ({self.host.address}) presented no host key")
        return OfferedKey(key, probe.host, probe.port, self._record_file(probe))

    def _record_file(self, probe: Any) -> str:
        """The known_hosts file a run checks the host's key against first: its `known_hosts`, else the ssh config's
        first real UserKnownHostsFile, else ~/.ssh/known_hosts."""
        if self.host.known_hosts is not None:
            return os.path.expanduser(self.host.known_hosts)
        listed = [entry for entry in probe.config.get("UserKnownHostsFile", ()) if not _null_known_hosts(entry)]
        return os.path.expanduser(str((listed or [DEFAULT_KNOWN_HOSTS])[0]))

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
            where = (self.host.address, self.host.port or 22)
            check = reach_check(exc, self.name, where, self.host.user)
            raise transport_error(exc, f"could not connect to {self.name}", timeout=reach, check=check) from None
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
