"""What README.md states that the code can contradict, checked so that it cannot go stale (issue 29, items 2 and
11): the set-up command works on a distribution's Python (a virtual environment, the Python version that
pyproject.toml requires), and the flagship plan's line counts and excerpt are those `runbook plan` prints; and
(issue 30) the notebook snippet reads a report of several workloads as it says.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
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


def test_the_notebook_snippet_reads_a_speedup_per_workload_and_the_request_records(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The README's notebook snippet, run as written on a report of two workloads (SPEED-Bench's categories and
    random ids, as the flagship's): one speedup per workload and category, none hiding another; its `runbook`
    is the CLI in this process (tests/clirun.py)."""
    from steps.benchmark_report import build_report
    from tests.executor.test_cli_report_formats import provenance, with_commands, write_json
    from tests.steps.test_benchmark_report import ACCEPTANCE, side_of
    from tests.steps.test_benchmark_workloads import RANDOM, SPEED, runs_of, step

    workloads = step(SPEED, RANDOM).resolved_workloads(True)
    gains = {"speed/low_entropy": 250.0, "speed/mixed": 150.0, "speed/high_entropy": 80.0, "random-ids": 110.0}
    baseline, candidate = (
        with_commands(side_of(label, runs_of(each)).model_copy(update={"workloads": workloads}))
        for label, each in (("baseline", dict.fromkeys(gains, 100.0)), ("dflash", gains))
    )
    files = ("hosts/gpu/requests/b.jsonl", "hosts/gpu/requests/c.jsonl")
    run = tmp_path / "logs" / "RUN"
    run.parent.mkdir()
    write_json(run, build_report(baseline, candidate, provenance(baseline, candidate, files), ACCEPTANCE))
    for name, ttft in zip(files, (20.0, 10.0), strict=True):
        (run / name).parent.mkdir(parents=True, exist_ok=True)
        (run / name).write_text(json.dumps({"ttft_ms": ttft, "error": None}) + "\n")

    def cli(argv: list[str], **_: object) -> object:
        assert argv[0] == "runbook"
        return runbook_cli(*argv[1:], cwd=tmp_path)

    monkeypatch.setattr(subprocess, "run", cli)
    monkeypatch.chdir(tmp_path)
    snippet = README[README.index("A notebook reads both") :].split("```python\n")[1].split("```")[0]
    scope: dict[str, object] = {"RUN_ID": "RUN"}
    exec(snippet, scope)  # the README's own code
    speedups = scope["speedups"]
    assert isinstance(speedups, dict) and sorted(speedups.values()) == [0.8, 1.1, 1.5, 2.5]
    assert capsys.readouterr().out.splitlines() == ["baseline 20.0", "dflash 10.0"]


def test_the_mcp_table_lists_every_argument_each_tool_takes() -> None:
    """The table under "MCP server" is where an agent's author looks up a tool's arguments (issue 31, item 3: plan
    and run lay a campaign's answer over the flagship): an argument the server takes that its row omits is unknown."""
    pytest.importorskip("mcp.server.mcpserver", reason="the optional extra runbook[mcp]")
    import asyncio

    from executor.faces.mcp_server import Launches, Roots, build_server

    launches = Launches()
    try:
        tools = asyncio.run(build_server(launches, Roots([REPO])).list_tools())
    finally:
        launches.close()
    missing = {}
    for tool in tools:
        row = re.search(rf"^\| `{tool.name}` \| (.*?) \|", README, re.MULTILINE)
        listed = set(re.findall(r"`(\w+)\??`", row.group(1))) if row else set()
        missing[tool.name] = sorted(set(tool.input_schema.get("properties", {})) - listed)
    assert not any(missing.values()), missing


def test_the_command_table_gives_every_option_of_runbook_demo() -> None:
    """The command table is where a newcomer looks up `runbook demo`; the search's demo (`--sweep --search`) and its
    second landscape (`--landscape headroom`) are what the section "Search" asks them to run."""
    import argparse

    from executor.faces.cli import _parser

    [commands] = [a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction)]
    options = {o for a in commands.choices["demo"]._actions for o in a.option_strings if o.startswith("--")}
    row = next(line for line in README.splitlines() if line.startswith("| `runbook demo "))
    assert not sorted(o for o in options - {"--help"} if o not in row), row
