"""Typed events: the emitter's stamps, the reporters, the seam that keeps a failing reporter away from the
run, the `--json` stream of a real run read back with the union model, and README's table of them."""

from __future__ import annotations

import asyncio
import io
import json
import re
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
import yaml
from rich.console import Console

from executor.redact import Redactor
from executor.run.emitter import Emitter, EventStream
from executor.run.engine import Engine, RunOptions
from executor.run.event_models import (
    EVENT_TYPES,
    EVENTS,
    AttemptFailed,
    Carried,
    CellCounts,
    CellsProgress,
    CommandFinished,
    Event,
    HostOutcome,
    LaunchCounts,
    Note,
    PlannedStep,
    Progress,
    RunFinished,
    RunStarted,
    SearchDecided,
    StepFinished,
    StepStarted,
    VarCause,
)
from executor.run.events import ConsoleReporter, JsonReporter, RedactingReporter, Reporter
from executor.runbook.loader import load_runbook
from sandbox.hub import HubServer
from sandbox.repos import DRAFTER_ID
from sandbox.sshd import SSHServer
from tests.clirun import runbook_cli

README = Path(__file__).resolve().parents[2] / "README.md"
SECRET = "hf_events_secret_value"


class Collect(Reporter):
    def __init__(self) -> None:
        self.events: list[Event] = []

    def emit(self, event: Event) -> None:
        self.events.append(event)


class RaiseOn(Collect):
    """Raises on every event of the given types (a reporter's bug); collects the others."""

    def __init__(self, *types: type[Event]) -> None:
        super().__init__()
        self.types, self.raised, self.closed = types, 0, False

    def emit(self, event: Event) -> None:
        if isinstance(event, self.types):
            self.raised += 1
            raise ValueError(f"reporter bug on {event.event}: {SECRET}")
        super().emit(event)

    def close(self) -> None:
        self.closed = True


def stream(reporter: Reporter, stderr: io.StringIO | None = None) -> Emitter:
    return Emitter(EventStream(reporter, "run-1", Redactor([SECRET]), stderr))


def samples(text: str) -> list[Event]:
    """One event of each type with `text` in every string it holds (a dict's keys too)."""
    stamp: dict[str, Any] = {"seq": 1, "run_id": text, "time": 1.5, "step": text, "host": text, "attempt": 1}
    planned = PlannedStep(id=text, kind=text, hosts=[text], reused=False, runs=True, plan=text)
    return [
        RunStarted(**stamp, run_dir=text, runbook=text, resumed_from=text, steps=[planned]),
        StepStarted(**stamp, kind=text, hosts=[text]),
        CommandFinished(**stamp, exit_code=0, timed_out=False, duration_s=0.1),
        AttemptFailed(**stamp, message=text),
        StepFinished(
            **stamp,
            status=text,
            via=text,
            duration_s=1,
            hosts={text: HostOutcome(status=text, attempts=1, via=text)},
            failures=[text],
        ),
        CellsProgress(
            **stamp,
            group=text,
            cells=CellCounts(total=2, passed=1, failed=0, skipped=0, running=1),
            launches=LaunchCounts(done=1, planned=2),
        ),
        SearchDecided(**stamp, group=text, decision=1, action="prune", config=text, reason=text),
        Progress(**stamp, message=text, fields={text: [text, {text: text}], "n": 3}),
        Note(**stamp, message=text),
        RunFinished(**stamp, status=text, exit_code=0, audit=text, error=text),
    ]


# ----------------------------------------------------------------------------- the emitter


def test_every_event_is_stamped_with_the_next_seq_the_run_id_and_what_it_belongs_to() -> None:
    got = Collect()
    emitter = stream(got)
    emitter.emit(RunStarted, run_dir="d", runbook="b", resumed_from=None, steps=[])
    attempt = emitter.bind(step="s", host="h", attempt=2)
    attempt.emit(CommandFinished, exit_code=0, timed_out=False, duration_s=0.5)
    attempt.emit(Note, message="m")
    emitter.emit(Note, host="other", message="run-level")
    attempt.emit(AttemptFailed, attempt=3, message="given here wins over the bound attempt")
    assert [e.seq for e in got.events] == [1, 2, 3, 4, 5]
    assert {e.run_id for e in got.events} == {"run-1"}
    assert [(e.step, e.host, e.attempt) for e in got.events] == [
        (None, None, None),
        ("s", "h", 2),
        ("s", "h", 2),
        (None, "other", None),
        ("s", "h", 3),
    ]
    assert all(e.time > 1.7e9 for e in got.events)


def test_seq_has_no_gaps_across_hosts_emitting_at_once() -> None:
    got = Collect()
    emitter = stream(got)

    async def host(name: str) -> None:
        bound = emitter.bind(step="s", host=name, attempt=1)
        for i in range(50):
            bound.emit(Progress, message=f"{name} {i}", fields={"i": i})
            await asyncio.sleep(0)

    async def hosts() -> None:
        await asyncio.gather(*(host(f"h{n}") for n in range(8)))

    asyncio.run(hosts())
    assert [e.seq for e in got.events] == list(range(1, 401))  # delivered in seq order, none missing
    assert {e.host for e in got.events} == {f"h{n}" for n in range(8)}
    assert [e.fields["i"] for e in got.events if e.host == "h3"] == list(range(50))


def test_events_from_several_threads_reach_the_reporter_in_seq_order() -> None:
    got = Collect()
    emitter = stream(got)

    def host(name: str) -> None:
        bound = emitter.bind(step="s", host=name, attempt=1)
        for i in range(200):
            bound.emit(Progress, message=str(i), fields={})

    threads = [threading.Thread(target=host, args=(f"h{n}",)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert [e.seq for e in got.events] == list(range(1, 801))


def test_a_failing_reporter_is_said_once_closed_and_given_nothing_more() -> None:
    """Fails on main: a reporter's exception there propagates out of `emit` into the step's attempt."""
    reporter, err = RaiseOn(Progress), io.StringIO()
    emitter = stream(reporter, err).bind(step="s", host="h", attempt=1)
    emitter.emit(CommandFinished, exit_code=0, timed_out=False, duration_s=0.1)
    for i in range(3):
        emitter.emit(Progress, message=str(i), fields={})  # raises nothing here
    emitter.emit(Note, message="after")
    assert reporter.raised == 1 and reporter.closed
    assert [e.event for e in reporter.events] == ["command_finished"]
    (line,) = err.getvalue().splitlines()
    assert line.startswith("runbook: the reporter failed on event 2 (progress)")
    assert "ValueError: reporter bug on progress: ***" in line and SECRET not in line


# ----------------------------------------------------------------------------- the reporters


def test_the_redacting_reporter_masks_every_string_of_every_event() -> None:
    got = Collect()
    for event in samples(f"a {SECRET} b"):
        RedactingReporter(got, Redactor([SECRET])).emit(event)
    dumped = json.dumps([e.model_dump(by_alias=True) for e in got.events])
    assert SECRET not in dumped and dumped.count("a *** b") > 40
    assert [type(e) for e in got.events] == list(EVENT_TYPES)


def test_json_lines_read_back_as_the_same_typed_event_with_the_schema_version() -> None:
    out = io.StringIO()
    reporter = JsonReporter(out)
    events = samples("x\x1b]0;t\x07 \u202e \x9b")
    for event in events:
        reporter.emit(event)
    lines = out.getvalue().splitlines()
    assert [EVENTS.validate_json(line) for line in lines] == events
    assert all(json.loads(line)["schema"] == 1 for line in lines)
    assert not [c for c in out.getvalue() if (ord(c) < 0x20 and c != "\n") or ord(c) >= 0x7F]  # JSON escapes


def test_the_console_has_one_handler_for_each_event_type_and_shows_each() -> None:
    console = ConsoleReporter()
    assert set(console.handlers) == set(EVENT_TYPES)
    out = io.StringIO()
    console.console.file = out
    for event in samples("seen"):
        console.emit(event)
    assert "seen" in out.getvalue()


def test_every_model_has_a_json_schema() -> None:
    schema = EVENTS.json_schema()
    assert set(schema["discriminator"]["mapping"]) == {t.model_fields["event"].default for t in EVENT_TYPES}
    for event_type in EVENT_TYPES:
        properties = event_type.model_json_schema()["properties"]
        assert {"schema", "event", "seq", "run_id", "time", "step", "host", "attempt"} <= set(properties)


def _readme_rows() -> dict[str, str]:
    """README's event table: the first cell (an event name, or `(every event)`) to the fields cell."""
    text = README.read_text()
    section = text[text.index("### Events: the `--json` contract") :]
    section = section[: section.index("\n#")]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| ") and len(cells) == 3 and cells[0] not in ("event", "---"):
            rows[cells[0].strip("`")] = cells[1]
    return rows


def _names(cell: str) -> set[str]:
    return set(re.findall(r"`([a-z_]+)`", cell))


def _nested(cell: str) -> list[set[str]]:
    return [set(re.split(r",\s*", group)) for group in re.findall(r"`\{([a-z_, ]+)\}`", cell)]


def test_readme_documents_every_event_and_every_field() -> None:
    rows = _readme_rows()
    common = set(Event.model_fields)
    assert set(rows) == {"(every event)"} | {t.model_fields["event"].default for t in EVENT_TYPES}
    assert _names(rows["(every event)"]) == {f.alias or name for name, f in Event.model_fields.items()}
    for event_type in EVENT_TYPES:
        cell = rows[event_type.model_fields["event"].default]
        assert _names(cell) == set(event_type.model_fields) - common, event_type.__name__
    assert _nested(rows["run_started"]) == [set(PlannedStep.model_fields), set(Carried.model_fields)]
    assert _nested(rows["step_finished"]) == [set(HostOutcome.model_fields)]
    assert _nested(rows["attempt_failed"]) == [set(VarCause.model_fields)]


# ----------------------------------------------------------------------------- real runs on the sshd host


def two_hosts(sshd: SSHServer) -> str:
    """`a` and `b`: the test sshd under two names, so that a step runs on two hosts at once."""
    return sshd.host_yaml("a") + sshd.host_yaml("b").removeprefix("hosts:\n")


def test_json_stream_of_a_real_run_reads_back_with_seq_1_to_n_and_the_run_id_on_every_line(
    write_runbook: Any, sshd: SSHServer, tmp_path: Path
) -> None:
    """Fails on main: its lines carry no `seq` and `run_id` only on run_started and run_finished."""
    path = write_runbook(
        """\
        name: t
        __HOSTS__
        steps:
          - {id: both, kind: shell, hosts: all, script: "echo one; echo two", retry: {attempts: 1}}
          - {id: flaky, kind: shell, host: a, script: "exit 3", retry: {attempts: 2, delay: 10ms}}
        """,
        hosts=two_hosts(sshd),
    )
    done = runbook_cli("run", str(path), "--log-dir", str(tmp_path / "logs"), "--json")
    assert done.returncode == 1, done.stderr
    events = [EVENTS.validate_json(line) for line in done.stdout.splitlines()]
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    first, last = events[0], events[-1]
    assert isinstance(first, RunStarted) and isinstance(last, RunFinished) and last.exit_code == 1
    assert {e.run_id for e in events} == {first.run_id} and Path(first.run_dir).name == first.run_id
    commands = [e for e in events if isinstance(e, CommandFinished)]
    assert sorted((e.step, e.host, e.attempt) for e in commands) == [
        ("both", "a", 1),
        ("both", "b", 1),
        ("flaky", "a", 1),
        ("flaky", "a", 2),
    ]
    failed = [(e.step, e.host, e.attempt) for e in events if isinstance(e, AttemptFailed)]
    assert failed == [("flaky", "a", 1), ("flaky", "a", 2)]
    finished = {e.step: e for e in events if isinstance(e, StepFinished)}
    assert finished["both"].hosts["b"].status == "passed" and finished["flaky"].status == "failed"


@pytest.mark.parametrize("fails_on", [CommandFinished, StepFinished])
def test_a_reporter_that_raises_fails_no_step_and_no_run(
    fails_on: type[Event], write_runbook: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Fails on main: there the exception surfaces as "step kind 'shell' failed unexpectedly" (an
    attempt's event) or crashes the run (a step's event)."""
    path = write_runbook("""\
        name: t
        __HOSTS__
        steps:
          - {id: a, kind: shell, script: "echo one"}
          - {id: b, kind: shell, script: "echo two"}
        """)
    reporter = RaiseOn(fails_on)
    code = asyncio.run(Engine(load_runbook(path), RunOptions(log_dir=tmp_path / "logs"), reporter).run())
    err = capsys.readouterr().err
    assert code == 0, err
    assert reporter.raised == 1 and reporter.closed
    assert err.count("runbook: the reporter failed") == 1 and f"({fails_on.model_fields['event'].default})" in err
    (run_dir,) = (tmp_path / "logs").iterdir()
    records = [json.loads(line) for line in (run_dir / "audit.jsonl").read_text().splitlines()]
    assert [(r["step"], r["stdout"]) for r in records if r["event"] == "command"] == [("a", "one\n"), ("b", "two\n")]
    assert runbook_cli("audit", "verify", str(run_dir)).returncode == 0


def test_a_json_stdout_that_cannot_be_written_leaves_the_run_passing(write_runbook: Any, tmp_path: Path) -> None:
    """`--json` into a full disk: said once on stderr, the run passes. Fails on main: a traceback, exit 1."""
    path = write_runbook("""\
        name: t
        __HOSTS__
        steps:
          - {id: a, kind: shell, script: "echo one"}
        """)
    command = [
        sys.executable,
        "-m",
        "executor.faces.cli",
        "run",
        str(path),
        "--log-dir",
        str(tmp_path / "logs"),
        "--json",
    ]
    with open("/dev/full", "w") as full:
        done = subprocess.run(command, stdout=full, stderr=subprocess.PIPE, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("runbook: the reporter failed on event 1 (run_started)") == 1
    assert "No space left on device" in done.stderr and "Traceback" not in done.stderr


def test_a_reporter_that_raises_on_progress_fails_no_download(
    testhost: Any, hub: HubServer, write_runbook: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Real `progress` events: the second download finds the first one's files complete and says so. Fails
    on main: there the reporter's exception fails that step ("step kind 'download' failed unexpectedly")."""
    hf = {"HF_ENDPOINT": hub.endpoint, "HF_HUB_DISABLE_XET": "1", "HF_HUB_DISABLE_TELEMETRY": "1"}
    fetch = {"kind": "download", "repo": DRAFTER_ID, "local_dir": str(tmp_path / "drafter")}
    doc = {"vars": hf, "steps": [{"id": "first", **fetch}, {"id": "again", **fetch}]}
    path = write_runbook("name: dl\n__HOSTS__\n" + yaml.safe_dump(doc), hosts=testhost("h200").host_yaml())
    reporter = RaiseOn(Progress)
    code = asyncio.run(Engine(load_runbook(path), RunOptions(log_dir=tmp_path / "logs"), reporter).run())
    err = capsys.readouterr().err
    assert code == 0, err
    assert reporter.raised == 1 and reporter.closed
    assert err.count("runbook: the reporter failed") == 1 and "(progress)" in err
    (run_dir,) = (tmp_path / "logs").iterdir()
    assert runbook_cli("audit", "verify", str(run_dir)).returncode == 0


def test_a_terminals_live_line_carries_the_grid_while_a_matrix_runs_and_drops_it_when_done() -> None:
    console = Console(file=io.StringIO(), force_terminal=True, width=200)
    reporter = ConsoleReporter(console)
    stamp: dict[str, Any] = {"seq": 1, "run_id": "r", "time": 1.0, "step": "bench[n=1]", "host": "gpu1"}

    def progress(passed: int, running: int) -> CellsProgress:
        counts = CellCounts(total=2, passed=passed, failed=0, skipped=0, running=running)
        return CellsProgress(**stamp, group="sweep", cells=counts, launches=LaunchCounts(done=1, planned=2))

    def live() -> str:
        assert reporter._status is not None
        return str(reporter._status.renderable.text)  # type: ignore[attr-defined]

    try:
        reporter.emit(progress(1, 1))
        reporter.emit(StepStarted(**stamp, kind="benchmark", hosts=["gpu1"]))
        assert live().startswith("sweep  cells 1/2 done: 1 passed, 0 failed, 0 skipped, 1 running;  launches 1/2")
        assert live().endswith("bench[n=1] on gpu1")
        reporter.emit(progress(2, 0))
        reporter.emit(StepStarted(**{**stamp, "step": "report"}, kind="campaign_report", hosts=["gpu1"]))
        assert live() == "report on gpu1"
    finally:
        reporter.close()
