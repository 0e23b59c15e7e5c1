"""The embedded asyncssh server that serves the demo's test host where no OpenSSH server is installed.

It must behave as sshd does for what runbook relies on: the login shell runs the command with the
session's environment, stdout and stderr stay apart, the exit status passes, and closing the
channel (a timeout, a dropped connection) reaches the command as EOF on its stdin so that the
wrapper kills the step's process group. Driven through the real SSH transport.
"""

from __future__ import annotations

import asyncio
import secrets
import subprocess
from collections.abc import Iterator
from pathlib import Path

import asyncssh
import pytest

from executor.errors import TransportError
from executor.render import render_command
from executor.runbook.model import Host
from executor.transport import SSHTransport
from sandbox.embedded_sshd import start_embedded_sshd
from sandbox.sshd import SSHServer
from tests.executor.test_transport import live_pids, wait_until


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[SSHServer, Path]]:
    root = tmp_path_factory.mktemp("embedded")
    home = root / "home"
    home.mkdir()
    proc, server = start_embedded_sshd(root / "ssh", {"PATH": "/usr/bin:/bin", "HOME": str(home), "MARK": "set"})
    yield server, home
    proc.terminate()
    proc.wait(timeout=10)


def transport(server: SSHServer) -> SSHTransport:
    return SSHTransport("box", Host(**server.host_dict()))


def test_commands_run_with_the_session_environment(served: tuple[SSHServer, Path]) -> None:
    server, home = served

    async def go() -> None:
        t = transport(server)
        try:
            result = await t.run(render_command('echo "$HOME $MARK $PATH" ; pwd; echo oops >&2; exit 7', {}), 30)
        finally:
            await t.close()
        assert result.exit_code == 7
        assert result.stdout_text.splitlines() == [f"{home} set /usr/bin:/bin", str(home)]
        assert result.stderr_text == "oops\n"

    asyncio.run(go())


def test_a_timeout_kills_the_step_s_process_group(served: tuple[SSHServer, Path]) -> None:
    server, _ = served
    sleeper = f"sleep {800_000 + secrets.randbelow(100_000)}"

    async def go() -> None:
        t = transport(server)
        try:
            result = await t.run(render_command(f"{sleeper} & {sleeper}\n", {}), 1)
        finally:
            await t.close()
        assert result.timed_out

    asyncio.run(go())
    assert wait_until(lambda: not live_pids(cmdline=sleeper))


def test_a_dropped_connection_kills_the_step(served: tuple[SSHServer, Path]) -> None:
    server, _ = served
    sleeper = f"sleep {900_000 + secrets.randbelow(100_000)}"

    async def go() -> None:
        conn = await asyncssh.connect(
            "127.0.0.1",
            port=server.port,
            username=server.user,
            client_keys=[str(server.client_key)],
            known_hosts=str(server.known_hosts),
        )
        command = render_command(f"{sleeper}\n", {})
        process = await conn.create_process(command.command_line, encoding=None)
        process.stdin.write(command.stdin)
        assert await asyncio.to_thread(wait_until, lambda: bool(live_pids(cmdline=sleeper)))
        conn.abort()

    asyncio.run(go())
    assert wait_until(lambda: not live_pids(cmdline=sleeper))


def test_files_go_both_ways_over_sftp(served: tuple[SSHServer, Path], tmp_path: Path) -> None:
    server, home = served
    local = tmp_path / "blob"
    local.write_bytes(secrets.token_bytes(300_000))

    async def go() -> None:
        t = transport(server)
        try:
            sent = await t.put(local, str(home / "blob"))
            back = await t.get(str(home / "blob"), tmp_path / "back")
        finally:
            await t.close()
        assert sent.size == back.size == 300_000 and sent.sha256 == back.sha256

    asyncio.run(go())
    assert (tmp_path / "back").read_bytes() == local.read_bytes()


def test_an_unknown_key_is_refused(served: tuple[SSHServer, Path], tmp_path: Path) -> None:
    server, _ = served
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "stranger")], check=True)
    host = Host(**{**server.host_dict(), "identity_file": str(tmp_path / "stranger")})

    async def go() -> None:
        t = SSHTransport("box", host)
        with pytest.raises(TransportError, match="cannot connect"):
            await t.connect()

    asyncio.run(go())
