"""A fleet of real sshd servers on 127.0.0.1 for the fan-out benchmark: N hosts that look alike.

Each server is `sandbox.sshd.start_sshd` (the real OpenSSH server the tests use), but all of them
share one host key and one client key, and the fleet writes one known_hosts listing every port:
the runbook, ansible-playbook and pyinfra then see the same N hosts through the same files, so
their times differ only by how they fan out. Sharing the keys also saves two `ssh-keygen` runs
per server: the first server makes them, the others copy them.

Starting 32 servers one after the other costs 32 waits for the listening socket; they start in a
thread pool instead (each start is a subprocess and a poll loop, so threads overlap fully), which
takes well under a second on two cores. Ports are reserved all at once by the main thread so that
two parallel starts can never draw the same free port.

Stopping is reliable by construction: `sshd_fleet` is a context manager whose exit (normal, an
exception, or Ctrl-C's KeyboardInterrupt) first lets every start that is still in flight finish,
then stops every server that started. sshd's listener does not end the per-connection processes it
forked when it exits, and an open connection (ansible's ControlPersist master, say) would keep one
alive after the benchmark; so the connection processes are terminated together with the listener.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import os
import shutil
import signal
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

from sandbox.sshd import SSHServer, start_sshd

#: What a host's login shell is like. sshd starts every command through the user's login shell,
#: and bash sources ~/.bashrc even for non-interactive commands from sshd.
SHELLS = {
    "clean": "HOME is an empty folder (sshd `SetEnv`), so the login shell reads no ~/.bashrc",
    "login": "this machine's own HOME, so every command first runs its ~/.bashrc, as on a real host",
}
Shell = Literal["clean", "login"]
STOP_GRACE_S = 5.0
KEY_FILES = ("host_ed25519", "host_ed25519.pub", "client_ed25519.pub")


def reserve_ports(count: int) -> list[int]:
    """`count` distinct free loopback ports: all sockets are bound at once, so no port repeats."""
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(count)]
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        return [int(sock.getsockname()[1]) for sock in socks]


def _start(root: Path, port: int, shell: Shell, first: Path | None) -> tuple[subprocess.Popen[bytes], SSHServer]:
    """One sshd in `root`, with the keys of the server in `first` if given (start_sshd keeps keys it finds)."""
    root.mkdir(parents=True, exist_ok=True)
    if first is not None:
        for name in KEY_FILES:
            shutil.copy2(first / name, root / name)
    extra = ""
    if shell == "clean":
        (root / "home").mkdir(exist_ok=True)
        extra = f'SetEnv "HOME={root / "home"}"\n'
    return start_sshd(root, port=port, extra_config=extra)


def _connection_pids(listener: int) -> list[int]:
    """The per-connection sshd processes the listener forked (its direct children)."""
    try:
        text = Path(f"/proc/{listener}/task/{listener}/children").read_text()
    except OSError:  # already gone, or a kernel without CONFIG_PROC_CHILDREN
        return []
    return [int(pid) for pid in text.split()]


def stop_servers(procs: list[subprocess.Popen[bytes]]) -> None:
    """Terminate every listener and its open connections; kill what outlives STOP_GRACE_S."""
    connections = [pid for proc in procs for pid in _connection_pids(proc.pid)]
    for proc in procs:
        proc.terminate()
    for pid in connections:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextlib.contextmanager
def sshd_fleet(root: Path, count: int, shell: Shell = "clean") -> Iterator[list[SSHServer]]:
    """`count` running sshd servers under `root`, sharing keys and one known_hosts; stopped on exit.

    `shell` says what each server's login shell is like (see SHELLS).

    The servers' `client_key` and `known_hosts` point at the shared files, so `host_dict()` and
    `host_yaml()` give the same credentials for every host.
    """
    ports = reserve_ports(count)
    roots = [root / f"sshd-{i:03d}" for i in range(count)]
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=count, thread_name_prefix="sshd")
    futures = [pool.submit(_start, roots[0], ports[0], shell, None)]
    try:
        futures[0].result()  # its keys are the fleet's
        futures += [pool.submit(_start, r, p, shell, roots[0]) for r, p in zip(roots[1:], ports[1:], strict=True)]
        started = [future.result() for future in futures]
        known_hosts = root / "known_hosts"
        known_hosts.write_text("".join(server.known_hosts.read_text() for _, server in started))
        yield [
            dataclasses.replace(server, client_key=roots[0] / "client_ed25519", known_hosts=known_hosts)
            for _, server in started
        ]
    finally:
        pool.shutdown(wait=True)  # a start still in flight (Ctrl-C mid-start) finishes, so it can be stopped
        stop_servers([f.result()[0] for f in futures if not f.cancelled() and f.exception() is None])
