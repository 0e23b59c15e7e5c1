"""The audit log: hash chain, durability details, truncation, redaction, tamper detection."""

from __future__ import annotations

import hashlib
import io
import json
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from executor import files
from executor.faces.cli import main
from executor.redact import Redactor
from executor.run import audit
from executor.run.audit import AuditContext, AuditLog, verify
from executor.run.state import RunMeta, RunState, StepRecord, now
from executor.transport.base import Collector, CommandResult
from tests.clirun import runbook_cli

SECRET = "hf_SeCrEt_ToKeN_123"


def result(stdout: bytes = b"ok\n", exit_code: int = 0):  # type: ignore[no-untyped-def]
    collect = Collector()
    collect.stdout.feed(stdout)
    return collect.result(exit_code)


def write_log(run_dir: Path, records: int = 4, stdout: bytes = b"ok\n") -> AuditLog:
    run_dir.mkdir(parents=True, exist_ok=True)
    log = AuditLog(run_dir, "run-1", Redactor([SECRET]))
    for attempt in range(1, records + 1):
        bound = AuditContext(step="s", host="box", attempt=attempt)
        log.command(bound, f"echo {attempt}", result(stdout))
    log.close()
    return log


def lines(run_dir: Path) -> list[str]:
    return (run_dir / audit.AUDIT_FILE).read_text().splitlines()


def test_records_carry_the_required_fields_and_chain(tmp_path: Path) -> None:
    write_log(tmp_path / "r")
    records = [json.loads(line) for line in lines(tmp_path / "r")]
    first = records[0]
    for key in (
        "run_id",
        "step",
        "attempt",
        "host",
        "command",
        "exit_code",
        "timed_out",
        "stdout",
        "stderr",
        "stdout_bytes",
        "stdout_sha256",
        "started_at",
        "duration_s",
        "prev_hash",
        "hash",
    ):
        assert key in first, key
    assert first["prev_hash"] == audit.GENESIS
    assert [r["prev_hash"] for r in records[1:]] == [r["hash"] for r in records[:-1]]
    assert verify(tmp_path / "r").ok


def test_files_are_private(tmp_path: Path) -> None:
    write_log(tmp_path / "r")
    for name in (audit.AUDIT_FILE, audit.HEAD_FILE):
        assert stat.S_IMODE((tmp_path / "r" / name).stat().st_mode) == 0o600


def test_large_output_is_clipped_with_full_count_and_hash(tmp_path: Path) -> None:
    big = b"x" * 300_000 + b"THE END\n"
    write_log(tmp_path / "r", records=1, stdout=big)
    record = json.loads(lines(tmp_path / "r")[0])
    assert record["stdout_truncated"] is True
    assert record["stdout_bytes"] == len(big)
    assert record["stdout_sha256"] == hashlib.sha256(big).hexdigest()
    assert record["stdout"].endswith("THE END\n") and "characters omitted" in record["stdout"]
    assert len(record["stdout"]) < 100_000


def test_secret_values_are_redacted_by_value(tmp_path: Path) -> None:
    run_dir = tmp_path / "r"
    run_dir.mkdir()
    log = AuditLog(run_dir, "run-1", Redactor([SECRET]))
    log.command(
        AuditContext(step="s", host="h", attempt=1),
        f"curl -H 'Authorization: {SECRET}'",
        result(f"token={SECRET}\n".encode()),
    )
    log.close()
    text = (run_dir / audit.AUDIT_FILE).read_text()
    assert SECRET not in text and "***" in text
    assert verify(run_dir).ok


def test_the_record_format_is_pinned(tmp_path: Path) -> None:
    """Every kind of record, byte for byte as runs before the plain writer wrote them (the hash of the last
    line covers every line before it): a changed key, value or order of serialization changes it."""
    run_dir = tmp_path / "r"
    run_dir.mkdir()
    log = AuditLog(run_dir, "run-1", Redactor([SECRET]))
    done = CommandResult(
        0, f"tok {SECRET}\n".encode(), b"", 9, 0, "a" * 64, "b" * 64, "2026-12-01T00:00:00.000000+00:00", 0.25
    )
    attempt = AuditContext(step="s", host="box", attempt=1, via="primary")
    log.host_key_unverified("box")
    log.command(attempt, f"echo {SECRET}", done)
    log.transfer(attempt, "put", "/l", "/r", 3, "c" * 64)
    log.abandoned(AuditContext(step="s", host="box", attempt=2), "run-0", None, 2, audit.Abandoned([1], 0, False))
    log.finish()
    log.close()
    first = json.loads(lines(run_dir)[0])
    assert first == {
        "event": "host_key_unverified",
        "hash": "3a0dc1417a5e74415eabf310638641a432708fb0537d385a19b48b7f6d8d858f",
        "host": "box",
        "note": "host key verification is off for box",
        "prev_hash": audit.GENESIS,
        "run_id": "run-1",
        "seq": 1,
    }
    assert log.position == (4, "cdecd7f415d9912f7007c0715d6368a16fa36f6a81d3c2b74d9b6686bf8001ea")
    assert json.loads((run_dir / audit.HEAD_FILE).read_text()) == {"count": 4, "hash": log.position[1]}
    assert verify(run_dir).ok


@pytest.mark.parametrize(
    ("tamper", "expected"),
    [
        ("edit", "audit.jsonl:2: content does not match its hash"),
        ("delete_middle", "audit.jsonl:2: chain broken"),
        ("reorder", "audit.jsonl:2: chain broken"),
        ("delete_last", "log has 3 records but the run recorded 4"),
    ],
)
def test_tampering_is_found_with_its_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], tamper: str, expected: str
) -> None:
    run_dir = tmp_path / "r"
    write_log(run_dir)
    content = lines(run_dir)
    if tamper == "edit":
        record = json.loads(content[1])
        record["exit_code"] = 1
        content[1] = json.dumps(record, sort_keys=True, separators=(",", ":"))
    elif tamper == "delete_middle":
        del content[1]
    elif tamper == "reorder":
        content[1], content[2] = content[2], content[1]
    else:
        del content[-1]
    (run_dir / audit.AUDIT_FILE).write_text("\n".join(content) + "\n")
    assert main(["audit", "verify", str(run_dir)]) == 1
    captured = capsys.readouterr()
    assert expected in captured.err
    assert captured.out.startswith("tampered")


def _tampered(lines: list[str], how: str) -> list[str]:
    """A finished run's log of three records (one per step), tampered with at its second line as `how` says."""
    second = json.loads(lines[1])
    second["exit_code"] = 7  # what an edit changes: the step's outcome
    if how == "edited":
        lines[1] = audit.canonical(second)
    elif how == "edited, its hash computed again":
        second["hash"] = audit.record_hash(second)
        lines[1] = audit.canonical(second)
    elif how == "removed":
        del lines[1]
    elif how == "removed, the next edited":
        third = json.loads(lines.pop(2))
        third["exit_code"] = 7
        lines[1] = audit.canonical(third)
    else:  # added: a record made up after the first, its hash not of the chain
        second["step"] = "made-up"
        lines.insert(1, audit.canonical(second))
    return lines


@pytest.mark.parametrize(
    ("how", "said", "not_said"),
    [
        ("edited", "audit.jsonl:2: content does not match its hash: line 2 (record 2) was edited", "removed"),
        ("edited, its hash computed again", "audit.jsonl:2: edited, its hash computed again: line 3", "removed"),
        ("removed", "audit.jsonl:2: chain broken: record 2 was removed before this line", "edited"),
        ("added", "audit.jsonl:2: a line was added here", "edited"),
        (  # the edit hid the removal before it
            "removed, the next edited",
            "audit.jsonl:2: content does not match its hash: line 2 (record 3) was edited; record 2 was removed "
            "before it",
            "lines were moved",
        ),
    ],
)
def test_verify_says_whether_a_line_was_edited_removed_or_added(
    tmp_path: Path, how: str, said: str, not_said: str
) -> None:
    """`audit verify` through the CLI on a real run's folder (three steps on `address: local`): each tampering is
    named as what it is, at its line, once; an edit is no longer also reported as lines removed or cut (the
    walk goes on past it), a removal or an added line no longer as an edit."""
    book = tmp_path / "b.yaml"
    steps = "".join(f"  - {{id: a{n}, kind: shell, script: echo a{n}}}\n" for n in (1, 2, 3))
    book.write_text(f"name: t\nhosts: {{h: {{address: local}}}}\nsteps:\n{steps}")
    logs = tmp_path / "logs"
    assert runbook_cli("run", str(book), "--log-dir", str(logs)).returncode == 0
    (run_dir,) = logs.iterdir()
    (run_dir / audit.AUDIT_FILE).write_text("\n".join(_tampered(lines(run_dir), how)) + "\n")
    checked = runbook_cli("audit", "verify", str(run_dir))
    assert checked.returncode == 1, checked.stderr
    problems = [line for line in checked.stderr.splitlines() if line.startswith("TAMPERED: ")]
    assert len(problems) == 1 and said in problems[0], problems
    assert not_said not in checked.stderr
    assert checked.stdout.startswith(f"tampered: {3 - how.startswith('removed') + (how == 'added')} records")


def test_torn_last_line_is_reported_and_tolerated(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = tmp_path / "r"
    write_log(run_dir)
    with (run_dir / audit.AUDIT_FILE).open("a") as handle:
        handle.write('{"run_id":"run-1","step":"s","comm')
    assert main(["audit", "verify", str(run_dir)]) == 0
    captured = capsys.readouterr()
    assert "audit.jsonl:5: torn last line" in captured.err
    assert captured.out.startswith("intact: 4 records")


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(line=st.text(alphabet=st.characters(blacklist_characters="\n", blacklist_categories=("Cs",)), max_size=60))
def test_a_whole_last_line_that_is_no_record_is_tampering(tmp_path_factory: pytest.TempPathFactory, line: str) -> None:
    """A record is written with its newline in one write, and JSON escapes every other newline: a cut
    write never ends in one. So a last line that ends in a newline but is no record (`garbage`, `[1]`,
    an empty line) was added, not torn; it was tolerated as a torn line, and the run verified intact."""
    run_dir = tmp_path_factory.mktemp("r")
    write_log(run_dir)
    with (run_dir / audit.AUDIT_FILE).open("a") as handle:
        handle.write(line + "\n")
    report = verify(run_dir)
    assert not report.ok, report
    assert not any("torn" in note for note in report.notes), report.notes


def test_torn_line_in_the_middle_is_tampering(tmp_path: Path) -> None:
    run_dir = tmp_path / "r"
    write_log(run_dir)
    content = lines(run_dir)
    content[1] = content[1][:40]
    (run_dir / audit.AUDIT_FILE).write_text("\n".join(content) + "\n")
    report = verify(run_dir)
    assert not report.ok and "audit.jsonl:2: not a complete JSON record" in report.problems[0]


def test_a_head_that_lags_is_tolerated_but_a_rewritten_log_is_not(tmp_path: Path) -> None:
    run_dir = tmp_path / "r"
    write_log(run_dir)
    records = [json.loads(line) for line in lines(run_dir)]
    (run_dir / audit.HEAD_FILE).write_text(json.dumps({"count": 2, "hash": records[1]["hash"]}))
    report = verify(run_dir)
    assert report.ok and "the last 2 record(s) were written just before the run stopped" in report.notes[0]
    (run_dir / audit.HEAD_FILE).write_text(json.dumps({"count": 2, "hash": records[2]["hash"]}))
    report = verify(run_dir)
    assert not report.ok and "record 2 does not match the recorded head" in report.problems[0]


def test_a_deleted_audit_log_is_tampering(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = tmp_path / "r"
    write_log(run_dir)
    (run_dir / "run.json").write_text("{}")
    (run_dir / audit.AUDIT_FILE).unlink()
    assert main(["audit", "verify", str(run_dir)]) == 1
    assert "is gone" in capsys.readouterr().err
    assert main(["audit", "verify", str(tmp_path)]) == 2


def test_verify_of_a_live_run_that_writes_while_it_reads_is_no_alarm(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`audit verify` on a run still running: a record, its head and a step save written after verify read
    the log (the run went on) are no cut and no removed lines; what it recorded beside the log is read first."""
    run_dir = tmp_path / "run-1"
    meta = RunMeta(run_id="run-1", runbook="live", path=str(tmp_path / "live.yaml"), started_at=now())
    state = RunState.create(run_dir, meta)
    log = AuditLog(run_dir, "run-1", Redactor([SECRET]))
    bound = AuditContext(step="s", host="box", attempt=1)
    step = StepRecord(step="s", host="box", position=0, status="running", fingerprint="", attempts=1)
    log.command(bound, "echo 1", result())
    state.save(step, audit=log.position)
    reading = audit.read_records

    def then_the_run_goes_on(folder: Path) -> Iterator[tuple[int, dict[str, Any] | None, bytes]]:
        yield from reading(folder)
        log.command(bound, "echo 2", result())
        state.save(step, audit=log.position)

    monkeypatch.setattr(audit, "read_records", then_the_run_goes_on)
    try:
        report = verify(run_dir)
    finally:
        log.close()
        state.close()
    assert report.ok, report.problems
    assert report.records == 1  # what it read; the record written after is the next verify's


def test_a_head_read_while_the_live_run_rewrites_it_is_checked_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A live run rewrites its head in place: a read that meets the write sees part of each head (a torn
    read; the same one again while the writer is paused mid-write). verify checks a running run again."""
    run_dir = tmp_path / "run-1"
    meta = RunMeta(run_id="run-1", runbook="live", path=str(tmp_path / "live.yaml"), started_at=now())
    state = RunState.create(run_dir, meta)
    log = AuditLog(run_dir, "run-1", Redactor([SECRET]))
    for attempt in (1, 2):
        log.command(AuditContext(step="s", host="box", attempt=attempt), "echo", result())
    whole = (run_dir / audit.HEAD_FILE).read_bytes()
    torn = whole[:30] + b"f" * 8 + whole[38:]  # the new head's first bytes over the old one's rest
    torn_reads = iter([True, True, True])
    opened = files.open_run_file

    def open_run_file(path: Path) -> Any:
        return io.BytesIO(torn) if path.name == audit.HEAD_FILE and next(torn_reads, False) else opened(path)

    monkeypatch.setattr(audit, "open_run_file", open_run_file)
    try:
        report = verify(run_dir)
        torn_reads = iter([True] * audit.LIVE_CHECKS)  # torn every time: what tampering looks like
        tampered = verify(run_dir)
    finally:
        log.close()
        state.close()
    assert report.ok, report.problems
    assert tampered.problems == ["run-1: record 2 does not match the recorded head: the log was rewritten"]


@pytest.mark.parametrize("order", ["RUN_DIR --key", "--key RUN_DIR", "--key KEY RUN_DIR", "RUN_DIR --key KEY"])
def test_verify_takes_the_run_folder_before_or_after_key(tmp_path: Path, order: str) -> None:
    """`--key` takes an optional PATH: argparse gave `audit verify --key RUN_DIR` the run folder as the key and
    asked for a run folder (exit 2). A folder is the run, checked with the default key; without one, exit 2 says
    what to type."""
    config = {"XDG_CONFIG_HOME": str(tmp_path / "config")}
    assert runbook_cli("audit", "key", env=config).returncode == 0
    book = tmp_path / "b.yaml"
    book.write_text("name: t\nhosts: {h: {address: local}}\nsteps:\n  - {id: a, kind: shell, script: echo}\n")
    assert runbook_cli("run", str(book), "--log-dir", str(tmp_path / "logs"), env=config).returncode == 0
    (run_dir,) = (tmp_path / "logs").iterdir()
    key = tmp_path / "config" / "runbook" / "audit.key"
    words = order.replace("RUN_DIR", str(run_dir)).replace("KEY", str(key)).split()
    checked = runbook_cli("audit", "verify", *words, env=config)
    assert checked.returncode == 0, checked.stderr
    assert checked.stdout.startswith("intact: 1 records") and "seal checked" in checked.stdout
    alone = runbook_cli("audit", "verify", "--key", env=config)
    assert alone.returncode == 2 and alone.stderr.splitlines()[-1].endswith(
        "which run? give its folder: runbook audit verify RUN_DIR [--key [PATH]]"
    )
