"""A run folder's files are data: a lock, state.db, run.json, events.jsonl, audit log or report.json that is
a FIFO, a socket, a device or a symlink (even to a regular file outside) is never opened blocking nor
followed. `runs`, `status`, `report`, `audit show` and the MCP tools answer at once, naming the odd file
(exit 2, `ok: false`), and `runs` still lists the other runs. Before: a FIFO lock hung `status`, `runs` and
the MCP `events` for ever, a FIFO events.jsonl hung `events`, and a symlinked state.db or report.json was
shown as the run's own. In-process, each call bounded by a thread's timeout (a hang fails, never blocks)."""

from __future__ import annotations

import contextlib
import functools
import io
import json
import os
import shutil
import socket
import sqlite3
import stat
import tempfile
import threading
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from executor.faces.cli import main

pytest.importorskip("mcp.server.mcpserver", reason="the optional extra runbook[mcp]")

from executor.faces import mcp_server
from tests.executor.test_mcp_guards import call
from tests.runfolders import run_folders

#: every call must answer within this many seconds (each takes well under one)
BOUND_S = 10
ODD_KINDS = ("fifo", "socket", "device", "symlink")
#: a run folder's files and, for each, the answers that read it: (surface, arguments)
READERS: dict[str, list[tuple[str, dict[str, Any]]]] = {
    "lock": [("cli", {"argv": ["status"]}), ("mcp", {"tool": "events"}), ("mcp", {"tool": "stop"})],
    "state.db": [("cli", {"argv": ["status"]}), ("mcp", {"tool": "status"})],
    "run.json": [("cli", {"argv": ["status"]}), ("mcp", {"tool": "events"})],
    "events.jsonl": [("mcp", {"tool": "events"})],
    "audit.jsonl": [("cli", {"argv": ["audit", "show"]}), ("mcp", {"tool": "tail", "step": "a"})],
    "report.json": [("cli", {"argv": ["report"]}), ("mcp", {"tool": "report"})],
}
#: the files whose oddness makes the run's row in `runs` unreadable (the others are not read by it)
LISTED = ("lock", "state.db", "run.json")


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A log folder of two finished runs (`address: local`), the later with a report.json."""
    folder = tmp_path_factory.mktemp("runs")
    book = folder / "one.yaml"
    book.write_text("name: one\nhosts:\n  box: {address: local}\nsteps:\n  - {id: a, kind: shell, script: echo a}\n")
    logs = folder / "logs"
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        for _ in range(2):
            assert main(["run", str(book), "--log-dir", str(logs)]) == 0
    latest = run_folders(logs)[-1]
    provenance: dict[str, Any] = {"generated_at": "now", "gpus": None, "unknown": {}}
    provenance |= {key: [] for key in ("repos", "deployments", "benchmarks")}
    (latest / "report.json").write_text(json.dumps({"title": "t", "tables": [], "provenance": provenance}))
    return logs


def bounded(call: Callable[[], Any]) -> Any:
    """`call()`'s value, or a failure when it has not answered within BOUND_S (it hangs: a FIFO opened)."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = call()
        except BaseException as exc:  # carried to the test's thread
            box["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(BOUND_S)
    assert not thread.is_alive(), f"no answer within {BOUND_S}s: it waits on the odd file"
    if "error" in box:
        raise box["error"]
    return box["value"]


@contextlib.contextmanager
def made_odd(path: Path, kind: str, outside: Path) -> Iterator[None]:
    """`path` replaced by a FIFO, a listening socket, a device (/dev/null's) or a symlink to itself moved
    outside the run folder (a reader that follows it answers as if nothing were odd); a FIFO is opened for
    writing at the end, so that a reader stuck on it ends."""
    if kind == "symlink":
        shutil.move(path, outside)
        path.symlink_to(outside)
    else:
        path.unlink()
    held: socket.socket | None = None
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "socket":
        held = socket.socket(socket.AF_UNIX)
        with tempfile.TemporaryDirectory(dir="/tmp") as short:  # a socket's path is at most 107 bytes
            held.bind(f"{short}/s")  # (a pytest-xdist worker's tmp_path may be longer): bound there, moved
            os.rename(f"{short}/s", path)
        held.listen()
    elif kind == "device":
        try:
            os.mknod(path, 0o600 | stat.S_IFCHR, os.makedev(1, 3))
        except PermissionError:
            pytest.skip("no CAP_MKNOD here to make a device node")
    try:
        yield
    finally:
        if held is not None:
            held.close()
        if kind == "fifo":  # free a reader that is stuck on it
            with contextlib.suppress(OSError):
                os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))


def cli(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


@pytest.mark.parametrize("kind", ODD_KINDS)
@pytest.mark.parametrize("name", sorted(READERS))
def test_an_odd_run_file_is_named_at_once_by_every_reader(two_runs: Path, tmp_path: Path, name: str, kind: str) -> None:
    logs = tmp_path / "logs"
    shutil.copytree(two_runs, logs, symlinks=True)
    older, run_dir = run_folders(logs)
    if name == "lock":  # read by `runs` and `status` for a run said to be running (a killed one's lock is free)
        with contextlib.closing(sqlite3.connect(run_dir / "state.db")) as db, db:
            db.execute("UPDATE run SET value = 'running' WHERE key = 'status'")
    with made_odd(run_dir / name, kind, tmp_path / "elsewhere"):
        code, out, _ = bounded(lambda: cli(["runs", "--json", "--log-dir", str(logs)]))
        rows = {row["run_id"]: row for row in json.loads(out)}
        assert code == 0 and rows[older.name]["status"] == "passed"  # the other run is still listed
        if name in LISTED:
            assert rows[run_dir.name]["status"] == "unreadable" and name in rows[run_dir.name]["note"], rows
        for surface, how in READERS[name]:
            if surface == "cli":
                where = [str(run_dir)] if how["argv"][0] != "status" else [run_dir.name, "--log-dir", str(logs)]
                code, _, err = bounded(functools.partial(cli, [*how["argv"], *where]))
                assert code == 2 and name in err and "Traceback" not in err, (how, code, err)
            else:
                arguments = {k: v for k, v in how.items() if k != "tool"} | {"log_dir": str(logs)}
                arguments |= {"run_id": run_dir.name} if how["tool"] != "report" else {"run_dir": str(run_dir)}
                answer = bounded(functools.partial(call, how["tool"], tmp_path, **arguments))
                assert answer["ok"] is False and answer["exit_code"] == 2, (how, answer)
                assert name in answer["error"], answer


# ---- sizes: a run file's size bounds nothing but what is read of it ---------------------------------


def peak_bytes(call: Callable[[], Any]) -> tuple[Any, int]:
    """`call()`'s value and the most memory Python held for it meanwhile (tracemalloc's peak)."""
    tracemalloc.start()
    try:
        return call(), tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


#: a file of this many bytes (sparse: zeros, no newline) is read past in bounded memory
HUGE = 64 << 20


def test_a_huge_events_line_is_read_past_in_bounded_memory(
    two_runs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: one line of events.jsonl was read whole (a 1 GiB sparse file, or a 300 MB line without a
    newline, took the server past 2 GB), and a line that was no JSON object failed every call from there
    on, a follower stuck at its seq. Now a line past EVENT_MAX_BYTES (16 MiB), or no JSON object, comes as an
    `unreadable` event of its seq and `next_seq` moves on."""
    monkeypatch.setattr(mcp_server, "EVENT_MAX_BYTES", 1 << 20)  # a smaller limit: a quicker test
    logs = tmp_path / "logs"
    shutil.copytree(two_runs, logs, symlinks=True)
    run_dir = run_folders(logs)[-1]
    events = run_dir / "events.jsonl"
    whole = events.read_bytes()
    count = whole.count(b"\n")
    with events.open("ab") as handle:
        handle.write(b"[1, 2]\n{not json\n")
        handle.truncate(len(whole) + 17 + HUGE)  # zeros, then a newline: one line of 64 MiB
        handle.seek(0, os.SEEK_END)
        handle.write(b'\n{"seq": 99, "event": "last"}\n')
    answer, peak = peak_bytes(lambda: call("events", tmp_path, run_id=run_dir.name, log_dir=str(logs)))
    assert peak < 8 << 20, peak
    odd = answer["events"][count:]
    assert [event["event"] for event in odd] == ["unreadable"] * 3 + ["last"], odd
    assert [event["seq"] for event in odd[:3]] == [count + 1, count + 2, count + 3]
    assert "1 MiB" in odd[2]["error"] and answer["next_seq"] == count + 4, answer
    again = call("events", tmp_path, run_id=run_dir.name, since_seq=count + 1, log_dir=str(logs))
    assert [event["seq"] for event in again["events"]][:2] == [count + 2, count + 3], again


def test_a_huge_report_is_refused_unread(two_runs: Path, tmp_path: Path) -> None:
    """Before: report.json was read whole (a 1 GiB one took `runbook report` and the server past 2 GB)."""
    run_dir = tmp_path / "run"
    shutil.copytree(run_folders(two_runs)[-1], run_dir, symlinks=True)
    with (run_dir / "report.json").open("ab") as handle:
        handle.truncate(HUGE)
    answer, peak = peak_bytes(lambda: call("report", tmp_path, run_dir=str(run_dir)))
    assert answer["ok"] is False and answer["exit_code"] == 2 and "16 MiB" in answer["error"], answer
    assert peak < 1 << 20, peak
    code, _, err = cli(["report", str(run_dir)])
    assert code == 2 and "16 MiB" in err, err


def test_text_json_cannot_carry_is_answered_as_json_can(two_runs: Path, tmp_path: Path) -> None:
    """Before: an event holding a lone surrogate (`"\\ud800"`, as json.loads gives it from a remote's JSON)
    failed that `events` call and every later one from its seq (`PydanticSerializationError`: the SDK cannot
    encode it), a follower stuck; NaN went into the text block as `NaN`, which no strict JSON parser reads. Now
    such text comes with U+FFFD in its place and NaN or Infinity by their names (`strict_json`), in both the
    structured content and the text block."""
    logs = tmp_path / "logs"
    shutil.copytree(two_runs, logs, symlinks=True)
    run_dir = run_folders(logs)[-1]
    events = run_dir / "events.jsonl"
    count = events.read_bytes().count(b"\n")
    with events.open("ab") as handle:
        handle.write(b'{"seq": %d, "event": "odd", "text": "a\\ud800b", "nan": NaN, "inf": -Infinity}\n' % (count + 1))
    answer = call("events", tmp_path, run_id=run_dir.name, since_seq=count, log_dir=str(logs))
    (event,) = answer["events"]
    assert event["text"].startswith("a\ufffd") and event["text"].endswith("b"), event
    assert event["nan"] == "NaN" and event["inf"] == "-Infinity" and answer["next_seq"] == count + 1, answer


@pytest.mark.parametrize("kind", ["fifo", "symlink"])
@pytest.mark.parametrize("suffix", ["-journal", "-wal", "-shm"])
def test_an_odd_sqlite_sidecar_is_named_at_once(two_runs: Path, tmp_path: Path, suffix: str, kind: str) -> None:
    """SQLite opens state.db's journal, WAL and shared-memory files itself, following links: before, a FIFO
    as state.db-journal (a hot journal to roll back) hung `status`, `runs` and the MCP `status` for ever, and
    a link was followed (another run's WAL read as this one's)."""
    logs = tmp_path / "logs"
    shutil.copytree(two_runs, logs, symlinks=True)
    older, run_dir = run_folders(logs)
    name = f"state.db{suffix}"
    (run_dir / name).write_bytes(b"")
    with made_odd(run_dir / name, kind, tmp_path / "elsewhere"):
        code, _, err = bounded(lambda: cli(["status", run_dir.name, "--log-dir", str(logs)]))
        assert code == 2 and name in err, err
        code, out, _ = bounded(lambda: cli(["runs", "--json", "--log-dir", str(logs)]))
        rows = {row["run_id"]: row for row in json.loads(out)}
        assert rows[older.name]["status"] == "passed" and name in rows[run_dir.name]["note"], rows
        answer = bounded(lambda: call("status", tmp_path, run_id=run_dir.name, log_dir=str(logs)))
        assert answer["ok"] is False and name in answer["error"], answer


#: a line json.loads gives up on with RecursionError, not ValueError
DEEP = b"[" * 100_000 + b"]" * 100_000 + b"\n"


def test_a_deeply_nested_line_is_no_event_and_no_record(two_runs: Path, tmp_path: Path) -> None:
    """Before: a line of 100 000 nested lists in events.jsonl or the audit log raised RecursionError (json.loads'
    other failure) through `events` and `tail` on every call from there on, and through `audit show`."""
    logs = tmp_path / "logs"
    shutil.copytree(two_runs, logs, symlinks=True)
    run_dir = run_folders(logs)[-1]
    count = (run_dir / "events.jsonl").read_bytes().count(b"\n")
    for name in ("events.jsonl", "audit.jsonl"):
        with (run_dir / name).open("ab") as handle:
            handle.write(DEEP)
    answer = call("events", tmp_path, run_id=run_dir.name, since_seq=count, log_dir=str(logs))
    assert [event["event"] for event in answer["events"]] == ["unreadable"] and answer["next_seq"] == count + 1
    assert call("tail", tmp_path, run_id=run_dir.name, step="a", log_dir=str(logs))["stdout"] == "a"
    code, _, err = cli(["audit", "show", str(run_dir)])
    assert code == 0 and "RecursionError" not in err, err


def test_run_data_nested_too_deep_is_unreadable_not_a_crash(two_runs: Path, tmp_path: Path) -> None:
    """Before: json.loads' RecursionError (not a ValueError) went through every reader of run data: a run.json
    of 30 000 nested lists made `runbook runs` a traceback (exit 1) and the MCP `runs` listed nothing; a step's
    facts so nested in state.db did the same to `status`. Now each is the run's `unreadable` row or exit 2."""
    logs = tmp_path / "logs"
    shutil.copytree(two_runs, logs, symlinks=True)
    older, run_dir = run_folders(logs)
    deep = "[" * 30_000 + "]" * 30_000
    with contextlib.closing(sqlite3.connect(older / "state.db")) as db, db:
        db.execute("UPDATE steps SET facts = ?", (deep,))
    (run_dir / "run.json").write_text(deep)
    code, out, err = cli(["runs", "--json", "--log-dir", str(logs)])
    rows = {row["run_id"]: row for row in json.loads(out)} if code == 0 else {}
    assert rows[run_dir.name]["status"] == rows[older.name]["status"] == "unreadable", (code, err)
    assert "nested" in rows[run_dir.name]["note"] and "nested" in rows[older.name]["note"], rows
    assert call("runs", tmp_path, log_dir=str(logs))["runs"] == json.loads(out)
    code, _, err = cli(["status", older.name, "--log-dir", str(logs)])
    assert code == 2 and "nested" in err, err


def test_an_event_too_big_even_cut_still_moves_next_seq_on(two_runs: Path, tmp_path: Path) -> None:
    """Before: an event whose scalars alone were over half the cap (20 000 keys) was cut from the list as a
    whole: `events` answered none, `next_seq` stayed where it was, and a follower asked for it for ever."""
    logs = tmp_path / "logs"
    shutil.copytree(two_runs, logs, symlinks=True)
    run_dir = run_folders(logs)[-1]
    events = run_dir / "events.jsonl"
    count = events.read_bytes().count(b"\n")
    big = {"seq": count + 1, "event": "big"} | {f"k{i}": i for i in range(20_000)} | {"many": {}}
    with events.open("a") as handle:
        handle.write(json.dumps(big) + "\n")
    answer = call("events", tmp_path, run_id=run_dir.name, since_seq=count, log_dir=str(logs))
    (event,) = answer["events"]
    assert event["seq"] == count + 1 and event["event"] == "big" and event["truncated"] is True, event
    assert answer["next_seq"] == count + 1, answer
