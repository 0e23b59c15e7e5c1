"""The fan-out and verify-throughput benchmarks at tiny sizes: the harness runs, ratios come out.

No timing is asserted: these prove that the sshd fleet starts, serves and stops, that every
installed tool runs the fan-out cases, and that each benchmark computes its ratios and targets.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from bench import fanout, verify_throughput
from bench.fleet import sshd_fleet
from bench.harness import ToolFailed
from sandbox.sshd import SSHServer

MIB = 1 << 20


def alive(pid: int) -> bool:
    """Whether `pid` is a process that has not exited (a zombie counts as exited)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


def ssh(server: SSHServer, command: str) -> subprocess.Popen[bytes]:
    """The OpenSSH client on one fleet server, with the fleet's shared key and known_hosts only."""
    return subprocess.Popen(
        ["ssh", "-F", "/dev/null", "-i", str(server.client_key), "-p", str(server.port),
         "-o", f"UserKnownHostsFile={server.known_hosts}", "-o", "StrictHostKeyChecking=yes",
         "-o", "BatchMode=yes", f"{server.user}@127.0.0.1", command],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
    )  # fmt: skip


def test_fleet_shares_credentials_serves_and_stops(tmp_path: Path) -> None:
    with sshd_fleet(tmp_path, 3) as servers:
        assert len({s.port for s in servers}) == 3
        assert len({s.client_key for s in servers}) == 1
        assert len({s.known_hosts for s in servers}) == 1
        echoes = [ssh(s, "echo $HOME") for s in servers]
        assert [p.communicate(timeout=60)[0].decode().strip() for p in echoes] == [
            str(s.root / "home") for s in servers
        ]  # the clean shell: HOME is the server's own empty folder
        held = ssh(servers[0], "echo up; sleep 60")  # an open connection, like a ControlPersist master
        assert held.stdout is not None and held.stdout.readline() == b"up\n"
        listeners = [s.pid for s in servers]
    assert not any(alive(pid) for pid in listeners)
    assert held.wait(timeout=30) != 0  # its server-side process was stopped with the fleet


def test_fleet_stops_on_interrupt(tmp_path: Path) -> None:
    with pytest.raises(KeyboardInterrupt), sshd_fleet(tmp_path, 2) as servers:
        listeners = [s.pid for s in servers]
        raise KeyboardInterrupt
    assert not any(alive(pid) for pid in listeners)


def test_fanout_computes_ratios_for_every_tool() -> None:
    section = fanout.section(counts=(1, 2), reps=1)
    [table] = section.tables
    tools = [row[0] for row in table.rows]
    assert {"runbook (CLI)", "runbook (in-process)", "raw asyncssh (floor)"} <= set(tools)
    assert all(runner.name in tools for runner in fanout.runners() if runner.missing() is None)
    assert table.columns[-2:] == ["2 / 1", "2 hosts vs floor"]
    for row in table.rows:
        assert all(cell.endswith("x") for cell in row[-2:]), row  # computed, not "—"
    assert not section.notes or all("not run" in note for note in section.notes)
    assert [t.reached is not None for t in section.targets] == [True, True]


def test_verify_throughput_computes_ratio_and_target(tmp_path: Path) -> None:
    section = verify_throughput.section(total_bytes=32 * MIB, shards=4, reps=1, cache=tmp_path)
    [table] = section.tables
    by_case = {row[0]: row for row in table.rows}
    cores = os.cpu_count()
    assert by_case[f"verify step hashing ({cores} workers)"][-1].endswith("x")
    assert by_case["sha256sum, sequential"][-1] == "1x"
    assert all(float(row[3]) > 0 for row in table.rows)  # GB/s
    assert section.notes == []
    [target] = section.targets
    assert target.reached is not None and f"{cores} cores x" in target.detail


def test_model_folder_is_made_once_and_checked(tmp_path: Path) -> None:
    folder = verify_throughput.model_folder(tmp_path, 4 * MIB, 2)
    assert folder.total_bytes == 4 * MIB and len(folder.shards) == 2
    stamps = [p.stat().st_mtime_ns for p in folder.shards]
    again = verify_throughput.model_folder(tmp_path, 4 * MIB, 2)
    assert again == folder and [p.stat().st_mtime_ns for p in again.shards] == stamps  # reused, not rewritten
    verify_throughput.verify_case(folder, 2)()
    verify_throughput.sha256sum_case(folder)()
    with folder.shards[0].open("r+b") as shard:
        shard.write(b"changed")
    with pytest.raises(ToolFailed, match="wrong digests"):
        verify_throughput.verify_case(folder, 2)()
    with pytest.raises(ToolFailed, match="other digests"):
        verify_throughput.sha256sum_case(folder)()
