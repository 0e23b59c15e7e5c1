"""The network checks of a node group's preflight, ON EACH NODE: stdlib only, Python >= 3.8 (MIN_PYTHON), Linux.

Before any rank of a multi-node deploy starts, the controller asks every node what SGLang and NCCL will
use, and proves that rank 0's dist-init port is reachable from every other node, so that a wrong
interface or a firewall fails the step naming the node, instead of hanging at "Init torch distributed
begin" until the dist-timeout. Its config: `action` and the action's fields.

inspect {peer, interface}: the local IPv4 address a packet to `peer` (rank 0's address) leaves from (a UDP
socket's connect sends nothing: the kernel only picks the route and source), the interface holding that
address (or the named one) and whether it exists, and every interface of the node.

listen {port, expect, timeout} (on rank 0): binds the dist-init port on every address, as torch's
TCPStore server does (a busy port is refused, naming its holder), and accepts connections until every
expected node has sent its line `runbook-preflight NAME` or the timeout passes. The port is free again
when it answers: SGLang binds it later.

connect {address, port, name, timeout} (on every other node): tries to connect to rank 0's listener until
it answers or the timeout passes, and sends its line.

Every network call has a timeout (a name lookup too: getaddrinfo runs in a thread joined with one).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import selectors
import socket
import struct
import threading
import time
from typing import Any

from hostprograms import kit
from hostprograms.kit import port_holder

MIN_PYTHON = (3, 8)
#: The line a connecting node sends: this prefix, its name, a newline.
GREETING = "runbook-preflight "
SIOCGIFADDR = 0x8915  # linux/sockios.h: an interface's (first) IPv4 address
RESOLVE_S = 10.0
RETRY_PAUSE_S = 0.2
#: The longest greeting read; a connection that sends more, or no newline, is not one of ours.
LINE_MAX = 512


def progress(message: str, **fields: Any) -> None:
    kit.progress({"message": message, **fields})


def resolve(host: str, timeout: float) -> str:
    """The first IPv4 address of `host` (an address is itself). getaddrinfo has no timeout of its own: it
    runs in a daemon thread, given up after `timeout` seconds. OSError says why there is none."""
    found: list[Any] = []

    def lookup() -> None:
        try:
            found.append(socket.getaddrinfo(host, None, socket.AF_INET, socket.SOCK_STREAM)[0][4][0])
        except OSError as exc:
            found.append(exc)

    thread = threading.Thread(target=lookup, daemon=True)
    thread.start()
    thread.join(timeout)
    if not found:
        raise OSError(f"looking up {host} took more than {timeout:g}s")
    if isinstance(found[0], OSError):
        raise OSError(f"cannot resolve {host}: {found[0].strerror or found[0]}")
    return str(found[0])


def reason(exc: OSError) -> str:
    """An OSError as a person reads it: `Connection refused`, `timed out`."""
    return exc.strerror or str(exc) or type(exc).__name__


# ---------------------------------------------------------------- inspect


def source_address(peer: str) -> str:
    """The local IPv4 address the kernel routes a packet to `peer` from (a UDP connect sends nothing)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.settimeout(1.0)
        sock.connect((peer, 9))  # any port: no packet leaves
        return str(sock.getsockname()[0])


def interface_address(name: str) -> str | None:
    """The IPv4 address of interface `name` (SIOCGIFADDR), or None when it has none."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            answer = fcntl.ioctl(sock.fileno(), SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
        except OSError:  # EADDRNOTAVAIL: no IPv4 address; ENODEV: gone meanwhile
            return None
    return socket.inet_ntoa(answer[20:24])


def inspect(config: dict[str, Any]) -> dict[str, Any]:
    named = config.get("interface")
    interfaces = [name for _, name in socket.if_nameindex()]
    report: dict[str, Any] = {"action": "inspect", "source_address": None, "interface": named,
                              "interface_exists": named in interfaces, "interfaces": interfaces,
                              "peer_resolved": None, "failure": None}  # fmt: skip
    problems = []
    if named is not None and named not in interfaces:
        problems.append(f"interface {named} does not exist on this node (it has {', '.join(interfaces)})")
    try:
        report["peer_resolved"] = resolve(config["peer"], RESOLVE_S)
        report["source_address"] = source_address(report["peer_resolved"])
    except OSError as exc:  # resolve's names the peer
        said = reason(exc)
        problems.append(said if report["peer_resolved"] is None else f"no route to {config['peer']}: {said}")
    if named is None and report["source_address"] is not None:
        holder = [name for name in interfaces if interface_address(name) == report["source_address"]]
        report["interface"] = holder[0] if holder else None
        report["interface_exists"] = bool(holder)
        if not holder:
            problems.append(f"no interface holds {report['source_address']} (interfaces: {', '.join(interfaces)})")
    report["failure"] = "; ".join(problems) or None
    return report


# ---------------------------------------------------------------- listen, connect


def listen(config: dict[str, Any]) -> dict[str, Any]:
    port, expect, timeout = config["port"], list(config["expect"]), float(config["timeout"])
    report: dict[str, Any] = {"action": "listen", "port": port, "port_free": False, "joined": [],
                              "missing": expect, "failure": None}  # fmt: skip
    bind = "0.0.0.0"
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    with server, selectors.DefaultSelector() as selector:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            server.bind((bind, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                report["failure"] = f"port {port} is taken by {port_holder(port)}"
            else:
                report["failure"] = f"cannot listen on {bind}:{port} on this node: {reason(exc)}"
            return report
        report["port_free"] = True
        server.listen(64)
        server.setblocking(False)
        selector.register(server, selectors.EVENT_READ, data=server)
        progress(f"listening on {bind}:{port} for {', '.join(expect)}", phase="listen")
        joined = set(receive_greetings(selector, server, set(expect), time.monotonic() + timeout))
    report["joined"] = [name for name in expect if name in joined]
    report["missing"] = [name for name in expect if name not in joined]
    if report["missing"]:
        report["failure"] = f"no word from {', '.join(report['missing'])} on port {port} within {timeout:g}s"
    return report


def receive_greetings(
    selector: selectors.BaseSelector, server: socket.socket, expect: set[str], deadline: float
) -> set[str]:
    """The expected names that arrived as greetings before `deadline`, read from every connection at once
    (a connection that sends nothing holds up no other)."""
    joined: set[str] = set()
    pending: dict[socket.socket, bytes] = {}
    try:
        while not expect <= joined:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            for key, _ in selector.select(left):
                sock: socket.socket = key.data
                if sock is server:
                    with contextlib.suppress(OSError):
                        conn, _ = server.accept()
                        conn.setblocking(False)
                        pending[conn] = b""
                        selector.register(conn, selectors.EVENT_READ, data=conn)
                    continue
                try:
                    data = sock.recv(LINE_MAX)
                except OSError:
                    data = b""
                pending[sock] += data
                if data and b"\n" not in pending[sock] and len(pending[sock]) < LINE_MAX:
                    continue
                line = pending.pop(sock).split(b"\n", 1)[0].decode("utf-8", "replace")
                selector.unregister(sock)
                sock.close()
                name = line[len(GREETING) :].strip()
                if line.startswith(GREETING) and name in expect:
                    joined.add(name)
                    progress(f"{name} reached the port", phase="joined")
    finally:
        for sock in pending:
            sock.close()
    return joined


def connect(config: dict[str, Any]) -> dict[str, Any]:
    address, port, timeout = config["address"], config["port"], float(config["timeout"])
    report: dict[str, Any] = {"action": "connect", "address": address, "port": port, "reachable": False,
                              "error": None, "seconds": None}  # fmt: skip
    started = time.monotonic()
    deadline = started + timeout
    line = f"{GREETING}{config['name']}\n".encode()
    progress(f"connecting to {address}:{port} (up to {timeout:g}s)", phase="connect")
    while True:
        left = deadline - time.monotonic()
        try:
            peer = resolve(address, max(min(RESOLVE_S, left), 0.1))
            with socket.create_connection((peer, port), timeout=max(min(5.0, left), 0.1)) as sock:
                sock.sendall(line)
            report["reachable"], report["error"] = True, None
            break
        except OSError as exc:
            report["error"] = reason(exc)
        if time.monotonic() + RETRY_PAUSE_S >= deadline:
            break
        time.sleep(RETRY_PAUSE_S)
    report["seconds"] = round(time.monotonic() - started, 2)
    return report


def run(config: dict[str, Any]) -> dict[str, Any]:
    actions = {"inspect": inspect, "listen": listen, "connect": connect}
    if config.get("action") not in actions:
        raise kit.Refused(f"node_preflight: unknown action {config.get('action')!r} (one of {', '.join(actions)})")
    return actions[config["action"]](config)


def main() -> int:
    return kit.main(run)
