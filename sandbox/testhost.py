"""The test host: what a session on the tests' GPU host sees, as sshd_config lines.

The host is this machine reached through its own sshd (tests/conftest.py `testhost`), with:

- PATH = the nvidia-smi test double (sandbox/gpu.py), the SGLang virtualenv (real SGLang files,
  real huggingface_hub and `hf`), then the system's folders;
- RUNBOOK_SANDBOX_GPU = which GPUs the double reports (`h200`, `rtx6000`, `none`); the variant
  `absent` leaves nvidia-smi off PATH instead, as on a host without NVIDIA tools;
- HOME = a folder of the test host's own, so `~/.cache/huggingface/token` and `~/models` are the
  test host's and never this machine's.

These go to sshd as `SetEnv`, which OpenSSH (checked with 9.2) applies after its own defaults,
so it overrides PATH and HOME. Overriding HOME matters beyond isolation: bash, started by sshd,
sources ~/.bashrc, and root's ~/.bashrc on this machine puts pyenv's shims first on PATH; with
the test host's own (empty) HOME the session keeps exactly the PATH above.
"""

from __future__ import annotations

from pathlib import Path

from sandbox.gpu import ENV_VAR
from sandbox.prepare import BIN, PINS, VENV, VENV_PYTHON

GPU_VARIANTS = ("h200", "rtx6000", "none", "absent")
SYSTEM_PATH = ("/usr/local/bin", "/usr/bin", "/bin")


def missing() -> str | None:
    """Why the prepared test host files are unusable, or None when they are in place."""
    site = list(VENV.glob("lib/python*/site-packages"))
    needed = [VENV_PYTHON, VENV / "bin" / "hf", BIN / "nvidia-smi"]
    needed += [site[0] / f"{name}-{version}.dist-info" for name, version, _ in PINS] if site else [VENV / "lib"]
    absent = [str(path) for path in needed if not path.exists()]
    if absent:
        return f"the test host is not prepared ({', '.join(absent)} missing): run `python -m sandbox.prepare` first"
    return None


def session_env(gpu: str, home: Path) -> dict[str, str]:
    """The environment every SSH session of a test host with this GPU variant starts with."""
    if gpu not in GPU_VARIANTS:
        raise ValueError(f"unknown GPU variant {gpu!r}: one of {', '.join(GPU_VARIANTS)}")
    path = ([] if gpu == "absent" else [str(BIN)]) + [str(VENV / "bin"), *SYSTEM_PATH]
    env = {"PATH": ":".join(path), "HOME": str(home)}
    if gpu != "absent":
        env[ENV_VAR] = gpu
    return env


def sshd_config(env: dict[str, str]) -> str:
    """`SetEnv` for sshd_config; each NAME=VALUE in double quotes, so paths may hold spaces."""
    for name, value in env.items():
        if '"' in value or "\n" in value:
            raise ValueError(f"{name}={value!r}: sshd_config cannot carry a double quote or newline")
    return "SetEnv " + " ".join(f'"{name}={value}"' for name, value in env.items()) + "\n"
