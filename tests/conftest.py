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

import pytest

from sandbox.hub import HubServer
from sandbox.sglang_standin import faults as standin_faults
from sandbox.sshd import SSHServer, start_sshd


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
    space (an allocation past it fails there, as MemoryError)."""

    def bound() -> None:
        if memory_bytes is not None:
            resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))

    return subprocess.run(
        [sys.executable, "-m", "executor.cli", *args],
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
    """Factory of test hosts: `testhost("h200" | "rtx6000" | "none" | "absent", shell="clean" | "noisy")`,
    one sshd per variant and login shell for the session (`noisy`: a slow, chatty ~/.bashrc that
    changes the environment, sandbox/testhost.py). Tests that write into `.home` remove what they wrote."""
    from sandbox import testhost as sandbox_host
    from sandbox.prepare import VENV_PYTHON

    problem = sandbox_host.missing()
    if problem:
        pytest.fail(problem)
    started: dict[tuple[str, str], tuple[subprocess.Popen[bytes], SandboxHost]] = {}

    def get(gpu: str = "h200", shell: str = "clean") -> SandboxHost:
        if (gpu, shell) not in started:
            root = tmp_path_factory.mktemp(f"testhost-{gpu}-{shell}")
            home = root / "home"
            home.mkdir()
            sandbox_host.write_home(shell, home)
            setenv = sandbox_host.sshd_config(sandbox_host.session_env(gpu, home))
            proc, server = start_sshd(root / "sshd", extra_config=setenv)
            started[gpu, shell] = (proc, SandboxHost(server, gpu, home, VENV_PYTHON))
        return started[gpu, shell][1]

    yield get
    for proc, _ in started.values():
        proc.terminate()
        proc.wait(timeout=10)
