"""The test host: what a session on the tests' GPU host sees, as sshd_config lines.

The host is this machine reached through its own sshd (tests/conftest.py `testhost`), with:

- PATH = the nvidia-smi test double (sandbox/gpu.py), the SGLang virtualenv (real SGLang files,
  real huggingface_hub and `hf`; `python -m sglang.launch_server|bench_serving` run the SGLang
  stand-in, sandbox/sglang_standin/), then the system's folders;
- RUNBOOK_SANDBOX_GPU = which GPUs the double reports (`h200`, `rtx6000`, `none`); the variant
  `absent` leaves nvidia-smi off PATH instead, as on a host without NVIDIA tools;
- HOME = a folder of the test host's own, so `~/.cache/huggingface/token` and `~/models` are the
  test host's and never this machine's.

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

from pathlib import Path

from sandbox.gpu import ENV_VAR
from sandbox.prepare import BIN, PINS, VENV, VENV_PYTHON, standin_pth_problem

GPU_VARIANTS = ("h200", "rtx6000", "none", "absent")
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
    needed = [VENV_PYTHON, VENV / "bin" / "hf", BIN / "nvidia-smi"]
    needed += [site[0] / f"{name}-{version}.dist-info" for name, version, _ in PINS] if site else [VENV / "lib"]
    problems = [f"{path} missing" for path in needed if not path.exists()]
    standin = standin_pth_problem()
    problems += [standin] if standin else []
    if problems:
        return f"the test host is not prepared ({', '.join(problems)}): run `python -m sandbox.prepare` first"
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


def write_home(shell: str, home: Path) -> None:
    """Give a test host's HOME the login shell of kind `shell` (see SHELLS)."""
    if shell not in SHELLS:
        raise ValueError(f"unknown login shell {shell!r}: one of {', '.join(SHELLS)}")
    if shell == "noisy":
        (home / NOISY_PATH_DIR).mkdir(parents=True, exist_ok=True)
        (home / ".bashrc").write_text(NOISY_BASHRC)
