"""`runbook mcp` driven by the MCP SDK's own client over stdio: its tools, a run on the test host followed by
its events to the end (with its status, tail and benchmark report), a run stopped as Ctrl-C would and then
resumed, a secret of the server's environment in no result, and results cut to the cap."""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import sys
import textwrap
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import jsonschema
import pytest

pytest.importorskip("mcp.server.mcpserver", reason="the optional extra runbook[mcp]")

from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp_types import CallToolResult

from executor.faces.cli import main
from executor.faces.mcp_server import (
    EVENTS_LIMIT,
    RESULT_CAP,
    TAIL_LINES,
    Launches,
    Roots,
    build_server,
    capped,
    read_events,
    step_tail,
)
from executor.run.events import EVENTS_FILE
from executor.runbook.schema import plan_schema
from tests.executor.test_resume import wait_for
from tests.steps.test_benchmark import standin as standin  # the stand-in test fixture, shared
from tests.steps.test_benchmark import yaml_steps

SECRET = "hf_mcpSecretToken0123456789"
TOOLS = {"validate", "plan", "run", "resume", "status", "runs", "events", "tail", "stop", "report", "compare"}

Call = Callable[..., Awaitable[dict[str, Any]]]


@asynccontextmanager
async def server(cwd: Path) -> AsyncIterator[tuple[ClientSession, Call, list[str]]]:
    """A `python -m executor.faces.cli mcp` over stdio, HF_TOKEN in its environment; `call(tool, **arguments)` gives
    a tool's structured result, and every result's JSON is kept in the list (to look for the secret)."""
    env = {**os.environ, "HF_TOKEN": SECRET, "PYTHONPATH": os.pathsep.join(sys.path)}
    params = StdioServerParameters(command=sys.executable, args=["-m", "executor.faces.cli", "mcp"], env=env, cwd=cwd)
    seen: list[str] = []
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()

        async def call(tool: str, **arguments: Any) -> dict[str, Any]:
            result = await session.call_tool(tool, arguments)
            assert not result.is_error, result.content
            seen.append(json.dumps(result.structured_content))
            seen.extend(getattr(block, "text", "") for block in result.content)
            assert isinstance(result.structured_content, dict)
            return result.structured_content

        yield session, call, seen


async def follow(call: Call, run_id: str, log_dir: Path, timeout: float = 240) -> list[dict[str, Any]]:
    """A run's events by seq, a few at a time, until run_finished."""
    events: list[dict[str, Any]] = []
    since, deadline = 0, time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = await call("events", run_id=run_id, since_seq=since, limit=5, log_dir=str(log_dir))
        events += got["events"]
        since = got["next_seq"]
        if got["finished"]:
            return events
        await asyncio.sleep(0.2)
    raise AssertionError(f"run {run_id} did not finish: {events[-3:]}")


def test_an_agent_validates_runs_follows_stops_and_resumes_through_the_sdk_client(
    standin: dict[str, Any], write_runbook: Any, tmp_path: Path
) -> None:
    hosts = standin["host"].host_yaml()
    lengths = {"concurrencies": [1], "input_len": 16, "output_len": 8, "num_prompts": 2, "repeats": 1}
    dflash = standin["deploy"] | {"draft_model_path": standin["drafter"], "speculative_num_draft_tokens": 8}
    hello = 'echo "token $HF_TOKEN"; for i in $(seq 1 300); do echo "line $i"; done; echo "said $HF_TOKEN" >&2'
    big = 'python3 -c \'import json; print(json.dumps({"rows": ["x" * 100] * 1000}))\''
    bench = write_runbook(
        "name: agent\n__HOSTS__\nsecrets: {HF_TOKEN: {env: HF_TOKEN}}\n"
        + yaml_steps(
            {"id": "hello", "kind": "shell", "script": hello},
            {"id": "big", "kind": "shell", "script": big, "parse": "json"},
            {"id": "deploy_baseline", **standin["deploy"]},
            {"id": "bench_baseline", "kind": "benchmark", "server": "deploy_baseline", "label": "baseline", **lengths},
            {"id": "deploy_dflash", **dflash | {"draft_attention_backend": "fa3"}},
            {
                "id": "bench_dflash",
                "kind": "benchmark",
                "server": "deploy_dflash",
                "label": "dflash",
                "compare_to": "bench_baseline",
                **lengths,
            },
        ),
        name="bench.yaml",
        hosts=hosts,
    )
    marker = tmp_path / "slept"
    sleepy = write_runbook(
        "name: sleepy\n__HOSTS__\n"
        + yaml_steps(
            {"id": "first", "kind": "shell", "script": "echo first"},
            {"id": "nap", "kind": "shell", "script": f"if [ ! -e {marker} ]; then touch {marker}; sleep 300; fi"},
        ),
        name="sleepy.yaml",
        hosts=hosts,
    )
    broken = write_runbook("name: broken\n__HOSTS__\nsteps:\n  - id: a\n    kind: shell\n    scirpt: echo\n")
    log_dir = tmp_path / "logs"

    async def agent() -> list[str]:
        async with server(tmp_path) as (session, call, seen):
            assert {tool.name for tool in (await session.list_tools()).tools} == TOOLS

            problems = (await call("validate", file=str(broken)))["problems"]
            where = (broken.read_text().splitlines().index("    scirpt: echo") + 1, 5)
            assert any((p["line"], p["column"]) == where and "scirpt" in p["message"] for p in problems), problems
            validated = await call("validate", file=str(bench))
            assert {key: validated[key] for key in ("ok", "steps", "problems", "warnings")} == {
                "ok": True,
                "steps": 6,
                "problems": [],
                "warnings": [],
            }
            assert [host["host"] for host in validated["hosts"]] == ["box"]  # each with its fields' sources
            planned = await call("plan", file=str(bench))
            assert [s["id"] for s in planned["steps"]][:2] == ["hello", "big"]

            # a run on the test host, started in the background and followed by seq to its end
            started = await call("run", file=str(bench), log_dir=str(log_dir))
            assert started["ok"] and Path(started["run_dir"]).name == started["run_id"]
            events = await follow(call, started["run_id"], log_dir)
            assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
            assert events[0]["event"] == "run_started" and events[-1]["event"] == "run_finished"
            assert (events[-1]["status"], events[-1]["exit_code"]) == ("passed", 0)
            lines = (Path(started["run_dir"]) / EVENTS_FILE).read_text().splitlines()
            assert [json.loads(line) for line in lines] == events  # the file holds what --json prints

            status = await call("status", run_id=started["run_id"], log_dir=str(log_dir))
            assert status["run"]["status"] == "passed"
            assert {s["step"]: s["status"] for s in status["steps"]} == dict.fromkeys(
                ["hello", "big", "deploy_baseline", "bench_baseline", "deploy_dflash", "bench_dflash"], "passed"
            )
            # the big step's facts alone are over the cap: they are what is left out, the rest is whole
            assert status["truncated"] and status["facts_left_out"] == ["big@box"]
            assert len(json.dumps(status)) <= RESULT_CAP
            assert next(s for s in status["steps"] if s["step"] == "bench_dflash")["facts"]["speedup"]

            tail = await call("tail", run_id=started["run_id"], step="hello", lines=3, log_dir=str(log_dir))
            assert tail["stdout"].splitlines() == ["line 298", "line 299", "line 300"]
            assert tail["stderr"] == "said ***" and tail["exit_code"] == 0

            report = await call("report", run_dir=started["run_dir"])  # in short: tests/executor/test_mcp_report.py
            assert report["kind"] == "benchmark" and set(report["speedup"]["by_concurrency"]) == {"1"}
            deployments = await call("report", run_dir=started["run_dir"], section="Provenance: deployments")
            assert [row[0] for row in deployments["rows"]] == ["baseline", "dflash"]
            assert await call("report", run_id=started["run_id"], log_dir=str(log_dir)) == report  # as other tools
            assert (await call("report", run_dir=str(tmp_path)))["exit_code"] == 2  # no report there

            # a run with a long step, stopped as Ctrl-C would stop it, then resumed
            napping = await call("run", file=str(sleepy), log_dir=str(log_dir))
            deadline = time.monotonic() + 60
            while not marker.exists():
                assert time.monotonic() < deadline, f"run {napping['run_id']}'s step nap never started ({marker})"
                await asyncio.sleep(0.1)
            stopped = await call("stop", run_id=napping["run_id"], log_dir=str(log_dir))
            assert stopped["ok"] and stopped["pid"] == napping["pid"]
            ended = (await follow(call, napping["run_id"], log_dir))[-1]
            assert (ended["status"], ended["exit_code"]) == ("interrupted", 130)
            steps = (await call("status", run_id=napping["run_id"], log_dir=str(log_dir)))["steps"]
            assert [s["status"] for s in steps] == ["passed", "interrupted"]
            again = await call("stop", run_id=napping["run_id"], log_dir=str(log_dir))
            assert not again["ok"] and "not running" in again["error"]

            resumed = await call("resume", file=str(sleepy), run_id=napping["run_id"], log_dir=str(log_dir))
            assert (await follow(call, resumed["run_id"], log_dir))[-1]["status"] == "passed"
            runs = (await call("runs", log_dir=str(log_dir)))["runs"]
            assert [r["run_id"] for r in runs][:2] == [resumed["run_id"], napping["run_id"]]
            assert runs[0]["resumed_from"] == napping["run_id"] and runs[0]["status"] == "passed"
            return seen

    seen = asyncio.run(agent())
    assert not [text for text in seen if SECRET in text]  # in no tool result, structured or as text
    assert "said ***" in "".join(seen)  # it was printed, and came back masked


def test_a_run_that_cannot_start_gives_its_exit_code_and_problems(write_runbook: Any, tmp_path: Path) -> None:
    broken = write_runbook("name: broken\n__HOSTS__\nsteps:\n  - id: a\n    kind: nope\n")

    async def agent() -> dict[str, Any]:
        async with server(tmp_path) as (_, call, _):
            return await call("run", file=str(broken), log_dir=str(tmp_path / "logs"))

    result = asyncio.run(agent())
    assert not result["ok"] and result["exit_code"] == 2
    line = broken.read_text().splitlines().index("    kind: nope") + 1
    assert any(m.startswith(f"{broken}:{line}:") and "nope" in m for m in result["messages"]), result


def test_a_runs_files_go_when_it_ends_and_the_servers_folder_when_the_server_exits(tmp_path: Path) -> None:
    """Before: every `runbook mcp` made a /tmp/runbook-mcp-* folder, and each run a file in it, never removed."""
    book = tmp_path / "one.yaml"
    book.write_text("name: one\nhosts:\n  box: {address: local}\nsteps:\n  - {id: a, kind: shell, script: echo}\n")
    log_dir = tmp_path / "logs"

    async def agent() -> Path:
        async with server(tmp_path) as (_, call, _):
            started = await call("run", file=str(book), log_dir=str(log_dir))
            stderr = Path(started["stderr"])
            assert stderr.parent.name.startswith("runbook-mcp-") and stderr.exists(), started
            await follow(call, started["run_id"], log_dir)
            deadline = time.monotonic() + 30
            while stderr.exists():  # removed once a call sees the run's process ended (it said nothing there)
                assert time.monotonic() < deadline, f"{stderr} of the ended run {started['run_id']} is still there"
                await call("runs", log_dir=str(log_dir))
                await asyncio.sleep(0.1)
            assert stderr.parent.is_dir()
            return stderr.parent

    folder = asyncio.run(agent())
    deadline = time.monotonic() + 10  # the client's exit closes the server's stdin; its own exit may lag
    while folder.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not folder.exists()


def test_a_long_list_is_cut_to_the_cap_saying_how_much_was_left_out() -> None:
    result = capped({"run_id": "r", "events": [{"seq": n, "text": "x" * 100} for n in range(2000)]}, "events")
    assert len(json.dumps(result)) <= RESULT_CAP < len(json.dumps({"events": [{"text": "x" * 100}] * 2000}))
    assert result["truncated"] and result["left_out"] == 2000 - len(result["events"]) > 0
    assert [e["seq"] for e in result["events"]] == list(range(len(result["events"])))  # the first ones, in order


def test_every_run_writes_its_events_as_json_prints_them(
    write_runbook: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_runbook(
        textwrap.dedent("""\
            name: tee
            __HOSTS__
            steps:
              - {id: a, kind: shell, script: echo a}
            """)
    )
    assert main(["run", str(path), "--log-dir", str(tmp_path / "logs"), "--json"]) == 0
    printed = capsys.readouterr().out
    (run_dir,) = (tmp_path / "logs").iterdir()
    assert (run_dir / EVENTS_FILE).read_text() == printed


def test_the_tail_of_an_output_of_control_characters_fits_the_cap(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: 131 149 bytes, twice the cap: each stream was cut to a third of the cap in characters, and an
    ESC or a BEL takes six bytes of JSON (`\\u001b`)."""
    book = tmp_path / "noise.yaml"
    noise = 'import sys; [sys.stdout.buffer.write(b"\\x1b\\x07\\x01" * 300 + b"\\n") for _ in range(300)]'
    book.write_text(
        "name: noise\nhosts:\n  box: {address: local}\nsteps:\n"
        f"  - {{id: noise, kind: shell, script: {json.dumps(f'python3 -c {shlex.quote(noise)} | tee /dev/stderr')}}}\n"
    )
    assert main(["run", str(book), "--log-dir", str(tmp_path / "logs")]) == 0
    capsys.readouterr()
    (run_dir,) = (tmp_path / "logs").iterdir()
    result = step_tail(run_dir, "noise", None, TAIL_LINES)
    assert len(json.dumps(result).encode()) <= RESULT_CAP
    assert result["stdout"].endswith("\x1b\x07\x01") and result["stdout_truncated"] and result["stderr_truncated"]


def in_process(tool: str, root: Path | None = None, **arguments: Any) -> dict[str, Any]:
    """A tool's structured result from the server called in this process (no stdio: for arguments only), its
    roots the working folder and `root`."""
    launches = Launches()
    try:
        roots = Roots([Path.cwd(), *([root] if root else [])])
        result = asyncio.run(build_server(launches, roots).call_tool(tool, arguments))
    finally:
        launches.close()
    assert isinstance(result, CallToolResult) and not result.is_error, result
    assert isinstance(result.structured_content, dict)
    return result.structured_content


def test_a_var_holding_a_nul_byte_is_refused_by_run_as_by_validate(write_runbook: Any, tmp_path: Path) -> None:
    """Before: `run` raised from Popen (`embedded null byte`), an error instead of a result."""
    book = write_runbook("name: nul\n__HOSTS__\nvars: {url: x}\nsteps:\n  - {id: a, kind: shell, script: echo}\n")
    for tool in ("run", "resume"):
        result = in_process(tool, tmp_path, file=str(book), vars={"url": "a\0b"}, log_dir=str(tmp_path / "logs"))
        assert result["ok"] is False and result["exit_code"] == 2 and "NUL" in result["error"], result
    assert not (tmp_path / "logs").exists()


@pytest.mark.parametrize(
    ("tool", "arguments"),
    [
        ("events", {"run_id": "r" * 200_000}),
        ("status", {"run_id": "r" * 200_000}),
        ("stop", {"run_id": "r" * 200_000}),
        ("tail", {"run_id": "r" * 200_000, "step": "s"}),
        ("tail", {"step": "s" * 200_000}),
    ],
)
def test_a_huge_argument_quoted_back_still_fits_the_cap(tool: str, arguments: dict[str, Any], tmp_path: Path) -> None:
    """Before: the message naming the run or step that was not found quoted all of it (400 kB for `tail`)."""
    logs = tmp_path / "logs"
    book = tmp_path / "one.yaml"
    book.write_text("name: one\nhosts:\n  box: {address: local}\nsteps:\n  - {id: a, kind: shell, script: echo}\n")
    assert main(["run", str(book), "--log-dir", str(logs)]) == 0
    (run_dir,) = logs.iterdir()
    result = in_process(tool, tmp_path, **{"run_id": run_dir.name, **arguments, "log_dir": str(logs)})
    assert result["ok"] is False and len(json.dumps(result).encode()) <= RESULT_CAP, len(json.dumps(result))
    assert result["error"].startswith("no ")


def test_the_plan_of_a_ten_thousand_cell_matrix_fits_the_cap_with_its_first_cells_and_steps(tmp_path: Path) -> None:
    """Before: `{"truncated": true, "error": "... over the cap even without its steps"}`, nothing else: the
    groups' cells and header alone were 700 kB."""
    book = tmp_path / "grid.yaml"
    axes = {"x": list(range(100)), "y": list(range(100))}
    book.write_text(
        "name: grid\nhosts:\n  box: {address: local}\nsteps:\n"
        f"  - {{id: a, kind: shell, matrix: {json.dumps(axes)}, script: echo $matrix_x $matrix_y}}\n"
    )
    result = in_process("plan", tmp_path, file=str(book))
    assert len(json.dumps(result).encode()) <= RESULT_CAP  # the plan summarises the grid; the cap may cut more
    assert result["runbook"] == "grid" and result["steps"][0]["id"].startswith("a")
    (group,) = result["groups"]
    assert group["cells"][0]["id"] == "x=0,y=0" and group["cells_left_out"] == 10_000 - len(group["cells"]) > 0
    assert list(jsonschema.Draft202012Validator(plan_schema()).iter_errors(result)) == []  # cut, still a plan


def test_an_event_over_the_cap_comes_cut_so_that_a_follower_gets_past_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: a run_started listing 800 steps (141 kB) was cut from the list, `events: []` and `next_seq: 0`
    at every call: an agent following the run never got its first event, nor any after it."""
    ids = [f"step_{n:04d}_{'x' * 60}" for n in range(800)]
    book = tmp_path / "many.yaml"
    book.write_text(
        "name: many\nhosts:\n  box: {address: local}\nsteps:\n"
        + "".join(f"  - {{id: {step}, kind: shell, script: echo}}\n" for step in ids)
    )
    assert main(["run", str(book), "--log-dir", str(tmp_path / "logs"), "--only", ids[0]]) == 0
    capsys.readouterr()
    (run_dir,) = (tmp_path / "logs").iterdir()
    got = read_events(run_dir, 0, EVENTS_LIMIT)
    assert len(json.dumps(got).encode()) <= RESULT_CAP and got["finished"]
    first = got["events"][0]
    assert first["event"] == "run_started" and first["run_id"] == run_dir.name and first["truncated"]
    assert first["fields_left_out"] == ["steps"] and [e["seq"] for e in got["events"]] == list(range(1, 6))


def test_arguments_that_read_as_options_stay_the_runs_file_and_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: `file: "--help"` made `runbook run` print its usage on stdout, and `run` raised reading it as
    the first event (`Expecting value`); a runbook named `-x.yaml` or a log_dir `-logs` was read as options."""
    monkeypatch.chdir(tmp_path)
    Path("-x.yaml").write_text(
        "name: dash\nhosts:\n  box: {address: local}\nsteps:\n  - {id: a, kind: shell, script: echo}\n"
    )
    started = in_process("run", file="-x.yaml", log_dir="-logs")
    assert started["ok"] and Path(started["run_dir"]).parent == Path("-logs"), started
    finished = lambda: read_events(Path(started["run_dir"]), 0, EVENTS_LIMIT)["finished"]  # noqa: E731
    wait_for(finished, 60, f"run {started['run_id']}'s run_finished")
    refused = in_process("run", file="--help", log_dir="-logs")
    assert refused["ok"] is False and refused["exit_code"] == 2, refused
    (problem,) = refused["problems"]  # read as a file (none there), before any process starts
    assert problem["file"] == "--help" and "cannot read the runbook" in problem["message"], refused


def test_resume_answers_what_it_carries_and_drops_what_unset_vars_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The resume tool's answer says the --var values it carries over from the run (`carried`, as `run_started`
    does); `unset_vars` drops one (the runbook's value applies again), and a name the run was not started with
    is refused as the CLI refuses it (exit 2, did you mean), in whole lines whatever terminal started the server."""
    monkeypatch.setenv("COLUMNS", "40")  # the server's starter's: a run it starts writes to a file, for an agent
    logs, marker = tmp_path / "logs", tmp_path / "marker"
    book = tmp_path / "carry.yaml"
    book.write_text(
        "name: carry\nhosts: {box: {address: local}}\nvars: {color: red}\nsteps:\n"
        f"  - {{id: a, kind: shell, script: 'echo $color'}}\n  - {{id: b, kind: shell, script: 'test -f {marker}'}}\n"
    )
    assert main(["run", str(book), "--var", "color=blue", "--log-dir", str(logs)]) == 1
    refused = in_process("resume", tmp_path, file=str(book), unset_vars=["colr"], log_dir=str(logs))
    assert (refused["ok"], refused["exit_code"]) == (False, 2)
    assert "carries no --var colr (did you mean 'color'?)" in "\n".join(refused["messages"])
    resumed = in_process("resume", tmp_path, file=str(book), unset_vars=["color"], log_dir=str(logs))
    assert resumed["ok"], resumed
    assert resumed["carried"] == {"inventory": None, "vars": {}, "unset": ["color"]}
    wait_for(lambda: '"run_finished"' in (Path(resumed["run_dir"]) / EVENTS_FILE).read_text(), what="the resume")
    assert json.loads((Path(resumed["run_dir"]) / "run.json").read_text())["vars"]["color"] == "red"
