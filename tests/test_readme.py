"""What README.md states that the code can contradict, checked so that it cannot go stale (issue 29, items 2 and
11): the set-up command works on a distribution's Python (a virtual environment, the Python version that
pyproject.toml requires), and the flagship plan's line counts and excerpt are those `runbook plan` prints.
"""

from __future__ import annotations

import re
import shlex
import sys
import tomllib
from pathlib import Path

import pytest

from tests.clirun import runbook_cli

REPO = Path(__file__).resolve().parent.parent
README = (REPO / "README.md").read_text()
FLAGSHIP = "runbooks/k26_dflash.yaml"
#: A host program's size and digest in a plan line: they change with every edit of the program.
PROGRAM = re.compile(r"\d+ bytes, sha256:[0-9a-f]{64}")


def fresh_machine_section() -> str:
    return README[README.index("## On a fresh machine") : README.index("Run the tests")]


def test_the_set_up_installs_into_a_virtual_environment_and_names_the_python_pyproject_requires() -> None:
    """`pip install` outside a virtual environment fails on Debian 12 and Ubuntu 24.04's Python
    (externally-managed-environment): the first command makes one and uses its pip and its `runbook`."""
    section = fresh_machine_section()
    first = next(line.strip() for line in section.splitlines() if line.startswith("    "))
    venv, install, demo = first.split(" && ")
    assert venv == "python3 -m venv .venv"
    assert install == ".venv/bin/pip install -e ."
    assert demo == ".venv/bin/runbook demo"
    required = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["requires-python"]
    assert required == ">=3.11"
    assert "Python 3.11 or later" in section
    assert "python3-venv" in section  # where Debian's python3 has no ensurepip


def test_the_flagship_plan_s_line_counts_and_excerpt_are_what_plan_prints() -> None:
    """The README's "The plan": its line count, the `--full` count (about: within 2%), and each line of the
    excerpt found in the plan in order ("..." skips lines; a host program's size and digest may differ)."""
    done = runbook_cli("plan", FLAGSHIP, cwd=REPO)
    assert done.returncode == 0, done.stderr
    plan = done.stdout.splitlines()
    stated = re.search(r"The flagship's\s+plan is (\d+) lines", README)
    assert stated is not None and int(stated[1]) == len(plan)
    full = runbook_cli("plan", "--full", FLAGSHIP, cwd=REPO)
    about = re.search(r"host programs in base64: about ([\d,]+)\s+lines for the flagship", README)
    assert about is not None
    assert abs(int(about[1].replace(",", "")) - len(full.stdout.splitlines())) <= 0.02 * len(full.stdout.splitlines())
    excerpt = README[README.index("plan is ", stated.start()) :].split("```\n")[1].splitlines()
    lines = iter(PROGRAM.sub("PROGRAM", line) for line in plan)
    for line in excerpt:
        if line.strip() != "...":
            assert PROGRAM.sub("PROGRAM", line) in lines, f"not in `runbook plan {FLAGSHIP}` (in order): {line}"


def test_the_runbook_format_s_example_is_a_valid_runbook(tmp_path: Path) -> None:
    """The first runbook a reader sees, the one that shows every key: `runbook validate` passes it as written
    (its host's `vars:` once set a var the runbook did not declare)."""
    section = README[README.index("## The runbook format") :]
    example = tmp_path / "example.yaml"
    example.write_text(section.split("```yaml\n", 1)[1].split("```\n", 1)[0])
    done = runbook_cli("validate", str(example), env={"HF_TOKEN": "hf_readme_example_token"})
    assert done.returncode == 0, done.stdout + done.stderr


def test_runbook_mcp_without_the_sdk_names_the_install_into_this_checkout_s_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The README installs from a checkout into .venv: `pip install 'runbook[mcp]'` there reaches for an index's
    `runbook` (another project, or none) with whatever `pip` the shell finds first."""
    monkeypatch.delitem(sys.modules, "executor.faces.mcp_server", raising=False)
    for name in ["mcp", *(name for name in sys.modules if name.startswith("mcp."))]:
        monkeypatch.setitem(sys.modules, name, None)  # `import mcp...` fails as where the extra is not installed
    done = runbook_cli("mcp")
    assert done.returncode == 2, done.stderr
    checkout = Path(__file__).resolve().parents[1]
    install = shlex.join([sys.executable, "-m", "pip", "install", "-e", f"{checkout}[mcp]"])
    said = " ".join(done.stderr.split())  # on one line, or the command on a line of its own where it fits no other
    assert re.fullmatch(rf"runbook mcp: needs the MCP SDK \(mcp[.a-z]*\): {re.escape(install)}", said), said
