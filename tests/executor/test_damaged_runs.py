"""Damaged run folders, closed pipes and what a resumed run says about the run it continues.

A run.json or state.db whose fields have the wrong type, or whose `resumed_from` names the run itself
or goes round in a cycle, is named with the reason (exit 2) by `runs`, `status`, `audit verify` and
`--resume`, never a traceback. Output into a pipe whose reader went away ends quietly (exit 141). The
CLI runs in this process (tests.clirun) against the test sshd, in a subprocess where a closed pipe or a
kill -9 is the subject; the open-ended damage is drawn by hypothesis and run
through the CLI's `main` in this process (an `address: local` host), so that many kinds can be tried.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from executor.faces import cli as cli_mod
from tests.clirun import runbook_cli
from tests.runfolders import run_folders

CLI = [sys.executable, "-m", "executor.faces.cli"]


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    done = runbook_cli(*args)
    assert "Traceback" not in done.stderr, done.stderr
    return done


def book_text(name: str, folder: Path, hosts: str) -> str:
    return (
        f"name: {name}\n{hosts.rstrip()}\n"
        f"vars:\n  side: {folder / 'side.txt'}\n  marker: {folder / 'marker'}\n"
        "steps:\n"
        "  - id: one\n    kind: shell\n    script: 'echo one >> \"$side\"'\n"
        '  - id: two\n    kind: shell\n    script: \'echo two >> "$side"; test -f "$marker"\'\n'
    )


def run_ids(logs: Path) -> list[str]:
    metas = []
    for path in logs.glob("*/run.json"):
        with contextlib.suppress(ValueError, KeyError, TypeError):
            metas.append(json.loads(path.read_text()))
    return [m["run_id"] for m in sorted(metas, key=lambda m: str(m["started_at"]))]


def edit_meta(run_dir: Path, **fields: Any) -> None:
    meta = json.loads((run_dir / "run.json").read_text())
    (run_dir / "run.json").write_text(json.dumps(meta | fields))


# ---- resumed_from that names its own run, or a cycle ----------------------------------------------


@pytest.mark.parametrize("shape", ["itself", "cycle"])
def test_a_run_that_resumes_itself_or_a_cycle_is_named_everywhere(
    shape: str, tmp_path: Path, write_runbook: Any
) -> None:
    logs = tmp_path / "logs"
    book = write_runbook(book_text("cycles", tmp_path, "__HOSTS__"))
    assert cli("run", str(book), "--log-dir", str(logs)).returncode == 1
    (tmp_path / "marker").touch()
    assert cli("run", str(book), "--resume", "--log-dir", str(logs)).returncode == 0
    first, second = run_ids(logs)
    if shape == "itself":
        edit_meta(logs / second, resumed_from=second)
        why = "its run.json says it resumed itself"
        broken = [second]
    else:
        edit_meta(logs / first, resumed_from=second)  # first -> second -> first
        why = "resumed_from goes round in a cycle"
        broken = [first, second]

    listed = cli("runs", "--log-dir", str(logs))
    assert listed.returncode == 0, listed.stderr
    rows = {line.split("│")[1].strip(): line for line in listed.stdout.splitlines() if line.startswith("│")}
    for run_id in broken:
        assert "unreadable" in rows[run_id] and why[:20] in rows[run_id], listed.stdout
    for args in (
        ("status", "--log-dir", str(logs)),
        ("status", second, "--log-dir", str(logs)),
        ("audit", "verify", str(logs / second)),
        ("run", str(book), "--resume", "--log-dir", str(logs)),
        ("run", str(book), "--resume", second, "--log-dir", str(logs)),
    ):
        done = cli(*args)
        assert done.returncode == 2, (args, done.returncode, done.stdout, done.stderr)
        # a run of the cycle: which one, when both started within one second, their ids' random tails decide
        assert why in done.stderr and any(str(logs / run) in done.stderr for run in broken), (args, done.stderr)
    assert run_ids(logs) == [first, second]  # nothing was resumed


def test_a_wrong_typed_state_db_field_is_named_by_status_and_resume(tmp_path: Path, write_runbook: Any) -> None:
    logs = tmp_path / "logs"
    book = write_runbook(book_text("typed", tmp_path, "__HOSTS__"))
    assert cli("run", str(book), "--log-dir", str(logs)).returncode == 1
    (run_id,) = run_ids(logs)
    with contextlib.closing(sqlite3.connect(logs / run_id / "state.db")) as db, db:
        db.execute("UPDATE steps SET message = 17, duration_s = 'long' WHERE step = 'two'")
    for args in (
        ("status", "--log-dir", str(logs)),
        ("status", "--json", "--log-dir", str(logs)),
        ("run", str(book), "--resume", "--log-dir", str(logs)),
    ):
        done = cli(*args)
        assert done.returncode == 2, (args, done.stdout, done.stderr)
        assert f"{logs / run_id / 'state.db'} is unreadable (step 'two': field 'duration_s' must be" in done.stderr
    listed = cli("runs", "--log-dir", str(logs))
    assert listed.returncode == 0 and "unreadable" in listed.stdout, listed.stdout


# ---- random damage, drawn by hypothesis ---------------------------------------------------------

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=6,
)
#: what each run.json field must hold, written here independently of executor/run/state.py
META_TYPES: dict[str, Any] = {
    "run_id": str,
    "runbook": str,
    "path": str,
    "started_at": str,
    "resumed_from": (str, type(None)),
    "audit_prev_hash": str,
    "vars": dict,
    "secrets": list,
    "runbook_sha256": (str, type(None)),
    "var_args": list,
    "var_args_withheld": list,
    "inventory": (str, type(None)),
}
COLUMNS = ["position", "status", "attempts", "fingerprint", "facts", "started_at", "duration_s", "exit_code"]
COLUMNS += ["message", "via", "reused_from", "gate", "parts"]


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path]]:
    """A failed run then its passed resume, on this machine (`address: local`): (book, logs)."""
    folder = tmp_path_factory.mktemp("finished")
    book = folder / "book.yaml"
    book.write_text(book_text("damage", folder, "hosts:\n  here: {address: local}"))
    logs = folder / "logs"
    assert _main("run", str(book), "--log-dir", str(logs))[0] == 1
    (folder / "marker").touch()
    assert _main("run", str(book), "--resume", "--log-dir", str(logs))[0] == 0
    yield book, logs


def _main(*args: str) -> tuple[int, str, str]:
    """The CLI's `main` in this process: (exit code, stdout, stderr); an exception fails the test."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli_mod.main(list(args))
    return code, out.getvalue(), err.getvalue()


@contextlib.contextmanager
def _copy(logs: Path) -> Iterator[Path]:
    with tempfile.TemporaryDirectory() as scratch:
        copy = Path(scratch) / "logs"
        shutil.copytree(logs, copy, ignore=shutil.ignore_patterns("lock"))
        yield copy


def _every_command(book: Path, logs: Path, run_id: str) -> dict[str, tuple[int, str, str]]:
    return {
        "runs": _main("runs", "--log-dir", str(logs)),
        "runs --json": _main("runs", "--json", "--log-dir", str(logs)),
        "status": _main("status", run_id, "--log-dir", str(logs)),
        "status --json": _main("status", run_id, "--json", "--log-dir", str(logs)),
        "audit verify": _main("audit", "verify", str(logs / run_id)),
        "audit show": _main("audit", "show", str(logs / run_id)),
        "resume": _main("run", str(book), "--resume", run_id, "--log-dir", str(logs)),
    }


def _fits(value: Any, wanted: Any) -> bool:
    return isinstance(value, wanted) and not (isinstance(value, bool) and wanted is not bool)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(field=st.sampled_from(sorted(META_TYPES)), value=JSON_VALUES)
def test_random_damage_to_a_run_json_field_is_named_never_a_traceback(
    finished_run: tuple[Path, Path], field: str, value: Any
) -> None:
    book, pristine = finished_run
    with _copy(pristine) as logs:
        run_id = run_ids(logs)[-1]
        edit_meta(logs / run_id, **{field: value})
        done = _every_command(book, logs, run_id)
        wrong = not _fits(value, META_TYPES[field])
        if wrong:
            for name in ("status", "status --json", "audit verify", "resume"):
                code, _out, said = done[name]
                assert code == 2 and f"field {field!r} must be" in said, (name, done[name])
            assert "unreadable" in done["runs"][1] and f"field {field!r}" in done["runs"][1], done["runs"]
        for name, (code, _out, said) in done.items():
            assert code in (0, 1, 2), (name, code, said)
            assert "Traceback" not in said, (name, said)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    column=st.sampled_from(COLUMNS),
    value=st.none()
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8)
    | st.binary(max_size=4)
    | JSON_VALUES.map(json.dumps),
    step=st.sampled_from(["one", "two"]),
)
def test_random_damage_to_a_state_db_field_is_named_never_a_traceback(
    finished_run: tuple[Path, Path], column: str, value: Any, step: str
) -> None:
    book, pristine = finished_run
    with _copy(pristine) as logs:
        run_id = run_ids(logs)[-1]
        try:
            with contextlib.closing(sqlite3.connect(logs / run_id / "state.db")) as db, db:
                db.execute(f"UPDATE steps SET {column} = ? WHERE step = ?", (value, step))
        except sqlite3.IntegrityError:  # a NOT NULL column: SQLite itself refuses the damage
            assume(False)
        done = _every_command(book, logs, run_id)
        for name in ("status", "status --json", "resume"):
            code, _out, said = done[name]
            assert code in (0, 2), (name, code, said)
            if code == 2:
                assert f"{logs / run_id / 'state.db'} is unreadable (step " in said, (name, said)
        for name, (code, _out, said) in done.items():
            assert code in (0, 1, 2) and "Traceback" not in said, (name, code, said)


@pytest.mark.parametrize("seconds", [math.inf, -math.inf, 1e308, -1.0])
def test_a_duration_no_step_can_take_is_named_never_an_overflow(
    finished_run: tuple[Path, Path], seconds: float
) -> None:
    """A damaged state.db's duration_s of infinity made `runbook status` raise OverflowError formatting it (1e308
    printed 300 digits of hours, -1 "-1000ms"): it is a field of the wrong shape, named, exit 2."""
    book, pristine = finished_run
    with _copy(pristine) as logs:
        run_id = run_ids(logs)[-1]
        with contextlib.closing(sqlite3.connect(logs / run_id / "state.db")) as db, db:
            db.execute("UPDATE steps SET duration_s = ? WHERE step = 'two'", (seconds,))
        for name, (code, _out, said) in _every_command(book, logs, run_id).items():
            if name.startswith(("status", "resume")):
                assert code == 2 and "field 'duration_s' must be seconds (0 to 1e9) or null" in said, (name, said)


# ---- a pipe whose reader went away --------------------------------------------------------------


def test_output_into_a_closed_pipe_ends_quietly(tmp_path: Path, write_runbook: Any) -> None:
    """`runbook status | head` and `runbook audit show RUN | head`: the reader is gone before the first
    write (the pipe's read end is closed before the command starts), deterministically."""
    logs = tmp_path / "logs"
    book = write_runbook(book_text("pipes", tmp_path, "__HOSTS__"))
    assert cli("run", str(book), "--log-dir", str(logs)).returncode == 1
    (run_id,) = run_ids(logs)
    # stdout block-buffered, as in a user's shell: what fits the buffer is written by the flush at exit
    env = {name: value for name, value in os.environ.items() if name != "PYTHONUNBUFFERED"}
    for args in (
        ("status", "--log-dir", str(logs)),
        ("status", "--json", "--log-dir", str(logs)),
        ("runs", "--log-dir", str(logs)),
        ("runs", "--json", "--log-dir", str(logs)),
        ("audit", "show", str(logs / run_id)),
        ("audit", "verify", str(logs / run_id)),
        ("plan", str(book)),  # print()'s lines wait in Python's buffer for its flush at exit
        ("plan", "--json", str(book)),
    ):
        read_end, write_end = os.pipe()
        os.close(read_end)
        try:
            done = subprocess.run(
                [*CLI, *args], stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=60, check=False, env=env
            )
        finally:
            os.close(write_end)
        assert (done.returncode, done.stderr) == (141, ""), (args, done.returncode, done.stderr)


# ---- the abandoned record says what the killed run's log holds ----------------------------------


def test_a_kill_in_a_retry_delay_is_said_to_have_its_record(tmp_path: Path, write_runbook: Any) -> None:
    """Killed (-9) while waiting to retry: attempt 1's command is in the killed run's log, and the
    resumed run's `abandoned` record says so (and where), instead of claiming it left no record."""
    logs, marker = tmp_path / "logs", tmp_path / "marker"
    book = write_runbook(
        "name: retry-delay\n__HOSTS__\n"
        f"vars:\n  marker: {marker}\n"
        "steps:\n"
        "  - id: flaky\n    kind: shell\n    retry: {attempts: 2, delay: 1h, max_delay: 1h}\n"
        "    script: 'echo try; test -f \"$marker\"'\n"
    )
    proc = subprocess.Popen(
        [*CLI, "run", str(book), "--log-dir", str(logs)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        while not any(p.read_bytes().endswith(b"\n") for p in logs.glob("*/audit.jsonl")):
            assert time.monotonic() < deadline and proc.poll() is None, "attempt 1 was never recorded"
            time.sleep(0.02)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=10)
    (killed,) = run_ids(logs)

    marker.touch()
    done = cli("run", str(book), "--resume", "--log-dir", str(logs))
    assert done.returncode == 0, done.stderr
    resumed = logs / run_ids(logs)[-1]
    first = json.loads((resumed / "audit.jsonl").read_text().splitlines()[0])
    assert (first["event"], first["step"], first["attempt"]) == ("abandoned", "flaky", 1)
    assert first["recorded_lines"] == [1] and first["last_exit_code"] == 1 and not first["torn_tail"]
    assert f"run {killed}'s log holds 1 record(s) of attempt 1 (line 1, the last with exit code 1)" in first["note"]
    assert "left no record" not in first["note"]
    shown = cli("audit", "show", str(resumed)).stdout
    assert f"abandoned: was running when run {killed} stopped; run {killed}'s log holds 1 record(s)" in shown
    assert cli("audit", "verify", str(resumed)).returncode == 0


@pytest.mark.parametrize("kind", ["dev-zero", "fifo", "huge"])
def test_a_run_json_that_is_no_small_file_is_named_not_read_forever(finished_run: tuple[Path, Path], kind: str) -> None:
    book, logs = finished_run
    with _copy(logs) as copy:
        run_id = run_folders(copy)[-1].name
        meta = copy / run_id / "run.json"
        meta.unlink()
        if kind == "dev-zero":
            meta.symlink_to("/dev/zero")
        elif kind == "fifo":
            os.mkfifo(meta)
        else:
            meta.write_text(" " * (2 << 20) + "{}")
        code, out, _err = _main("runs", "--log-dir", str(copy))
        assert code == 0 and "unreadable" in out
        for command, (code, _out, err) in _every_command(book, copy, run_id).items():
            if command.startswith("runs") or command == "audit show":  # show prints the log as it is
                continue
            assert code == 2, (command, code, err)
