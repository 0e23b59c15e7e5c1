"""Prepare the test host's files: `python -m sandbox.prepare` (run by .ci/run before pytest).

This is the only part of the test set-up that reaches PyPI, so the tests themselves never do.
It builds `.cache/testhost/` (git-ignored):

- `venv/`: a virtualenv holding the REAL SGLang release installed with `--no-deps` (its files
  and metadata are the real ones; it cannot import without torch, which a probe must not need)
  and the real huggingface_hub with its `hf` CLI, at the version a real H200 host ran
  (../shared/fixtures/gpu-host-h200/pip.json);
- `bin/nvidia-smi`: the nvidia-smi test double (sandbox/gpu.py) as an executable on the host's PATH;
- `venv/lib/python3.X/site-packages/runbook_sandbox_sglang_standin.pth`: the hook that makes
  `python -m sglang.launch_server` / `-m sglang.bench_serving` in that venv run the SGLang
  stand-in (sandbox/sglang_standin/, a test double) while the real SGLang files stay in place.

Idempotent: what is already there at the pinned version is left alone. It prints what it did.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import venv
from pathlib import Path

from sandbox.sglang_standin import hook as standin_hook

REPO = Path(__file__).resolve().parent.parent
TESTHOST = REPO / ".cache" / "testhost"
VENV = TESTHOST / "venv"
BIN = TESTHOST / "bin"
VENV_PYTHON = VENV / "bin" / "python"

STANDIN_PTH = "runbook_sandbox_sglang_standin.pth"

#: (distribution, version, installed without its dependencies); sglang last, so that pip's check
#: after installing huggingface_hub does not list the dependencies sglang lacks on purpose
PINS = (("huggingface_hub", "1.33.0", False), ("sglang", "0.5.23", True))

NVIDIA_SMI = '''#!/usr/bin/env python3
"""TEST DOUBLE for nvidia-smi, written by `python -m sandbox.prepare`: see sandbox/gpu.py."""
import runpy
import sys
from pathlib import Path

sys.argv[0] = "nvidia-smi"
runpy.run_path(str(Path(__file__).resolve().parents[3] / "sandbox" / "gpu.py"), run_name="__main__")
'''


def installed_versions(names: list[str]) -> dict[str, str | None]:
    """Versions of distributions in the test host's venv (None: not installed), from their metadata."""
    code = (
        "import importlib.metadata as m, json, sys\n"
        "def v(n):\n"
        "    try:\n"
        "        return m.version(n)\n"
        "    except m.PackageNotFoundError:\n"
        "        return None\n"
        "print(json.dumps({n: v(n) for n in sys.argv[1:]}))\n"
    )
    out = subprocess.run([str(VENV_PYTHON), "-c", code, *names], check=True, capture_output=True, text=True)
    versions: dict[str, str | None] = json.loads(out.stdout)
    return versions


def ensure_venv() -> str:
    """The venv, made anew when its interpreter no longer runs (its base Python was removed, say)."""
    if VENV_PYTHON.exists() and subprocess.run([str(VENV_PYTHON), "-c", ""], check=False).returncode == 0:
        return f"venv {VENV} exists"
    venv.EnvBuilder(with_pip=True, symlinks=True, clear=True).create(VENV)
    return f"created venv {VENV}"


def ensure_packages() -> list[str]:
    done = []
    have = installed_versions([name for name, _, _ in PINS])
    for name, version, no_deps in PINS:
        if have[name] == version:
            done.append(f"{name}=={version} already installed")
            continue
        command = [str(VENV_PYTHON), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
        command += ["--no-deps"] if no_deps else []
        subprocess.run([*command, f"{name}=={version}"], check=True)
        done.append(f"installed {name}=={version}" + (" (--no-deps)" if no_deps else "") + f" (was {have[name]})")
    have = installed_versions([name for name, _, _ in PINS])
    wrong = {name: have[name] for name, version, _ in PINS if have[name] != version}
    if wrong:
        raise SystemExit(f"sandbox.prepare: versions still wrong after installing: {wrong}")
    if not (VENV / "bin" / "hf").exists():
        raise SystemExit(f"sandbox.prepare: huggingface_hub installed no `hf` CLI in {VENV / 'bin'}")
    return done


def ensure_nvidia_smi() -> str:
    BIN.mkdir(parents=True, exist_ok=True)
    path = BIN / "nvidia-smi"
    if path.exists() and path.read_text() == NVIDIA_SMI and os.access(path, os.X_OK):
        return f"{path} up to date"
    path.write_text(NVIDIA_SMI)
    path.chmod(0o755)
    return f"wrote {path} (test double of nvidia-smi)"


def site_packages() -> Path | None:
    """The test venv's site-packages folder, None before the venv exists."""
    found = sorted(VENV.glob("lib/python*/site-packages"))
    return found[0] if found else None


def standin_pth_problem() -> str | None:
    """Why the SGLang stand-in's hook is not in place (missing or written for another checkout)."""
    site = site_packages()
    path = (site or VENV / "lib") / STANDIN_PTH
    if not path.exists():
        return f"{path} missing"
    if path.read_text() != standin_hook.pth_line():
        return f"{path} out of date"
    return None


def ensure_standin_hook() -> str:
    site = site_packages()
    if site is None:
        raise SystemExit(f"sandbox.prepare: no site-packages in {VENV}")
    if standin_pth_problem() is None:
        return f"{site / STANDIN_PTH} up to date"
    (site / STANDIN_PTH).write_text(standin_hook.pth_line())
    return f"wrote {site / STANDIN_PTH} (hook of the SGLang stand-in, a test double)"


def main() -> int:
    for line in [ensure_venv(), *ensure_packages(), ensure_nvidia_smi(), ensure_standin_hook()]:
        print(f"sandbox.prepare: {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
