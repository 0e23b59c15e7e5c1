"""Nothing a host program ships is left on the host (executor/hostprogram.py `host_program`): a folder whose
bash was killed before its EXIT trap could run (here: the controller killed with SIGKILL mid-program, over the
real sshd) is removed by the next program on the host, and a folder of a program still running (another run's,
over another connection) is not touched."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from executor.hostprogram import host_program
from executor.model import Host
from executor.render import render_command
from executor.transport import SSHTransport
from sandbox.sshd import SSHServer

CONTROLLER = """
import asyncio, json, sys
from executor.model import Host
from executor.render import render_command
from executor.transport import SSHTransport
host, script = json.loads(sys.argv[1]), sys.argv[2]
async def main():
    transport = SSHTransport("box", Host(**host))
    await transport.connect()
    await transport.run(render_command(script, {}), timeout=60)
asyncio.run(main())
"""


def waiting_program(tmp: Path, seconds: float) -> str:
    """A host program that waits `seconds` (node_preflight listening for a peer that never comes), its folder
    in `tmp`."""
    config = {"action": "listen", "port": 0, "expect": ["nobody"], "timeout": seconds}
    return f"export TMPDIR={tmp}\n" + host_program("node_preflight", config)


def folders(tmp: Path, until: Callable[[list[Path]], bool], within: float = 10.0) -> list[Path]:
    """The program folders in `tmp`, once `until` holds of them (or `within` seconds have passed)."""
    end = time.monotonic() + within
    while not until(found := sorted(tmp.glob("runbook-prog.*"))) and time.monotonic() < end:
        time.sleep(0.05)
    return found


def test_a_killed_controller_s_program_folder_goes_at_the_next_program_and_a_live_one_stays(
    sshd: SSHServer, tmp_path: Path
) -> None:
    host = sshd.host_dict()
    killed = subprocess.Popen([sys.executable, "-c", CONTROLLER, json.dumps(host), waiting_program(tmp_path, 60)])
    try:
        [left] = folders(tmp_path, bool)
    finally:
        killed.send_signal(signal.SIGKILL)
        killed.wait()
    owner = Path("/proc", left.name.split(".")[1])  # the step's bash, which the name carries
    end = time.monotonic() + 10
    while owner.exists() and time.monotonic() < end:  # the runner's stop of its steps: TERM, then KILL after 2 s
        time.sleep(0.05)
    assert not owner.exists() and left.is_dir()  # what a step killed outright leaves

    async def next_programs() -> tuple[list[Path], list[Path]]:
        transport = SSHTransport("box", Host(**host))
        await transport.connect()
        try:
            live = asyncio.create_task(transport.run(render_command(waiting_program(tmp_path, 30), {}), 60))
            running = await asyncio.to_thread(folders, tmp_path, lambda found: bool(found) and left not in found)
            quick = {"action": "listen", "port": 0, "expect": [], "timeout": 0}
            done = await transport.run(render_command(f"export TMPDIR={tmp_path}\n" + host_program(
                "node_preflight", quick), {}), 30)  # fmt: skip
            assert done.exit_code == 0, done.stderr
            after = sorted(tmp_path.glob("runbook-prog.*"))
            live.cancel()
            return running, after
        finally:
            await transport.close()

    live, after = asyncio.run(next_programs())
    assert len(live) == 1  # the next program (this one) removed the killed one's folder at its start
    assert after == live  # the program after it left the live one's, and its own went at its exit


@pytest.mark.parametrize("strict", ["", "set -euo pipefail\nIFS=$'\\n\\t'\n"])
def test_the_sweep_tells_a_live_owner_from_a_gone_or_reused_pid_whatever_the_script_set_before(
    strict: str, tmp_path: Path
) -> None:
    with subprocess.Popen(["sleep", "30"]) as live:
        started = Path(f"/proc/{live.pid}/stat").read_text().rsplit(") ", 1)[1].split()[19]
        kept = tmp_path / f"runbook-prog.{live.pid}.{started}.aaaaaaaa"
        reused = tmp_path / f"runbook-prog.{live.pid}.{int(started) + 1}.bbbbbbbb"  # the pid of a later process
        gone = tmp_path / "runbook-prog.4194304.5.cccccccc"  # above any pid_max
        for folder in (kept, reused, gone):
            folder.mkdir()
        script = strict + host_program("node_preflight", {"action": "listen", "port": 0, "expect": [], "timeout": 0})
        done = subprocess.run(["bash", "-c", script], env={"TMPDIR": str(tmp_path), "PATH": os.environ["PATH"]})
        live.kill()
    assert done.returncode == 0
    assert sorted(tmp_path.iterdir()) == [kept]
