"""Shared fixtures: a real OpenSSH server on 127.0.0.1 with fresh host and client keys.

No SSH layer is mocked: transports and the CLI talk to this sshd through asyncssh.
"""

from __future__ import annotations

import getpass
import os
import shutil
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

SSHD = shutil.which("sshd") or "/usr/sbin/sshd"


@dataclass(frozen=True)
class SSHServer:
    """A running sshd and what a client needs to reach it."""

    port: int
    user: str
    client_key: Path
    known_hosts: Path
    root: Path
    pid: int  # the listening sshd; its children serve the connections

    def host_yaml(self, name: str = "box") -> str:
        return textwrap.dedent(f"""\
            hosts:
              {name}:
                address: 127.0.0.1
                port: {self.port}
                user: {self.user}
                identity_file: {self.client_key}
                known_hosts: {self.known_hosts}
                ssh_config: {self.root / "ssh_config"}
                connect_timeout: 10s
            """)

    def host_dict(self) -> dict[str, object]:
        return {
            "address": "127.0.0.1",
            "port": self.port,
            "user": self.user,
            "identity_file": str(self.client_key),
            "known_hosts": str(self.known_hosts),
            "ssh_config": str(self.root / "ssh_config"),
        }


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _keygen(path: Path) -> None:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)


def start_sshd(
    root: Path, port: int | None = None, extra_config: str = ""
) -> tuple[subprocess.Popen[bytes], SSHServer]:
    """Start an sshd on 127.0.0.1 in `root` (keys, config, known_hosts); wait until it accepts.

    `extra_config` is appended to its sshd_config (the test host's `SetEnv`, say).
    """
    if not Path(SSHD).exists():
        pytest.fail("sshd is not installed: .ci/run installs openssh-server")
    root.mkdir(parents=True, exist_ok=True)
    os.chmod(root, 0o700)
    port = port or free_port()
    host_key, client_key = root / "host_ed25519", root / "client_ed25519"
    if not host_key.exists():
        _keygen(host_key)
        _keygen(client_key)
    (root / "authorized_keys").write_text((root / "client_ed25519.pub").read_text())
    os.chmod(root / "authorized_keys", 0o600)
    (root / "sshd_config").write_text(
        textwrap.dedent(f"""\
        Port {port}
        ListenAddress 127.0.0.1
        HostKey {host_key}
        AuthorizedKeysFile {root}/authorized_keys
        PidFile {root}/sshd.pid
        StrictModes no
        UsePAM no
        PasswordAuthentication no
        KbdInteractiveAuthentication no
        PubkeyAuthentication yes
        PermitRootLogin prohibit-password
        MaxSessions 200
        MaxStartups 200
        AcceptEnv LANG
        Subsystem sftp internal-sftp
        LogLevel ERROR
        """)
        + extra_config
    )
    (root / "ssh_config").write_text("")  # keeps the user's own ~/.ssh/config out of the tests
    host_pub = (root / "host_ed25519.pub").read_text().split()
    (root / "known_hosts").write_text(f"[127.0.0.1]:{port} {host_pub[0]} {host_pub[1]}\n")
    Path("/run/sshd").mkdir(exist_ok=True)
    proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(root / "sshd_config")], stderr=subprocess.PIPE)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"sshd exited: {proc.stderr.read().decode() if proc.stderr else ''}")
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                break
        time.sleep(0.05)
    server = SSHServer(port, getpass.getuser(), client_key, root / "known_hosts", root, proc.pid)
    return proc, server


@pytest.fixture(scope="session")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SSHServer]:
    proc, server = start_sshd(tmp_path_factory.mktemp("sshd"))
    yield server
    proc.terminate()
    proc.wait(timeout=10)


@pytest.fixture
def write_runbook(tmp_path: Path, sshd: SSHServer):
    """Write a runbook whose single host `box` is the test sshd; returns its path."""

    def write(body: str, name: str = "runbook.yaml", hosts: str | None = None) -> Path:
        path = tmp_path / name
        path.write_text(textwrap.dedent(body).replace("__HOSTS__\n", hosts or sshd.host_yaml()))
        return path

    return write


def runbook_cli(
    *args: str, env: dict[str, str] | None = None, timeout: float = 120, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """Run the real `runbook` CLI in a subprocess, as a user would."""
    return subprocess.run(
        [sys.executable, "-m", "executor.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
        cwd=cwd,
        stdin=subprocess.DEVNULL,
    )


from sandbox.hub import HubServer  # noqa: E402  (appended with the `hub` fixture; may move to the top)


@pytest.fixture
def hub() -> Iterator[HubServer]:
    """The local Hugging Face Hub test double (sandbox/hub.py) on 127.0.0.1, fresh for each test.

    `.endpoint` (HF_ENDPOINT), `.token`, `.repos`, `.faults`, `.requests`, `.client_env(hf_home, token=...)`.
    """
    with HubServer() as server:
        yield server


@dataclass(frozen=True)
class SandboxHost:
    """A running test host (sandbox/testhost.py): its sshd, GPU variant, HOME and SGLang python."""

    server: SSHServer
    gpu: str
    home: Path
    python: Path  # the SGLang virtualenv's interpreter

    def host_yaml(self, name: str = "box") -> str:
        return self.server.host_yaml(name)

    def host_dict(self) -> dict[str, object]:
        return self.server.host_dict()


@pytest.fixture(scope="session")
def testhost(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., SandboxHost]]:
    """Factory of test hosts: `testhost("h200" | "rtx6000" | "none" | "absent")`, one sshd per
    variant for the session. Tests that write into `.home` remove what they wrote."""
    from sandbox import testhost as sandbox_host
    from sandbox.prepare import VENV_PYTHON

    problem = sandbox_host.missing()
    if problem:
        pytest.fail(problem)
    started: dict[str, tuple[subprocess.Popen[bytes], SandboxHost]] = {}

    def get(gpu: str = "h200") -> SandboxHost:
        if gpu not in started:
            root = tmp_path_factory.mktemp(f"testhost-{gpu}")
            home = root / "home"
            home.mkdir()
            setenv = sandbox_host.sshd_config(sandbox_host.session_env(gpu, home))
            proc, server = start_sshd(root / "sshd", extra_config=setenv)
            started[gpu] = (proc, SandboxHost(server, gpu, home, VENV_PYTHON))
        return started[gpu][1]

    yield get
    for proc, _ in started.values():
        proc.terminate()
        proc.wait(timeout=10)
