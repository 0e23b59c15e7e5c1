"""The MCP server acts only on what is ours, in this process (no stdio; the SDK's in-memory client where the
client's part matters): `stop` signals only the process its run's lock proves took it (a reused pid, an older
lock, another run's lock are refused, the process left alone); every path argument must resolve under the
server's roots (its working folder, `--root`, the client's `file://` roots), symlinks and `..` followed first;
a file that is no runbook is refused in one line quoting none of it; every result, its text block too, fits
the cap; and every failure, a crash and arguments of the wrong type included, is an `ok: false` result."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import io
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import FileUrl

pytest.importorskip("mcp.server.mcpserver", reason="the optional extra runbook[mcp]")

import mcp_types as types
from mcp.client.client import Client
from mcp_types import CallToolResult

from executor.faces import views
from executor.faces.cli import main
from executor.faces.mcp_server import RESULT_CAP, Launches, Roots, build_server
from executor.run.state import LOCK_FILE, LockRecord, process_start

BOOK = "name: one\nhosts:\n  box: {address: local}\nsteps:\n  - {id: a, kind: shell, script: echo a}\n"
#: what a file that is no runbook holds: none of it may come back
SECRET = "hunter2SECRETvalue"


def call(tool: str, root: Path, **arguments: Any) -> dict[str, Any]:
    """A tool's structured result, the server's roots `root` alone; its text block is the same JSON."""
    launches = Launches()
    try:
        result = asyncio.run(build_server(launches, Roots([root])).call_tool(tool, arguments))
    finally:
        launches.close()
    assert isinstance(result, CallToolResult) and not result.is_error, result
    assert isinstance(result.structured_content, dict)
    (block,) = result.content
    assert json.loads(getattr(block, "text", ""), parse_constant=strict) == result.structured_content
    assert len(getattr(block, "text", "").encode()) <= RESULT_CAP
    return result.structured_content


def strict(constant: str) -> None:
    """Fails a text block holding NaN or Infinity, which JSON has not (json.loads reads them)."""
    raise AssertionError(f"{constant} in a text block: no JSON")


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding one.yaml and logs/ with one finished run of it (`address: local`)."""
    folder = tmp_path_factory.mktemp("site")
    (folder / "one.yaml").write_text(BOOK)
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        assert main(["run", str(folder / "one.yaml"), "--log-dir", str(folder / "logs")]) == 0
    return folder


# ---- stop --------------------------------------------------------------------------------------------


@contextlib.contextmanager
def held_lock(run_dir: Path, record: bytes) -> Iterator[None]:
    """The run's lock held by this process (as a live run holds it), `record` written in it."""
    fd = os.open(run_dir / LOCK_FILE, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.ftruncate(fd, 0)
        os.write(fd, record)
        yield
    finally:
        os.close(fd)


@pytest.mark.parametrize("record", ["reused pid", "older lock", "another run", "not the holder"])
def test_stop_never_signals_a_process_the_lock_does_not_prove_took_it(finished: Path, record: str) -> None:
    """Before: `stop` sent SIGINT to whatever pid the lock file held: a pid reused by another process since
    (here a `sleep`) was interrupted; and a record naming another process, its start time and the run (what
    anyone may write, /proc/PID/stat is readable) was proof enough while the lock was held by someone else."""
    (run_dir,) = (finished / "logs").iterdir()
    foreign = subprocess.Popen(["sleep", "60"])
    try:
        started = process_start(foreign.pid)
        assert started is not None
        text = {
            "reused pid": LockRecord(foreign.pid, started - 1, run_dir.name).text(),  # a process before it
            "older lock": str(foreign.pid),  # what `runbook` wrote before it recorded more
            "another run": LockRecord(foreign.pid, started, "20260101-000000-abcdef").text(),
            "not the holder": LockRecord(foreign.pid, started, run_dir.name).text(),  # this process holds it
        }[record]
        with held_lock(run_dir, text.encode()):
            answer = call("stop", finished, run_id=run_dir.name, log_dir=str(finished / "logs"))
        time.sleep(0.2)
        assert foreign.poll() is None, "the foreign process was signalled"
        assert answer["ok"] is False and answer["exit_code"] == 2 and "not signalled" in answer["error"], answer
        why = {
            "reused pid": "pid was reused",
            "older lock": "no record",
            "another run": "taken for run",
            "not the holder": "holds no lock",
        }[record]
        assert why in answer["error"], answer
    finally:
        foreign.kill()
        foreign.wait()


def test_stop_interrupts_the_runbook_process_that_took_the_lock(finished: Path, tmp_path: Path) -> None:
    """The lock's record, as `RunLock.acquire` writes it, is proof enough: the holder gets its SIGINT."""
    (source,) = (finished / "logs").iterdir()
    run_dir = tmp_path / "logs" / source.name
    run_dir.parent.mkdir()
    run_dir.mkdir()
    for name in ("run.json", "state.db"):
        (run_dir / name).write_bytes((source / name).read_bytes())
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from pathlib import Path; from executor.run.state import RunLock; "
            f"RunLock(Path({str(run_dir)!r})).acquire(); print('held', flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == b"held\n"
        answer = call("stop", tmp_path, run_id=run_dir.name, log_dir=str(tmp_path / "logs"))
        assert answer == {"ok": True, "run_id": run_dir.name, "pid": holder.pid, "signal": "SIGINT"}, answer
        assert holder.wait(timeout=10) != 0 and b"KeyboardInterrupt" in holder.communicate()[1]
    finally:
        holder.kill()
        holder.wait()


# ---- roots -------------------------------------------------------------------------------------------


@pytest.fixture
def site(finished: Path, tmp_path: Path) -> tuple[Path, Path]:
    """A root folder (a runbook, a run, links out of it) and a folder outside it with its own runbook and run."""
    root, outside = tmp_path / "root", tmp_path / "outside"
    for folder in (root, outside):
        folder.mkdir()
        (folder / "one.yaml").write_text(BOOK)
    shutil.copytree(finished / "logs", outside / "logs")
    (root / "own-logs").mkdir()  # the root's own logs, whose one run folder is a link to the run outside
    (run_dir,) = (outside / "logs").iterdir()
    (root / "own-logs" / run_dir.name).symlink_to(run_dir, target_is_directory=True)
    (root / "link.yaml").symlink_to(outside / "one.yaml")
    (root / "link-logs").symlink_to(outside / "logs", target_is_directory=True)
    return root, outside


#: each tool with a path argument, the argument pointing outside the root (OUT: the outside folder; LINK: the
#: root's links to it; `..`: out of it by name)
OUTSIDE_CALLS: list[tuple[str, dict[str, str]]] = [
    ("validate", {"file": "OUT/one.yaml"}),
    ("validate", {"file": "ROOT/link.yaml"}),
    ("validate", {"file": "ROOT/../outside/one.yaml"}),
    ("validate", {"file": "ROOT/one.yaml", "inventory": "OUT/one.yaml"}),
    ("plan", {"file": "ROOT/link.yaml"}),
    ("run", {"file": "OUT/one.yaml"}),
    ("run", {"file": "ROOT/one.yaml", "log_dir": "OUT/new-logs"}),
    ("resume", {"file": "ROOT/one.yaml", "log_dir": "ROOT/link-logs"}),
    ("status", {"log_dir": "ROOT/link-logs"}),
    ("status", {"log_dir": "ROOT/own-logs"}),  # a run folder in it is a link out of the root
    ("runs", {"log_dir": "OUT/logs"}),
    ("events", {"run_id": "2", "log_dir": "ROOT/link-logs"}),
    ("tail", {"run_id": "2", "step": "a", "log_dir": "OUT/logs"}),
    ("stop", {"run_id": "2", "log_dir": "ROOT/own-logs"}),
    ("report", {"run_dir": "ROOT/link-logs"}),
    ("report", {"log_dir": "OUT/logs"}),
]


@pytest.mark.parametrize(("tool", "arguments"), OUTSIDE_CALLS)
def test_a_path_outside_the_roots_is_refused_by_every_tool(
    site: tuple[Path, Path], tool: str, arguments: dict[str, str]
) -> None:
    """Before: every tool read (and `run` wrote) any path it was given, /etc/passwd as well as another
    user's run folder."""
    root, outside = site
    given = {k: v.replace("ROOT", str(root)).replace("OUT", str(outside)) for k, v in arguments.items()}
    answer = call(tool, root, **given)
    assert answer["ok"] is False and answer["exit_code"] == 2, answer
    assert not (outside / "new-logs").exists() and "\n" not in answer["error"], answer
    if "own-logs" in arguments.get("log_dir", ""):  # a run folder that is a symlink is never followed
        assert "a symlink, not a run folder" in answer["error"], answer
    else:
        assert "outside the server's roots" in answer["error"], answer


def test_runs_names_a_run_folder_that_is_a_symlink_without_following_it(site: tuple[Path, Path]) -> None:
    root, _ = site
    (row,) = call("runs", root, log_dir=str(root / "own-logs"))["runs"]
    assert row["status"] == "unreadable" and "symlink" in row["note"] and row["runbook"] is None, row


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(parts=st.lists(st.sampled_from(["..", ".", "root", "outside", "link-logs", "logs", "own-logs"]), max_size=5))
def test_any_path_is_answered_as_where_it_resolves(site: tuple[Path, Path], parts: list[str]) -> None:
    """A path's words (`..`, links) never decide: where it resolves does. Inside the root, `runs` lists its
    runs; anywhere else it is refused."""
    root, _ = site
    path = os.path.join(str(root), *parts)
    answer = call("runs", root, log_dir=path)
    inside = Path(path).resolve().is_relative_to(root.resolve())
    assert ("runs" in answer) is inside and (answer.get("ok") is False) is (not inside), (path, answer)


def test_the_clients_roots_are_roots_too(site: tuple[Path, Path]) -> None:
    """A client that declares roots is asked for them at each call (`file://` ones only), through the SDK's
    own client in this process."""
    root, outside = site

    async def roots(_: object) -> types.ListRootsResult:
        return types.ListRootsResult(roots=[types.Root(uri=FileUrl(outside.as_uri()))])

    async def validate(callback: Any) -> dict[str, Any]:
        async with Client(build_server(Launches(), Roots([root])), list_roots_callback=callback) as client:
            result = await client.call_tool("validate", {"file": str(outside / "one.yaml")})
        assert isinstance(result.structured_content, dict)
        return result.structured_content

    answer = asyncio.run(validate(roots))
    assert {key: answer[key] for key in ("ok", "steps", "problems", "warnings")} == {
        "ok": True,
        "steps": 1,
        "problems": [],
        "warnings": [],
    }
    assert "outside the server's roots" in asyncio.run(validate(None))["error"]


def test_a_clients_root_on_another_host_or_no_path_is_no_root(site: tuple[Path, Path]) -> None:
    """Before: `file://elsewhere/PATH` was taken as PATH here (the host ignored), and a root whose path held a
    NUL byte (`%00`) or was a symlink loop failed every call (ValueError, RuntimeError), the other roots with it."""
    root, outside = site
    (root / "loop").symlink_to(root / "loop")
    listed = [f"file://elsewhere{outside}", f"file://{root}/x%00y", (root / "loop").as_uri()]

    async def roots(_: object) -> types.ListRootsResult:
        return types.ListRootsResult(roots=[types.Root(uri=FileUrl(uri)) for uri in listed])

    callback: Any = roots  # the SDK's type of it is a protocol over the request context, unused here

    async def validate(file: Path) -> dict[str, Any]:
        async with Client(build_server(Launches(), Roots([root])), list_roots_callback=callback) as client:
            result = await client.call_tool("validate", {"file": str(file)})
        assert isinstance(result.structured_content, dict)
        return result.structured_content

    assert "outside the server's roots" in asyncio.run(validate(outside / "one.yaml"))["error"]
    assert asyncio.run(validate(root / "one.yaml"))["ok"] is True
    listed = [outside.as_uri().replace("///", "//localhost/")]  # this host's own name: a root here
    assert asyncio.run(validate(outside / "one.yaml"))["ok"] is True


def test_runbook_mcp_refuses_a_root_that_is_no_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["mcp", "--root", str(tmp_path / "nope")]) == 2
    assert "--root" in capsys.readouterr().err


# ---- files that are no runbook -----------------------------------------------------------------------

NOT_RUNBOOKS = {
    "passwd": f"root:x:0:0:{SECRET}:/root:/bin/bash\ndaemon:x:1:1::/usr/sbin:/usr/sbin/nologin\n",
    "a list": f"- {SECRET}\n- b\n",
    "a mapping without steps": f"password: !!int {SECRET}\napi_key: {SECRET}\n",
    "an alias it lacks": f"token: *{SECRET}\n",
    "a tag": f"token: !{SECRET} x\n",
    "a binary": "\x7fELF\x02\x01\x01\x00" + SECRET,
}


@pytest.mark.parametrize("tool", ["validate", "plan", "run"])
@pytest.mark.parametrize("kind", sorted(NOT_RUNBOOKS))
def test_a_file_that_is_no_runbook_is_refused_in_one_line_quoting_none_of_it(
    tmp_path: Path, tool: str, kind: str
) -> None:
    """Before: `validate` of `password: !!int SECRET` answered "YAML cannot read 'SECRET' as int", of
    `token: *SECRET` "found undefined alias 'SECRET'": any file under the roots could be read a value at a
    time."""
    path = tmp_path / "secrets.yaml"
    path.write_bytes(NOT_RUNBOOKS[kind].encode("utf-8", "surrogateescape"))
    answer = call(tool, tmp_path, file=str(path), log_dir=str(tmp_path / "logs"))
    assert answer["ok"] is False and answer["exit_code"] == 2, answer
    assert SECRET not in json.dumps(answer) and "root:x" not in json.dumps(answer), answer
    said = answer.get("error") or answer["problems"][0]["message"]
    assert len(answer.get("problems", [])) <= 1 and "\n" not in said and ("not a runbook" in said or "UTF-8" in said)
    assert not (tmp_path / "logs").exists()


def test_an_inventory_that_is_none_is_refused_as_well(tmp_path: Path) -> None:
    (tmp_path / "one.yaml").write_text(BOOK)
    (tmp_path / "inv.yaml").write_text(f"password: !!int {SECRET}\n")
    answer = call("validate", tmp_path, file=str(tmp_path / "one.yaml"), inventory=str(tmp_path / "inv.yaml"))
    assert answer["ok"] is False and "not an inventory" in answer["error"] and SECRET not in json.dumps(answer)


# ---- caps and errors ---------------------------------------------------------------------------------


def test_a_big_answers_text_block_fits_the_cap_too(tmp_path: Path) -> None:
    """Before: the text block was the SDK's indented copy of the structured result, 90 kB for a plan cut to
    the cap's 64 KiB (a plan lists a grid's first 50 instances: each one's long script makes it big)."""
    book = tmp_path / "grid.yaml"
    axes = {"x": list(range(100)), "y": list(range(100))}
    book.write_text(
        "name: grid\nhosts:\n  box: {address: local}\nsteps:\n"
        f"  - {{id: a, kind: shell, matrix: {json.dumps(axes)}, script: echo $matrix_x $matrix_y {'z' * 3000}}}\n"
    )
    plan = call("plan", tmp_path, file=str(book))  # `call` checks the text block's size and content
    assert plan["truncated"] and len(json.dumps(plan, indent=2).encode()) > RESULT_CAP


def test_an_answer_over_the_cap_even_cut_is_an_ok_false_with_the_whole(finished: Path, tmp_path: Path) -> None:
    """Before: a status whose run.json alone is over the cap (100 vars of 1000 characters, as a runbook may
    set them) answered `{"truncated": true, "error": ...}`: neither `ok: false` and an exit code nor where
    the whole is."""
    logs = tmp_path / "logs"
    shutil.copytree(finished / "logs", logs)
    (run_dir,) = logs.iterdir()
    meta = json.loads((run_dir / "run.json").read_text())
    (run_dir / "run.json").write_text(json.dumps(meta | {"vars": {f"v{i}": "x" * 1000 for i in range(100)}}))
    answer = call("status", tmp_path, run_id=run_dir.name, log_dir=str(logs))
    assert answer["ok"] is False and answer["exit_code"] == 1 and answer["truncated"] is True, answer
    assert answer["whole"] == str(run_dir / "state.db") and "cap" in answer["error"], answer


def test_arguments_of_the_wrong_type_and_a_crash_are_ok_false_results(
    finished: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: the SDK's `is_error` text (pydantic's message quoting the value), and for a crash
    `Error executing tool runs`, neither the documented `ok: false` with an exit code."""
    wrong = call("events", finished, run_id="1", since_seq=SECRET, log_dir=str(finished / "logs"))
    assert wrong == {"ok": False, "exit_code": 2, "error": "events: invalid arguments: since_seq"}
    assert call("nope", finished)["exit_code"] == 2

    def crash(log_dir: Path) -> list[dict[str, Any]]:
        raise RuntimeError("boom\nwith a second line")

    monkeypatch.setattr(views, "runs", crash)
    crashed = call("runs", finished, log_dir=str(finished / "logs"))
    assert crashed == {"ok": False, "exit_code": 1, "error": "runs: RuntimeError: boom with a second line"}


def test_a_number_json_cannot_write_back_is_a_bad_argument_not_a_crash(
    finished: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: `since_seq` of 5000 digits was echoed as `next_seq`, and writing the answer raised (Python writes
    no int of over 4300 digits): a traceback on the server's stderr and the SDK's `is_error` text, no answer.
    Writing any answer is now inside the net that makes a crash `ok: false`."""
    logs = str(finished / "logs")
    answer = call("events", finished, run_id="2", since_seq=10**5000, log_dir=logs)
    assert answer == {"ok": False, "exit_code": 2, "error": "events: invalid arguments: since_seq"}, answer
    assert call("events", finished, run_id="2", since_seq=2**63 - 1, log_dir=logs)["events"] == []
    monkeypatch.setattr(views, "runs", lambda log_dir: [{"n": 10**5000}])
    crashed = call("runs", finished, log_dir=logs)
    assert crashed["ok"] is False and crashed["exit_code"] == 1 and "4300 digits" in crashed["error"], crashed


def test_arguments_too_long_for_a_command_line_are_a_bad_argument(finished: Path) -> None:
    """Before: a var of 300 000 characters for `run` answered exit 1, `OSError: [Errno 7] Argument list too long`
    with the interpreter's path, as if the server had failed rather than the argument."""
    logs = str(finished / "logs")
    answer = call("run", finished, file=str(finished / "one.yaml"), vars={"a": "b" * 300_000}, log_dir=logs)
    assert answer["ok"] is False and answer["exit_code"] == 2 and "too long" in answer["error"], answer
    assert sys.executable not in answer["error"], answer
