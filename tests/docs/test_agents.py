"""docs/agents.md, the agent's guide, against the code: its exit codes, its MCP tools with their parameters,
its events' schema version and names, and its example session, run as the page shows it. Before: nothing
checked it, and its tool table had drifted (`log_dir` missing from six tools, `resume`'s parameters elided)."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

import pytest

from executor import errors
from executor.errors import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, DurableWriteError, InvalidRunbook, RunLocked
from executor.faces.cli import EXIT_BROKEN_PIPE
from executor.run.event_models import EVENT_TYPES, SCHEMA_VERSION
from executor.runbook.campaign import EXIT_CELLS_FAILED
from tests.clirun import runbook_cli

DOC = Path(__file__).resolve().parents[2] / "docs" / "agents.md"


def section(title: str) -> str:
    """The page's text under the heading that starts with `title`, up to the next heading of any level."""
    text = DOC.read_text()
    (start,) = [m.end() for m in re.finditer(rf"^#+ {re.escape(title)}.*$", text, re.M)]
    following = re.search(r"^#+ ", text[start:], re.M)
    return text[start : start + following.start()] if following else text[start:]


def rows(text: str) -> list[list[str]]:
    """The body rows of the Markdown table in `text`, each as its cells."""
    lines = [line for line in text.splitlines() if line.startswith("| ")][2:]  # after the header and its rule
    return [[cell.strip() for cell in line.strip("|").split(" | ")] for line in lines]


def error_classes(base: type[errors.RunbookError]) -> list[type[errors.RunbookError]]:
    return [base, *(found for sub in base.__subclasses__() for found in error_classes(sub))]


def test_the_exit_code_table_lists_every_code_runbook_exits_with_and_what_each_means() -> None:
    meaning = {int(cells[0]): cells[1] for cells in rows(section("Exit codes"))}
    exits = {EXIT_OK, EXIT_FAILED, EXIT_INTERRUPTED, EXIT_BROKEN_PIPE, EXIT_CELLS_FAILED}
    assert set(meaning) == exits | {error.exit_code for error in error_classes(errors.RunbookError)}
    said = {
        EXIT_OK: "passed",
        EXIT_FAILED: "a step failed",
        InvalidRunbook.exit_code: "bad input",
        RunLocked.exit_code: "locked",
        DurableWriteError.exit_code: "a write to the run folder failed",
        EXIT_CELLS_FAILED: "cells failed",
        EXIT_INTERRUPTED: "interrupted",
        EXIT_BROKEN_PIPE: "pipe",
    }
    assert {code: words for code, words in said.items() if words not in meaning[code]} == {}


def test_the_tool_table_is_every_tool_the_server_registers_with_its_parameters() -> None:
    pytest.importorskip("mcp.server.mcpserver", reason="the optional extra runbook[mcp]")
    from executor.faces.mcp_server import Launches, build_server

    tools = asyncio.run(build_server(Launches()).list_tools())
    registered = {
        tool.name: (list(tool.input_schema["properties"]), set(tool.input_schema.get("required", []))) for tool in tools
    }
    documented: dict[str, tuple[list[str], set[str]]] = {}
    for cells in rows(section("The MCP tools")):
        call = re.fullmatch(r"`(\w+)\((.*)\)`", cells[0])
        assert call, cells[0]
        parameters = [p for p in call[2].split(", ") if p]  # `name` required; `name?` or `name=default` not
        documented[call[1]] = (
            [p.partition("=")[0].rstrip("?") for p in parameters],
            {p for p in parameters if re.fullmatch(r"\w+", p)},
        )
    assert documented == registered
    assert all("log_dir" in names for name, (names, _) in registered.items() if name not in {"validate", "plan"})


def test_the_events_section_has_the_codes_schema_version_and_every_event() -> None:
    text = section("Events (schema")
    heading = re.findall(r"^### Events \(schema (\d+)\)$", DOC.read_text(), re.M)
    assert [*map(int, heading), *map(int, re.findall(r"`schema` \((\d+)\)", text))] == [SCHEMA_VERSION] * 2
    names = [model.model_fields["event"].default for model in EVENT_TYPES]
    assert [name for name in names if f"`{name}`" not in text] == []


def test_the_example_session_runs_as_the_page_shows_it(tmp_path: Path) -> None:
    (book,) = re.findall(r"```yaml\n(.*?)```", section("One complete session"), re.S)
    (tmp_path / "smoke.yaml").write_text(book)
    shown = section("One complete session")

    def cli(*args: str, code: int) -> str:
        done = runbook_cli(*args, cwd=tmp_path)
        assert done.returncode == code, (args, done.stdout, done.stderr)
        return done.stdout + done.stderr if args[0] == "validate" else done.stdout

    assert "smoke.yaml: ok (2 steps" in cli("validate", "smoke.yaml", code=0)
    failed = [json.loads(line) for line in cli("run", "smoke.yaml", "--json", code=1).splitlines()]
    (why,) = [event for event in failed if event["event"] == "attempt_failed"]
    assert (why["step"], why["attempt"]) == ("weights", 1) and f'"message": {json.dumps(why["message"])}' in shown
    assert (failed[-1]["event"], failed[-1]["status"], failed[-1]["exit_code"]) == ("run_finished", "failed", 1)
    status: dict[str, Any] = json.loads(cli("status", "--json", code=0))
    steps = {step["step"]: step for step in status["steps"]}
    assert steps["disk"]["status"] == "passed" and isinstance(steps["disk"]["facts"]["free_kb"], int)
    assert steps["weights"]["status"] == "failed" and steps["weights"]["message"].startswith("[primary] weights.ok")

    (tmp_path / "weights.ok").touch()
    resumed = [json.loads(line) for line in cli("run", "smoke.yaml", "--resume", "--json", code=0).splitlines()]
    first = failed[0]["run_id"]
    assert [(s["id"], s["reused"], s["plan"]) for s in resumed[0]["steps"]] == [
        ("disk", True, f"reused (passed in {first})"),
        ("weights", False, f"runs again (did not pass in {first})"),
    ]
    assert (resumed[-1]["event"], resumed[-1]["status"]) == ("run_finished", "passed")
