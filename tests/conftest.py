"""Shared fixtures: a real OpenSSH server on 127.0.0.1 with fresh host and client keys.

No SSH layer is mocked: transports and the CLI talk to this sshd through asyncssh.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from sandbox.hub import HubServer
from sandbox.netns import NetnsUnavailable
from sandbox.sglang_standin import faults as standin_faults
from sandbox.sshd import SSHServer, start_sshd
from sandbox.testhost import PoolHost, SshServerKind


@pytest.fixture(autouse=True)
def no_terminal_width(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No test sees a terminal width it did not set: the CLI fits its lines to `COLUMNS` (README "The console"),
    which pytest-xdist's workers have as 80; and the CLI's consoles, which read it once, are made anew for each."""
    from executor.faces import cli

    monkeypatch.delenv("COLUMNS", raising=False)
    cli.err.cache_clear()
    cli.out.cache_clear()
    yield
    cli.err.cache_clear()
    cli.out.cache_clear()


@pytest.fixture(scope="session")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SSHServer]:
    proc, server = start_sshd(tmp_path_factory.mktemp("sshd"))
    yield server
    proc.terminate()
    proc.wait(timeout=10)


@pytest.fixture
def write_runbook(tmp_path: Path, sshd: SSHServer):
    """Write a runbook whose single host `box` is the test sshd; returns its path."""

    def write(body: str, name: str = "runbook.yaml", hosts: str | None = None) -> Path:
        path = tmp_path / name
        path.write_text(textwrap.dedent(body).replace("__HOSTS__\n", hosts or sshd.host_yaml()))
        return path

    return write


def runbook_cli(
    *args: str,
    env: dict[str, str] | None = None,
    timeout: float = 120,
    cwd: Path | None = None,
    memory_bytes: int | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run the real `runbook` CLI in a subprocess, as a user would; `memory_bytes` bounds its address
    space (an allocation past it fails there, as MemoryError). For tests whose subject is the process (an
    rlimit, a hang bounded by `timeout`); the others call tests.clirun.runbook_cli, in this process."""

    def bound() -> None:
        if memory_bytes is not None:
            resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))

    return subprocess.run(
        [sys.executable, "-m", "executor.faces.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        preexec_fn=bound if memory_bytes is not None else None,
    )


@pytest.fixture
def hub() -> Iterator[HubServer]:
    """The local Hugging Face Hub test double (sandbox/hub.py) on 127.0.0.1, fresh for each test.

    `.endpoint` (HF_ENDPOINT), `.token`, `.repos`, `.faults`, `.requests`, `.client_env(hf_home, token=...)`.
    """
    with HubServer() as server:
        yield server


@dataclass(frozen=True)
class SandboxHost:
    """A running test host (sandbox/testhost.py): its sshd, GPU variant, HOME and SGLang python."""

    server: SSHServer
    gpu: str
    home: Path
    python: Path  # the SGLang virtualenv's interpreter

    def host_yaml(self, name: str = "box") -> str:
        return self.server.host_yaml(name)

    def host_dict(self) -> dict[str, object]:
        return self.server.host_dict()

    def standin(self, **switches: object) -> standin_faults.Switched:
        """`with host.standin(fault="never_healthy", startup_s=0.5):` the SGLang stand-in's switches
        ($HOME/sglang-standin.json, sandbox/sglang_standin/faults.py) for the block, removed after."""
        return standin_faults.Switched(self.home, switches)


@pytest.fixture(scope="session")
def testhost(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., SandboxHost]]:
    """Factory of test hosts: `testhost("h200" | "rtx6000" | "h200x8" | "h100x8" | "none" | "absent",
    shell="clean" | "noisy", sglang="release" | "ddtree-pr")`, one sshd per variant, login shell and
    SGLang build for the session (`noisy`: a slow, chatty ~/.bashrc that changes the environment;
    `ddtree-pr`: SGLang with the DDTree pull request; sandbox/testhost.py). Tests that write into
    `.home` remove what they wrote."""
    from sandbox import testhost as sandbox_host
    from sandbox.prepare import VENV_PYTHON

    problem = sandbox_host.missing()
    if problem:
        pytest.fail(problem)
    started: dict[tuple[str, str, str], tuple[subprocess.Popen[bytes], SandboxHost]] = {}

    def get(gpu: str = "h200", shell: str = "clean", sglang: str = "release") -> SandboxHost:
        if (gpu, shell, sglang) not in started:
            root = tmp_path_factory.mktemp(f"testhost-{gpu}-{shell}-{sglang}")
            proc, host = sandbox_host.start(root, "box", gpu, shell, sglang)
            started[gpu, shell, sglang] = (proc, SandboxHost(host.server, gpu, host.home, VENV_PYTHON))
        return started[gpu, shell, sglang][1]

    yield get
    for proc, _ in started.values():
        proc.terminate()
        proc.wait(timeout=10)


def _pools(tmp_path_factory: pytest.TempPathFactory, own_addresses: bool) -> Iterator[Callable[..., list[PoolHost]]]:
    """The factory behind `testhosts` and `testnodes`: pools started once per arguments, stopped at the end."""
    from sandbox import testhost as sandbox_host

    problem = sandbox_host.missing()
    if problem:
        pytest.fail(problem)
    started: dict[tuple[Any, ...], list[tuple[subprocess.Popen[bytes], PoolHost]]] = {}

    def get(
        n: int = 3,
        variants: tuple[str, ...] | None = None,
        ssh: SshServerKind = "openssh",
        sglang: str = "release",
        isolated: tuple[int, ...] = (),
    ) -> list[PoolHost]:
        gpus = variants or ("h200x8",) * n
        assert len(gpus) == n, f"{n} hosts, {len(gpus)} variants"
        key = (gpus, ssh, sglang, isolated)
        if key not in started:
            root = tmp_path_factory.mktemp("testnodes" if own_addresses else "testhosts")
            try:
                started[key] = sandbox_host.start_pool(root, gpus, sglang, ssh, own_addresses, isolated)
            except NetnsUnavailable as exc:
                pytest.skip(f"node(s) {isolated} need a network namespace of their own: {exc}")
        return [host for _, host in started[key]]

    yield get
    for hosts in started.values():
        sandbox_host.stop_pool(hosts)


@pytest.fixture(scope="session")
def testhosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., list[PoolHost]]]:
    """Factory of several test hosts at once: `testhosts(3, variants=("h200x8", "h200x8", "h100x8"),
    ssh="openssh" | "embedded", sglang="release" | "ddtree-pr")` -> hosts gpu1..gpuN, each its own SSH
    server (own loopback port), GPU variant, HOME (models folder, deploy state) and SGLang port; started
    once per arguments for the session. `sandbox.testhost.pool_inventory(hosts, site_vars)` writes their
    inventory, with `hosts.gpuN.vars` (models_dir, sglang_port)."""
    yield from _pools(tmp_path_factory, own_addresses=False)


@pytest.fixture(scope="session")
def testnodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., list[PoolHost]]]:
    """Factory of the nodes of one multi-node group: `testnodes(2, variants=("h100x8", "h100x8"),
    sglang="release" | "ddtree-pr")` -> nodes gpu1..gpuN as `testhosts` gives them, but each OpenSSH
    server on a loopback address of its own, 127.0.0.(i+1), which is the node's inventory `address`
    (`.address`): rank 0's dist-init address is gpu1's, and node_preflight's interface is `lo`.
    `node.standin(...)` sets that node's SGLang stand-in switches (`fault="nccl_hang"`, ...).
    `isolated=(2,)`: node 2's sshd runs in a network namespace of its own, reached over a veth
    (sandbox/netns.py), from which the other nodes' loopback addresses are unreachable; skipped with the reason
    where namespaces cannot be made (not root, no CAP_NET_ADMIN). The namespaces go with the pools at the end."""
    yield from _pools(tmp_path_factory, own_addresses=True)
