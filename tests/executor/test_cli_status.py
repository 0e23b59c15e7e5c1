"""`runbook status` and `runbook runs` as a user reads them, and a console nobody reads any more.

Runs go through the real CLI in a subprocess against the real test sshd.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.conftest import runbook_cli

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


def cli(*args: str, columns: int = 80) -> subprocess.CompletedProcess[str]:
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
    ids = [json.loads(p.read_text())["run_id"] for p in sorted(logs.glob("*/run.json"))]

    table = cli("runs", "--log-dir", str(logs), columns=40).stdout
    for run_id in ids:  # a user copies these into `status` and `--resume`
        assert run_id in table
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
        [sys.executable, "-m", "executor.cli", "run", str(book), "--log-dir", str(logs)],
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
