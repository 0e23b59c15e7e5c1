"""Resume, --from/--only, locking, interruption, kill -9 and secret hygiene, end to end.

Every test drives the real `runbook` CLI against the real test sshd (which runs on this machine, so
side-effect files written by steps are readable here): in this process (tests.clirun), and in a subprocess
where the process is the subject (kill -9, SIGINT/SIGTERM/SIGHUP, a run holding the lock). What a resume,
`--from` and `--only` run again, which needs neither, runs on scripted hosts: tests/executor/test_engine_offline.py.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import os
import re
import secrets
import shlex
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from executor.errors import StateError
from executor.run.engine import Engine, RunOptions
from executor.run.events import Reporter
from executor.run.state import RunLock
from executor.runbook.loader import load_runbook
from tests.clirun import runbook_cli
from tests.executor.killpoints import run_book

CLI = [sys.executable, "-m", "executor.faces.cli"]


# ---- helpers -----------------------------------------------------------------------------------


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    done = runbook_cli(*args, env=env)
    assert "Traceback" not in done.stderr, done.stderr
    return done


def start(*args: str) -> subprocess.Popen[str]:
    """Start `runbook` in the background, as a user's shell would: SIGHUP at its default even where the tests
    run under `nohup` (which ignores it, and a run started so rightly outlives a hang-up)."""
    return subprocess.Popen(
        [*CLI, *args],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_DFL),
    )


def finish(proc: subprocess.Popen[str], timeout: float = 30) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=timeout)
    assert "Traceback" not in err, err
    return proc.returncode, out, err


def wait_for(predicate: Any, timeout: float = 20, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.02)
    pytest.fail(f"timed out waiting for {what}")


def runs(log_dir: Path) -> list[dict[str, Any]]:
    """run.json of every run in a log folder, oldest first."""
    metas = []
    for meta_file in log_dir.glob("*/run.json"):
        try:
            metas.append(json.loads(meta_file.read_text()))
        except ValueError:
            continue
    return sorted(metas, key=lambda m: m["started_at"])


def newest(log_dir: Path) -> Path:
    return log_dir / runs(log_dir)[-1]["run_id"]


def audit_records(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "audit.jsonl"
    if not path.exists():
        return []
    records = []
    for raw in path.read_bytes().splitlines(keepends=True):
        if raw.endswith(b"\n"):
            records.append(json.loads(raw))
    return records


def audited_steps(run_dir: Path) -> list[str]:
    return [r["step"] for r in audit_records(run_dir) if r.get("event") == "command"]


def side_lines(path: Path) -> list[str]:
    return path.read_text().split() if path.exists() else []


def status_json(log_dir: Path, run_id: str | None = None) -> dict[str, Any]:
    done = cli("status", *([run_id] if run_id else []), "--log-dir", str(log_dir), "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def step_status(status: dict[str, Any]) -> dict[str, str]:
    return {s["step"]: s["status"] for s in status["steps"]}


def verify(run_dir: Path) -> subprocess.CompletedProcess[str]:
    return cli("audit", "verify", str(run_dir))


def steps_yaml(ids: list[str], sleep: float = 0, special: dict[str, str] | None = None) -> str:
    """A `steps:` block where each step appends its id to $side (then maybe sleeps)."""
    special = special or {}
    lines = ["steps:"]
    for step_id in ids:
        body = special.get(step_id, f'echo {step_id} >> "$side"' + (f"; sleep {sleep}" if sleep else ""))
        lines += [f"  - id: {step_id}", "    kind: shell", f"    script: {json.dumps(body)}"]
    return "\n".join(lines) + "\n"


def header(name: str, tmp_path: Path, extra_vars: str = "") -> str:
    return (
        f"name: {name}\n"
        "__HOSTS__\n"
        "defaults:\n  timeout: 60s\n"
        "vars:\n"
        f"  side: {tmp_path / 'side.txt'}\n"
        f"  marker: {tmp_path / 'marker'}\n" + extra_vars
    )


# ---- 1. fail, fix, resume ------------------------------------------------------------------------


def test_resume_after_fixing_the_cause_runs_only_the_rest(tmp_path: Path, write_runbook: Any) -> None:
    side, marker, logs = tmp_path / "side.txt", tmp_path / "marker", tmp_path / "logs"
    check = 'echo s3 >> "$side"; test -f "$marker"'
    book = write_runbook(
        header("fix-cause", tmp_path) + steps_yaml(["s1", "s2", "s3", "s4", "s5"], special={"s3": check})
    )

    first = cli("run", str(book), "--log-dir", str(logs))
    assert first.returncode == 1, first.stderr
    assert side_lines(side) == ["s1", "s2", "s3"]
    old = newest(logs)
    failed = status_json(logs)
    assert step_status(failed) == {"s1": "passed", "s2": "passed", "s3": "failed", "s4": "pending", "s5": "pending"}
    s3 = next(s for s in failed["steps"] if s["step"] == "s3")
    assert s3["gate"] == "exit_code == 0" and s3["exit_code"] == 1 and s3["attempts"] == 1
    table = cli("status", "--log-dir", str(logs)).stdout
    assert "failing gate" in table and "exit_code == 0" in table and "pending" in table

    marker.touch()  # fix the cause, then do what the failed run said
    hint = "after fixing the cause, continue where it stopped: "
    (said,) = [line.removeprefix(hint) for line in first.stderr.splitlines() if line.startswith(hint)]
    assert shlex.split(said) == ["runbook", "run", str(book), "--resume", "--log-dir", str(logs)]
    second = cli(*shlex.split(said)[1:])
    assert second.returncode == 0, second.stderr
    assert hint not in second.stderr
    new = newest(logs)
    assert new != old
    meta = json.loads((new / "run.json").read_text())
    assert meta["resumed_from"] == old.name

    assert audited_steps(new) == ["s3", "s4", "s5"]
    assert side_lines(side) == ["s1", "s2", "s3", "s3", "s4", "s5"]
    steps = {s["step"]: s for s in status_json(logs)["steps"]}
    assert steps["s1"]["reused_from"] == old.name and steps["s2"]["reused_from"] == old.name
    assert all(steps[s]["status"] == "passed" and not steps[s]["reused_from"] for s in ("s3", "s4", "s5"))

    checked = verify(new)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "intact" in checked.stdout and "2 run(s)" in checked.stdout
    assert old.name in checked.stdout and new.name in checked.stdout
    # the new log's first record links to the old log's last one
    assert audit_records(new)[0]["prev_hash"] == audit_records(old)[-1]["hash"]

    # verifying the new run checks the old run's log too: an edit there is found
    old_log = old / "audit.jsonl"
    old_log.write_text(old_log.read_text().replace('"stdout":"', '"stdout":"x', 1))
    tampered = verify(new)
    assert tampered.returncode == 1, tampered.stdout + tampered.stderr
    assert f"{old.name}/audit.jsonl:1" in tampered.stderr


# ---- 2. kill -9 at any moment ----------------------------------------------------------------------


def _resume_until_passed(book: Path, logs: Path) -> None:
    for _ in range(4):
        done = cli("run", str(book), "--resume", "--log-dir", str(logs))
        assert done.returncode in (0, 1), (done.returncode, done.stderr)
        if done.returncode == 0:
            return
    pytest.fail("resume never passed")


def _check_after_kill(book: Path, logs: Path, side: Path, ids: list[str], context: str) -> None:
    """Resume a killed run until it passes; nothing it had recorded as passed may run again."""
    killed = runs(logs)
    if not killed:  # killed before run.json was written: nothing to resume; a fresh run works
        done = cli("run", str(book), "--resume", "--log-dir", str(logs))
        assert done.returncode == 2 and "nothing to resume" in done.stderr, (context, done.stderr)
        done = cli("run", str(book), "--log-dir", str(logs))
        assert done.returncode == 0, (context, done.stderr)
        assert side_lines(side) == ids, context
        return
    killed_id = killed[0]["run_id"]
    state = status_json(logs, killed_id)  # the killed run's store opens cleanly
    passed = {s["step"] for s in state["steps"] if s["status"] == "passed"}
    if state["run"]["status"] in ("passed", "failed"):  # the kill came too late
        assert passed == set(ids), (context, state)

    _resume_until_passed(book, logs)

    later = runs(logs)[1:]
    assert later and all(m["resumed_from"] for m in later), context
    final = later[-1]["run_id"]
    with contextlib.closing(sqlite3.connect(logs / final / "state.db")) as db:
        final_status = db.execute("SELECT value FROM run WHERE key = 'status'").fetchone()[0]
        final_steps = dict(db.execute("SELECT step, status FROM steps").fetchall())
    assert final_status == "passed", context
    assert final_steps == dict.fromkeys(ids, "passed"), context
    for meta in later:
        rerun = set(audited_steps(logs / meta["run_id"])) & passed
        assert not rerun, f"{context}: steps passed before the kill ran again: {rerun}"
    lines = side_lines(side)
    assert set(lines) == set(ids), (context, lines)
    for step_id in passed:
        assert lines.count(step_id) == 1, (context, lines)

    checked = verify(logs / final)
    assert checked.returncode == 0, (context, checked.stdout, checked.stderr)
    assert f"{len(killed) + len(later)} run(s)" in checked.stdout, (context, checked.stdout)


def test_kill_9_sweep_then_resume(tmp_path: Path, write_runbook: Any) -> None:
    ids = ["k1", "k2", "k3", "k4", "k5"]

    def book_in(folder: Path) -> Path:
        folder.mkdir()
        return write_runbook(header("kill-sweep", folder) + steps_yaml(ids, sleep=0.2), name=f"{folder.name}.yaml")

    # how long an undisturbed run takes, to spread the kills over it
    book = book_in(tmp_path / "baseline")
    t0 = time.monotonic()
    baseline = cli("run", str(book), "--log-dir", str(tmp_path / "baseline" / "logs"))
    duration = time.monotonic() - t0
    assert baseline.returncode == 0, baseline.stderr
    assert side_lines(tmp_path / "baseline" / "side.txt") == ids

    # the kills, one at a time so that nothing else competes for the CPU ...
    delays: list[float | None] = [None] + [duration * (i + 0.5) / 8 for i in range(8)]
    cases = []
    for n, delay in enumerate(delays):
        folder = tmp_path / f"kill{n}"
        book, logs = book_in(folder), folder / "logs"
        proc = start("run", str(book), "--log-dir", str(logs))
        if delay is None:  # right at the start: as soon as the run folder appears
            wait_for(lambda logs=logs: logs.is_dir() and any(logs.iterdir()), what="the run folder")
        else:
            time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=10)
        context = f"kill #{n} after {'the run folder appeared' if delay is None else f'{delay:.2f}s'}"
        cases.append((book, logs, folder / "side.txt", ids, context))

    # ... then the resumes and checks, two at a time
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        for future in [pool.submit(_check_after_kill, *case) for case in cases]:
            future.result()


def test_kill_9_at_every_durable_write_then_resume(tmp_path: Path, write_runbook: Any) -> None:
    """Deterministic: a kill right after each write of the state store and the audit log, and halfway
    through each audit line (a torn line); every time `--resume` completes the run as the sweep above."""
    ids = ["w1", "w2", "w3"]

    def book_in(folder: Path) -> Path:
        folder.mkdir()
        path: Path = write_runbook(header("kill-points", folder) + steps_yaml(ids), name=f"{folder.name}.yaml")
        return path

    # an undisturbed run names the writes, in order
    book = book_in(tmp_path / "baseline")
    done = run_book(book, tmp_path / "baseline" / "logs", tmp_path / "baseline" / "journal")
    assert done.returncode == 0, done.stderr
    points = (tmp_path / "baseline" / "journal").read_text().split()
    kinds = {"state.save", "state.set:status", "state.set:finished_at", "audit.line", "audit.head"}
    assert set(points) == kinds, points
    assert points.count("audit.line") == len(ids), points
    lines_at = [n for n, point in enumerate(points, start=1) if point == "audit.line"]
    cases = [(n, "after") for n in range(1, len(points) + 1)] + [(n, "torn") for n in lines_at]

    def passed_by(n: int) -> set[str]:
        """Steps whose `passed` record was committed by write n: the first state.save after their line."""
        done_writes = points[:n]
        return {
            step_id
            for step_id, at in zip(ids, lines_at, strict=True)
            if "state.save" in done_writes[at:]  # `at` is 1-based: the writes after the line
        }

    def check(n: int, mode: str, book: Path, folder: Path, context: str) -> None:
        logs = folder / "logs"
        if not runs(logs):  # killed before its run.json appeared: no run; a fresh one works
            assert "audit.line" not in points[:n], context
            _check_after_kill(book, logs, folder / "side.txt", ids, context)
            return
        killed = logs / runs(logs)[0]["run_id"]
        line = points[:n].count("audit.line")  # audit lines begun before the kill
        if mode == "torn":
            torn = verify(killed)
            assert torn.returncode == 0, (context, torn.stdout, torn.stderr)
            assert "torn" in torn.stderr and f"audit.jsonl:{line}" in torn.stderr, (context, torn.stderr)
            assert f"intact: {line - 1} records" in torn.stdout, (context, torn.stdout)
        else:
            assert len(audit_records(killed)) == line, context
        _check_after_kill(book, logs, folder / "side.txt", ids, context)
        # the killed run's store holds exactly what had been committed: no more, no less
        with contextlib.closing(sqlite3.connect(killed / "state.db")) as db:
            stored = {step for step, status in db.execute("SELECT step, status FROM steps") if status == "passed"}
        assert stored == passed_by(n), (context, stored)
        if mode == "torn":  # verifying the whole history still reports the torn line
            final = verify(newest(logs))
            assert final.returncode == 0 and f"{killed.name}/audit.jsonl:{line}: torn" in final.stderr, (
                context,
                final.stderr,
            )

    # the kills, one at a time; each killed run's resume and checks start at once, two at a time (a kill
    # lands at its write whatever else runs, so unlike the sweep above the kills need no quiet machine)
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        checks = []
        for n, mode in cases:
            folder = tmp_path / f"{mode}{n}"
            book, journal = book_in(folder), folder / "journal"
            context = f"kill {mode} write #{n} of {len(points)} ({points[n - 1]})"
            killed = run_book(book, folder / "logs", journal, kill_at=n, mode=mode)
            assert killed.returncode == -signal.SIGKILL, (context, killed.returncode, killed.stderr)
            assert journal.read_text().split() == points[:n], context  # the same writes, in the same order
            checks.append(pool.submit(check, n, mode, book, folder, context))
        for future in checks:
            future.result()


def _finished_run(tmp_path: Path, write_runbook: Any) -> Path:
    book = write_runbook(header("audit-chain", tmp_path) + steps_yaml(["a1", "a2", "a3"]))
    logs = tmp_path / "logs"
    done = cli("run", str(book), "--log-dir", str(logs))
    assert done.returncode == 0, done.stderr
    run_dir = newest(logs)
    assert len(audit_records(run_dir)) == 3
    return run_dir


def test_audit_verify_tolerates_a_torn_last_line(tmp_path: Path, write_runbook: Any) -> None:
    run_dir = _finished_run(tmp_path, write_runbook)
    with (run_dir / "audit.jsonl").open("ab") as handle:
        handle.write(b'{"event":"command","step":"a4","comm')
    checked = verify(run_dir)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "torn" in checked.stderr
    assert "audit.jsonl:4" in checked.stderr
    assert "intact: 3 records" in checked.stdout


def test_audit_verify_finds_an_edited_middle_line(tmp_path: Path, write_runbook: Any) -> None:
    run_dir = _finished_run(tmp_path, write_runbook)
    path = run_dir / "audit.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    record = json.loads(lines[1])
    assert record["step"] == "a2"
    record["exit_code"] = 7
    lines[1] = json.dumps(record, sort_keys=True, separators=(",", ":")) + "\n"
    path.write_text("".join(lines))
    checked = verify(run_dir)
    assert checked.returncode == 1, checked.stdout + checked.stderr
    assert "tampered" in checked.stdout
    assert f"{run_dir.name}/audit.jsonl:2" in checked.stderr


def test_audit_verify_finds_a_deleted_last_line(tmp_path: Path, write_runbook: Any) -> None:
    run_dir = _finished_run(tmp_path, write_runbook)
    path = run_dir / "audit.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[:-1]))
    checked = verify(run_dir)
    assert checked.returncode == 1, checked.stdout + checked.stderr
    assert "tampered" in checked.stdout
    assert "removed" in checked.stderr


# ---- 3. edits between runs ---------------------------------------------------------------------


def test_resume_carries_the_vars_and_inventory_the_run_was_started_with(
    tmp_path: Path, write_runbook: Any, sshd: Any
) -> None:
    side, marker, logs = tmp_path / "side.txt", tmp_path / "marker", tmp_path / "logs"
    book = write_runbook(
        header("carry", tmp_path, extra_vars="  color: red\n")
        + steps_yaml(
            ["c1", "c2", "c3", "c4"],
            special={"c2": 'echo "c2-$color" >> "$side"', "c3": 'echo c3 >> "$side"; test -f "$marker"'},
        ),
        hosts="hosts:\n  box: {address: 127.0.0.1, port: 1}\n",  # nothing listens: the site file says where box is
    )
    site = tmp_path / "site.yaml"
    site.write_text(sshd.host_yaml())  # where `box` really is comes only from the inventory
    first = cli("run", str(book), "--inventory", str(site), "--var", "color=blue", "--log-dir", str(logs))
    assert first.returncode == 1, first.stderr
    assert side_lines(side) == ["c1", "c2-blue", "c3"]

    marker.touch()
    resumed = cli("run", str(book), "--resume", "--log-dir", str(logs))  # no --var, no --inventory
    assert resumed.returncode == 0, resumed.stderr
    assert f"as it was started: --inventory {site} --var color=blue" in resumed.stderr
    assert audited_steps(newest(logs)) == ["c3", "c4"]
    assert side_lines(side) == ["c1", "c2-blue", "c3", "c3", "c4"]

    changed = cli("run", str(book), "--resume", "--var", "color=green", "--log-dir", str(logs))
    assert changed.returncode == 0, changed.stderr
    # a --var given now overrides the carried one; every shell step gets every var, c1 too (README)
    assert audited_steps(newest(logs)) == ["c1", "c2", "c3", "c4"]
    assert side_lines(side)[-4:] == ["c1", "c2-green", "c3", "c4"]


def test_resume_carries_a_var_the_runbook_s_default_would_not_accept(tmp_path: Path, write_runbook: Any) -> None:
    """The default `port: CHANGE_ME` cannot render a deploy step: the resume must use the run's own --var."""
    logs, marker = tmp_path / "logs", tmp_path / "marker"
    book = write_runbook(
        header("needs-var", tmp_path, extra_vars="  port: CHANGE_ME\n")
        + steps_yaml(["n1"], special={"n1": 'test -f "$marker"'})
        + "  - id: serve\n    kind: stop_server\n    port: $port\n"
    )
    assert cli("run", str(book), "--log-dir", str(logs)).returncode == 2  # the default does not fit
    first = cli("run", str(book), "--var", "port=30001", "--log-dir", str(logs))
    assert first.returncode == 1, first.stderr
    marker.touch()
    resumed = cli("run", str(book), "--resume", "--log-dir", str(logs))
    assert "as it was started: --var port=30001" in resumed.stderr, resumed.stderr
    assert audited_steps(newest(logs))[:1] == ["n1"]


def test_a_var_holding_a_secret_is_not_carried_but_asked_for(tmp_path: Path, write_runbook: Any) -> None:
    logs, marker, token = tmp_path / "logs", tmp_path / "marker", "tok-" + secrets.token_hex(8)
    book = write_runbook(
        header("secret-var", tmp_path, extra_vars="  url: https://hub.example/none\n")
        + "secrets:\n  TOK: {env: TOK}\n"
        + steps_yaml(["s1"], special={"s1": 'echo "$url" >> "$side"; test -f "$marker"'})
    )
    given = f"url=https://hub.example/{token}"
    first = cli("run", str(book), "--var", given, "--log-dir", str(logs), env={"TOK": token})
    assert first.returncode == 1, first.stderr
    meta = json.loads((newest(logs) / "run.json").read_text())
    assert (meta["var_args"], meta["var_args_withheld"]) == ([], ["url"])
    assert token not in (newest(logs) / "run.json").read_text()

    marker.touch()
    refused = cli("run", str(book), "--resume", "--log-dir", str(logs), env={"TOK": token})
    assert refused.returncode == 2
    assert "started with --var url=... holding a secret's value" in refused.stderr
    again = cli("run", str(book), "--resume", "--var", given, "--log-dir", str(logs), env={"TOK": token})
    assert again.returncode == 0, again.stderr
    assert side_lines(tmp_path / "side.txt") == [f"https://hub.example/{token}"] * 2


# ---- 4. --from and --only ------------------------------------------------------------------------


def _facts_book(tmp_path: Path, write_runbook: Any) -> Path:
    body = header("from-only", tmp_path) + (
        "steps:\n"
        "  - id: a\n"
        "    kind: shell\n"
        "    parse: json\n"
        "    script: |\n"
        '      echo a >> "$side"\n'
        "      echo '{\"x\": 5}'\n"
        "  - id: b\n"
        "    kind: shell\n"
        '    script: echo b >> "$side"\n'
        "    gates:\n"
        "      - exit_code == 0\n"
        "      - that: steps.a.facts.x == 5\n"
        "        message: step a's facts did not arrive\n"
        "  - id: c\n"
        "    kind: shell\n"
        '    script: echo c >> "$side"\n'
    )
    return write_runbook(body)


def test_a_failed_only_run_is_continued_as_one_step(tmp_path: Path, write_runbook: Any) -> None:
    side, logs = tmp_path / "side.txt", tmp_path / "logs"
    book = write_runbook(
        header("only-again", tmp_path) + steps_yaml(["o1", "o2", "o3"], special={"o2": 'test -f "$marker"'})
    )
    marker = tmp_path / "site-marker"  # the runbook's own marker never exists: only this --var's can pass o2
    site = f"marker={marker}"
    marker.touch()
    assert cli("run", str(book), "--var", site, "--log-dir", str(logs)).returncode == 0
    marker.unlink()
    failed = cli("run", str(book), "--only", "o2", "--var", site, "--log-dir", str(logs))
    assert failed.returncode == 1
    hint = "after fixing the cause, continue where it stopped: "
    (said,) = [line.removeprefix(hint) for line in failed.stderr.splitlines() if line.startswith(hint)]
    # not --resume, which would run o3; the run's --var said again, as --only carries none over
    assert shlex.split(said)[3:] == ["--only", "o2", f"--var={site}", "--log-dir", str(logs)]
    marker.touch()
    assert cli(*shlex.split(said)[1:]).returncode == 0
    assert audited_steps(newest(logs)) == ["o2"]
    assert side_lines(side) == ["o1", "o3"]

    widened = cli("run", str(book), "--resume", "--log-dir", str(logs))  # what --only left out runs now
    assert re.search(r"o3 .* runs \(skipped in [0-9a-f-]+\)", widened.stderr), widened.stderr
    assert audited_steps(newest(logs)) == ["o3"]


def test_only_without_an_earlier_run_names_the_step_it_needs(tmp_path: Path, write_runbook: Any) -> None:
    side, logs = tmp_path / "side.txt", tmp_path / "logs"
    book = _facts_book(tmp_path, write_runbook)
    for option in ("--only", "--from"):
        done = cli("run", str(book), option, "b", "--log-dir", str(logs))
        assert done.returncode == 2, done.stdout + done.stderr
        assert "needs facts from step 'a'" in done.stderr and "'b'" in done.stderr
    unknown = cli("run", str(book), "--only", "nosuch", "--log-dir", str(logs))
    assert unknown.returncode == 2
    assert "no step 'nosuch'" in unknown.stderr
    assert not side.exists()  # nothing ran


# ---- 5. the run lock -----------------------------------------------------------------------------


def _pgrep(pattern: str) -> bool:
    return subprocess.run(["pgrep", "-f", pattern], capture_output=True).returncode == 0


def test_a_running_run_is_locked_and_a_killed_one_is_not(tmp_path: Path, write_runbook: Any) -> None:
    side, marker, logs = tmp_path / "side.txt", tmp_path / "marker", tmp_path / "logs"
    slow = 'echo l2 >> "$side"; [ -f "$marker" ] || sleep 30.31'
    book = write_runbook(header("locked", tmp_path) + steps_yaml(["l1", "l2", "l3"], special={"l2": slow}))

    proc = start("run", str(book), "--log-dir", str(logs))
    try:
        wait_for(lambda: "l2" in side_lines(side), what="the long step to start")
        run_id = runs(logs)[0]["run_id"]
        for resume in (["--resume"], ["--resume", run_id]):
            second = cli("run", str(book), *resume, "--log-dir", str(logs))
            assert second.returncode == 3, second.stdout + second.stderr
            assert "in use" in second.stderr
        assert [m["run_id"] for m in runs(logs)] == [run_id]  # the refused resume left no run behind
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=10)
    # the dead controller's connection closed, so the remote wrapper killed its step
    wait_for(lambda: not _pgrep(r"^sleep 30\.31$"), timeout=5, what="the orphaned remote sleep to be killed")

    marker.touch()
    again = cli("run", str(book), "--resume", run_id, "--log-dir", str(logs))
    assert again.returncode == 0, again.stderr
    new = newest(logs)
    assert json.loads((new / "run.json").read_text())["resumed_from"] == run_id
    assert audited_steps(new) == ["l2", "l3"]
    # the killed run's log has no record of l2's command: the resumed run's log says so first
    assert "l2" not in audited_steps(logs / run_id)
    first = audit_records(new)[0]
    assert (first["event"], first["step"], first["run"]) == ("abandoned", "l2", run_id)
    shown = cli("audit", "show", str(new)).stdout
    assert f"abandoned: was running when run {run_id} stopped" in shown
    assert verify(new).returncode == 0


# ---- 6. SIGINT / SIGTERM ---------------------------------------------------------------------------


@pytest.mark.parametrize(("sig", "seconds"), [(signal.SIGINT, 3457), (signal.SIGTERM, 3458), (signal.SIGHUP, 3459)])
def test_interrupt_kills_the_remote_step_and_resume_reruns_it(
    tmp_path: Path, write_runbook: Any, sig: signal.Signals, seconds: int
) -> None:
    marker, logs = tmp_path / "marker", tmp_path / "logs"
    pattern = f"^sleep {seconds}$"
    assert not _pgrep(pattern)
    long = f'echo i2 >> "$side"; [ -f "$marker" ] || sleep {seconds}'
    book = write_runbook(header("interrupted", tmp_path) + steps_yaml(["i1", "i2", "i3"], special={"i2": long}))

    proc = start("run", str(book), "--log-dir", str(logs))
    try:
        wait_for(lambda: _pgrep(pattern), what="the remote sleep")
        proc.send_signal(sig)
        code, _out, _err = finish(proc, timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert code == 130
    wait_for(lambda: not _pgrep(pattern), timeout=5, what="the remote sleep to be killed")

    status = status_json(logs)
    assert status["run"]["status"] == "interrupted"
    assert step_status(status) == {"i1": "passed", "i2": "interrupted", "i3": "pending"}
    run_dir = newest(logs)
    records = [r for r in audit_records(run_dir) if r["step"] == "i2"]
    assert len(records) == 1 and records[0]["interrupted"] is True

    marker.touch()
    again = cli("run", str(book), "--resume", "--log-dir", str(logs))
    assert again.returncode == 0, again.stderr
    assert audited_steps(newest(logs)) == ["i2", "i3"]
    assert step_status(status_json(logs)) == {"i1": "passed", "i2": "passed", "i3": "passed"}
    assert verify(newest(logs)).returncode == 0


# ---- 7. secrets ------------------------------------------------------------------------------------


def test_a_secret_is_written_nowhere(tmp_path: Path, write_runbook: Any) -> None:
    # a password-like value: JSON output escapes its quote and backslash, which must not leak either
    token = "tok-" + secrets.token_hex(12) + '-"q\\b'
    forms = {token, json.dumps(token)[1:-1]}
    assert len(forms) == 2
    logs = tmp_path / "logs"
    received = tmp_path / "received"
    as_json = 'python3 -c \'import json, os; print(json.dumps({"tok": os.environ["TOK"], "n": 1}))\''
    body = header("secretive", tmp_path, extra_vars=f"  received: {received}\n") + (
        "secrets:\n"
        "  TOK: {env: TOK}\n"
        "steps:\n"
        "  - id: show\n"
        "    kind: shell\n"
        "    script: |\n"
        '      printf %s "$TOK" > "$received"\n'
        '      echo "the token is $TOK"\n'
        '      echo "$TOK" >&2\n'
        "  - id: facts\n"
        "    kind: shell\n"
        "    parse: json\n"
        "    script: |\n"
        f"      {as_json}\n"
        "    gates:\n"
        "      - facts.n == 1\n"
        "      - facts.tok | length > 0\n"
        "  - id: boom\n"
        "    kind: shell\n"
        "    script: |\n"
        '      echo "failing with $TOK"\n'
        f"      {as_json} >&2\n"
        "      exit 3\n"
    )
    book = write_runbook(body)
    outputs = []
    for extra in ([], ["--json"]):
        done = cli("run", str(book), "--log-dir", str(logs), *extra, env={"TOK": token})
        assert done.returncode == 1, done.stderr
        outputs += [done.stdout, done.stderr]
    assert received.read_text() == token  # the secret did reach the host
    assert "failing with ***" in outputs[1] and "failing with ***" in outputs[2], outputs[1:3]
    run_dir = newest(logs)
    show = next(r for r in audit_records(run_dir) if r["step"] == "show")
    assert show["stdout"] == "the token is ***\n"
    assert json.loads((run_dir / "run.json").read_text())["secrets"] == ["TOK"]  # its name, not its value
    steps = status_json(logs)["steps"]
    assert steps[1]["facts"] == {"tok": "***", "n": 1}
    assert steps[2]["status"] == "failed"

    for command in (["status", "--json"], ["runs", "--json"], ["status"]):
        done = cli(*command, "--log-dir", str(logs))
        outputs += [done.stdout, done.stderr]
    done = cli("audit", "show", str(run_dir))
    outputs += [done.stdout, done.stderr]
    for text in outputs:
        for form in forms:
            assert form not in text
    files = [p for p in logs.rglob("*") if p.is_file()]
    assert len(files) >= 8
    for path in files:
        data = path.read_bytes()
        for form in forms:
            assert form.encode() not in data, (path, form)


def test_an_interrupt_in_a_retry_delay_keeps_why_the_attempt_failed(tmp_path: Path, write_runbook: Any) -> None:
    logs = tmp_path / "logs"
    book = write_runbook(
        header("retry-wait", tmp_path)
        + steps_yaml(["r1"], special={"r1": 'echo r1 >> "$side"; exit 3'})
        + "    retry: {attempts: 3, delay: 60s}\n    gates:\n      - that: exit_code == 0\n"
        + "        message: r1 must exit 0\n"
    )
    proc = start("run", str(book), "--log-dir", str(logs))
    wait_for(lambda: side_lines(tmp_path / "side.txt") == ["r1"], what="the first attempt")
    time.sleep(0.5)  # the attempt has failed; the run waits out the retry delay
    proc.send_signal(signal.SIGINT)
    code, _out, _err = finish(proc)
    assert code == 130
    (step,) = status_json(logs)["steps"]
    assert step["status"] == "interrupted" and step["gate"] == "exit_code == 0"
    assert "r1 must exit 0" in step["message"] and "exit_code = 3" in step["message"]


def test_under_nohup_a_hangup_does_not_stop_the_run(tmp_path: Path, write_runbook: Any) -> None:
    logs, marker = tmp_path / "logs", tmp_path / "marker"
    wait = 'echo h2 >> "$side"; while [ ! -f "$marker" ]; do sleep 0.05; done'
    book = write_runbook(header("nohup", tmp_path) + steps_yaml(["h1", "h2", "h3"], special={"h2": wait}))
    proc = subprocess.Popen(
        [*CLI, "run", str(book), "--log-dir", str(logs)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN),  # what `nohup` does
    )
    wait_for(lambda: "h2" in side_lines(tmp_path / "side.txt"), what="the second step to start")
    proc.send_signal(signal.SIGHUP)
    time.sleep(0.3)
    marker.touch()
    code, _out, err = finish(proc)
    assert code == 0, err
    assert side_lines(tmp_path / "side.txt") == ["h1", "h2", "h3"]


def test_a_second_interrupt_does_not_cut_the_clean_up_short(tmp_path: Path, write_runbook: Any) -> None:
    """A step that ignores TERM takes the wrapper's grace period to kill; Ctrl-C twice still records it."""
    logs, seconds = tmp_path / "logs", 3000 + secrets.randbelow(500)
    special = {"stubborn": f"trap '' TERM; echo started >> \"$side\"; sleep {seconds}"}
    book = write_runbook(header("twice", tmp_path) + steps_yaml(["stubborn"], special=special))
    proc = start("run", str(book), "--log-dir", str(logs))
    wait_for(lambda: (tmp_path / "side.txt").exists(), what="the step to start")
    proc.send_signal(signal.SIGINT)
    time.sleep(0.3)
    proc.send_signal(signal.SIGINT)
    code, _out, _err = finish(proc)
    assert code == 130
    (record,) = audit_records(newest(logs))
    assert record["interrupted"] is True
    assert not subprocess.run(["pgrep", "-f", f"^sleep {seconds}$"], capture_output=True).stdout


def test_how_commands_reach_the_host_is_not_part_of_a_step_s_definition(tmp_path: Path) -> None:
    from executor.run.resume import definition_parts, fingerprint
    from executor.runbook.loader import load_runbook

    def fingerprint_with(**host: object) -> str:
        settings = {"address": "gpu-box.example", **host}
        path = tmp_path / "book.yaml"
        path.write_text(
            f"name: t\nhosts: {{box: {json.dumps(settings)}}}\nsteps:\n  - {{id: a, kind: shell, script: echo}}\n"
        )
        runbook = load_runbook(path)
        return fingerprint(definition_parts(runbook, runbook.steps[0], "box", {}))

    plain = fingerprint_with()
    how = {
        "runner": "exec",
        "connect_timeout": "2m",  # the natural fix after a connection timeout
        "keepalive": "5s",
        "identity_file": "~/.ssh/other",
        "known_hosts": "/tmp/known",
        "verify_host_key": False,
        "proxy_jump": "bastion.example",
        "ssh_config": "/tmp/ssh_config",
    }
    for name, value in how.items():
        assert fingerprint_with(**{name: value}) == plain, f"changing {name} must rerun nothing"
    for name, value in {"address": "other.example", "port": 2222, "user": "deploy"}.items():
        assert fingerprint_with(**{name: value}) != plain, f"changing {name} is another place to run"


def test_editing_an_uploaded_file_reruns_the_step(tmp_path: Path, write_runbook: Any) -> None:
    side, logs, conf = tmp_path / "side.txt", tmp_path / "logs", tmp_path / "conf.txt"
    conf.write_text("v1\n")
    copied = tmp_path / "copied.txt"
    book = write_runbook(
        header("upload-edit", tmp_path)
        + steps_yaml(["u1", "u2", "u3"])
        + f"  - id: ship\n    kind: shell\n    upload: [{{src: conf.txt, dest: {copied}}}]\n"
        + '    script: echo ship >> "$side"\n'
    )
    assert cli("run", str(book), "--log-dir", str(logs)).returncode == 0
    assert cli("run", str(book), "--resume", "--log-dir", str(logs)).returncode == 0
    assert audited_steps(newest(logs)) == []  # same file: reused

    conf.write_text("v2\n")
    again = cli("run", str(book), "--resume", "--log-dir", str(logs))
    assert again.returncode == 0, again.stderr
    assert re.search(r"ship .* runs again \(changed since [0-9a-f-]+: file conf\.txt\)", again.stderr), again.stderr
    assert audited_steps(newest(logs)) == ["ship"]
    assert copied.read_text() == "v2\n"
    assert side_lines(side) == ["u1", "u2", "u3", "ship", "ship"]


def test_a_resume_whose_source_log_cannot_be_read_leaves_the_source_unlocked(tmp_path: Path) -> None:
    """An API caller's resume refused (StateError: the source run's audit.jsonl is no regular file) must not
    keep that run locked by its own process: after the folder is repaired, the same process resumes it."""
    book = tmp_path / "book.yaml"
    book.write_text(
        "name: unlocked\nhosts:\n  here: {address: local}\nsteps:\n  - {id: s, kind: shell, script: exit 1}\n"
    )
    logs = tmp_path / "logs"
    runbook = load_runbook(book)
    assert asyncio.run(Engine(runbook, RunOptions(log_dir=logs), Reporter()).run()) == 1
    (source,) = [p for p in logs.iterdir() if p.is_dir()]
    log = source / "audit.jsonl"
    kept = log.read_bytes()
    log.unlink()
    os.mkfifo(log)
    with pytest.raises(StateError, match="not a regular file"):
        asyncio.run(Engine(runbook, RunOptions(log_dir=logs, resume="latest"), Reporter()).run())
    assert not RunLock(source).held()
    log.unlink()
    log.write_bytes(kept)
    assert asyncio.run(Engine(runbook, RunOptions(log_dir=logs, resume="latest"), Reporter()).run()) == 1
