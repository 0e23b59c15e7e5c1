"""The state store and the run folders of a log folder, read directly (the CLI's tests go through
tests/executor/test_cli_status.py): reading never writes, damage is named, run ids may be cut short."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from executor.errors import ResumeError, RunLocked, StateError
from executor.run.state import (
    META_FILE,
    STATE_FILE,
    RunLock,
    RunMeta,
    RunState,
    StepRecord,
    find_run,
    open_state,
    scan_runs,
)


def make_run(log_dir: Path, run_id: str, runbook: str = "book") -> Path:
    """A run folder as the engine leaves it: store, run.json, one step record."""
    meta = RunMeta(run_id=run_id, runbook=runbook, path="/x.yaml", started_at=f"{run_id[:15]}.000000")
    state = RunState.create(log_dir / run_id, meta)
    state.save(StepRecord(step="one", host="box", position=0, status="passed", fingerprint="f", facts={"n": 1}))
    state.close()
    return log_dir / run_id


def files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in folder.iterdir()}


def test_reading_a_store_writes_nothing(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path, "20260101-000000-aaaaaa")
    before = files(run_dir)
    with open_state(run_dir) as state:
        assert [r.facts for r in state.records()] == [{"n": 1}]
        assert state.status() == "stopped"  # `running`, and no process holds its lock
    assert files(run_dir) == before


def test_a_missing_store_is_an_error_and_is_not_made_again(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path, "20260101-000000-aaaaaa")
    (run_dir / STATE_FILE).unlink()
    with pytest.raises(StateError, match=r"state\.db is missing: nothing of run 20260101-000000-aaaaaa can be reused"):
        RunState(run_dir)
    assert not (run_dir / STATE_FILE).exists()


@pytest.mark.parametrize(
    ("damage", "why"),
    [
        (b"junk\n", "file is not a database"),
        (b"", "no steps or run table"),  # an empty file is an empty SQLite database
    ],
)
def test_a_damaged_store_is_named_with_sqlite_s_reason(tmp_path: Path, damage: bytes, why: str) -> None:
    run_dir = make_run(tmp_path, "20260101-000000-aaaaaa")
    for leftover in run_dir.glob(f"{STATE_FILE}-*"):
        leftover.unlink()
    (run_dir / STATE_FILE).write_bytes(damage)
    with pytest.raises(StateError) as caught:
        RunState(run_dir)
    assert str(caught.value).startswith(f"{run_dir / STATE_FILE} is unreadable (") and why in str(caught.value)
    assert caught.value.reason.startswith(f"{STATE_FILE}: ")
    assert (run_dir / STATE_FILE).read_bytes() == damage  # no schema was written into it


def test_an_older_store_gains_the_missing_columns_and_nothing_else(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path, "20260101-000000-aaaaaa")
    with sqlite3.connect(run_dir / STATE_FILE) as db:
        db.execute("ALTER TABLE steps DROP COLUMN gate")
    with open_state(run_dir) as state:
        assert [r.gate for r in state.records()] == [None]
    with sqlite3.connect(run_dir / STATE_FILE) as db:
        assert "gate" in {row[1] for row in db.execute("PRAGMA table_info(steps)")}
        assert {row[0] for row in db.execute("SELECT name FROM sqlite_master")} >= {"steps", "run"}


def test_run_json_comes_last_and_whole(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path, "20260101-000000-aaaaaa")
    assert sorted(p.name for p in run_dir.iterdir() if not p.name.startswith(STATE_FILE)) == ["lock", META_FILE]
    # a folder a kill left before its run.json (store only) is no run; one with an audit log is a damaged run
    (tmp_path / "20260101-000001-bbbbbb").mkdir()
    (tmp_path / "20260101-000001-bbbbbb" / STATE_FILE).touch()
    assert scan_runs(tmp_path).unreadable == []
    (tmp_path / "20260101-000001-bbbbbb" / "audit.jsonl").touch()
    (unreadable,) = scan_runs(tmp_path).unreadable
    assert (unreadable.run_id, unreadable.reason) == ("20260101-000001-bbbbbb", "run.json is missing")


def test_unreadable_folders_are_reported_not_skipped(tmp_path: Path) -> None:
    make_run(tmp_path, "20260101-000000-aaaaaa")
    make_run(tmp_path, "20260101-000001-bbbbbb", runbook="other")
    (make_run(tmp_path, "20260102-000000-cccccc") / META_FILE).write_text('{"run_id": ')
    make_run(tmp_path, "20260103-000000-dddddd").rename(tmp_path / "20260103-000000-renamed")

    found = scan_runs(tmp_path, "book")
    assert [m.run_id for m in found.runs] == ["20260101-000000-aaaaaa"]
    assert [(u.run_id, u.reason) for u in found.unreadable] == [
        ("20260103-000000-renamed", "its run.json names run 20260103-000000-dddddd, not 20260103-000000-renamed"),
        ("20260102-000000-cccccc", "run.json: Expecting value: line 1 column 12 (char 11)"),
    ]
    assert [m.run_id for m in scan_runs(tmp_path).runs] == ["20260101-000001-bbbbbb", "20260101-000000-aaaaaa"]
    assert [u.run_id for u in scan_runs(tmp_path, "other").unreadable] == ["20260102-000000-cccccc"]

    # the latest run of `book` would be an older one than two folders that cannot be read: refused
    with pytest.raises(StateError, match=r"20260103-000000-renamed is unreadable \(its run.json names run .*\); give"):
        find_run(tmp_path, None, "book")
    # `other`'s latest run is older than the folder whose runbook is unknown: refused too
    with pytest.raises(StateError, match="20260102-000000-cccccc is unreadable"):
        find_run(tmp_path, None, "other")
    # named, they say why; by the id in the renamed folder's run.json too
    with pytest.raises(StateError, match=r"20260102-000000-cccccc is unreadable \(run.json: Expecting value"):
        find_run(tmp_path, "20260102-000000-cccccc", "book")
    with pytest.raises(StateError, match="20260103-000000-renamed is unreadable"):
        find_run(tmp_path, "20260103-000000-dddddd")
    assert find_run(tmp_path, "20260101-000000-aaaaaa", "book") is not None


def test_a_run_id_prefix_names_one_run_or_says_which_it_could_be(tmp_path: Path) -> None:
    for run_id in ("20260101-000000-aaaaaa", "20260101-000000-abbbbb", "20260102-000000-cccccc"):
        make_run(tmp_path, run_id)
    make_run(tmp_path, "20260102-000001-dddddd", runbook="other")

    def found(wanted: str, runbook: str | None = None) -> str | None:
        meta = find_run(tmp_path, wanted, runbook)
        return meta.run_id if meta else None

    assert found("20260102", "book") == "20260102-000000-cccccc"  # the other runbook's run does not count
    assert found("20260101-000000-ab") == "20260101-000000-abbbbb"
    assert found("20260101-000000-aaaaaa") == "20260101-000000-aaaaaa"
    with pytest.raises(
        ResumeError,
        match=r"prefix '20260101-000000-a' is ambiguous in .*: it matches "
        r"20260101-000000-abbbbb, 20260101-000000-aaaaaa$",
    ):
        find_run(tmp_path, "20260101-000000-a")
    with pytest.raises(ResumeError, match=r"^no run 20260103 of runbook 'book' in "):
        find_run(tmp_path, "20260103", "book")
    # a prefix that matches a folder that cannot be read is answered with why it cannot be read
    (tmp_path / "20260102-000000-cccccc" / META_FILE).write_text("[]")
    with pytest.raises(StateError, match=r"cccccc is unreadable \(run.json: expected an object, got list\)"):
        find_run(tmp_path, "20260102-000000-c")


def test_a_run_of_another_runbook_is_named_as_such(tmp_path: Path) -> None:
    make_run(tmp_path, "20260101-000000-aaaaaa", runbook="other")
    with pytest.raises(ResumeError, match="run 20260101-000000-aaaaaa is a run of runbook 'other', not 'book'"):
        find_run(tmp_path, "20260101-000000", "book")
    with pytest.raises(ResumeError, match="no run 2027 of runbook 'book'"):
        find_run(tmp_path, "2027", "book")


def test_a_new_run_is_published_locked_and_with_its_rows(tmp_path: Path) -> None:
    """Another `runbook` never finds a new run without its step rows, nor takes its lock first."""
    meta = RunMeta(run_id="20260101-000000-aaaaaa", runbook="book", path="/x.yaml", started_at="2026")
    rows = [StepRecord(step="one", host="box", position=0, status="pending", fingerprint="")]
    state = RunState.create(tmp_path / meta.run_id, meta, rows)
    with pytest.raises(RunLocked):
        RunLock(tmp_path / meta.run_id).acquire()
    with open_state(tmp_path / meta.run_id) as reader:
        assert [(r.step, r.status) for r in reader.records()] == [("one", "pending")]
        assert reader.get("status") == "running"
    state.close()
    lock = RunLock(tmp_path / meta.run_id)
    lock.acquire()  # closing the store released the run's lock
    lock.release()
