"""`runbook status` and `runbook runs` as a user reads them, and a console nobody reads any more.

Runs go through the real CLI (in this process: tests.clirun) against the real test sshd; a console reader going
away, a `kill -9` and a run in progress are another process, as they are for a user.
"""

from __future__ import annotations

import hashlib
import json
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tests.clirun import runbook_cli
from tests.runfolders import run_folders

FIVE_STEPS = """\
name: five
__HOSTS__
vars:
  marker: {marker}
steps:
  - id: one
    kind: shell
    script: echo one
  - id: two
    kind: shell
    script: echo two
  - id: three
    kind: shell
    script: 'test -e "$marker" || {{ echo "{long}"; exit 4; }}'
    gates:
      - that: exit_code == 0
        message: {message}
  - id: four
    kind: shell
    script: echo four
  - id: five
    kind: shell
    script: echo five
"""


def _five(write_runbook: Any, tmp_path: Path, message: str = "the marker file is missing", long: str = "x") -> Path:
    return write_runbook(  # type: ignore[no-any-return]
        FIVE_STEPS.format(marker=tmp_path / "marker", message=json.dumps(message), long=long)
    )


def cli(*args: str, columns: int = 250) -> subprocess.CompletedProcess[str]:
    """`runbook ARGS` on a terminal wide enough for a row of these tables on one line (how a table fits a narrower
    one: tests/executor/test_console_width.py)."""
    done = runbook_cli(*args, env={"COLUMNS": str(columns)})
    assert "Traceback" not in done.stderr, done.stderr
    return done


def test_status_lists_every_step_with_the_failing_gate(write_runbook: Any, tmp_path: Path) -> None:
    book, logs = _five(write_runbook, tmp_path), tmp_path / "logs"
    assert cli("run", str(book), "--log-dir", str(logs)).returncode == 1

    table = cli("status", "--log-dir", str(logs)).stdout
    rows = {line.split("│")[1].strip(): line for line in table.splitlines() if line.startswith("│")}
    assert list(rows) == ["one", "two", "three", "four", "five"]
    assert "passed" in rows["one"] and "pending" in rows["four"] and "pending" in rows["five"]
    assert "failed" in rows["three"] and "exit_code == 0" in rows["three"]
    assert "the marker file is missing" in rows["three"]
    # the whole message (with the values the gate saw) follows the table
    assert "three@box: [primary] the marker file is missing\n  gate: exit_code == 0\n  exit_code = 4" in table

    document = json.loads(cli("status", "--log-dir", str(logs), "--json").stdout)
    assert document["run"]["status"] == "failed"
    assert document["run"]["started_at"] <= document["run"]["finished_at"]
    steps = document["steps"]
    three = steps[2]
    assert (three["status"], three["gate"], three["exit_code"]) == ("failed", "exit_code == 0", 4)
    assert [s["status"] for s in steps] == ["passed", "passed", "failed", "pending", "pending"]


def test_a_long_message_is_cut_in_the_table_and_whole_below_it(write_runbook: Any, tmp_path: Path) -> None:
    message = "the marker file is missing " + "because " * 100 + "THE-END"
    book, logs = _five(write_runbook, tmp_path, message=message), tmp_path / "logs"
    assert cli("run", str(book), "--log-dir", str(logs)).returncode == 1
    table = cli("status", "--log-dir", str(logs)).stdout
    (row,) = [line for line in table.splitlines() if line.startswith("│ three")]
    assert "…" in row and "THE-END" not in row
    assert "THE-END" in table.split("└")[-1]


def test_runs_shows_whole_run_ids_on_a_narrow_terminal(write_runbook: Any, tmp_path: Path) -> None:
    book, logs = _five(write_runbook, tmp_path), tmp_path / "logs"
    assert cli("run", str(book), "--log-dir", str(logs)).returncode == 1
    (tmp_path / "marker").touch()
    assert cli("run", str(book), "--resume", "--log-dir", str(logs)).returncode == 0
    ids = [folder.name for folder in run_folders(logs)]

    table = cli("runs", "--log-dir", str(logs), columns=40).stdout
    for run_id in ids:  # a user copies these into `status` and `--resume`: whole, though the table is split
        assert run_id in table
    assert all(len(line) <= 40 or len(line.split()) == 1 for line in table.splitlines()), table  # or a path
    table = cli("runs", "--log-dir", str(logs), columns=100).stdout
    newest_row = next(line for line in table.splitlines() if line.startswith(f"│ {ids[-1]}"))
    assert "passed" in newest_row and ids[0] in newest_row  # resumed from the failed run
    assert cli("status", ids[0], "--log-dir", str(logs)).returncode == 0


def test_runs_in_an_empty_log_dir_says_so(tmp_path: Path) -> None:
    done = cli("runs", "--log-dir", str(tmp_path / "nothing-here"))
    assert done.returncode == 0
    assert done.stdout.strip() == f"no runs in {tmp_path / 'nothing-here'}"
    assert json.loads(cli("runs", "--json", "--log-dir", str(tmp_path)).stdout) == []


def test_a_store_written_before_the_gate_column_is_resumed(write_runbook: Any, tmp_path: Path) -> None:
    book, logs = _five(write_runbook, tmp_path), tmp_path / "logs"
    assert cli("run", str(book), "--log-dir", str(logs)).returncode == 1
    (run_dir,) = logs.iterdir()
    with sqlite3.connect(run_dir / "state.db") as db:
        db.execute("ALTER TABLE steps DROP COLUMN gate")
    (tmp_path / "marker").touch()
    resumed = cli("run", str(book), "--resume", "--log-dir", str(logs))
    assert resumed.returncode == 0, resumed.stderr
    assert "reused (passed in" in resumed.stderr


def test_a_run_whose_console_reader_went_away_still_finishes(write_runbook: Any, tmp_path: Path) -> None:
    """`runbook run ... 2>&1 | head -2`: the pipe breaks after two lines; the deployment must not stop."""
    (tmp_path / "marker").touch()
    book, logs = _five(write_runbook, tmp_path), tmp_path / "logs"
    proc = subprocess.Popen(
        [sys.executable, "-m", "executor.faces.cli", "run", str(book), "--log-dir", str(logs)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    assert proc.stderr is not None
    proc.stderr.readline()
    proc.stderr.close()  # the reader goes away while the run has most of its lines still to print
    assert proc.wait(timeout=60) == 0
    status = json.loads(cli("status", "--log-dir", str(logs), "--json").stdout)
    assert status["run"]["status"] == "passed"
    assert [s["status"] for s in status["steps"]] == ["passed"] * 5


# ---- run folders that cannot be read ------------------------------------------------------------


def _run(book: Path, logs: Path, *extra: str) -> tuple[int, str]:
    """`runbook run BOOK`: its exit code and the id of the run folder it made."""
    before = set(logs.iterdir()) if logs.exists() else set()
    done = cli("run", str(book), "--log-dir", str(logs), *extra)
    (made,) = set(logs.iterdir()) - before
    return done.returncode, made.name


def _failed_twice(write_runbook: Any, tmp_path: Path) -> tuple[Path, Path, list[str]]:
    """Two failed runs of five (the second a fresh one, not a resume): book, log folder, ids oldest first."""
    book, logs = _five(write_runbook, tmp_path), tmp_path / "logs"
    (code_old, old), (code_new, new) = _run(book, logs), _run(book, logs)
    assert code_old == code_new == 1
    return book, logs, [old, new]


def test_a_damaged_state_db_is_named_and_runs_lists_the_others(write_runbook: Any, tmp_path: Path) -> None:
    book, logs, (old, new) = _failed_twice(write_runbook, tmp_path)
    (logs / old / "state.db").write_text("junk\n")
    said = f"runbook: {logs / old / 'state.db'} is unreadable (file is not a database)"

    for args in (("status", old), ("run", str(book), "--resume", old)):
        done = cli(*args, "--log-dir", str(logs))
        assert (done.returncode, done.stderr.strip()) == (2, said), args
    assert cli("status", "--log-dir", str(logs)).returncode == 0  # the other run is shown as ever

    table = cli("runs", "--log-dir", str(logs)).stdout
    rows = {line.split("│")[1].strip(): line for line in table.splitlines() if line.startswith("│")}
    assert list(rows) == [new, old]
    assert "failed" in rows[new] and "unreadable: state.db: file is not a database" in rows[old]
    document = {row["run_id"]: row for row in json.loads(cli("runs", "--json", "--log-dir", str(logs)).stdout)}
    assert document[old]["status"] == "unreadable" and document[old]["note"] == "state.db: file is not a database"
    assert document[new]["status"] == "failed"


def test_a_deleted_state_db_is_not_made_again_nor_resumed_as_empty(write_runbook: Any, tmp_path: Path) -> None:
    book, logs = _five(write_runbook, tmp_path), tmp_path / "logs"
    code, run_id = _run(book, logs)
    assert code == 1
    for store in (logs / run_id).glob("state.db*"):
        store.unlink()
    said = (
        f"runbook: {logs / run_id / 'state.db'} is missing: nothing of run {run_id} can be reused; "
        "run without --resume to start over"
    )
    for args in (("status",), ("run", str(book), "--resume")):
        done = cli(*args, "--log-dir", str(logs))
        assert (done.returncode, done.stderr.strip()) == (2, said), args
        assert not (logs / run_id / "state.db").exists(), args  # a read does not make an empty store
    assert [p.name for p in logs.iterdir()] == [run_id]  # the refused resume ran nothing
    assert "unreadable: state.db is missing" in cli("runs", "--log-dir", str(logs)).stdout


def test_a_damaged_run_json_is_reported_and_never_resumed_past(write_runbook: Any, tmp_path: Path) -> None:
    """The newest run's run.json cannot be read: `--resume` must not pick an older (passed) run silently."""
    book, logs = _five(write_runbook, tmp_path), tmp_path / "logs"
    code, failed = _run(book, logs)
    assert code == 1
    (tmp_path / "marker").touch()
    code, passed = _run(book, logs, "--resume")
    assert code == 0
    (tmp_path / "marker").unlink()
    code, damaged = _run(book, logs)
    assert code == 1
    (logs / damaged / "run.json").write_text('{"run_id": ')
    why = "run.json: Expecting value: line 1 column 12 (char 11)"

    table = cli("runs", "--log-dir", str(logs)).stdout
    rows = {line.split("│")[1].strip(): line for line in table.splitlines() if line.startswith("│")}
    assert set(rows) == {damaged, passed, failed}
    assert f"unreadable: {why}" in rows[damaged] and "passed" in rows[passed] and "failed" in rows[failed]

    done = cli("status", damaged, "--log-dir", str(logs))
    assert (done.returncode, done.stderr.strip()) == (2, f"runbook: {logs / damaged} is unreadable ({why})")
    done = cli("status", "--log-dir", str(logs))  # the latest readable run is not the latest run
    assert done.returncode == 2 and f"{logs / damaged} is unreadable ({why})" in done.stderr

    done = cli("run", str(book), "--resume", "--log-dir", str(logs))
    assert (done.returncode, done.stderr.strip()) == (
        2,
        f"runbook: {logs / damaged} is unreadable ({why}); give the run to resume (--resume RUN_ID) "
        "or move that folder away",
    )
    assert {p.name for p in logs.iterdir()} == {failed, passed, damaged}  # nothing ran
    assert cli("status", passed, "--log-dir", str(logs)).returncode == 0  # a run named is shown


def test_a_renamed_run_folder_is_reported(write_runbook: Any, tmp_path: Path) -> None:
    _, logs, (old, new) = _failed_twice(write_runbook, tmp_path)
    (logs / old).rename(logs / f"{old}-copy")
    why = f"its run.json names run {old}, not {old}-copy"
    assert f"unreadable: {why}" in cli("runs", "--log-dir", str(logs)).stdout
    done = cli("status", old, "--log-dir", str(logs))  # by the id it holds, or by the folder's name
    assert (done.returncode, done.stderr.strip()) == (2, f"runbook: {logs / old}-copy is unreadable ({why})")
    assert cli("status", f"{old}-copy", "--log-dir", str(logs)).returncode == 2
    assert cli("status", new, "--log-dir", str(logs)).returncode == 0


def test_a_run_id_prefix_names_a_run_when_only_one_matches(write_runbook: Any, tmp_path: Path) -> None:
    book, logs, (old, new) = _failed_twice(write_runbook, tmp_path)
    shared = old[: next(i for i, (a, b) in enumerate(zip(old, new, strict=True)) if a != b)]  # e.g. the date
    listed = ", ".join(sorted([old, new], reverse=True))
    document = json.loads(cli("status", old[:-1], "--json", "--log-dir", str(logs)).stdout)
    assert document["run"]["run_id"] == old

    for args in (("status", shared), ("run", str(book), "--resume", shared)):
        done = cli(*args, "--log-dir", str(logs))
        assert done.returncode == 2, args
        assert f"run id prefix '{shared}' is ambiguous" in done.stderr and f"it matches {listed}" in done.stderr

    (tmp_path / "marker").touch()
    code, resumed = _run(book, logs, "--resume", old[:-1])
    assert code == 0
    assert json.loads((logs / resumed / "run.json").read_text())["resumed_from"] == old


def test_a_killed_run_is_stopped_in_json_and_its_step_running_without_a_process(
    write_runbook: Any, tmp_path: Path
) -> None:
    started = tmp_path / "started"
    book = write_runbook(f"""\
        name: killed
        __HOSTS__
        steps:
          - id: one
            kind: shell
            script: echo one
          - id: slow
            kind: shell
            script: touch {started}; sleep 30
        """)
    logs = tmp_path / "logs"
    proc = subprocess.Popen(
        [sys.executable, "-m", "executor.faces.cli", "run", str(book), "--log-dir", str(logs)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 30
    while not started.exists():
        assert time.monotonic() < deadline and proc.poll() is None, "the slow step never started"
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)

    document = json.loads(cli("status", "--json", "--log-dir", str(logs)).stdout)
    assert (document["run"]["status"], document["run"]["note"]) == (
        "stopped",
        "its process is gone; --resume continues it",
    )
    assert [s["status"] for s in document["steps"]] == ["passed", "running"]
    table = cli("status", "--log-dir", str(logs)).stdout
    assert "stopped (its process is gone; --resume continues it)" in table
    (row,) = [line for line in table.splitlines() if line.startswith("│ slow")]
    assert "running (process gone)" in row
    (run,) = json.loads(cli("runs", "--json", "--log-dir", str(logs)).stdout)
    assert run["status"] == "stopped"


def test_a_long_gate_is_cut_in_the_table_and_whole_below_it(write_runbook: Any, tmp_path: Path) -> None:
    gate = "exit_code == 0 and stdout is search('" + "because " * 30 + "THE-GATE-END')"
    book = write_runbook(f"""\
        name: gated
        __HOSTS__
        steps:
          - id: gated
            kind: shell
            script: echo hello
            gates:
              - that: {json.dumps(gate)}
                message: no reason found
        """)
    logs = tmp_path / "logs"
    assert cli("run", str(book), "--log-dir", str(logs)).returncode == 1
    table = cli("status", "--log-dir", str(logs)).stdout
    (row,) = [line for line in table.splitlines() if line.startswith("│ gated")]
    assert "exit_code == 0 and stdout is search" in row and "…" in row and "THE-GATE-END" not in row
    assert len(row) < 200, row
    assert " ".join(gate.split()) in " ".join(table.split("└")[-1].split())  # whole, its lines fitted to the terminal


def test_a_log_dir_that_cannot_be_written_is_exit_2_with_the_reason(write_runbook: Any, tmp_path: Path) -> None:
    book = _five(write_runbook, tmp_path)
    (tmp_path / "a-file").write_text("")
    done = cli("run", str(book), "--log-dir", str(tmp_path / "a-file" / "logs"))
    assert done.returncode == 2
    assert f"runbook: cannot write the run folder {tmp_path / 'a-file' / 'logs'}/" in done.stderr
    assert "Not a directory" in done.stderr


def test_run_json_holds_the_runbook_s_content_hash(write_runbook: Any, tmp_path: Path) -> None:
    book, logs = _five(write_runbook, tmp_path), tmp_path / "logs"
    cli("run", str(book), "--log-dir", str(logs))
    (meta_file,) = logs.glob("*/run.json")
    assert json.loads(meta_file.read_text())["runbook_sha256"] == hashlib.sha256(book.read_bytes()).hexdigest()


def test_resuming_a_run_of_another_file_with_the_same_name_says_so(write_runbook: Any, tmp_path: Path) -> None:
    book, logs = _five(write_runbook, tmp_path), tmp_path / "logs"
    assert cli("run", str(book), "--log-dir", str(logs)).returncode == 1
    copy = tmp_path / "copy.yaml"
    copy.write_text(book.read_text())
    (tmp_path / "marker").touch()
    resumed = cli("run", str(copy), "--resume", "--log-dir", str(logs))
    assert resumed.returncode == 0, resumed.stderr
    assert f"ran {book.resolve()}; this is {copy.resolve()}" in resumed.stderr
    assert "runbook: note:" not in cli("run", str(copy), "--resume", "--log-dir", str(logs)).stderr


def test_status_of_a_live_run_shows_the_attempt_under_way(write_runbook: Any, tmp_path: Path) -> None:
    side, go, logs = tmp_path / "side.txt", tmp_path / "go", tmp_path / "logs"
    script = (
        f'echo try >> "{side}"; n=$(wc -l < "{side}")\n'
        f'if [ "$n" = 2 ]; then while [ ! -f "{go}" ]; do sleep 0.05; done; fi\n'
        '[ "$n" -ge 3 ]\n'
    )
    book = write_runbook(
        "name: tries\n__HOSTS__\nsteps:\n  - id: flaky\n    kind: shell\n"
        "    retry: {attempts: 3, delay: 100ms}\n    script: " + json.dumps(script) + "\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "executor.faces.cli", "run", str(book), "--log-dir", str(logs)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while not (side.exists() and len(side.read_text().split()) == 2):
            assert time.monotonic() < deadline, "the second attempt never started"
            time.sleep(0.05)
        (step,) = json.loads(cli("status", "--log-dir", str(logs), "--json").stdout)["steps"]
        assert (step["status"], step["attempts"]) == ("running", 2)
        go.touch()
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    (step,) = json.loads(cli("status", "--log-dir", str(logs), "--json").stdout)["steps"]
    assert (step["status"], step["attempts"]) == ("passed", 3)
