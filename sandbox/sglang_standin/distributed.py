"""SGLang's multi-node mode in the stand-in (TEST DOUBLE): `--nnodes N --node-rank R --dist-init-addr
HOST:PORT --dist-timeout S`, the rendezvous of the nodes and the NCCL failures multi-node deployments hit.

What SGLang 0.5.23 does (the installed release):

- every node runs the same launch with its own `--node-rank`; `tp_size` must be divisible by `nnodes`
  (arg_groups/validation_hook.py check_server_args) and each node runs tp_size / nnodes TP ranks on its
  own GPUs (entrypoints/engine.py `_calculate_rank_ranges`), global ranks node_rank * (tp_size / nnodes) on;
- each scheduler initializes torch.distributed (distributed/bootstrap.py `init_parallel_runtime`) with the
  init method `tcp://` + `--dist-init-addr` (utils/network.py `NetworkAddress.parse`, whose messages the
  stand-in repeats; without the flag: the serving host and the NCCL port, which only one node can reach)
  and `--dist-timeout` seconds (distributed/parallel_state.py `init_distributed_environment`: "timeout must
  be positive"); torch's TCPStore on global rank 0 listens on the port, every other rank connects to it,
  then the NCCL communicators are created;
- node 0 serves HTTP; nodes >= 1 run no tokenizer: they wait for their schedulers, log and ignore SIGTERM
  ("SIGTERM received on node_rank R; waiting for the rank-0 ShutdownReq broadcast to stop the
  schedulers.") and end when node 0's ShutdownReq stops them (entrypoints/engine.py `_launch_subprocesses`).

In their place the stand-in's node 0 listens on the dist-init address (the host part: torch binds every
interface; binding only the one given lets test nodes, one loopback address each, share this machine's
ports), and the other nodes connect to it, retrying until the timeout, and send one JSON line
`{"node_rank", "tp_size", "nnodes"}`. Then come barriers of all nodes, each a JSON line `{"stage": S}`
from every node to node 0 and back: `joined` (the TCPStore), `nccl` (the communicators), `loaded` (the
weights, before the KV cache is sized, where the real ranks all-reduce their free memory). Every
connection stays open afterwards: one that drops without node 0's `{"stage": "shutdown"}` is a rank gone,
and the node that sees it dies with NCCL's error for it. A stage not reached by every node within the
timeout fires the NCCL watchdog.

Log lines: "Init torch distributed begin." and "Init nccl begin." are the stages issue 18 names (SGLang's
ModelRunner logged them before 0.5.x; 0.5.23 logs "Init parallel begin." instead and has no such
literal); the stand-in keeps them, so that a hang shows as the last line a user searches for. The NCCL
and torch error lines are the real formats as users report them (sglang issues #3460, #3784; pytorch
issues #111187, #121209; NCCL's ncclGetErrorString and torch's getNcclErrorDetailStr texts); none of them
is a literal of the SGLang release (torch and NCCL are not installed here).

The stand-in's own wording: the refusal of a node that joins with another `--tp-size`/`--nnodes` (real
ranks would disagree on the world size and hang or fail in torch) and of a join message it cannot read.
Unlike 0.5.23, nodes >= 1 serve no HTTP (0.5.23 starts `launch_dummy_health_check_server`, /health
/health_generate /ping on --host:--port, once their schedulers are ready): issue 18's contract.

NCCL_SOCKET_IFNAME naming no interface of the node fails its NCCL init with NCCL's "no socket interface
found" (the interface variables the deploy step sets matter, as on real nodes).

Switches (faults.py) of the node they are set on: `nccl_error` (dies with NCCL's "unhandled system error"
after "Init nccl begin."), `nccl_hang` (prints "Init nccl begin." and nothing more), `wrong_tp` (joins
claiming twice its tp size).
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import os
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, BinaryIO

#: torch's default timeout of an NCCL process group (default_pg_nccl_timeout), used without --dist-timeout
DEFAULT_TIMEOUT_S = 600
NCCL_VERSION = "2.27.5"
CONNECT_RETRY_S = 0.2
HELLO_TIMEOUT_S = 5.0
STAGES = ("joined", "nccl", "loaded")
SHUTDOWN = "shutdown"
_REMOTE = (
    "remote process exited or there was a network error",
    "ncclRemoteError: A call failed possibly due to a network error or a remote process exiting prematurely.",
)
_INTERNAL = (
    "internal error - please report this issue to the NCCL developers",
    "ncclInternalError: Internal check failed.",
)
_SYSTEM = (
    "unhandled system error (run with NCCL_DEBUG=INFO for details)",
    "ncclSystemError: System call (e.g. socket, malloc) or external library call failed or device error. ",
)


@dataclass(frozen=True)
class Topology:
    """This node's place in a multi-node launch."""

    nnodes: int
    node_rank: int
    tp_size: int
    host: str  # the dist-init address, where node 0 listens
    port: int
    timeout_s: int

    @property
    def per_node(self) -> int:
        """TP ranks (GPUs) on each node."""
        return self.tp_size // self.nnodes

    @property
    def rank(self) -> int:
        """The global rank of this node's first TP rank (its log lines' `TPn`)."""
        return self.node_rank * self.per_node


def parse_address(addr: str) -> tuple[str, int]:
    """`NetworkAddress.parse` of 0.5.23 for IPv4 and host names; ValueError with its messages."""
    if not addr:
        raise ValueError("Empty address string")
    if addr.startswith("["):
        raise ValueError(f"the SGLang stand-in (a test double) joins IPv4 and host-name addresses only, not {addr!r}")
    if ":" not in addr:
        raise ValueError(f"Missing port in address (expected host:port): {addr!r}")
    host, port_str = addr.rsplit(":", 1)
    if not host:
        raise ValueError(f"Empty host in address: {addr!r}")
    if ":" in host:
        raise ValueError(f"Bare IPv6 address without brackets is ambiguous: {addr!r}. Use [{host}]:{port_str} instead.")
    try:
        port = int(port_str)
    except ValueError:
        raise ValueError(f"Invalid port number: {port_str!r}") from None
    if not 0 <= port <= 65535:
        raise ValueError(f"Port out of range (0-65535): {port}")
    return host, port


def topology(args: argparse.Namespace) -> Topology | None:
    """This node's topology, None for a single-node launch. ValueError/AssertionError as the scheduler
    raises them (an address it cannot parse, a timeout that is not positive)."""
    nnodes = int(args.nnodes or 1)
    if nnodes == 1:
        return None
    if args.dist_init_addr:
        host, port = parse_address(args.dist_init_addr)
    else:  # bootstrap._resolve_dist_init_method: the serving host and the NCCL port, on every node alike
        host, port = str(args.host or "127.0.0.1"), int(args.nccl_port or _free_port())
    timeout = DEFAULT_TIMEOUT_S if args.dist_timeout is None else int(args.dist_timeout)
    if timeout <= 0:
        raise AssertionError("timeout must be positive")
    return Topology(nnodes, int(args.node_rank or 0), int(args.tp_size or 1), host, port, timeout)


def missing_interface(ifname: str | None) -> str | None:
    """NCCL_SOCKET_IFNAME when it selects no interface of this host (NCCL's syntax: comma-separated name
    prefixes, `=` for exact names, `^` to exclude), else None."""
    if not ifname or ifname.startswith("^"):
        return None
    exact = ifname.startswith("=")
    wanted = [name for name in ifname.lstrip("=").split(",") if name]
    present = [name for _, name in socket.if_nameindex()]
    found = any(p == w if exact else p.startswith(w) for p in present for w in wanted)
    return None if found else f"NCCL_SOCKET_IFNAME={ifname}"


def nccl_error(reason: tuple[str, str], last_error: str) -> str:
    """torch's exception for a failed NCCL call, with NCCL's error detail and last error."""
    return (
        "torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:3356, "
        f"{reason[0]}, NCCL version {NCCL_VERSION}\n{reason[1]}\nLast error:\n{last_error}"
    )


def work_timeout(rank: int, timeout_s: int, waited_s: float) -> str:
    """What the c10d watchdog says of a collective that outlived the process group's timeout."""
    return (
        f"[Rank {rank}] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1, OpType=ALLREDUCE, "
        f"NumelIn=1, NumelOut=1, Timeout(ms)={timeout_s * 1000}) ran for {int(waited_s * 1000)} milliseconds "
        "before timing out."
    )


def watchdog_line(rank: int, timeout_s: int, waited_s: float) -> str:
    """The watchdog's log line (c10's format: `[rankN]:[E<month><day> <time> <file>:<line>] ...`)."""
    now = time.time()
    day = time.localtime(now)
    stamp = time.strftime("%H:%M:%S", day) + f".{int(now % 1 * 1e9):09d}"
    timeout = work_timeout(rank, timeout_s, waited_s).replace(f"[Rank {rank}] ", "")
    return (
        f"[rank{rank}]:[E{day.tm_mon}{day.tm_mday:02d} {stamp} ProcessGroupNCCL.cpp:688] "
        f"[PG ID 0 PG GUID 0(default_pg) Rank {rank}] {timeout}"
    )


class Group:
    """One node's side of the rendezvous and of the connections that stand for its NCCL communicators.

    `log` writes a scheduler line, `die` ends the process with a scheduler exception (it does not
    return); `stop` is set when this node is asked to stop. Waits end early when it is set (False)."""

    def __init__(
        self,
        topo: Topology,
        fault: str | None,
        log: Callable[[str], None],
        die: Callable[[str], None],
        stop: threading.Event,
    ) -> None:
        self.topo = topo
        self.fault = fault
        self.log = log
        self.die = die
        self.stop = stop
        self.finished = threading.Event()  # node >= 1: node 0 sent its shutdown
        self._closing = False  # a dropped connection is no error (this node stops, or hangs)
        self._changed = threading.Condition()
        self._reached: dict[str, set[int]] = {stage: set() for stage in STAGES}  # node 0: who reached what
        self._peers: dict[int, socket.socket] = {}  # node 0: the other nodes; node >= 1: {0: node 0}

    # -- the stages
    def join(self) -> bool:
        """Rendezvous, then the NCCL communicators; False when stopped on the way."""
        self.log("Init torch distributed begin.")
        if self.topo.node_rank == 0:
            self._accept_all()
        else:
            self._connect()
        if self.stop.is_set() or not self.barrier("joined"):
            return False
        self.log("Init nccl begin.")
        if self.fault == "nccl_hang":  # stuck inside NCCL's init: deaf even to the other nodes going away
            self._closing = True
            self.stop.wait()
            return False
        missing = missing_interface(os.environ.get("NCCL_SOCKET_IFNAME"))
        if missing is not None:
            self.die(nccl_error(_INTERNAL, f"Bootstrap : no socket interface found ({missing})"))
        if self.fault == "nccl_error":
            self.die(
                nccl_error(
                    _SYSTEM,
                    f"socketStartConnect: Connect to {self.topo.host}<{self.topo.port + 1}> failed : "
                    "Software caused connection abort",
                )
            )
        return self.barrier("nccl")

    def barrier(self, stage: str) -> bool:
        """Wait until every node reached `stage` (node 0 then tells the others); the NCCL watchdog's
        line and death when that takes longer than the timeout; False when stopped."""
        if self.topo.node_rank != 0:
            self._send(self._peers[0], {"stage": stage})
        deadline = time.monotonic() + self.topo.timeout_s
        with self._changed:
            while not self._complete(stage):
                if self.stop.is_set():
                    return False
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._changed.wait(min(left, 0.2))
            else:
                if self.topo.node_rank == 0:
                    for peer in self._peers.values():
                        self._send(peer, {"stage": stage})
                return True
        waited = time.monotonic() - deadline + self.topo.timeout_s
        sys.stderr.write(watchdog_line(self.topo.rank, self.topo.timeout_s, waited) + "\n")
        timeout = work_timeout(self.topo.rank, self.topo.timeout_s, waited)
        self.die(
            f"torch.distributed.DistBackendError: [PG ID 0 PG GUID 0(default_pg) Rank {self.topo.rank}] Process "
            f"group watchdog thread terminated with exception: {timeout}"
        )
        return False

    def _complete(self, stage: str) -> bool:
        if self.topo.node_rank == 0:
            return len(self._reached[stage]) == self.topo.nnodes - 1
        return 0 in self._reached[stage]

    def shutdown(self) -> None:
        """Node 0 stopping: tell every node to stop (SGLang's ShutdownReq broadcast), then hang up."""
        self._closing = True
        for peer in list(self._peers.values()):
            self._send(peer, {"stage": SHUTDOWN})
            with contextlib.suppress(OSError):
                peer.close()

    # -- node 0
    def _accept_all(self) -> None:
        """Listen on the dist-init address until every other node has joined (torch's TCPStore server)."""
        server = socket.socket()
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            server.bind((self.topo.host, self.topo.port))
            server.listen(64)
        except OSError as exc:
            self.die(
                "torch.distributed.DistNetworkError: The server socket has failed to listen on any local network "
                f"address. port: {self.topo.port}, useIpv6: false, code: -{exc.errno}, "
                f"name: {errno.errorcode.get(exc.errno or 0, 'UNKNOWN')}, message: {(exc.strerror or str(exc)).lower()}"
            )
        server.settimeout(0.2)
        deadline = time.monotonic() + self.topo.timeout_s
        try:
            while len(self._peers) < self.topo.nnodes - 1 and not self.stop.is_set():
                if time.monotonic() > deadline:
                    self.die(
                        f"torch.distributed.DistStoreError: Timed out after {self.topo.timeout_s + 1} seconds "
                        f"waiting for clients. {len(self._peers) + 1}/{self.topo.nnodes} clients joined."
                    )
                try:
                    conn, _ = server.accept()
                except TimeoutError:
                    continue
                self._admit(conn)
        finally:
            server.close()

    def _admit(self, conn: socket.socket) -> None:
        """Read a joining node's message and check it against this node's launch; ignore what is no join."""
        conn.settimeout(HELLO_TIMEOUT_S)
        stream = conn.makefile("rb")  # the one reader of this connection: what follows the join stays buffered here
        try:
            hello = json.loads(stream.readline())
            rank, tp_size, nnodes = int(hello["node_rank"]), int(hello["tp_size"]), int(hello["nnodes"])
        except (OSError, ValueError, TypeError, KeyError):
            conn.close()  # not a node of this launch (a port check, say): TCPStore drops it too
            return
        conn.settimeout(None)
        mine = self._claimed_tp()
        if (tp_size, nnodes) != (mine, self.topo.nnodes) or not 0 < rank < self.topo.nnodes or rank in self._peers:
            self.die(
                f"RuntimeError: node_rank {rank} joined the distributed group with tp_size={tp_size}, "
                f"nnodes={nnodes}, but node_rank 0 was launched with tp_size={mine}, nnodes={self.topo.nnodes}"
                + (f" and already has node_rank {rank}" if rank in self._peers else "")
                + ": launch every node with the same --tp-size and --nnodes and its own --node-rank "
                f"(1..{self.topo.nnodes - 1})"
            )
        self._peers[rank] = conn
        self._listen(rank, conn, stream)

    # -- nodes >= 1
    def _connect(self) -> None:
        """Connect to node 0's dist-init address, retrying until the timeout (torch's TCPStore client)."""
        deadline = time.monotonic() + self.topo.timeout_s
        while not self.stop.is_set():
            try:
                conn = socket.create_connection((self.topo.host, self.topo.port), timeout=CONNECT_RETRY_S * 5)
                break
            except OSError:
                if time.monotonic() > deadline:
                    self.die(
                        f"torch.distributed.DistNetworkError: The client socket has timed out after "
                        f"{self.topo.timeout_s * 1000}ms while trying to connect to ({self.topo.host}, "
                        f"{self.topo.port})."
                    )
                self.stop.wait(CONNECT_RETRY_S)
        else:
            return
        conn.settimeout(None)
        self._peers[0] = conn
        self._send(conn, {"node_rank": self.topo.node_rank, "tp_size": self._claimed_tp(), "nnodes": self.topo.nnodes})
        self._listen(0, conn, conn.makefile("rb"))

    def _claimed_tp(self) -> int:
        return self.topo.tp_size * 2 if self.fault == "wrong_tp" else self.topo.tp_size

    # -- the connections
    def _send(self, conn: socket.socket, message: dict[str, Any]) -> None:
        with contextlib.suppress(OSError):  # the reader of this connection reports the peer gone
            conn.sendall(json.dumps(message).encode() + b"\n")

    def _listen(self, rank: int, conn: socket.socket, stream: BinaryIO) -> None:
        threading.Thread(target=self._read, args=(rank, conn, stream), daemon=True).start()

    def _read(self, rank: int, conn: socket.socket, stream: BinaryIO) -> None:
        """Record the stages a peer reached; its connection dropping is NCCL's remote error, unless node 0
        said goodbye first (or this node is stopping)."""
        try:
            peer = "{}<{}>".format(*conn.getpeername()[:2])
        except OSError:
            peer = f"{self.topo.host}<{self.topo.port}>"
        while True:
            try:
                line = stream.readline()
            except OSError:
                line = b""
            if not line:
                break
            try:
                stage = str(json.loads(line).get("stage"))
            except (ValueError, AttributeError):
                continue
            if stage == SHUTDOWN:
                self._closing = True
                self.finished.set()
                return
            with self._changed:
                self._reached.setdefault(stage, set()).add(rank)
                self._changed.notify_all()
        if not self._closing and not self.stop.is_set():
            self.die(nccl_error(_REMOTE, f"socketProgress: Connection closed by remote peer {peer}"))


def _free_port() -> int:
    """A random free port, as server_args picks `nccl_port` when none is given."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
