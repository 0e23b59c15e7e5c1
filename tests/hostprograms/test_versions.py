"""Each host program runs on the oldest Python it declares (MIN_PYTHON), the kit it is bundled with too:
vermin (PyPI) finds the minimum version each module's code needs; and `step_kinds()` loads no program."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from executor.hostprogram import PACKAGE, minimum_python

PROGRAMS = sorted(p.stem for p in PACKAGE.glob("*.py") if p.stem not in ("__init__", "kit"))
VERMIN = "import sys, vermin; sys.argv[0] = 'vermin'; sys.exit(vermin.main())"


def too_new(path: Path, target: tuple[int, int]) -> str | None:
    """vermin's report when the code at `path` needs more than Python `target`, else None."""
    done = subprocess.run(
        [sys.executable, "-c", VERMIN, "--no-tips", "--violations", f"--target={target[0]}.{target[1]}-", str(path)],
        capture_output=True,
        text=True,
    )
    return None if done.returncode == 0 else done.stdout + done.stderr


@pytest.mark.parametrize("name", PROGRAMS)
def test_a_program_needs_no_newer_python_than_it_declares(name: str) -> None:
    assert too_new(PACKAGE / f"{name}.py", minimum_python(name)) is None


def test_the_kit_runs_on_the_oldest_python_any_program_declares() -> None:
    assert too_new(PACKAGE / "kit.py", min(minimum_python(name) for name in PROGRAMS)) is None


def test_the_check_fails_on_newer_syntax_than_declared(tmp_path: Path) -> None:
    program = tmp_path / "walrus.py"
    program.write_text("MIN_PYTHON = (3, 7)\n\nif (n := len('abc')) > 2:\n    print(n)\n")
    report = too_new(program, (3, 7))
    assert report is not None and "named expressions require !2, 3.8" in report


def test_step_kinds_import_no_host_program() -> None:
    """The kinds ship programs as files: none is imported into the controller, not even the kit, whose
    constants are read from its source (issue 17: `runbook validate` and `plan` import no host program)."""
    code = (
        "import sys; from executor.stepkind import step_kinds; step_kinds(); "
        "print(sorted(m for m in sys.modules if m.startswith('hostprograms.')"
        " or m.startswith('steps.') and m.endswith('_host')))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
