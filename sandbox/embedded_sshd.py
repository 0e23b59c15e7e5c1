"""An SSH server on 127.0.0.1 built on asyncssh, for `runbook demo` where no OpenSSH server is installed.

Not a test double of SSH: clients speak real SSH to it (key exchange, host key checked against a
known_hosts file, public-key login, exec channels, SFTP). It stands in for `sshd` the program only,
and behaves as sshd does for what runbook uses:

- each exec request runs `<the user's login shell> -c COMMAND` with a fresh environment: the
  session env it was started with (the test host's PATH, HOME, GPU variant), plus USER, LOGNAME,
  SHELL and SSH_CLIENT/SSH_CONNECTION (so Debian's bash sources ~/.bashrc as under sshd);
- the channel's stdin feeds the command's stdin, and its EOF (or a dropped connection) closes it:
  the runbook wrapper relies on that to kill a step's process group;
- stdout and stderr stay separate; the exit status is sent once the command has exited and its
  output has been read (a process left holding the output gets OUTPUT_DRAIN_S, as the client allows);
- the `sftp` subsystem serves the real filesystem (asyncssh's SFTPServer).

Run as its own process (`start_embedded_sshd`), like sshd, so that a run's event loop and the
server's never share a thread.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import getpass
import json
import os
import pwd
import select
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

import asyncssh

from sandbox.sshd import SSHServer, free_port

OUTPUT_DRAIN_S = 2.0
START_TIMEOUT_S = 20.0
READY = "embedded-sshd ready"


def login_shell() -> str:
    shell = pwd.getpwuid(os.getuid()).pw_shell
    return shell if shell and Path(shell).exists() else "/bin/sh"


def write_keys(root: Path, port: int) -> tuple[Path, Path]:
    """Host and client keys, authorized_keys and known_hosts in `root`, as `start_sshd` lays them out."""
    root.mkdir(parents=True, exist_ok=True)
    os.chmod(root, 0o700)
    host_key, client_key = root / "host_ed25519", root / "client_ed25519"
    for path in (host_key, client_key):
        if not path.exists():
            key = asyncssh.generate_private_key("ssh-ed25519")
            key.write_private_key(str(path))
            key.write_public_key(str(path) + ".pub")
            os.chmod(path, 0o600)
    (root / "authorized_keys").write_text((root / "client_ed25519.pub").read_text())
    host_pub = (root / "host_ed25519.pub").read_text().split()
    (root / "known_hosts").write_text(f"[127.0.0.1]:{port} {host_pub[0]} {host_pub[1]}\n")
    (root / "ssh_config").write_text("")  # keeps the user's own ~/.ssh/config out of the demo
    return host_key, client_key


async def _feed_stdin(channel: asyncssh.SSHReader[bytes], proc: asyncio.subprocess.Process) -> None:
    """Channel stdin to the command's stdin; EOF or a lost channel closes it."""
    assert proc.stdin is not None
    try:
        while data := await channel.read(65536):
            proc.stdin.write(data)
            await proc.stdin.drain()
    except (OSError, asyncssh.Error):
        pass
    finally:
        proc.stdin.close()


async def _copy(source: asyncio.StreamReader, into: asyncssh.SSHWriter[bytes]) -> None:
    with contextlib.suppress(OSError, asyncssh.Error):
        while data := await source.read(65536):
            into.write(data)
            await into.drain()  # the client's pace: a large output is not held in memory here


def session_handler(env: dict[str, str], port: int) -> Callable[[asyncssh.SSHServerProcess[bytes]], Awaitable[None]]:
    shell = login_shell()
    user = getpass.getuser()

    async def handle(process: asyncssh.SSHServerProcess[bytes]) -> None:
        if not process.command:
            process.stderr.write(b"this server runs commands only; no interactive shell\n")
            process.exit(1)
            return
        peer = process.get_extra_info("peername") or ("127.0.0.1", 0)
        session = {
            **env,
            "USER": user,
            "LOGNAME": user,
            "SHELL": shell,
            "SSH_CLIENT": f"{peer[0]} {peer[1]} {port}",
            "SSH_CONNECTION": f"{peer[0]} {peer[1]} 127.0.0.1 {port}",
        }
        proc = await asyncio.create_subprocess_exec(
            shell,
            "-c",
            process.command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=session,
            cwd=env.get("HOME", "/"),
        )
        assert proc.stdout is not None and proc.stderr is not None
        feeder = asyncio.ensure_future(_feed_stdin(process.stdin, proc))
        streams = (_copy(proc.stdout, process.stdout), _copy(proc.stderr, process.stderr))
        output = asyncio.ensure_future(asyncio.gather(*streams))
        try:
            code = await proc.wait()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(output), OUTPUT_DRAIN_S)
        finally:
            output.cancel()
            feeder.cancel()
            if proc.returncode is None:
                proc.kill()
        process.exit(code if code >= 0 else 128 - code)

    return handle


async def serve(root: Path, port: int, env: dict[str, str]) -> None:
    host_key, _ = write_keys(root, port)
    await asyncssh.create_server(
        None,
        "127.0.0.1",
        port,
        server_host_keys=[str(host_key)],
        authorized_client_keys=str(root / "authorized_keys"),
        process_factory=session_handler(env, port),
        encoding=None,
        sftp_factory=True,
        allow_scp=False,
        password_auth=False,
        kbdint_auth=False,
        x509_trusted_certs=None,
    )
    print(f"{READY} {port}", flush=True)
    await asyncio.Event().wait()


def start_embedded_sshd(root: Path, env: dict[str, str]) -> tuple[subprocess.Popen[bytes], SSHServer]:
    """Start the server in its own process on a free loopback port; wait for its ready line."""
    port = free_port()
    command = [sys.executable, "-m", "sandbox.embedded_sshd", "--root", str(root), "--port", str(port)]
    proc = subprocess.Popen(
        [*command, "--env", json.dumps(env)],
        stdout=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        cwd=Path(__file__).resolve().parent.parent,
    )
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], START_TIMEOUT_S)
    line = proc.stdout.readline().decode() if ready else "(nothing)"
    if not line.startswith(READY):
        proc.kill()
        raise RuntimeError(f"the embedded SSH server did not start (said {line!r}, exit {proc.poll()})")
    server = SSHServer(port, getpass.getuser(), root / "client_ed25519", root / "known_hosts", root, proc.pid)
    return proc, server


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--root", type=Path, required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--env", default="{}", help="the session environment, as a JSON object")
    args = parser.parse_args()
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(args.root, args.port, json.loads(args.env)))


if __name__ == "__main__":
    main()
