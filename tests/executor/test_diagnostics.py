"""The controller's diagnostics (executor/diagnostics.py): a run writes debug.log in its folder, JSON lines
with run, step, host and attempt bound where they are known, masked by the run's Redactor; `-v` shows them on
stderr, never on stdout; runs in one process never share a logger (no global structlog state)."""

from __future__ import annotations

import asyncio
import errno
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import structlog

from executor import diagnostics
from executor.diagnostics import DEBUG_FILE, DebugLog, route_asyncssh
from executor.errors import DurableWriteError
from executor.redact import Redactor
from executor.run.audit import AuditLog
from executor.run.engine import WRITE_FAILED, Engine, RunOptions
from executor.run.events import Reporter
from executor.run.state import open_state
from executor.runbook.loader import load_runbook
from sandbox.sshd import SSHServer
from tests.clirun import runbook_cli

SECRET = "s3cr3t-diagnostic-value"
#: a step that fails its first attempt (a retry is scheduled) and passes the second; `b` runs a fallback
#: (`a`'s gate reads its stdout, so a gate worker starts: the default gate is evaluated in the run itself)
RUNBOOK = """\
name: diag
__HOSTS__
vars: {marker: none}
secrets:
  TOKEN: {env: RB_DIAG_TOKEN}
defaults: {retry: {attempts: 2, delay: 10ms}}
steps:
  - id: a
    kind: shell
    script: |
      echo "token $TOKEN"
      test -e "$marker" || { touch "$marker"; exit 3; }
    gates:
      - that: exit_code == 0 and 'token' in stdout  # reads stdout: a gate worker evaluates it
  - id: b
    kind: shell
    retry: {attempts: 1}
    script: exit 1
    fallbacks:
      - script: echo fallback
"""


def debug_lines(logs: Path) -> list[dict[str, Any]]:
    (run_dir,) = [p for p in logs.iterdir() if p.is_dir()]
    text = (run_dir / DEBUG_FILE).read_text()
    return [json.loads(line) for line in text.splitlines()]


def run_cli(book: Path, logs: Path, *extra: str) -> tuple[str, str]:
    """Run RUNBOOK; its step `a` fails once per log folder (the marker is the folder's)."""
    marker = f"marker={logs}.marker"
    done = runbook_cli("run", str(book), "--log-dir", str(logs), "--var", marker, *extra, env={"RB_DIAG_TOKEN": SECRET})
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    return done.stdout, done.stderr


def test_a_run_writes_debug_log_with_its_fields_bound(write_runbook: Callable[..., Path], tmp_path: Path) -> None:
    book = write_runbook(RUNBOOK)
    _, err = run_cli(book, tmp_path / "logs")
    lines = debug_lines(tmp_path / "logs")
    (run_dir,) = [p for p in (tmp_path / "logs").iterdir() if p.is_dir()]
    run_id = run_dir.name
    assert all(line["run_id"] == run_id and {"time", "level", "event"} <= line.keys() for line in lines)
    events = [line["event"] for line in lines]
    assert events[0] == "run started" and events[-1] == "run finished"
    commands = [line for line in lines if line["event"] == "command finished"]  # from inside an attempt
    assert [(c["step"], c["host"], c["attempt"], c["via"], c["exit_code"]) for c in commands] == [
        ("a", "box", 1, "primary", 3),
        ("a", "box", 2, "primary", 0),
        ("b", "box", 1, "primary", 1),
        ("b", "box", 2, "fallback 1", 0),
    ]
    (retry,) = [line for line in lines if line["event"] == "retry scheduled"]
    assert (retry["step"], retry["host"], retry["attempt"]) == ("a", "box", 1) and retry["delay_s"] >= 0
    (fallback,) = [line for line in lines if line["event"] == "fallback taken"]
    assert (fallback["step"], fallback["via"]) == ("b", "fallback 1") and "non-zero status" in fallback["after"]
    (opened,) = [line for line in lines if line["event"] == "connection opened"]  # bound at the connection
    assert (opened["host"], opened["connection"], opened["address"]) == ("box", 1, "127.0.0.1")
    assert any(line["event"] == "runner started" and line["connection"] == 1 for line in lines)
    assert any(line["event"] == "gate worker started" for line in lines)
    assert any(line.get("logger", "").startswith("asyncssh") for line in lines)  # asyncssh's own, routed here
    assert SECRET not in (run_dir / DEBUG_FILE).read_text()
    assert "debug:" not in err  # without -v, nothing of it on the console
    assert (run_dir / DEBUG_FILE).stat().st_mode & 0o077 == 0


def test_verbose_shows_the_diagnostics_on_stderr_and_json_stdout_stays_events(
    write_runbook: Callable[..., Path], tmp_path: Path
) -> None:
    book = write_runbook(RUNBOOK)
    _, err = run_cli(book, tmp_path / "logs", "-v")
    assert "debug: command finished" in err and "step=a" in err and "attempt=2" in err and "run_id=" in err
    assert SECRET not in err
    out, err = run_cli(book, tmp_path / "logs-json", "--json", "--verbose")
    events = [json.loads(line) for line in out.splitlines()]  # every stdout line is an event
    assert events and all("event" in event for event in events)
    assert {"run_started", "run_finished"} <= {event["event"] for event in events}
    assert "debug: retry scheduled" in err and "debug:" not in out


def test_debug_log_masks_every_form_of_a_secret(tmp_path: Path) -> None:
    debug = DebugLog(tmp_path / DEBUG_FILE, Redactor([SECRET]))
    debug.log.bind(run_id="r").warning(f"said {SECRET}", nested={"list": [f"x{SECRET}y", SECRET.encode()]})
    debug.close()
    debug.log.info("after close: dropped")  # a closed (or failing) debug log never raises
    (line,) = [json.loads(text) for text in (tmp_path / DEBUG_FILE).read_text().splitlines()]
    assert SECRET not in json.dumps(line) and line["event"] == "said ***" and line["run_id"] == "r"


def test_verbose_masks_a_secret_nested_as_bytes(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """`-v` shows a nested value as JSON: a non-ASCII secret's bytes are no `\\xc3\\xa4` repr there."""
    secret = "pässwörd-ünïcode-value"
    debug = DebugLog(tmp_path / DEBUG_FILE, Redactor([secret, SECRET]), echo=True)
    debug.log.info("said", nested={"k": [secret.encode(), f"a\n{SECRET}"]}, plain=secret.encode())
    debug.close()
    err = capsys.readouterr().err
    assert "\\x" not in err and "ssw" not in err and "diagnostic" not in err
    assert 'nested={"k": ["***", "a\\n***"]}' in err and "plain=***" in err


def test_runs_in_one_process_keep_their_own_logs(sshd: SSHServer, tmp_path: Path) -> None:
    """Two engines at once in one process (as the tests and an embedding program run them): each debug.log
    holds its own run's lines only, asyncssh's included, and structlog's global configuration is untouched."""
    route_asyncssh()
    books = []
    for name in ("one", "two"):
        book = tmp_path / f"{name}.yaml"
        book.write_text(f"name: {name}\n{sshd.host_yaml()}steps:\n  - {{id: s, kind: shell, script: echo {name}}}\n")
        books.append(book)

    async def both() -> list[int]:
        engines = [Engine(load_runbook(b), RunOptions(log_dir=tmp_path / b.stem), Reporter()) for b in books]
        return list(await asyncio.gather(*(engine.run() for engine in engines)))

    assert asyncio.run(both()) == [0, 0]
    for book in books:
        lines = debug_lines(tmp_path / book.stem)
        (run_id,) = {line["run_id"] for line in lines}  # its own run's lines only
        assert (tmp_path / book.stem / run_id / DEBUG_FILE).is_file()
        assert any(line.get("logger", "").startswith("asyncssh") for line in lines)
    assert not structlog.is_configured()


def test_a_write_failing_before_the_first_step_still_closes_the_run(
    sshd: SSHServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first record (host key verification off) cannot be written: the run stops as on any failed write
    (write_failed, its debug log closed) and its logger is no longer the task's (asyncssh's records of a
    later connection would go to a closed run)."""
    hosts = sshd.host_yaml().replace("connect_timeout: 10s", "connect_timeout: 10s\n    verify_host_key: false")
    book = tmp_path / "early.yaml"
    book.write_text(f"name: early\n{hosts}steps:\n  - {{id: s, kind: shell, script: echo hi}}\n")

    def disk_full(_log: AuditLog, _host: str) -> None:
        raise DurableWriteError(str(tmp_path), "the audit log", "No space left on device", errno.ENOSPC, 0)

    monkeypatch.setattr(AuditLog, "host_key_unverified", disk_full)

    async def run() -> Engine:
        engine = Engine(load_runbook(book), RunOptions(log_dir=tmp_path / "logs"), Reporter())
        with pytest.raises(DurableWriteError):
            await engine.run()
        assert diagnostics.CURRENT.get() is diagnostics.NO_LOG
        return engine

    engine = asyncio.run(run())
    with open_state(engine.run_dir) as state:
        assert state.status() == WRITE_FAILED
    assert json.loads((engine.run_dir / DEBUG_FILE).read_text().splitlines()[-1])["event"] == "run finished"
