"""A network namespace for a test node that must NOT reach the other nodes' loopback addresses.

Test nodes on loopback addresses of their own (127.0.0.2, 127.0.0.3, ...: sandbox/testhost.py) always reach
one another: Linux routes all of 127.0.0.0/8 to one `lo`. A node whose path to rank 0's dist-init port is
broken, as on a cluster where rank 0's address is one the other nodes cannot route to, needs a network of its
own. This is it: a namespace (`ip netns`) joined to this machine's by a veth pair, the node's sshd started
inside it (`Namespace.wrap`), so the controller reaches that sshd over the veth while, inside, 127.0.0.2 is
the namespace's own loopback (nothing listens there: connection refused).

The addresses come from 198.18.0.0/15 (RFC 2544's benchmarking range, never a real network's): a /30 per
namespace, the first one that no interface of this machine holds, chosen under a lock, since several test
sessions may run at once. Root (CAP_NET_ADMIN) only: `create` raises NetnsUnavailable, with `ip`'s own
words, where that is not allowed, and the tests skip with it.
"""

from __future__ import annotations

import fcntl
import ipaddress
import itertools
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

#: RFC 2544's benchmarking range: never a real network's, so a test's veth shadows no route of the machine.
RANGE = ipaddress.IPv4Network("198.18.0.0/15")
#: Held while a namespace's /30 is chosen and assigned, so two sessions never take the same one.
LOCK = Path(tempfile.gettempdir()) / "runbook-netns.lock"
IP_TIMEOUT_S = 10.0
_numbers = itertools.count(1)


class NetnsUnavailable(Exception):
    """`ip netns add` (or a veth pair) was refused (not root, no CAP_NET_ADMIN) or `ip` is missing: the reason,
    for a skip."""


@dataclass(frozen=True)
class Namespace:
    """A network namespace and the veth pair that joins it to this machine's."""

    name: str
    host_veth: str  # this machine's end
    host_address: str
    address: str  # the namespace's end: where what runs inside is reached from here

    @property
    def wrap(self) -> list[str]:
        """The words that run a command inside the namespace (`ip netns exec` execs it: its pid is the command's)."""
        return ["ip", "netns", "exec", self.name]


def _ip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=IP_TIMEOUT_S)


def _must(*args: str) -> None:
    done = _ip(*args)
    if done.returncode != 0:
        raise RuntimeError(f"`ip {' '.join(args)}` failed: {done.stderr.strip()}")


@contextmanager
def _locked() -> Iterator[None]:
    lock = os.open(LOCK, os.O_RDONLY | os.O_CREAT, 0o644)  # flock needs no write access: any user may take it
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield
    finally:
        os.close(lock)  # which releases it


def _free_subnet() -> ipaddress.IPv4Network:
    """The first /30 of RANGE that no interface here holds an address of."""
    shown = _ip("-4", "-o", "addr", "show").stdout.split()
    held = {ipaddress.ip_interface(word).ip for word in shown if "/" in word and word[0].isdigit()}
    for subnet in RANGE.subnets(new_prefix=30):
        if not any(address in subnet for address in held):
            return subnet
    raise RuntimeError(f"every /30 of {RANGE} is taken on this machine")


def create() -> Namespace:
    """A new namespace with its loopback up and a veth pair to this machine's, each end with an address of a free
    /30 of RANGE. NetnsUnavailable where namespaces cannot be made here; `delete` removes it all."""
    if shutil.which("ip") is None:
        raise NetnsUnavailable("network namespaces need iproute2's `ip`, which is not installed")
    stem = f"rb{os.getpid()}x{next(_numbers)}"  # veth names are at most 15 characters
    with _locked():  # the /30 is free until its address is assigned: one session at a time
        host_address, address = map(str, _free_subnet().hosts())
        namespace = Namespace(stem, f"{stem}h", host_address, address)
        added = _ip("netns", "add", stem)
        if added.returncode != 0:
            raise NetnsUnavailable(
                f"`ip netns add` was refused (root with CAP_NET_ADMIN needed): {added.stderr.strip()}"
            )
        try:
            veth = _ip("link", "add", namespace.host_veth, "type", "veth", "peer", "name", f"{stem}n", "netns", stem)
            if veth.returncode != 0:  # a container may allow namespaces but not veth devices
                raise NetnsUnavailable(f"a veth pair could not be made: {veth.stderr.strip()}")
            _must("addr", "add", f"{host_address}/30", "dev", namespace.host_veth)
            _must("link", "set", namespace.host_veth, "up")
            _must("-n", stem, "addr", "add", f"{address}/30", "dev", f"{stem}n")
            _must("-n", stem, "link", "set", f"{stem}n", "up")
            _must("-n", stem, "link", "set", "lo", "up")
        except BaseException:
            delete(namespace)
            raise
    return namespace


def delete(namespace: Namespace) -> None:
    """Remove the veth pair (deleting one end deletes both) and the namespace; what is gone already is fine.
    Processes still inside keep the namespace alive until they exit, but no longer reachable by its name."""
    _ip("link", "del", namespace.host_veth)
    _ip("netns", "del", namespace.name)
