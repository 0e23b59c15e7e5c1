"""A full or failing disk on the controller: a failed durable write stops the run at once (exit 4).

The full disk is real: a small tmpfs mounted for the test holds the log folder, and a step (run over
SSH on the test sshd, which is this machine) fills it. The errno classes that cannot be produced for
real here (EIO, EROFS, EDQUOT) come from tests/executor/faultpoints.py, an in-process fault injection on
the write path, at every durable write in turn.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import errno
import json
import os
import re
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from executor.errors import DurableWriteError
from executor.redact import Redactor
from executor.run import audit
from executor.run.audit import AuditContext, AuditLog
from executor.transport.base import Collector
from steps.benchmark_figures import write_report
from tests.clirun import runbook_cli
from tests.steps.test_benchmark_report import BASELINE, DFLASH, PROVENANCE

REPO = Path(__file__).resolve().parents[2]
FAULTPOINTS = [sys.executable, "-m", "tests.executor.faultpoints"]


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 4 MiB tmpfs of its own: what fills it fills nothing else."""
    mount = tmp_path / "disk"
    mount.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root (CI runs as root)")
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4m,mode=0755", "tmpfs", str(mount)], capture_output=True, text=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    done = runbook_cli(*args)
    assert "Traceback" not in done.stderr, done.stderr
    return done


def records(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / audit.AUDIT_FILE
    lines = path.read_bytes().splitlines(keepends=True) if path.exists() else []
    return [json.loads(line) for line in lines if line.endswith(b"\n")]


def commands(run_dir: Path) -> list[tuple[str, int]]:
    return [(r["step"], r["attempt"]) for r in records(run_dir) if r["event"] == "command"]


def run_ids(logs: Path) -> list[str]:
    """Run folders with a run.json, oldest first."""
    metas = [json.loads(p.read_text()) for p in logs.glob("*/run.json")]
    return [m["run_id"] for m in sorted(metas, key=lambda m: m["started_at"])]


def stored(run_dir: Path) -> tuple[str | None, dict[str, str]]:
    """The run's status and each step's status, as its state.db holds them."""
    with contextlib.closing(sqlite3.connect(f"file:{run_dir / 'state.db'}?mode=ro", uri=True)) as db:
        row = db.execute("SELECT value FROM run WHERE key = 'status'").fetchone()
        return (row[0] if row else None), dict(db.execute("SELECT step, status FROM steps").fetchall())


def side(path: Path) -> list[str]:
    return path.read_text().split() if path.exists() else []


def book_text(name: str, folder: Path, steps: dict[str, str], hosts: str) -> str:
    lines = [
        f"name: {name}",
        hosts.rstrip("\n"),
        "defaults:",
        "  timeout: 60s",
        "  retry: {attempts: 3, delay: 0s}",  # a failed write must never be retried: a retry would show
        "vars:",
        f"  side: {folder / 'side.txt'}",
        f"  fill: {folder / 'fill'}",
        "steps:",
    ]
    for step_id, script in steps.items():
        lines += [f"  - id: {step_id}", "    kind: shell", f"    script: {json.dumps(script)}"]
    return "\n".join(lines) + "\n"


FILL = 'head -c 64M /dev/zero > "$fill" 2>/dev/null; '  # fills the 4 MiB tmpfs: ENOSPC, for real
LOUD = "head -c 40000 /dev/zero | tr '\\0' x; echo"  # a record larger than any page left over


def check_stopped(done: subprocess.CompletedProcess[str], logs: Path) -> None:
    """Exit 4 with the one paragraph: which folder, how much space is left, no traceback, no retry."""
    assert done.returncode == 4, (done.returncode, done.stderr)
    assert "Traceback" not in done.stderr and "failed unexpectedly" not in done.stderr, done.stderr
    said = [line for line in done.stderr.splitlines() if line.startswith("runbook: the run stopped: cannot write")]
    assert len(said) == 1, done.stderr
    assert f" in {logs}" in said[0] and re.search(r"\(\d+(\.\d)? (bytes|KiB|MiB|GiB|TiB) free there\)", said[0])
    assert "--resume" in said[0] and "attempt 2" not in done.stderr


def test_a_full_log_disk_stops_the_run_and_resume_continues(
    small_disk: Path, tmp_path: Path, write_runbook: Any, sshd: Any
) -> None:
    logs, fill = small_disk / "logs", small_disk / "fill"
    steps = {
        "d1": 'echo d1 >> "$side"',
        "d2": f'echo d2 >> "$side"; [ -f {tmp_path / "fixed"} ] || {{ {FILL}}}; {LOUD}',
        "d3": 'echo d3 >> "$side"',
    }
    book = write_runbook(book_text("full-disk", small_disk, steps, "__HOSTS__\n"))
    (small_disk / "side.txt").touch()  # its one page is there before the disk fills

    first = cli("run", str(book), "--log-dir", str(logs))
    check_stopped(first, logs)
    assert "No space left on device (ENOSPC)" in first.stderr and "(0 bytes free there)" in first.stderr
    assert side(small_disk / "side.txt") == ["d1", "d2"]  # nothing started after the failed write
    (killed,) = run_ids(logs)
    run_status, steps_status = stored(logs / killed)
    assert run_status != "passed" and steps_status["d2"] == "running" and steps_status["d3"] == "pending"
    assert commands(logs / killed) == [("d1", 1)]  # d2's record did not fit: rolled back, not left torn
    assert (logs / killed / audit.AUDIT_FILE).read_bytes().endswith(b"\n")
    intact = cli("audit", "verify", str(logs / killed))
    assert intact.returncode == 0 and "intact: 1 records" in intact.stdout, intact.stdout + intact.stderr
    shown = cli("status", "--log-dir", str(logs))
    assert shown.returncode == 0 and "d2" in shown.stdout and "passed" not in shown.stdout.splitlines()[0]

    still = cli("run", str(book), "--resume", "--log-dir", str(logs))  # the disk is still full
    check_stopped(still, logs)
    assert run_ids(logs) == [killed] and side(small_disk / "side.txt") == ["d1", "d2"]  # no run, nothing ran

    fill.unlink()  # space is back
    (tmp_path / "fixed").touch()
    again = cli("run", str(book), "--resume", "--log-dir", str(logs))
    assert again.returncode == 0, again.stderr
    resumed = logs / run_ids(logs)[-1]
    assert commands(resumed) == [("d2", 1), ("d3", 1)]  # d1, which passed, did not run again
    assert side(small_disk / "side.txt") == ["d1", "d2", "d2", "d3"]
    first_record = records(resumed)[0]
    assert (first_record["event"], first_record["step"], first_record["recorded_lines"]) == ("abandoned", "d2", [])
    assert "left no record" in first_record["note"]
    whole = cli("audit", "verify", str(resumed))
    assert whole.returncode == 0 and "intact: 4 records in 2 run(s)" in whole.stdout, whole.stdout + whole.stderr


def test_a_full_disk_stops_every_host_of_the_step_at_once(
    small_disk: Path, tmp_path: Path, write_runbook: Any, sshd: Any
) -> None:
    """One host's record cannot be written: the other host's long command is killed, not waited for,
    and no host starts another command (each step would retry three times if it were a step failure)."""
    logs, marker, lock = small_disk / "logs", tmp_path / "slow-started", tmp_path / "slow-lock"
    hosts = sshd.host_yaml("one") + "\n".join(sshd.host_yaml("two").splitlines()[1:]) + "\n"
    said = tmp_path / "log.txt"
    steps = {  # both hosts are the test sshd: whichever comes first is the slow one, the other fills the disk
        "both": (
            f"if mkdir {lock} 2>/dev/null; then echo slow >> {said}; touch {marker}; exec sleep 3461; fi; "
            f"while [ ! -f {marker} ]; do sleep 0.05; done; echo fast >> {said}; {FILL}{LOUD}"
        ),
        "after": "echo after",
    }
    text = book_text("two-hosts", small_disk, steps, hosts).replace(
        "    kind: shell\n", "    kind: shell\n    hosts: all\n"
    )
    book = tmp_path / "book.yaml"
    book.write_text(text)

    done = cli("run", str(book), "--log-dir", str(logs))
    check_stopped(done, logs)
    assert sorted(side(said)) == ["fast", "slow"]  # one command each, none retried
    assert subprocess.run(["pgrep", "-f", "^sleep 3461$"], capture_output=True).returncode == 1
    (killed,) = run_ids(logs)
    run_status, _ = stored(logs / killed)
    assert run_status != "passed"


def _under_faults(book: Path, logs: Path, journal: Path, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("RUNBOOK_FAULT_")}
    base["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    base |= {"RUNBOOK_FAULT_JOURNAL": str(journal), **env}
    return subprocess.run(
        [*FAULTPOINTS, "run", str(book), "--log-dir", str(logs)],
        capture_output=True,
        text=True,
        timeout=60,
        env=base,
        stdin=subprocess.DEVNULL,
    )


ERRNOS = ["EIO", "ENOSPC", "EROFS", "EDQUOT"]


def test_a_failed_write_at_every_durable_write_stops_the_run(tmp_path: Path, write_runbook: Any) -> None:
    """In-process fault injection (faultpoints.py): each durable write in turn fails with EIO, ENOSPC,
    EROFS or EDQUOT, once (a moment) or from then on (a longer trouble), an audit line also torn half-way.
    Every time: exit 4 naming the folder, never a retry or a step failure, never a passed run, an audit
    log `verify` calls intact, and `--resume` completes the run without running what passed again."""
    ids = ["f1", "f2"]
    steps = {step_id: f'echo {step_id} >> "$side"' for step_id in ids}

    def book_in(folder: Path) -> Path:
        folder.mkdir()
        path: Path = write_runbook(book_text("faults", folder, steps, "__HOSTS__\n"), name=f"{folder.name}.yaml")
        return path

    book = book_in(tmp_path / "baseline")
    done = _under_faults(book, tmp_path / "baseline" / "logs", tmp_path / "baseline" / "journal")
    assert done.returncode == 0, done.stderr
    points = (tmp_path / "baseline" / "journal").read_text().split()
    assert {"write:audit.jsonl", "write:audit.head", "write:run.json.partial", "sqlite:steps", "sqlite:run"} == set(
        points
    ), points
    cases = []
    for n, point in enumerate(points, start=1):
        cases.append((n, ERRNOS[n % 4], "once" if n % 2 else "rest", ""))
        if point == "write:audit.jsonl":
            cases.append((n, "ENOSPC", "rest", "1"))

    def check(n: int, code: str, span: str, torn: str) -> None:
        folder = tmp_path / f"case{n}-{code}-{span}{'-torn' if torn else ''}"
        book, logs = book_in(folder), folder / "logs"
        context = f"write #{n} ({points[n - 1]}) fails with {code}, {span}{', torn' if torn else ''}"
        failed = _under_faults(
            book, logs, folder / "journal", RUNBOOK_FAULT_AT=str(n), RUNBOOK_FAULT_ERRNO=code,
            RUNBOOK_FAULT_SPAN=span, RUNBOOK_FAULT_TORN=torn,
        )  # fmt: skip
        check_stopped(failed, logs)
        # the errno is named: SQLite reports a quota as a full disk (SQLITE_FULL), which reads as ENOSPC
        named = "ENOSPC" if code == "EDQUOT" and "SQLITE_FULL" in failed.stderr else code
        assert re.search(rf"\b{named}\)", failed.stderr), (context, failed.stderr)
        ran = side(folder / "side.txt")
        if not run_ids(logs):  # it failed before its run.json was made durable: no run to resume
            assert ran == [], context
            again = cli("run", str(book), "--resume", "--log-dir", str(logs))
            assert again.returncode == 2 and "nothing to resume" in again.stderr, (context, again.stderr)
            assert cli("run", str(book), "--log-dir", str(logs)).returncode == 0, context
            return
        (stopped,) = run_ids(logs)
        run_status, steps_status = stored(logs / stopped)
        assert run_status in ("running", "write-failed"), (context, run_status)
        assert all(attempt == 1 for _step, attempt in commands(logs / stopped)), context
        assert "failed" not in steps_status.values(), (context, steps_status)
        intact = cli("audit", "verify", str(logs / stopped))
        assert intact.returncode == 0, (context, intact.stdout, intact.stderr)
        passed = {s for s, status in steps_status.items() if status == "passed"}
        running = [s for s, status in steps_status.items() if status == "running"]

        again = cli("run", str(book), "--resume", "--log-dir", str(logs))
        assert again.returncode == 0, (context, again.stderr)
        resumed = logs / run_ids(logs)[-1]
        assert not {s for s, _ in commands(resumed)} & passed, context
        assert sorted(side(folder / "side.txt")) == sorted(ran + [s for s in ids if s not in passed]), context
        abandoned = [r for r in records(resumed) if r["event"] == "abandoned"]
        assert [r["step"] for r in abandoned] == running, context
        for record in abandoned:  # it says what the stopped run's log holds of that attempt, no more
            held = [
                number
                for number, rec, _raw in audit.read_records(logs / stopped)
                if rec is not None and (rec.get("step"), rec.get("attempt")) == (record["step"], record["attempt"])
            ]
            assert record["recorded_lines"] == held, (context, record)
        whole = cli("audit", "verify", str(resumed))
        assert whole.returncode == 0 and "2 run(s)" in whole.stdout, (context, whole.stdout, whole.stderr)

    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        for future in [pool.submit(check, *case) for case in cases]:
            future.result()


# ---- the write path itself, on a real full disk ------------------------------------------------


def _result(stdout: bytes) -> Any:
    collect = Collector()
    collect.stdout.feed(stdout)
    return collect.result(0)


def _fill(folder: Path, most: int = 64 << 20) -> None:
    """Write until the disk is full (its 4 MiB), failing after `most` bytes: not the small disk, never full."""
    with contextlib.suppress(OSError), (folder / "fill").open("wb") as handle:
        for _ in range(most // 65536):
            handle.write(b"\0" * 65536)
            handle.flush()
        pytest.fail(f"{folder} took {most} bytes and is not full: not the 4 MiB disk")


def test_an_audit_line_that_does_not_fit_is_rolled_back(small_disk: Path) -> None:
    run_dir = small_disk / "run"
    run_dir.mkdir()
    log = AuditLog(run_dir, "run-1", Redactor([]))
    log.command(AuditContext(step="s", host="h", attempt=1), "echo 1", _result(b"ok\n"))
    before = (run_dir / audit.AUDIT_FILE).read_bytes()
    _fill(small_disk)
    with pytest.raises(DurableWriteError) as raised:
        log.command(AuditContext(step="s", host="h", attempt=2), "echo 2", _result(b"x" * 200_000))
    assert raised.value.errno == errno.ENOSPC and raised.value.free_bytes == 0
    assert raised.value.folder == str(run_dir) and "audit log" in str(raised.value)
    assert (run_dir / audit.AUDIT_FILE).read_bytes() == before  # no part of the record stayed
    (small_disk / "fill").unlink()
    log.command(AuditContext(step="s", host="h", attempt=3), "echo 3", _result(b"ok\n"))  # the chain goes on
    log.close()
    report = audit.verify(run_dir)
    assert report.ok and report.records == 2 and not report.notes, report


def test_a_report_that_does_not_fit_raises_a_durable_write_error(small_disk: Path) -> None:
    run_dir = small_disk / "run"
    run_dir.mkdir()
    _fill(small_disk)
    with pytest.raises(DurableWriteError) as raised:
        write_report(run_dir, BASELINE, DFLASH, PROVENANCE)
    assert raised.value.errno == errno.ENOSPC and "report" in raised.value.what
    assert not list(run_dir.glob("*.tmp"))  # nothing half-written left behind


def test_a_fetch_into_a_full_run_folder_stops_the_run(
    small_disk: Path, tmp_path: Path, write_runbook: Any, sshd: Any
) -> None:
    logs, big = small_disk / "logs", tmp_path / "big.bin"
    big.write_bytes(os.urandom(8 << 20))  # random: no holes to keep, twice the disk
    text = book_text("fetch-full", tmp_path, {"f1": "true", "f2": 'echo f2 >> "$side"'}, "__HOSTS__\n")
    text = text.replace('    script: "true"\n', f'    script: "true"\n    fetch: [{{src: {big}, dest: big.bin}}]\n', 1)
    book = write_runbook(text)
    done = cli("run", str(book), "--log-dir", str(logs))
    check_stopped(done, logs)
    assert "a fetched file" in done.stderr and side(tmp_path / "side.txt") == []  # f2 never started
