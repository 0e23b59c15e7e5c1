"""The test host: what a session on the tests' GPU host sees, as sshd_config lines.

The host is this machine reached through its own sshd (tests/conftest.py `testhost`), with:

- PATH = the nvidia-smi test double (sandbox/gpu.py), the SGLang virtualenv (real SGLang files,
  real huggingface_hub and `hf`; `python -m sglang.launch_server|bench_serving` run the SGLang
  stand-in, sandbox/sglang_standin/), then the system's folders;
- RUNBOOK_SANDBOX_GPU = which GPUs the double reports (`h200`, `rtx6000`, `h200x8`, `h100x8`, `none`); the variant
  `absent` leaves nvidia-smi off PATH instead, as on a host without NVIDIA tools;
- HOME = a folder of the test host's own, so `~/.cache/huggingface/token` and `~/models` are the
  test host's and never this machine's;
- the SGLang build (`SGLANG_BUILDS`): `release`, the real 0.5.23 files; `ddtree-pr`, the same release
  as a build with SGLang's DDTree pull request #29907 would be (sandbox/prepare.py DDTREE_BUILD, first
  on PYTHONPATH): the probe then finds DDTREE and the stand-in serves `--speculative-algorithm DDTREE
  --speculative-ddtree-budget N`; `old-client`, the release as one from before its serving benchmark moved (only
  the deprecated `sglang.bench_serving`, sandbox/prepare.py OLD_CLIENT_BUILD, first on PYTHONPATH).

Several test hosts run at once (`start`, one folder each): each its own SSH server on its own loopback
port, GPU variant, HOME (so its own models folder, HF token and deploy state) and SGLang port
(`PoolHost.host_vars`, for `hosts.NAME.vars` of an inventory: `pool_inventory`), so two stand-in
servers never collide. As the nodes of one multi-node group (`start_pool(..., own_addresses=True)`),
each also listens on a loopback address of its own (127.0.0.2, 127.0.0.3, ...), which is its inventory
`address`: what a node is reached at, and where rank 0's dist-init port is bound and joined
(the SGLang stand-in's rendezvous, sandbox/sglang_standin/distributed.py), as on separate machines.
A node named in `isolated` runs its sshd in a network namespace of its own instead (sandbox/netns.py),
reached over a veth at an address of 198.18.0.0/15: from there the others' loopback addresses are its own
loopback's, so rank 0's dist-init port is unreachable from it, as from a node on another network.

These go to sshd as `SetEnv`, which OpenSSH (checked with 9.2) applies after its own defaults,
so it overrides PATH and HOME. Overriding HOME matters beyond isolation: bash, started by sshd,
sources ~/.bashrc, and root's ~/.bashrc on this machine puts pyenv's shims first on PATH; with
the test host's own (empty) HOME the session keeps exactly the PATH above.

The login shell comes in two kinds (`SHELLS`): `clean`, an empty HOME, and `noisy`, a HOME whose
~/.bashrc is what GPU hosts often have (conda init, pyenv, module systems, a welcome echo): slow
(NOISY_BASHRC_SLEEP_S), printing on stdout and stderr, bytes that look like a frame among them, and
changing the environment (an exported var, a folder first on PATH). Since bash sources ~/.bashrc
for every command sshd starts, it runs before every SSH command of that host.
"""

from __future__ import annotations

import subprocess
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

from sandbox import netns
from sandbox.embedded_sshd import start_embedded_sshd
from sandbox.gpu import ENV_VAR
from sandbox.prepare import BIN, DDTREE_BUILD, OLD_CLIENT_BUILD, PINS, VENV, VENV_PYTHON, standin_pth_problem
from sandbox.sglang_standin import faults as standin_faults
from sandbox.sshd import SSHServer, free_port, start_sshd

SGLANG_BUILDS = ("release", "ddtree-pr", "old-client")
SshServerKind = Literal["openssh", "embedded"]
GPU_VARIANTS = ("h200", "rtx6000", "h200x8", "h100x8", "h100", "none", "absent")
SYSTEM_PATH = ("/usr/local/bin", "/usr/bin", "/bin")
SHELLS = ("clean", "noisy")
NOISY_BASHRC_SLEEP_S = 0.15
#: What the noisy ~/.bashrc exports, and the folder it puts first on PATH (relative to HOME).
NOISY_EXPORT = ("RUNBOOK_TESTHOST_BASHRC", "sourced")
NOISY_PATH_DIR = ".noisy-bashrc/bin"
#: One byte is appended to this file (relative to HOME) each time the noisy ~/.bashrc runs.
NOISY_RUNS = ".noisy-bashrc/runs"
#: All the noisy ~/.bashrc prints, per stream: a welcome line, then bytes that look like a frame
#: (runner_host.HEADER: length, request 1, EXIT) and a line without its newline.
NOISY_STDOUT = (
    b"Welcome to gpu-node-07! (the noisy ~/.bashrc, on stdout)\n"
    + b"\0\0\0\x04\0\0\0\x01\x03\0\0\0\0"
    + b"no newline at the end"
)
NOISY_STDERR = b"conda: initialising base environment (the noisy ~/.bashrc, on stderr)\n"


def _printf(data: bytes) -> str:
    return "printf '" + "".join(f"\\{byte:03o}" for byte in data) + "'"


NOISY_BASHRC = f"""\
# ~/.bashrc of the noisy test host (sandbox/testhost.py): slow, chatty, changing the environment
sleep {NOISY_BASHRC_SLEEP_S}
{_printf(NOISY_STDOUT)}
{_printf(NOISY_STDERR)} >&2
export {NOISY_EXPORT[0]}={NOISY_EXPORT[1]}
export PATH="$HOME/{NOISY_PATH_DIR}:$PATH"
printf x >> "$HOME/{NOISY_RUNS}"
"""


def missing() -> str | None:
    """Why the prepared test host files are unusable, or None when they are in place."""
    site = list(VENV.glob("lib/python*/site-packages"))
    needed = [
        VENV_PYTHON,
        VENV / "bin" / "hf",
        BIN / "nvidia-smi",
        DDTREE_BUILD / "sglang",
        OLD_CLIENT_BUILD / "sglang",
    ]
    needed += [site[0] / f"{name}-{version}.dist-info" for name, version, _ in PINS] if site else [VENV / "lib"]
    problems = [f"{path} missing" for path in needed if not path.exists()]
    standin = standin_pth_problem()
    problems += [standin] if standin else []
    if problems:
        return f"the test host is not prepared ({', '.join(problems)}): run `python -m sandbox.prepare` first"
    return None


def session_env(gpu: str, home: Path, sglang: str = "release") -> dict[str, str]:
    """The environment every SSH session of a test host with this GPU variant and SGLang build starts with."""
    if gpu not in GPU_VARIANTS:
        raise ValueError(f"unknown GPU variant {gpu!r}: one of {', '.join(GPU_VARIANTS)}")
    if sglang not in SGLANG_BUILDS:
        raise ValueError(f"unknown SGLang build {sglang!r}: one of {', '.join(SGLANG_BUILDS)}")
    path = ([] if gpu == "absent" else [str(BIN)]) + [str(VENV / "bin"), *SYSTEM_PATH]
    env = {"PATH": ":".join(path), "HOME": str(home)}
    if gpu != "absent":
        env[ENV_VAR] = gpu
    if sglang != "release":
        env["PYTHONPATH"] = str(DDTREE_BUILD if sglang == "ddtree-pr" else OLD_CLIENT_BUILD)
    return env


def sshd_config(env: dict[str, str]) -> str:
    """`SetEnv` for sshd_config; each NAME=VALUE in double quotes, so paths may hold spaces."""
    for name, value in env.items():
        if '"' in value or "\n" in value:
            raise ValueError(f"{name}={value!r}: sshd_config cannot carry a double quote or newline")
    return "SetEnv " + " ".join(f'"{name}={value}"' for name, value in env.items()) + "\n"


def write_home(shell: str, home: Path) -> None:
    """Give a test host's HOME the login shell of kind `shell` (see SHELLS)."""
    if shell not in SHELLS:
        raise ValueError(f"unknown login shell {shell!r}: one of {', '.join(SHELLS)}")
    if shell == "noisy":
        (home / NOISY_PATH_DIR).mkdir(parents=True, exist_ok=True)
        (home / ".bashrc").write_text(NOISY_BASHRC)


@dataclass(frozen=True)
class PoolHost:
    """One of several test hosts running at once: what an inventory needs to reach it and keep it apart."""

    name: str
    server: SSHServer
    gpu: str
    home: Path
    sglang_port: int  # its own, so stand-in servers of two hosts never share one
    netns: netns.Namespace | None = None  # the network namespace its sshd runs in (`isolated`), else None

    @property
    def address(self) -> str:
        """Where the host is reached: its SSH server's loopback address."""
        return self.server.address

    def host_vars(self) -> dict[str, Any]:
        """Its `hosts.NAME.vars`: the models folder in its own HOME and its SGLang port."""
        return {"models_dir": str(self.home / "models"), "sglang_port": self.sglang_port}

    def standin(self, **switches: object) -> standin_faults.Switched:
        """`with host.standin(fault="nccl_hang"):` this host's SGLang stand-in switches for the block."""
        return standin_faults.Switched(self.home, switches)


def start(
    root: Path,
    name: str,
    gpu: str = "h200x8",
    shell: str = "clean",
    sglang: str = "release",
    ssh: SshServerKind = "openssh",
    address: str = "127.0.0.1",
    isolated: bool = False,
) -> tuple[subprocess.Popen[bytes], PoolHost]:
    """Start one test host in `root` (its HOME and SSH server's files): OpenSSH's sshd on `address`, or
    the embedded one (on 127.0.0.1 only) where there is none; `isolated`: OpenSSH's in a network namespace of
    its own, on its veth's address (netns.NetnsUnavailable where namespaces cannot be made). The caller stops
    it with `stop_pool`."""
    home = root / "home"
    home.mkdir(parents=True, exist_ok=True)
    write_home(shell, home)
    env = session_env(gpu, home, sglang)
    if isolated:
        if ssh != "openssh":
            raise ValueError(f"an isolated host runs OpenSSH's sshd in its namespace, not the {ssh} one")
        namespace = netns.create()
        try:
            config = sshd_config(env)
            proc, server = start_sshd(root / "sshd", free_port(), config, namespace.address, namespace.wrap)
        except BaseException:
            netns.delete(namespace)
            raise
        return proc, PoolHost(name, server, gpu, home, free_port(), namespace)
    if ssh == "openssh":
        proc, server = start_sshd(root / "sshd", extra_config=sshd_config(env), address=address)
    elif address != "127.0.0.1":
        raise ValueError(f"the embedded SSH server listens on 127.0.0.1 only, not {address}")
    else:
        proc, server = start_embedded_sshd(root / "sshd", env)
    return proc, PoolHost(name, server, gpu, home, free_port())


def node_address(index: int) -> str:
    """The loopback address of node `index` (1, 2, ...) of a multi-node group: 127.0.0.(index + 1)."""
    if not 1 <= index <= 253:
        raise ValueError(f"node {index}: a loopback address exists for nodes 1..253")
    return f"127.0.0.{index + 1}"


def start_pool(
    root: Path,
    gpus: Sequence[str],
    sglang: str = "release",
    ssh: SshServerKind = "openssh",
    own_addresses: bool = False,
    isolated: Collection[int] = (),
) -> list[tuple[subprocess.Popen[bytes], PoolHost]]:
    """Start hosts gpu1..gpuN (one per GPU variant) in `root`, each with its own SGLang port and, with
    `own_addresses`, its own loopback address (`node_address`); the hosts numbered in `isolated` (1..N) each in
    a network namespace of its own (`start`). The caller stops them with `stop_pool`; on a failure the ones
    already started are stopped here."""
    hosts: list[tuple[subprocess.Popen[bytes], PoolHost]] = []
    try:
        for i, gpu in enumerate(gpus, start=1):
            address = node_address(i) if own_addresses else "127.0.0.1"
            alone = i in isolated
            proc, host = start(
                root / f"gpu{i}", f"gpu{i}", gpu, sglang=sglang, ssh=ssh, address=address, isolated=alone
            )
            hosts.append((proc, host))
            while host.sglang_port in {h.sglang_port for _, h in hosts[:-1]}:  # free_port may repeat itself
                host = replace(host, sglang_port=free_port())
                hosts[-1] = (proc, host)
    except BaseException:
        stop_pool(hosts)
        raise
    return hosts


def stop_pool(hosts: Sequence[tuple[subprocess.Popen[bytes], PoolHost]]) -> None:
    """Terminate the SSH servers of `start_pool` and remove their network namespaces, each whatever the others
    did (the first error is raised after)."""
    failed: BaseException | None = None
    for proc, host in hosts:
        try:
            proc.terminate()
            proc.wait(timeout=10)
        except BaseException as exc:  # one server that will not stop leaves the rest to stop and clean up
            failed = failed or exc
        if host.netns is not None:
            netns.delete(host.netns)
    if failed is not None:
        raise failed


def pool_inventory(hosts: Sequence[PoolHost], site_vars: Mapping[str, Any]) -> dict[str, Any]:
    """An inventory of these hosts (each with its own `vars`) and the site's vars, as YAML data."""
    return {
        "hosts": {host.name: {**host.server.host_dict(), "vars": host.host_vars()} for host in hosts},
        "vars": dict(site_vars),
    }
