"""The SGLang stand-in across several test nodes (sandbox/sglang_standin/distributed.py): each rank started
with `python -m sglang.launch_server ... --nnodes N --node-rank R --dist-init-addr ADDR:PORT` in an SSH
session of its own node (`testnodes`: one sshd per loopback address), as the deploy step starts them."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from sandbox.sshd import free_port
from sandbox.testhost import PoolHost
from tests.sandbox.test_sglang_standin import READY_LINE, _alive, foreground, generate, http, wait_healthy
from tests.sandbox.test_testhost import ssh

FAST = {"startup_s": 0.3, "decode_tokens_per_s": 2000.0}
NCCL_REMOTE = "remote process exited or there was a network error"
DEADLINE_S = 15


@dataclass
class Rank:
    """One node's server: the shell that waits for it writes its exit status beside its log."""

    node: PoolHost
    pid: int  # the server (python); its process group is the shell's
    pgid: int
    port: int
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def text(self) -> str:
        return self.log.read_text() if self.log.exists() else ""

    def exit_status(self) -> int | None:
        rc = self.log.with_suffix(".rc")
        return int(rc.read_text()) if rc.exists() and rc.read_text().strip() else None

    def wait_exit(self, timeout: float = DEADLINE_S) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            status = self.exit_status()
            if status is not None:
                return status
            time.sleep(0.05)
        raise AssertionError(f"{self.node.name} still runs after {timeout}s:\n{self.text()}")

    def wait_for(self, text: str, timeout: float = DEADLINE_S) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if text in self.text():
                return
            time.sleep(0.05)
        raise AssertionError(f"{self.node.name} never logged {text!r} in {timeout}s:\n{self.text()}")

    def last_line(self) -> str:
        return self.text().rstrip("\n").rsplit("\n", 1)[-1]


@dataclass
class Group:
    nodes: list[PoolHost]
    model: Path
    dist_port: int
    ranks: list[Rank]

    def flags(self, rank: int, tp: int, *extra: str, timeout: int = 30) -> list[str]:
        node = self.nodes[rank]
        return [
            *("--model-path", str(self.model), "--tp-size", str(tp), "--host", "127.0.0.1"),
            *("--port", str(node.sglang_port), "--nnodes", str(len(self.nodes)), "--node-rank", str(rank)),
            *("--dist-init-addr", f"{self.nodes[0].address}:{self.dist_port}", "--dist-timeout", str(timeout)),
            *extra,
        ]

    def start(self, rank: int, tp: int, *extra: str, timeout: int = 30, interface: str = "lo") -> Rank:
        """Start rank `rank` on its node, detached from the SSH session (the session ends at once), with
        the interface variables a deploy sets."""
        node = self.nodes[rank]
        log = node.home / f"rank{rank}-{len(self.ranks)}.log"
        pid_file = log.with_suffix(".pid")
        env = f"NCCL_SOCKET_IFNAME={interface} GLOO_SOCKET_IFNAME={interface} SGLANG_HOST_IP={node.address}"
        flags = shlex.join(self.flags(rank, tp, *extra, timeout=timeout))
        server = f"env {env} python -m sglang.launch_server {flags}"
        script = (
            f"{server} > {log} 2>&1 < /dev/null & echo $! > {pid_file}; wait $!; echo $? > {log.with_suffix('.rc')}"
        )
        done = ssh(node, f"setsid bash -c {shlex.quote(script)} > /dev/null 2>&1 < /dev/null & echo $!")
        assert done.returncode == 0, done.stderr
        deadline = time.monotonic() + DEADLINE_S
        while not (pid_file.exists() and pid_file.read_text().strip()):
            assert time.monotonic() < deadline, f"rank {rank} never started"
            time.sleep(0.02)
        started = Rank(node, int(pid_file.read_text()), int(done.stdout), node.sglang_port, log)
        self.ranks.append(started)
        return started

    def start_all(self, tp: int) -> list[Rank]:
        return [self.start(rank, tp) for rank in range(len(self.nodes))]


@pytest.fixture
def group(testnodes: Callable[..., list[PoolHost]], tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Group]:
    """Nodes (`@pytest.mark.parametrize("group", [n], indirect=True)`, default 2 of 8x H100) with fast
    stand-in switches; every rank started is killed (its process group) and its files removed after."""
    count = getattr(request, "param", 2)
    nodes = testnodes(count, variants=("h100x8",) * count)
    model = tmp_path / "target"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"architectures": ["KimiK25ForConditionalGeneration"]}))
    started = Group(nodes, model, free_port(nodes[0].address), [])
    with contextlib.ExitStack() as switches:
        for node in nodes:
            switches.enter_context(node.standin(**FAST))
        yield started
    for rank in started.ranks:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(rank.pgid, signal.SIGKILL)
        deadline = time.monotonic() + DEADLINE_S
        while _alive(rank.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        for suffix in (".log", ".pid", ".rc"):
            rank.log.with_suffix(suffix).unlink(missing_ok=True)


def switched(group: Group, rank: int, **switches: object) -> contextlib.AbstractContextManager[Path]:
    """This node's switches for the block, on top of the fast defaults."""
    return group.nodes[rank].standin(**FAST, **switches)


def listening(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


# ---------------------------------------------------------------- a group that comes up


def test_two_nodes_rendezvous_node_0_serves_and_stops_the_group(group: Group) -> None:
    rank0 = group.start(0, 16)
    rank0.wait_for("Init torch distributed begin.")
    time.sleep(0.5)  # alone, node 0 waits for node 1 at the rendezvous: nothing is served
    assert rank0.last_line().endswith(" TP0] Init torch distributed begin.")
    assert http(rank0.url + "/health")[0] == 503
    rank1 = group.start(1, 16)
    wait_healthy(rank0, timeout=DEADLINE_S * 2)
    out = generate(rank0, "Tell me something nice about the sea.", max_new_tokens=8)
    assert out["meta_info"]["completion_tokens"] == 8
    status, raw = http(rank0.url + "/server_info")
    info = json.loads(raw)
    assert status == 200 and (info["tp_size"], info["nnodes"], info["node_rank"]) == (16, 2, 0)
    assert info["dist_init_addr"] == f"127.0.0.2:{group.dist_port}"

    rank1.wait_for("max_total_num_tokens=")
    log1 = rank1.text()
    assert " TP8] Init torch distributed begin." in log1 and " TP8] Init nccl begin." in log1
    assert "Uvicorn" not in log1 and READY_LINE not in log1 and not listening(rank1.port)  # node 1 serves no HTTP
    assert " TP0] Init nccl begin." in rank0.text()

    os.kill(rank1.pid, signal.SIGTERM)  # once ready, node 1 only logs it: node 0's shutdown stops it
    rank1.wait_for("SIGTERM received on node_rank 1; waiting for the rank-0 ShutdownReq broadcast")
    time.sleep(0.3)
    assert _alive(rank1.pid) and http(rank0.url + "/health")[0] == 200

    os.kill(rank0.pid, signal.SIGTERM)
    assert rank0.wait_exit() == 0 and rank1.wait_exit() == 0
    assert "NCCL error" not in rank0.text() + rank1.text()


@pytest.mark.parametrize("group", [3], indirect=True)
def test_three_nodes_rendezvous(group: Group) -> None:
    rank0, rank1, rank2 = group.start_all(24)
    wait_healthy(rank0, timeout=DEADLINE_S * 2)
    assert json.loads(http(rank0.url + "/server_info")[1])["nnodes"] == 3
    assert generate(rank0, "Hello there", max_new_tokens=4)["meta_info"]["completion_tokens"] == 4
    rank2.wait_for(" TP16] KV Cache is allocated.")
    rank1.wait_for(" TP8] KV Cache is allocated.")
    os.kill(rank0.pid, signal.SIGTERM)
    assert [rank0.wait_exit(), rank1.wait_exit(), rank2.wait_exit()] == [0, 0, 0]


# ---------------------------------------------------------------- a rank that goes away


@pytest.mark.parametrize("killed", [1, 0])
def test_a_node_killed_ends_the_other_with_nccls_error(group: Group, killed: int) -> None:
    ranks = group.start_all(16)
    wait_healthy(ranks[0], timeout=DEADLINE_S * 2)
    ranks[1].wait_for("max_total_num_tokens=")
    os.kill(ranks[killed].pid, signal.SIGKILL)
    survivor = ranks[1 - killed]
    assert survivor.wait_exit() == 128 + signal.SIGKILL  # kill_process_tree, as every scheduler death
    log = survivor.text()
    assert "Scheduler hit an exception" in log
    assert (
        "torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:" in log
    )
    assert NCCL_REMOTE in log and "socketProgress: Connection closed by remote peer" in log


def test_nccl_error_on_node_1_kills_it_with_nccls_line_and_node_0_after_it(group: Group) -> None:
    rank0 = group.start(0, 16)
    with switched(group, 1, fault="nccl_error"):
        rank1 = group.start(1, 16)
        assert rank1.wait_exit() == 128 + signal.SIGKILL
    assert "Init nccl begin." in rank1.text() and "unhandled system error (run with NCCL_DEBUG=INFO for details)" in (
        rank1.text()
    )
    assert "ncclSystemError: System call (e.g. socket, malloc) or external library call failed" in rank1.text()
    assert rank0.wait_exit() == 128 + signal.SIGKILL and NCCL_REMOTE in rank0.text()
    assert READY_LINE not in rank0.text()


def test_nccl_hang_on_node_1_leaves_init_nccl_as_its_last_line_and_node_0_never_serves(group: Group) -> None:
    with switched(group, 1, fault="nccl_hang"):
        # the dist timeout also bounds node 0's wait for node 1 to join: room for node 1's SSH session and start
        rank0 = group.start(0, 16, timeout=6)
        rank1 = group.start(1, 16, timeout=6)
        rank1.wait_for("Init nccl begin.")
        rank0.wait_for("Init nccl begin.")
        assert http(rank0.url + "/health")[0] == 503
        # node 0 waits in the NCCL init for the dist timeout, then its watchdog fires
        assert rank0.wait_exit() == 128 + signal.SIGKILL
    assert http(rank0.url + "/health")[0] == 0 and READY_LINE not in rank0.text()
    assert "] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1, OpType=ALLREDUCE" in rank0.text()
    assert "[rank0]:[E" in rank0.text() and "[PG ID 0 PG GUID 0(default_pg) Rank 0]" in rank0.text()
    assert "Timeout(ms)=6000)" in rank0.text()
    assert rank1.last_line().endswith(" TP8] Init nccl begin.") and _alive(rank1.pid)  # and nothing more, ever


def test_an_interface_the_node_does_not_have_fails_its_nccl_init(group: Group) -> None:
    rank0 = group.start(0, 16)
    rank1 = group.start(1, 16, interface="nosuchif9")
    assert rank1.wait_exit() == 128 + signal.SIGKILL
    assert "Init nccl begin." in rank1.text()
    assert "internal error - please report this issue to the NCCL developers" in rank1.text()
    assert "Bootstrap : no socket interface found (NCCL_SOCKET_IFNAME=nosuchif9)" in rank1.text()
    assert rank0.wait_exit() == 128 + signal.SIGKILL and NCCL_REMOTE in rank0.text()


def test_a_node_with_another_tp_size_is_refused_by_node_0(group: Group) -> None:
    rank0 = group.start(0, 16)
    with switched(group, 1, fault="wrong_tp"):
        rank1 = group.start(1, 16)
        assert rank0.wait_exit() == 128 + signal.SIGKILL
    assert (
        "RuntimeError: node_rank 1 joined the distributed group with tp_size=32, nnodes=2, but node_rank 0 was "
        "launched with tp_size=16, nnodes=2" in rank0.text()
    )
    assert rank1.wait_exit() == 128 + signal.SIGKILL and NCCL_REMOTE in rank1.text()


# ---------------------------------------------------------------- launches refused


@pytest.mark.parametrize(
    ("rank", "tp", "extra", "code", "line"),
    [
        (0, 15, [], 1, "AssertionError: tp_size must be divisible by number of nodes"),
        (
            1,
            32,
            [],
            137,
            "torch.AcceleratorError: CUDA error: invalid device ordinal\nGPU 8 requested by tp rank 24 (--tp-size 32 "
            "over --nnodes 2: 16 per node); this host has 8 GPU(s)",
        ),
        (0, 16, ["--dist-timeout", "0"], 137, "AssertionError: timeout must be positive"),
        (1, 16, ["--dist-init-addr", "gpu1"], 137, "ValueError: Missing port in address (expected host:port): 'gpu1'"),
        (0, 16, ["--dist-timeout", "1"], 137, "DistStoreError: Timed out after 2 seconds waiting for clients. 1/2"),
        (
            1,
            16,
            ["--dist-timeout", "1"],
            137,
            "torch.distributed.DistNetworkError: The client socket has timed out after 1000ms while trying to "
            "connect to (127.0.0.2, ",
        ),
    ],
)
def test_launches_sglang_refuses(group: Group, rank: int, tp: int, extra: list[str], code: int, line: str) -> None:
    flags = group.flags(rank, tp, *extra)  # a later flag wins, as in argparse
    status, output = foreground(group.nodes[rank], f"timeout 20 python -m sglang.launch_server {shlex.join(flags)}")
    assert (status, line in output) == (code, True), output[-2000:]
    assert READY_LINE not in output


def test_a_busy_dist_init_port_is_refused_on_node_0(group: Group) -> None:
    with socket.socket() as taken:
        taken.bind((group.nodes[0].address, group.dist_port))
        taken.listen()
        flags = group.flags(0, 16)
        status, output = foreground(group.nodes[0], f"timeout 20 python -m sglang.launch_server {shlex.join(flags)}")
    assert status == 137
    assert (
        "torch.distributed.DistNetworkError: The server socket has failed to listen on any local network address. "
        f"port: {group.dist_port}, useIpv6: false, code: -98, name: EADDRINUSE, message: address already in use"
    ) in output
