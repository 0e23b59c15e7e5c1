"""A real OpenSSH server on 127.0.0.1 with fresh host and client keys, for the tests and `bench/`.

Not a test double: the real sshd, configured for loopback only, so that transports, the CLI and the
benchmarks talk SSH as they would to a GPU host.
"""

from __future__ import annotations

import getpass
import os
import shutil
import socket
import subprocess
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

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
        raise RuntimeError("sshd is not installed: .ci/run installs openssh-server (apt-get)")
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
