"""Prepare the test host's files: `python -m sandbox.prepare` (run by .ci/run before pytest).

This is the only part of the test set-up that reaches PyPI, so the tests themselves never do.
It builds `.cache/testhost/` (git-ignored):

- `venv/`: a virtualenv holding the REAL SGLang release installed with `--no-deps` (its files
  and metadata are the real ones; it cannot import without torch, which a probe must not need)
  and the real huggingface_hub with its `hf` CLI, at the version a real H200 host ran
  (../shared/fixtures/gpu-host-h200/pip.json);
- `bin/nvidia-smi`: the nvidia-smi test double (sandbox/gpu.py) as an executable on the host's PATH;
- `venv/lib/python3.X/site-packages/runbook_sandbox_sglang_standin.pth`: the hook that makes
  `python -m sglang.launch_server` / `-m sglang.benchmark.serving` / `-m sglang.bench_serving` in that venv
  run the SGLang stand-in (sandbox/sglang_standin/, a test double) while the real SGLang files stay in place;
- `sglang-with-ddtree-pr/sglang/`: SGLang 0.5.23 as a build with the DDTree pull request (#29907,
  not in any release) would be: the real release's files (linked) but for the two the PR changes
  for what the probe and the launch flags read: `SpeculativeAlgorithm` gains DDTREE and the `spec`
  fields gain `speculative_ddtree_budget` (DDTREE_PATCHES). A test host with `sglang="ddtree-pr"`
  puts it first on PYTHONPATH (sandbox/testhost.py); the default test host never sees it.
- `sglang-old-client/sglang/`: SGLang as a release from before the serving benchmark moved to
  `sglang.benchmark.serving`: the real 0.5.23 files (linked) but without benchmark/serving.py, whose code is
  bench_serving.py's instead (as it was before the move: no deprecation warning). A test host with
  `sglang="old-client"` puts it first on PYTHONPATH.

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


DDTREE_BUILD = TESTHOST / "sglang-with-ddtree-pr"
#: file of the sglang package -> (text in the release, the text the DDTree PR makes of it)
DDTREE_PATCHES = {
    "srt/speculative/spec_info.py": ("    DFLASH = auto()\n", "    DFLASH = auto()\n    DDTREE = auto()\n"),
    "srt/arg_groups/fields/spec.py": (
        "    speculative_domino_candidate_pool_size: A[\n",
        "    speculative_ddtree_budget: A[\n"
        "        Optional[int],\n"
        '        "DDTREE only. Tree budget: draft tree nodes verified per step (sandbox: the DDTree PR #29907).",\n'
        "    ] = None\n"
        "    speculative_domino_candidate_pool_size: A[\n",
    ),
}


OLD_CLIENT_BUILD = TESTHOST / "sglang-old-client"
#: the benchmark's files of the release: the current entry module's, and the deprecated one's
SERVING, OLD_SERVING = "benchmark/serving.py", "bench_serving.py"


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


def _link_tree(real: Path, build: Path, patched: set[Path]) -> None:
    """`build` mirrors `real`: a link to each entry, but a folder of its own on the way to a patched file."""
    build.mkdir(parents=True, exist_ok=True)
    for entry in real.iterdir():
        target = build / entry.name
        if entry.is_dir() and any(entry in p.parents for p in patched):
            _link_tree(entry, target, patched)
        elif entry not in patched and not target.is_symlink():
            target.symlink_to(entry)


def ensure_ddtree_build() -> str:
    site = site_packages()
    if site is None:
        raise SystemExit(f"sandbox.prepare: no site-packages in {VENV}")
    real = site / "sglang"
    package = DDTREE_BUILD / "sglang"
    patched = [(package / name, new) for name, (_, new) in DDTREE_PATCHES.items()]
    if all(path.is_file() and new in path.read_text() for path, new in patched):
        return f"{package} up to date"
    _link_tree(real, package, {real / name for name in DDTREE_PATCHES})
    for name, (old, new) in DDTREE_PATCHES.items():
        source = (real / name).read_text()
        if source.count(old) != 1:
            raise SystemExit(f"sandbox.prepare: {real / name} is not the release the DDTree patch expects")
        (package / name).write_text(source.replace(old, new))
    return f"wrote {package} (SGLang 0.5.23 as a build with the DDTree PR, a test double)"


def ensure_old_client_build() -> str:
    site = site_packages()
    if site is None:
        raise SystemExit(f"sandbox.prepare: no site-packages in {VENV}")
    real, package = site / "sglang", OLD_CLIENT_BUILD / "sglang"
    code = (real / SERVING).read_text()
    old = package / OLD_SERVING
    if old.is_file() and not old.is_symlink() and old.read_text() == code and not (package / SERVING).exists():
        return f"{package} up to date"
    _link_tree(real, package, {real / SERVING, real / OLD_SERVING})
    old.write_text(code)
    return f"wrote {package} (SGLang with only the old sglang.bench_serving, a test double)"


def main() -> int:
    steps = [ensure_venv(), *ensure_packages(), ensure_nvidia_smi(), ensure_standin_hook(), ensure_ddtree_build()]
    steps.append(ensure_old_client_build())
    for line in steps:
        print(f"sandbox.prepare: {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
