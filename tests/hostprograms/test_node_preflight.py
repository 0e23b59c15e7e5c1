"""hostprograms/node_preflight.py run for real on loopback (the bundle under `python -I -S`): the interface and
source address toward rank 0, and the dist-init port's reachability (listen on rank 0, connect from the others)."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

from sandbox.sshd import free_port
from tests.hostprograms.conftest import ProgramRun, document, program_command


def test_inspect_finds_lo_and_its_address_toward_a_loopback_peer(run_program: ProgramRun) -> None:
    found = run_program("node_preflight", {"action": "inspect", "peer": "127.0.0.1", "interface": None})
    assert found["action"] == "inspect" and found["failure"] is None
    assert found["peer_resolved"] == "127.0.0.1" and found["source_address"] == "127.0.0.1"
    assert found["interface"] == "lo" and found["interface_exists"] and "lo" in found["interfaces"]
    assert found["interfaces"] == [name for _, name in socket.if_nameindex()]
    named = run_program("node_preflight", {"action": "inspect", "peer": "127.0.0.1", "interface": "lo"})
    assert named["interface"] == "lo" and named["interface_exists"] and named["failure"] is None


def test_inspect_reports_a_named_interface_the_node_lacks(run_program: ProgramRun) -> None:
    missing = run_program("node_preflight", {"action": "inspect", "peer": "127.0.0.1", "interface": "rbk-nope0"})
    assert missing["interface"] == "rbk-nope0" and missing["interface_exists"] is False
    assert missing["source_address"] == "127.0.0.1"  # the route is still told
    assert missing["failure"] == (
        f"interface rbk-nope0 does not exist on this node (it has {', '.join(missing['interfaces'])})"
    )


def test_listen_waits_for_every_node_while_a_silent_connection_holds_up_none(tmp_path: Path) -> None:
    port = free_port()
    listen = {"action": "listen", "port": port, "expect": ["gpu2", "gpu3"], "timeout": 30}
    rank0 = popen(tmp_path, listen)
    # Each node reaches rank 0 at another of its addresses: rank 0 listens on every address, as torch's
    # TCPStore does, not on its own name's (which /etc/hosts may map to 127.0.1.1).
    addresses = {"gpu2": "127.0.0.1", "gpu3": "127.0.1.1"}
    try:
        silent = connect_until_up(port)  # a connection that says nothing, held open meanwhile
        with silent:
            nodes = [popen(tmp_path, connect_config(port, name, 30, address)) for name, address in addresses.items()]
            joined = [document(finish(node)) for node in nodes]
            listened = document(finish(rank0))
    finally:
        rank0.kill()
    assert listened == {"action": "listen", "port": port, "port_free": True, "joined": ["gpu2", "gpu3"],
                        "missing": [], "failure": None}  # fmt: skip
    for answer, address in zip(joined, addresses.values(), strict=True):
        assert answer["reachable"] is True and answer["error"] is None and answer["address"] == address
        assert answer["port"] == port and 0 <= answer["seconds"] < 30


def test_listen_names_the_nodes_that_never_came(run_program: ProgramRun) -> None:
    port = free_port()
    config = {"action": "listen", "port": port, "expect": ["gpu2"], "timeout": 1}
    alone = run_program("node_preflight", config)
    assert alone["port_free"] and alone["joined"] == [] and alone["missing"] == ["gpu2"]
    assert alone["failure"] == f"no word from gpu2 on port {port} within 1s"


def test_a_busy_dist_init_port_is_refused_naming_its_holder(run_program: ProgramRun) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        config = {"action": "listen", "port": port, "expect": ["gpu2"], "timeout": 30}
        refused = run_program("node_preflight", config)
    assert refused["port_free"] is False and refused["joined"] == [] and refused["missing"] == ["gpu2"]
    assert refused["failure"].startswith(f"port {port} is taken by pid {os.getpid()} (")


def test_a_closed_port_is_unreachable_after_retrying_for_the_timeout(run_program: ProgramRun) -> None:
    port = free_port()  # bound, then closed: nothing listens there
    started = time.monotonic()
    answer = run_program("node_preflight", connect_config(port, "gpu2", 1.5))
    assert answer["reachable"] is False and answer["error"] == "Connection refused"
    assert 1.5 - 0.5 <= answer["seconds"] <= time.monotonic() - started  # it retried until its timeout, no longer


# ----------------------------------------------------------------------------- helpers


def connect_config(port: int, name: str, timeout: float, address: str = "127.0.0.1") -> dict[str, Any]:
    return {"action": "connect", "address": address, "port": port, "name": name, "timeout": timeout}


def popen(tmp_path: Path, config: dict[str, Any]) -> subprocess.Popen[str]:
    command = program_command(tmp_path, "node_preflight", config)
    pipe = subprocess.PIPE
    return subprocess.Popen(command, stdout=pipe, stderr=pipe, stdin=subprocess.DEVNULL, text=True)


def finish(proc: subprocess.Popen[str]) -> subprocess.CompletedProcess[str]:
    out, err = proc.communicate(timeout=60)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def connect_until_up(port: int) -> socket.socket:
    """A plain connection to the listener, once it listens (within 30 s)."""
    deadline = time.monotonic() + 30
    while True:
        try:
            return socket.create_connection(("127.0.0.1", port), timeout=5)
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
