"""A console that fits (issue 29, item 9): every line the CLI prints fits the terminal's width (`COLUMNS`), but one
unbreakable word (a path, a digest, a command's word) on a line of its own.

The runs go through the real CLI in this process (tests.clirun) against `runbook_offline`'s scripted hosts (the
Engine the CLI makes is given their transport factory): the flagship as a failure, its resume, then plan, validate,
status, runs and report; a campaign (a matrix of long step ids) with and without `-v`; a run interrupted by a
SIGINT the scripted host sends this process. The fitting helpers' properties: any text, any table, any width.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import shlex
import signal
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rich.cells import cell_len
from rich.console import Console

from executor.consoles import key_columns, table_parts
from executor.terminal import MIN_WIDTH, fitted, shown_text
from executor.transport.scripted import Answer, ScriptedCommand
from tests.clirun import runbook_cli
from tests.executor.test_cli_report import write
from tests.runbooks.test_k26_dflash_offline import FlagshipHost
from tests.runfolders import run_folders

if TYPE_CHECKING:
    import subprocess

    from executor.faces.testing import Offline

pytest_plugins = ["executor.faces.testing"]

WIDTH = 100
FLAGSHIP = "runbooks/k26_dflash.yaml"


def too_wide(text: str, width: int = WIDTH) -> list[str]:
    """The lines of `text` wider than `width` cells, but a line that is one word (a path, a digest, a command's
    word before its ` \\`)."""
    return [line for line in text.splitlines() if cell_len(line) > width and len(_words(line)) > 1]


def _words(line: str) -> list[str]:
    return line.strip().removesuffix(" \\").removeprefix("$ ").split()


@pytest.fixture
def scripted(runbook_offline: Offline, monkeypatch: pytest.MonkeyPatch) -> Offline:
    """`runbook run` in this process against `runbook_offline`'s scripted hosts."""
    from executor.run import engine

    real = engine.Engine

    def on_scripted_hosts(*args: Any, **kwargs: Any) -> Any:
        return real(*args, **kwargs, transport_factory=runbook_offline.transport)

    monkeypatch.setattr(engine, "Engine", on_scripted_hosts)
    return runbook_offline


def cli(*args: str, columns: int = WIDTH) -> subprocess.CompletedProcess[str]:
    done = runbook_cli(*args, env={"COLUMNS": str(columns), "HF_TOKEN": "hf_offline_token_1234"})
    assert "Traceback" not in done.stderr, done.stderr
    return done


def fits(done: subprocess.CompletedProcess[str], width: int = WIDTH) -> subprocess.CompletedProcess[str]:
    assert not too_wide(done.stdout + done.stderr, width), "\n".join(too_wide(done.stdout + done.stderr, width))
    return done


def test_the_flagship_its_resume_plan_validate_status_runs_and_report_fit_100_columns(
    scripted: Offline, tmp_path: Path
) -> None:
    logs = str(tmp_path / "logs")
    host = FlagshipHost(scripted.host("gpu"), accept=2.0)  # a drafter below the gate: eval fails
    failed = fits(cli("run", FLAGSHIP, "--log-dir", logs))
    assert failed.returncode == 1 and "DFlash accepts fewer than 3 tokens" in failed.stderr
    again = continuing(failed.stderr, "after fixing the cause, continue where it stopped")
    assert again == ["runbook", "run", FLAGSHIP, "--resume", "--log-dir", logs]
    host.accept = 4.0
    resumed = fits(cli(*again[1:]))
    assert resumed.returncode == 0, resumed.stderr
    for args in (["validate", FLAGSHIP], ["status", "--log-dir", logs], ["runs", "--log-dir", logs]):
        assert fits(cli(*args)).returncode == 0
    run_dir = run_folders(tmp_path / "logs")[-1]  # the resume: by started_at, as runbook orders runs
    report = fits(cli("report", str(run_dir)))
    assert "Output throughput per concurrency" in report.stdout
    # a launch command is below its table, broken where it pastes whole: its lines joined are the command
    deployments = json.loads((run_dir / "report.json").read_text())["provenance"]["deployments"]
    pasted = _pasted(report.stdout)
    assert [d["argv"] for d in deployments] == pasted[:2], pasted
    plan = fits(cli("plan", FLAGSHIP))
    assert "\n    $ /root/venv_sglang/bin/python -m sglang.launch_server" in plan.stdout  # broken as it pastes


def continuing(stderr: str, hint: str) -> list[str]:
    """The command a run's console says continues it after `hint`: on the hint's line where it fits, else below
    it, broken with ` \\` as the shell reads it when pasted."""
    after = stderr.split(f"{hint}:")[1]
    if not after.startswith("\n"):
        return shlex.split(after.splitlines()[0])
    lines = re.match(r"\n    \$ ((?:.* \\\n)*.*)", after)
    assert lines is not None, stderr
    return shlex.split(lines.group(1).replace("\\\n", " "))


def _pasted(text: str) -> list[list[str]]:
    """Each command printed as `(N) $ ...` with ` \\` continuations, as the shell reads it when pasted."""
    found = re.findall(r"^\(\d+\) \$ ((?:.* \\\n)*.*)$", text, flags=re.MULTILINE)
    return [shlex.split(command.replace("\\\n", " ")) for command in found]


CAMPAIGN = """\
    hosts:
      box: {address: box.example}
    name: sweep
    steps:
      - {id: pre, kind: shell, script: echo pre}
      - group: grid
        matrix:
          server: [x-the-first, y-the-second]
          concurrency: [1, 16]
        on_failure: continue
        steps:
          - {id: up, kind: shell, script: echo up $matrix_server}
          - {id: bench_serving, kind: shell, script: bench $matrix_server $matrix_concurrency}
      - {id: post, kind: shell, script: echo post}
    """


def campaign(scripted: Offline, tmp_path: Path) -> Path:
    def bench(command: ScriptedCommand) -> Answer:  # fails in one cell, so that its reason is printed too
        failing = command.env["matrix_server"].startswith("y") and command.env["matrix_concurrency"] == "1"
        return Answer(exit_code=3 if failing else 0, stderr="out of memory " * 20 if failing else "")

    scripted.host("box").on("^echo ").on("^bench ", bench)
    path = tmp_path / "sweep.yaml"
    path.write_text(textwrap.dedent(CAMPAIGN))
    return path


def test_a_campaign_s_header_sums_up_each_group_and_its_step_ids_align(scripted: Offline, tmp_path: Path) -> None:
    book, logs = campaign(scripted, tmp_path), str(tmp_path / "logs")
    done = fits(cli("run", str(book), "--log-dir", logs))
    assert done.returncode == 5, done.stderr
    header = done.stderr.split("    running ")[0]
    assert "group grid: 4 cells, 0 launches, 6 step instances on box; 6 to run, 0 reused" in " ".join(header.split())
    assert "[server=" not in header and re.search(r"^  pre ", header, flags=re.MULTILINE)
    # every step's line, whatever its id's length, has its duration at the same column
    finished = [line for line in done.stderr.splitlines() if re.match(r" +(passed|failed|skipped) ", line)]
    columns = {line.index("  (") for line in finished}  # the duration right-aligned before the time elapsed
    assert len(finished) == 8 and len(columns) == 1, finished
    assert "some cells failed (runbook status lists them); to run only those again:" in done.stderr

    listed = fits(cli("run", str(book), "--log-dir", str(tmp_path / "again"), "-v"))
    header = listed.stderr.split("    running ")[0]
    instances = [f"bench_serving[server={s},concurrency={c}]" for s in ("x-the-first", "y-the-second") for c in (1, 16)]
    assert all(f"  {instance} " in header for instance in instances), header
    assert "group grid:" not in header
    assert fits(cli("status", "--log-dir", logs)).returncode == 0
    assert fits(cli("validate", str(book))).returncode == 0


def test_a_problem_fits_the_terminal_and_is_one_line_in_a_pipe(tmp_path: Path) -> None:
    book = tmp_path / "unused.yaml"
    book.write_text(textwrap.dedent(CAMPAIGN).replace("$matrix_server $matrix_concurrency", "$matrix_server"))
    problem = f"{book}:9:7: matrix axis 'concurrency': no step of 'grid' uses it"
    shown = fits(cli("validate", str(book)))
    assert (
        shown.returncode == 2 and shown.stderr.startswith(f"{book}:9:7: ") and problem in " ".join(shown.stderr.split())
    )
    assert [line for line in shown.stderr.splitlines() if line.startswith("  ")]  # its continuation lines
    piped = runbook_cli("validate", str(book))  # an editor reads it: one line
    assert piped.returncode == 2 and len(piped.stderr.splitlines()) == 1 and problem in piped.stderr


def test_every_command_s_usage_and_help_fit_the_terminal() -> None:
    """argparse wraps what it lays out itself to COLUMNS, not a usage line written out (`runbook run`'s, 151
    columns once): each command's --help, and the usage a missing FILE prints, fit."""
    from executor.faces.cli import _parser

    commands = next(a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction)).choices
    for command in ["", *commands]:
        helped = fits(cli(*command.split(), "--help"))
        assert helped.returncode == 0 and "usage:" in helped.stdout, command
    assert "usage: runbook run FILE" in fits(cli("run")).stderr


def test_after_ctrl_c_the_console_says_how_to_continue_and_names_no_cause(scripted: Offline, tmp_path: Path) -> None:
    book, logs = tmp_path / "two.yaml", str(tmp_path / "logs")
    book.write_text(
        "hosts: {box: {address: box.example}}\nname: two\nsteps:\n"
        "  - {id: first, kind: shell, script: echo one}\n  - {id: second, kind: shell, script: sleep 600}\n"
    )

    def interrupted(command: ScriptedCommand) -> Answer:
        os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C, while the command runs
        return Answer(hang=True)

    box = scripted.host("box").on("^echo ").on("^sleep 600$", interrupted)
    done = fits(cli("run", str(book), "--log-dir", logs))
    assert done.returncode == 130, done.stderr
    assert "fix" not in done.stderr and "cause" not in done.stderr
    said = continuing(done.stderr, "interrupted; to continue where it stopped")
    assert said == ["runbook", "run", str(book), "--resume", "--log-dir", logs]
    box.on("^sleep 600$")  # the newest rule answers first: the command passes now
    again = cli(*said[1:])
    assert again.returncode == 0, again.stderr


def test_a_continuing_command_too_long_for_the_terminal_is_broken_where_it_pastes(
    scripted: Offline, tmp_path: Path
) -> None:
    folder = tmp_path / ("a-folder-with-a-long-name-" * 3)
    folder.mkdir()
    book, logs = folder / "one.yaml", str(folder / "logs")
    book.write_text(
        "hosts: {box: {address: box.example}}\nname: one\nsteps:\n  - {id: only, kind: shell, script: fails}\n"
    )
    scripted.host("box").on("^fails$", Answer(exit_code=1))
    done = fits(cli("run", str(book), "--log-dir", logs, columns=80), width=80)
    assert done.returncode == 1
    hint = "after fixing the cause, continue where it stopped"
    assert f"{hint}:\n    $ runbook run " in done.stderr  # too long for its line: below it
    assert continuing(done.stderr, hint) == ["runbook", "run", str(book), "--resume", "--log-dir", logs]


def test_a_report_s_command_column_follows_its_table_ready_to_paste(tmp_path: Path) -> None:
    command = "/opt/venv/bin/python -m sglang.launch_server --model-path /models/" + "Kimi-K2.6/" * 8 + " --tp-size 8"
    table = {"title": "Launch commands", "columns": ["cell", "command"], "rows": [["a", command], ["b", ""]]}
    write(tmp_path / "run", {"title": "t", "tables": [table], "figures": []})
    done = fits(cli("report", str(tmp_path / "run")))
    assert _pasted(done.stdout) == [shlex.split(command)]
    assert re.search(r"│ a +│ \(1\) +│", done.stdout)
    # in a pipe (no COLUMNS), the table is printed whole, the command in its cell
    whole = runbook_cli("report", str(tmp_path / "run"))
    assert command in whole.stdout and not _pasted(whole.stdout)


# ---- the helpers, for any text, any table, any width -----------------------------------------------------

widths = st.integers(min_value=MIN_WIDTH, max_value=160)


@settings(max_examples=200, deadline=None)
@given(text=st.text(), width=widths)
def test_fitted_text_fits_and_keeps_every_word(text: str, width: int) -> None:
    shown = fitted(text, width)
    assert not too_wide(shown, width)
    assert shown.split() == text.split()  # no word cut, lost or added


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    width=widths,
    shape=st.integers(min_value=1, max_value=12).flatmap(
        lambda columns: st.tuples(
            st.lists(st.text(max_size=30), min_size=columns, max_size=columns),
            st.lists(st.lists(st.text(max_size=60), min_size=columns, max_size=columns), max_size=4),
        )
    ),
)
def test_a_table_fits_any_width_in_one_or_more_parts(width: int, shape: tuple[list[str], list[list[str]]]) -> None:
    columns, rows = shape
    printed = io.StringIO()
    console = Console(file=printed, width=width, highlight=False)
    parts = table_parts(
        "title", [shown_text(c) for c in columns], [[shown_text(c) for c in row] for row in rows], width
    )
    for part in parts:
        console.print(part)
    assert all(cell_len(line) <= width for line in printed.getvalue().splitlines()), printed.getvalue()


def test_each_part_of_a_split_table_starts_with_the_columns_that_tell_its_rows_apart() -> None:
    """A latency table's rows are told apart by concurrency and deployment together: a part that repeated only
    the concurrency would show two rows per concurrency with nothing to say which deployment each is."""
    columns = ["concurrency", "deployment", *(f"metric number {n}" for n in range(8))]
    rows = [[c, side, *(f"{n * 1000.5:,.1f}" for n in range(8))] for c in ("1", "4") for side in ("base", "dflash")]
    assert key_columns(rows) == 2 and key_columns([["a", "x"], ["b", "x"]]) == 1
    assert key_columns([["a", "x"], ["a", "x"]]) == 1  # rows alike: the first column, as before
    parts = table_parts("latency", columns, rows, 60)
    assert len(parts) > 1
    assert all([str(c.header) for c in part.columns][:2] == ["concurrency", "deployment"] for part in parts)
