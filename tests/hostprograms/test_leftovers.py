"""Nothing a host program ships is left on the host (executor/hostprogram.py `host_program`): a folder whose
bash was killed before its EXIT trap could run (a step or its controller killed outright; here the step's bash
gets SIGKILL, over the real sshd) is removed by the next program on the host, and the folder of a program
still running (another step's, another run's) is not touched."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from executor.hostprogram import host_program
from executor.render import render_command
from executor.runbook.model import Host
from executor.transport import SSHTransport
from executor.transport.base import CommandResult
from sandbox.sshd import SSHServer
from steps.benchmark import BenchmarkStep


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


def test_a_killed_step_s_program_folder_goes_at_the_next_program_and_a_live_one_stays(
    sshd: SSHServer, tmp_path: Path
) -> None:
    quick = {"action": "listen", "port": 0, "expect": [], "timeout": 0}

    async def programs() -> tuple[Path, CommandResult, list[Path], CommandResult, list[Path]]:
        transport = SSHTransport("box", Host.model_validate(sshd.host_dict()))
        await transport.connect()
        try:
            killed = asyncio.create_task(transport.run(render_command(waiting_program(tmp_path, 60), {}), 60))
            [left] = await asyncio.to_thread(folders, tmp_path, bool)
            os.kill(int(left.name.split(".")[1]), signal.SIGKILL)  # the step's bash, which the name carries
            outright = await killed
            assert left.is_dir()
            live = asyncio.create_task(transport.run(render_command(waiting_program(tmp_path, 30), {}), 60))
            running = await asyncio.to_thread(folders, tmp_path, lambda found: bool(found) and left not in found)
            done = await transport.run(render_command(f"export TMPDIR={tmp_path}\n" + host_program(
                "node_preflight", quick), {}), 30)  # fmt: skip
            after = sorted(tmp_path.glob("runbook-prog.*"))
            live.cancel()
            return left, outright, running, done, after
        finally:
            await transport.close()

    left, outright, running, done, after = asyncio.run(programs())
    assert outright.exit_code == 128 + signal.SIGKILL  # its EXIT trap never ran: its folder was left
    assert len(running) == 1 and left not in running  # the next program removed it at its start
    assert done.exit_code == 0, done.stderr
    assert after == running  # the program after that left the live one's folder; its own went at its exit


CONTROLLER = """
import asyncio, sys
from executor.runbook.model import Host
from executor.render import render_command
from executor.transport import SSHTransport
async def main():
    transport = SSHTransport("box", Host.model_validate_json(sys.argv[1]))
    await transport.connect()
    await transport.run(render_command(sys.argv[2], {}), timeout=60)
asyncio.run(main())
"""


def test_a_program_whose_controller_is_killed_removes_its_folder(sshd: SSHServer, tmp_path: Path) -> None:
    # the runner stops the step and closes its output: bash's `Terminated` line then met a closed pipe, and
    # SIGPIPE ended bash before its EXIT trap could remove the folder. Twice at most: on a loaded machine the runner's
    # KILL may come after its STOP_GRACE_S (2 s) before bash ran its trap (the next program's sweep then removes the
    # folder, by design); a trap that never removes it fails both.
    host = json.dumps(sshd.host_dict())
    for _ in range(2):
        with subprocess.Popen([sys.executable, "-c", CONTROLLER, host, waiting_program(tmp_path, 60)]) as controller:
            try:
                [made] = folders(tmp_path, bool)
            finally:
                controller.send_signal(signal.SIGKILL)
        owner = Path("/proc", made.name.split(".")[1])  # the step's bash, which the name carries
        end = time.monotonic() + 10
        while owner.exists() and time.monotonic() < end:
            time.sleep(0.05)
        if not owner.exists() and not made.exists():
            return
        shutil.rmtree(made, ignore_errors=True)
    raise AssertionError(f"twice, the folder of a program whose controller was killed was left: {made}")


#: The inode of this process's pid namespace, as a program's folder name carries it.
PID_NAMESPACE = "".join(filter(str.isdigit, os.readlink("/proc/self/ns/pid")))


def test_a_folder_of_another_pid_namespace_is_never_judged_by_this_one_s_pids(tmp_path: Path) -> None:
    # a container sharing /tmp (and the uid): its bash's pid names another process here, or none; sweeping by
    # it removed the folder of a program still running there (seen: `unshare --pid --fork --mount-proc`)
    theirs = tmp_path / "runbook-prog.4194304.5.1.aaaaaaaa"
    ours = tmp_path / f"runbook-prog.4194304.5.{PID_NAMESPACE}.bbbbbbbb"
    for folder in (theirs, ours):
        folder.mkdir()
    script = host_program("node_preflight", {"action": "listen", "port": 0, "expect": [], "timeout": 0})
    assert (
        subprocess.run(["bash", "-c", script], env={"TMPDIR": str(tmp_path), "PATH": os.environ["PATH"]}).returncode
        == 0
    )
    assert sorted(tmp_path.iterdir()) == [theirs]


@pytest.mark.parametrize(
    "strict", ["", "set -euo pipefail\nIFS=$'\\n\\t'\n", "set -euf -o pipefail\nshopt -s failglob\n"]
)
def test_the_sweep_tells_a_live_owner_from_a_gone_or_reused_pid_whatever_the_script_set_before(
    strict: str, tmp_path: Path
) -> None:
    with subprocess.Popen(["sleep", "30"]) as live:
        started = Path(f"/proc/{live.pid}/stat").read_text().rsplit(") ", 1)[1].split()[19]
        ns = PID_NAMESPACE
        kept = tmp_path / f"runbook-prog.{live.pid}.{started}.{ns}.aaaaaaaa"
        reused = tmp_path / f"runbook-prog.{live.pid}.{int(started) + 1}.{ns}.bbbbbbbb"  # the pid of a later process
        gone = tmp_path / f"runbook-prog.4194304.5.{ns}.cccccccc"  # above any pid_max
        for folder in (kept, reused, gone):
            folder.mkdir()
        script = strict + host_program("node_preflight", {"action": "listen", "port": 0, "expect": [], "timeout": 0})
        done = subprocess.run(["bash", "-c", script], env={"TMPDIR": str(tmp_path), "PATH": os.environ["PATH"]})
        live.kill()
    assert done.returncode == 0
    assert sorted(tmp_path.iterdir()) == [kept]


def test_a_killed_benchmark_s_output_goes_at_the_next_program(tmp_path: Path) -> None:
    # bench_serving writes its JSONL into a file of the host's temp folder: the same class as a program's folder
    sleeper = tmp_path / "python"
    sleeper.write_text("#!/bin/sh\nexec sleep 30\n")
    sleeper.chmod(0o755)
    bench = BenchmarkStep(id="b", server="d", python=str(sleeper)).script("http://127.0.0.1:1", 1, 1, 1)
    env = {"TMPDIR": str(tmp_path), "PATH": os.environ["PATH"]}
    with subprocess.Popen(["bash", "-c", bench], env=env, start_new_session=True) as killed:
        end = time.monotonic() + 10
        while not (made := sorted(set(tmp_path.iterdir()) - {sleeper})) and time.monotonic() < end:
            time.sleep(0.05)
        os.killpg(killed.pid, signal.SIGKILL)  # bash and bench_serving, outright: no EXIT trap runs
    assert made and all(path.exists() for path in made)
    script = host_program("node_preflight", {"action": "listen", "port": 0, "expect": [], "timeout": 0})
    assert subprocess.run(["bash", "-c", script], env=env).returncode == 0
    assert sorted(tmp_path.iterdir()) == [sleeper]
