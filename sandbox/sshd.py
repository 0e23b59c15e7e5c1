"""A real OpenSSH server on a loopback address with fresh host and client keys, for the tests and `bench/`.

Not a test double: the real sshd, configured for loopback only, so that transports, the CLI and the
benchmarks talk SSH as they would to a GPU host. Linux routes all of 127.0.0.0/8 to `lo`, so each of
several test nodes can have an address of its own (127.0.0.2, 127.0.0.3, ...: `ListenAddress`) without
root or network namespaces.
"""

from __future__ import annotations

import getpass
import os
import shutil
import socket
import subprocess
import textwrap
import time
from collections.abc import Sequence
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
    address: str = "127.0.0.1"  # the loopback address it listens on

    def host_yaml(self, name: str = "box") -> str:
        return textwrap.dedent(f"""\
            hosts:
              {name}:
                address: {self.address}
                port: {self.port}
                user: {self.user}
                identity_file: {self.client_key}
                known_hosts: {self.known_hosts}
                ssh_config: {self.root / "ssh_config"}
                connect_timeout: 10s
            """)

    def host_dict(self) -> dict[str, object]:
        return {
            "address": self.address,
            "port": self.port,
            "user": self.user,
            "identity_file": str(self.client_key),
            "known_hosts": str(self.known_hosts),
            "ssh_config": str(self.root / "ssh_config"),
        }


def free_port(address: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((address, 0))
        return int(sock.getsockname()[1])


def _keygen(path: Path) -> None:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)


def start_sshd(
    root: Path,
    port: int | None = None,
    extra_config: str = "",
    address: str = "127.0.0.1",
    wrap: Sequence[str] = (),
) -> tuple[subprocess.Popen[bytes], SSHServer]:
    """Start an sshd on `address` (a loopback one) in `root` (keys, config, known_hosts); wait until it accepts.

    `extra_config` is appended to its sshd_config (the test host's `SetEnv`, say). `wrap` goes before its
    command: `ip netns exec NAME` runs it inside a network namespace (sandbox/netns.py), `address` then the
    namespace's end of its veth, reached from here; give `port` then (a fresh namespace has every port free,
    but this namespace cannot bind its address to find one).
    """
    if not Path(SSHD).exists():
        raise RuntimeError("sshd is not installed: .ci/run installs openssh-server (apt-get)")
    root.mkdir(parents=True, exist_ok=True)
    os.chmod(root, 0o700)
    port = port or free_port(address)
    host_key, client_key = root / "host_ed25519", root / "client_ed25519"
    if not host_key.exists():
        _keygen(host_key)
        _keygen(client_key)
    (root / "authorized_keys").write_text((root / "client_ed25519.pub").read_text())
    os.chmod(root / "authorized_keys", 0o600)
    (root / "sshd_config").write_text(
        textwrap.dedent(f"""\
        Port {port}
        ListenAddress {address}
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
    (root / "known_hosts").write_text(f"[{address}]:{port} {host_pub[0]} {host_pub[1]}\n")
    Path("/run/sshd").mkdir(exist_ok=True)
    proc = subprocess.Popen([*wrap, SSHD, "-D", "-e", "-f", str(root / "sshd_config")], stderr=subprocess.PIPE)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"sshd exited: {proc.stderr.read().decode() if proc.stderr else ''}")
        with socket.socket() as sock:
            if sock.connect_ex((address, port)) == 0:
                break
        time.sleep(0.05)
    server = SSHServer(port, getpass.getuser(), client_key, root / "known_hosts", root, proc.pid, address)
    return proc, server
