"""hostprograms/deploy.py's actions for a node group's ranks, run for real (the bundle under `python -I -S`,
and once over the test sshd): `launch` answers before the server is ready, `watch` looks at a rank.

The ranks are tests/hostprograms/fake_rank.py (a test double: log lines, /health and /generate, an exit
status), each step of theirs set off by a file the test creates, so no assertion depends on timing.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from executor.hostprogram import host_program
from hostprograms import deploy as deploy_host
from sandbox.sshd import SSHServer, free_port
from tests.hostprograms.conftest import ProgramRun

FAKE_RANK = str(Path(__file__).with_name("fake_rank.py"))
#: A real NCCL failure as torch prints it when a peer rank goes away (sglang issues #3784, #12289).
NCCL_LINE = (
    "torch.distributed.DistBackendError: NCCL error in: /pytorch/torch/csrc/distributed/c10d/NCCLUtils.hpp:268, "
    "remote process exited or there was a network error, NCCL version 2.27.3"
)
#: Lines of a healthy multi-node start-up that carry error-like words: none is a rank's error while it runs.
HEALTHY = [
    "[2026-05-01 10:00:02 TP8] Init torch distributed begin.",
    "[W501 10:00:03.512 ProcessGroupNCCL.cpp:4718] [PG ID 0 PG GUID 0 Rank 8] using GPU 0 to perform barrier "
    "as devices used by this process are currently unknown.",
    "[2026-05-01 10:00:04 TP8] Failed to import deep_gemm, falling back (this is a warning)",
    "[2026-05-01 10:00:05 TP8] Init nccl begin.",
]


def wait_for(check: Callable[[], dict[str, Any]], until: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    """`check()`'s first answer that satisfies `until`, within 30 s (else the test fails with the last one)."""
    deadline = time.monotonic() + 30
    while True:
        answer = check()
        if until(answer) or time.monotonic() > deadline:
            assert until(answer), answer
            return answer
        time.sleep(0.1)


class Ranks:
    """Launch, watch and stop fake ranks on ports of their own, state in one folder; `kill_all()` (the
    fixture's teardown) ends whatever is still recorded, whatever the test asserted."""

    def __init__(self, run_program: ProgramRun, tmp_path: Path) -> None:
        self.run_program, self.tmp_path = run_program, tmp_path
        self.state_dir = tmp_path / "state"

    def config(self, port: int, *fake_args: str, **more: Any) -> dict[str, Any]:
        launch = [[sys.executable, False], [FAKE_RANK, False], *([arg, False] for arg in fake_args)]
        return {"action": "launch", "port": port, "bind": "127.0.0.1", "env": {}, "ready_timeout": 3600,
                "stop_timeout": 5, "state_dir": str(self.state_dir), "launch": launch, **more}  # fmt: skip

    def launch(self, port: int, *fake_args: str, **more: Any) -> dict[str, Any]:
        return self.run_program("deploy", self.config(port, *fake_args, **more))

    def watch(self, port: int, probe_http: bool = False) -> dict[str, Any]:
        config = {"action": "watch", "port": port, "bind": "127.0.0.1", "state_dir": str(self.state_dir)}
        return self.run_program("deploy", config | {"probe_http": probe_http})

    def stop(self, port: int) -> dict[str, Any]:
        return self.run_program("deploy", {"action": "stop", "port": port, "stop_timeout": 5,
                                           "state_dir": str(self.state_dir)})  # fmt: skip

    def kill_all(self) -> None:
        for state in self.state_dir.glob("*[0-9].json"):
            with contextlib.suppress(OSError, ValueError, KeyError):
                os.killpg(json.loads(state.read_text())["pgid"], signal.SIGKILL)


@pytest.fixture
def ranks(run_program: ProgramRun, tmp_path: Path) -> Iterator[Ranks]:
    here = Ranks(run_program, tmp_path)
    yield here
    here.kill_all()


def test_launch_answers_before_the_server_is_ready_which_watch_then_sees(ranks: Ranks, tmp_path: Path) -> None:
    port, ready = free_port(), tmp_path / "ready"
    args = ("--port", str(port), "--ready", str(ready), "--say", "Init torch distributed begin.")
    launched = ranks.launch(port, *args)  # ready_timeout 3600: start would wait for the file, launch does not
    assert launched["action"] == "launch" and launched["failure"] is None and not launched["reused"]
    assert launched["ready"] is False and launched["ready_s"] is None
    assert launched["health"] is None and launched["generate"] is None and launched["exit_code"] is None
    assert launched["argv"] == [sys.executable, FAKE_RANK, *args] and launched.get("port_holder") is None
    assert Path(launched["log_file"]).parent == ranks.state_dir and deploy_host.alive(launched["pid"], None)

    looked = wait_for(lambda: ranks.watch(port, probe_http=True), lambda w: w["health"]["status"] == 503)
    assert looked["alive"] and looked["pid"] == launched["pid"] and looked["exit_code"] is None
    assert looked["generate"] is None  # asked only after /health said 200
    assert looked["last_line"] == "Init torch distributed begin." and looked["error_line"] is None

    ready.touch()
    served = wait_for(lambda: ranks.watch(port, probe_http=True), lambda w: w["health"]["status"] == 200)
    assert served["generate"]["status"] == 200 and json.loads(served["generate"]["body"])["text"] == " Paris"
    assert ranks.watch(port)["health"] is None  # without probe_http (a rank > 0): no HTTP asked

    again = ranks.launch(port, *args)
    assert again["reused"] and again["pid"] == launched["pid"] and again["previous"] is None
    assert again["log_file"] == launched["log_file"] and again["failure"] is None

    other = ranks.launch(port, *args, env={"NCCL_SOCKET_IFNAME": "lo"})
    assert not other["reused"] and other["pid"] != launched["pid"]
    assert other["previous"]["action"] == "stopped" and other["previous"]["reason"] == "its environment differs"
    assert not deploy_host.alive(launched["pid"], None)


def test_watch_tells_how_long_a_rank_s_log_has_been_silent_and_its_last_line(ranks: Ranks) -> None:
    port = free_port()
    launched = ranks.launch(port, *(word for line in HEALTHY for word in ("--say", line)), serves_http=False)
    looked = wait_for(lambda: ranks.watch(port), lambda w: w["last_line"] == HEALTHY[-1])
    assert looked["alive"] and looked["error_line"] is None and looked["log_tail"] == []  # a healthy rank: no tail
    assert looked["health"] is None and looked["generate"] is None and looked["failure"] is None
    an_hour_ago = time.time() - 3600
    os.utime(launched["log_file"], (an_hour_ago, an_hour_ago))
    assert ranks.watch(port)["idle_s"] >= 3600


def test_an_nccl_error_line_is_the_rank_s_error_while_it_still_runs(ranks: Ranks, tmp_path: Path) -> None:
    port, broken = free_port(), tmp_path / "broken"
    says = (word for line in HEALTHY for word in ("--say", line))
    ranks.launch(port, *says, "--when", str(broken), "--then", NCCL_LINE, "--then", "still here", serves_http=False)
    healthy = wait_for(lambda: ranks.watch(port), lambda w: w["last_line"] == HEALTHY[-1])
    assert healthy["alive"] and healthy["error_line"] is None
    broken.touch()
    hung = wait_for(lambda: ranks.watch(port), lambda w: w["last_line"] == "still here")
    assert hung["alive"] and hung["exit_code"] is None and hung["error_line"] == NCCL_LINE
    assert hung["log_tail"][-2:] == [NCCL_LINE, "still here"]  # the tail comes with an error line


def test_after_a_rank_died_watch_gives_its_exit_status_and_error_line(ranks: Ranks) -> None:
    port = free_port()
    launched = ranks.launch(port, "--say", "Init nccl begin.", "--say", "RuntimeError: peer gone", "--exit", "3")
    assert launched["failure"] is None  # it answered before the rank exited: the keeper saw the exit
    dead = wait_for(lambda: ranks.watch(port, probe_http=True), lambda w: w["exit_code"] is not None)
    assert dead["alive"] is False and dead["exit_code"] == 3 and dead["pid"] == launched["pid"]
    assert dead["error_line"] == "RuntimeError: peer gone" and dead["last_line"] == "RuntimeError: peer gone"
    assert dead["health"] is None and dead["failure"] is None  # a dead rank is not asked over HTTP

    relaunched = ranks.launch(port, "--say", "Init nccl begin.")
    assert relaunched["previous"] == {"pid": launched["pid"], "action": "forgotten", "reason": "no longer running"}
    alive = wait_for(lambda: ranks.watch(port), lambda w: w["last_line"] == "Init nccl begin.")
    assert alive["alive"] and alive["exit_code"] is None  # the first rank's status is not the new one's


def test_a_rank_that_serves_no_http_skips_the_port_check_and_stops_with_its_group(ranks: Ranks) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        refused = ranks.launch(port, "--say", "up")
        assert refused["pid"] is None and refused["port_holder"].startswith(f"pid {os.getpid()} (")
        assert refused["failure"].startswith(f"port {port} is taken by pid {os.getpid()}")
        launched = ranks.launch(port, "--say", "up", serves_http=False)
        assert launched["failure"] is None and launched["pid"] is not None
    stopped = ranks.stop(port)
    assert stopped["stopped"] and stopped["pids"] == [launched["pid"]] and stopped["gpu_freed"]
    gone = ranks.watch(port)
    assert gone == {"action": "watch", "port": port, "pid": None, "alive": False, "exit_code": None,
                    "log_file": None, "error_line": None, "last_line": None, "idle_s": None, "log_tail": [],
                    "health": None, "generate": None, "failure": f"no server recorded on port {port}"}  # fmt: skip


def test_a_rank_that_shut_down_before_its_node_s_stop_looked_is_stopped_and_its_workers_too(
    ranks: Ranks, tmp_path: Path
) -> None:
    """A node group's rank > 0 ends by itself (status 0) once rank 0 stops, and every rank is stopped at once:
    its own node's stop may come after. It stopped, and the workers it left (which hold the GPU memory) are
    stopped by the same bounded wait, not judged by one look. The losing order of that race, set by a file."""
    port, shutdown = free_port(), tmp_path / "shutdown"
    launched = ranks.launch(port, "--worker", "--when", str(shutdown), "--exit", "0", serves_http=False)
    worker = int(wait_for(lambda: ranks.watch(port), lambda w: w["last_line"] is not None)["last_line"].split()[1])
    shutdown.touch()
    wait_for(lambda: ranks.watch(port), lambda w: w["exit_code"] == 0)
    assert deploy_host.alive(worker, None)  # left behind in the rank's group
    stopped = ranks.stop(port)
    assert stopped["stopped"] and stopped["gpu_freed"] and stopped["failure"] is None and not stopped["killed"]
    assert stopped["pids"] == [worker] and not deploy_host.alive(worker, None)
    assert stopped["note"] == (
        f"the server recorded on port {port} (pid {launched['pid']}) had shut down cleanly (status 0), "
        "as a node group's rank > 0 does when rank 0 stops"
    )
    assert not Path(launched["state_file"]).exists()


def test_a_stop_waits_for_the_keeper_s_record_of_a_rank_that_has_just_exited(tmp_path: Path) -> None:
    """The rank exited and its keeper has not yet written its status (a loaded host): the stop waits for the
    record (bounded), and only status 0, a clean shutdown, is a stop; a rank that crashed was not stopped."""
    gone = subprocess.Popen(["true"])
    gone.wait()  # a pid no longer running, whose group is empty
    state = {"pid": gone.pid, "pgid": gone.pid, "starttime": 1, "log_file": str(tmp_path / "log"), "kept": True}
    deploy_host.write_state(str(tmp_path), 7, state)
    exit_file = deploy_host.exit_path(str(tmp_path), 7)
    writer = threading.Timer(
        0.3, deploy_host.write_json, (exit_file, {"pid": gone.pid, "starttime": 1, "exit_code": 0})
    )
    writer.start()
    try:
        clean = deploy_host.stop({"port": 7, "stop_timeout": 30}, str(tmp_path))
    finally:
        writer.join()
    assert clean["stopped"] and clean["gpu_freed"] and clean["pids"] == [] and clean["failure"] is None
    assert "had shut down cleanly (status 0)" in clean["note"]

    deploy_host.write_state(str(tmp_path), 7, state)
    deploy_host.write_json(exit_file, {"pid": gone.pid, "starttime": 1, "exit_code": 3})
    crashed = deploy_host.stop({"port": 7, "stop_timeout": 30}, str(tmp_path))
    assert not crashed["stopped"] and crashed["gpu_freed"] and crashed["failure"] is None
    assert (
        crashed["note"]
        == f"the server recorded on port 7 (pid {gone.pid}) was no longer running: it had exited with status 3"
    )


def test_launch_over_ssh_ends_the_session_while_the_rank_runs_on(ranks: Ranks, sshd: SSHServer) -> None:
    """The rank and its keeper hold nothing of the SSH session: the command ends, the rank runs on."""
    port = free_port()
    script = host_program("deploy", ranks.config(port, "--say", "Init torch distributed begin."), sys.executable)
    done = subprocess.run(
        ["ssh", "-F", str(sshd.root / "ssh_config"), "-i", str(sshd.client_key), "-p", str(sshd.port),
         "-o", f"UserKnownHostsFile={sshd.known_hosts}", "-o", "BatchMode=yes", f"{sshd.user}@127.0.0.1", "bash -s"],
        input=script, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    launched = json.loads(done.stdout.splitlines()[-1])
    assert launched["failure"] is None and deploy_host.alive(launched["pid"], None)
    assert wait_for(lambda: ranks.watch(port), lambda w: w["last_line"] is not None)["alive"]


@given(st.binary(max_size=2000), st.booleans())
def test_a_look_at_any_log_names_an_error_line_from_it_or_none(log: bytes, running: bool) -> None:
    """Whatever a rank wrote (partial UTF-8, control characters, NUL), reading it never fails, and the error
    line is one of its lines; while it runs, only a line of NCCL's."""
    with tempfile.NamedTemporaryFile() as file:
        file.write(log)
        file.flush()
        tail = deploy_host.log_tail(file.name)
    line = deploy_host.watched_error_line(tail, running)
    assert line is None or line in [t.strip() for t in tail]
    if running and line is not None:
        assert "nccl" in line.lower() or "distbackenderror" in line.lower()


def test_a_look_reads_at_most_a_bounded_tail_of_a_regular_log_file(ranks: Ranks) -> None:
    """A line of 50 KB comes back cut, its error still named; a log replaced by a FIFO (which would block the
    look) or by a link to /dev/zero (which would never end) is not read: the look answers at once."""
    port = free_port()
    long_line = NCCL_LINE + " " + "x" * 50_000
    launched = ranks.launch(port, "--say", long_line, serves_http=False)
    looked = wait_for(lambda: ranks.watch(port), lambda w: w["last_line"] is not None)
    cut = looked["last_line"]
    assert cut.startswith(NCCL_LINE) and cut.endswith(" ...") and len(cut) == deploy_host.LINE_CHARS + 4
    assert looked["error_line"] == cut and looked["log_tail"] == [cut]
    log = Path(launched["log_file"])
    log.unlink()
    os.mkfifo(log)
    fifo = ranks.watch(port)  # the fixture's run gives a look 60 s
    assert fifo["alive"] and fifo["last_line"] is None and fifo["log_tail"] == [] and fifo["failure"] is None
    log.unlink()
    log.symlink_to("/dev/zero")
    zero = ranks.watch(port)
    assert zero["alive"] and zero["last_line"] is None and zero["failure"] is None
