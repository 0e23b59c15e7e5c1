"""A careless or hostile test of a runbook, and the Engine's transport seam misused, in-process: an unscripted
command fails its step at once (no retry delay, no fallback hiding it), a transport factory that raises or
makes no transport fails that host's steps with a clear message and the run ends closed and consistent, a
transport whose close() raises changes nothing recorded, a crashed run says it exited 1, a host program's
document no program could print is refused where the test gives it, and a command as the scripted host
keeps it shows no secret."""

from __future__ import annotations

import asyncio
import json
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from executor.diagnostics import Log
from executor.hostprogram import host_program
from executor.redact import Redactor
from executor.render import render_command
from executor.run import audit
from executor.run import engine as engine_module
from executor.run.engine import Engine, RunOptions
from executor.run.events import Reporter
from executor.run.scheduler import Scheduler
from executor.run.state import open_state
from executor.runbook.loader import load_runbook
from executor.runbook.model import Host
from executor.transport.base import Transport
from executor.transport.scripted import Answer, ScriptedTransport, UnscriptedCommand

if TYPE_CHECKING:
    from executor.faces.testing import Offline

pytest_plugins = ["executor.faces.testing"]

TOKEN = "hf_misuse0123456789abcdefghijklmn"
TWO_STEPS = """\
name: misuse
hosts:
  far: {address: far.example}
steps:
  - id: a
    kind: shell
    retry: {attempts: 3, delay: 5s}
    script: curl https://example.com/x
    fallbacks:
      - script: wget https://mirror.example/x
  - id: b
    kind: shell
    script: echo done
"""


def book(tmp_path: Path) -> Path:
    path = tmp_path / "misuse.yaml"
    path.write_text(textwrap.dedent(TWO_STEPS))
    return path


def events(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]


def test_an_unscripted_command_fails_its_step_at_once_with_no_retry_delay_and_no_fallback(
    runbook_offline: Offline, tmp_path: Path
) -> None:
    far = runbook_offline.host("far").on("^wget ")  # the fallback would pass: it must not hide the omission
    started = time.monotonic()
    run = runbook_offline.run(book(tmp_path))
    assert time.monotonic() - started < 3  # not 5s + 10s of retry delays
    assert (run.exit_code, run.step("a").status, run.step("a").attempts) == (1, "failed", 1)
    assert run.step("a").message == "no scripted answer on far for the command: 'curl https://example.com/x'"
    assert far.scripts() == ["curl https://example.com/x"]  # neither retried nor fallen back to wget


def engine_with(tmp_path: Path, factory: Callable[[str, Host, Redactor, Log], Any]) -> Engine:
    return Engine(
        load_runbook(book(tmp_path)), RunOptions(log_dir=tmp_path / "logs"), Reporter(), transport_factory=factory
    )


def raising(name: str, host: Host, redactor: Redactor, log: Log, /) -> Transport:
    raise RuntimeError(f"no lab machine {host.address}")


def making_none(name: str, host: Host, redactor: Redactor, log: Log, /) -> Any:
    return None


@pytest.mark.parametrize(
    ("factory", "why"),
    [
        (raising, "the transport factory raised RuntimeError: no lab machine far.example"),
        (making_none, "the transport factory returned NoneType, not a Transport"),
    ],
)
def test_a_factory_that_raises_or_makes_no_transport_fails_the_hosts_step_and_the_run_ends_closed(
    tmp_path: Path, factory: Callable[[str, Host, Redactor, Log], Any], why: str
) -> None:
    engine = engine_with(tmp_path, factory)
    assert asyncio.run(engine.run()) == 1  # a failed run, not the factory's traceback
    message = f"no transport for host 'far': {why}"
    assert (engine.records["a", "far"].status, engine.records["a", "far"].message) == ("failed", message)
    assert engine.records["b", "far"].status == "pending"  # the run stopped at the failed step
    finished = events(engine.run_dir)[-1]
    assert (finished["event"], finished["status"], finished["exit_code"]) == ("run_finished", "failed", 1)
    with open_state(engine.run_dir) as state:
        assert state.get("status") == "failed"
    assert audit.verify(engine.run_dir).ok


def test_a_transport_whose_close_raises_changes_nothing_recorded_and_the_debug_log_says_so(tmp_path: Path) -> None:
    class Unclosable(ScriptedTransport):
        async def close(self) -> None:
            raise OSError("socket already gone")

    def factory(name: str, host: Host, redactor: Redactor, log: Log, /) -> Transport:
        made = Unclosable(name).on("")
        made.redactor = redactor
        return made

    engine = engine_with(tmp_path, factory)
    assert asyncio.run(engine.run()) == 0
    assert events(engine.run_dir)[-1]["status"] == "passed"
    assert "transport close failed" in (engine.run_dir / "debug.log").read_text()
    assert "OSError: socket already gone" in (engine.run_dir / "debug.log").read_text()
    assert audit.verify(engine.run_dir).ok


def test_a_crashed_run_says_it_exited_1_not_0(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async def crash(self: Scheduler, attempts: object) -> tuple[str, int]:
        raise RuntimeError("a bug")

    monkeypatch.setattr(Scheduler, "run", crash)
    engine = engine_with(tmp_path, lambda name, host, redactor, log: ScriptedTransport(name))
    with pytest.raises(RuntimeError, match="a bug"):
        asyncio.run(engine.run())
    finished = events(engine.run_dir)[-1]
    assert (finished["status"], finished["exit_code"]) == ("crashed", 1)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), object()])
def test_a_document_no_program_could_print_is_refused_where_the_test_gives_it(value: object) -> None:
    with pytest.raises(ValueError, match="host program 'probe' could not print this document"):
        ScriptedTransport("gpu").program("probe", {"gpu": {"memory_mib": value}})  # the kit prints no NaN


def test_a_received_command_shows_no_secret_written_into_the_script() -> None:
    host = ScriptedTransport("gpu").on("login")
    host.redactor = Redactor([TOKEN])
    asyncio.run(host.run(render_command(f"login --token {TOKEN}", {}, {"HF_TOKEN": TOKEN}), 5))
    assert TOKEN not in host.commands[0].display and host.commands[0].display.endswith("login --token ***")


def test_a_rule_of_the_test_that_raises_fails_its_step_at_once_naming_where(
    runbook_offline: Offline, tmp_path: Path
) -> None:
    far = runbook_offline.host("far")
    far.on(lambda command: command.program.name == "probe")  # type: ignore[union-attr]  # None: no program
    run = runbook_offline.run(book(tmp_path))
    message = run.step("a").message or ""
    assert (run.step("a").status, run.step("a").attempts, len(far.commands)) == ("failed", 1, 1)
    assert message.startswith("a scripted rule of far raised AttributeError: 'NoneType' object has no attribute")
    assert f"({__file__}:" in message  # where the test's lambda raised, not the transport
    assert message.endswith("for the command: 'curl https://example.com/x'")


def test_a_document_made_by_a_callable_that_no_program_could_print_is_named_in_the_steps_failure() -> None:
    host = ScriptedTransport("gpu").program("probe", lambda call: {"free": float("inf")})
    with pytest.raises(UnscriptedCommand, match="host program 'probe' could not print this document: Out of range"):
        asyncio.run(host.run(render_command(host_program("probe", {}), {}), 5))


def test_a_broken_connection_and_a_failed_fetch_are_said_as_every_failed_attempt_is(
    runbook_offline: Offline, tmp_path: Path
) -> None:
    path = tmp_path / "fetch.yaml"
    path.write_text(
        textwrap.dedent("""\
        name: fetch
        hosts:
          far: {address: far.example}
        secrets:
          HF_TOKEN: {env: HF_TOKEN}
        steps:
          - id: a
            kind: shell
            retry: {attempts: 2, delay: 1ms}
            script: serve
          - id: b
            kind: shell
            retry: {attempts: 1}
            script: "true"
            fetch: [{src: /srv/none.log, dest: none.log}]
        """)
    )
    runbook_offline.environ["HF_TOKEN"] = TOKEN
    far = runbook_offline.host("far").on("^true")
    far.on("^serve", Answer(error=f"connection lost ({TOKEN})"), Answer())
    run = runbook_offline.run(path)
    assert run.failures() == [
        "a@far: transport error: connection lost (***)",
        "b@far: file transfer failed: download of far:/srv/none.log failed: no such file",
    ]
    assert (run.step("a").status, run.step("b").status) == ("passed", "failed")


def test_a_mapping_of_vars_gives_a_bool_as_the_command_line_would(runbook_offline: Offline, tmp_path: Path) -> None:
    path = tmp_path / "flag.yaml"
    path.write_text(
        "name: flag\nhosts:\n  far: {address: far.example}\nvars: {dflash: true}\n"
        "steps:\n  - id: a\n    kind: shell\n    script: serve $dflash\n"
    )
    far = runbook_offline.host("far").on("^serve")
    assert runbook_offline.run(path, var={"dflash": False}).exit_code == 0  # not refused as `dflash=False`
    assert far.commands[0].env["dflash"] == "false"


@pytest.mark.parametrize("delay", [float("nan"), float("inf"), -1.0])
def test_an_answer_whose_delay_is_no_number_of_seconds_is_refused_where_the_test_gives_it(delay: float) -> None:
    with pytest.raises(ValueError, match=r"give a finite number of seconds >= 0 \(never ends: hang=True\)"):
        Answer(delay=delay)


def test_a_transport_whose_close_never_ends_holds_the_run_no_longer_than_its_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    class Stuck(ScriptedTransport):
        async def close(self) -> None:
            await asyncio.Event().wait()

    def factory(name: str, host: Host, redactor: Redactor, log: Log, /) -> Transport:
        return Stuck(name).on("")

    monkeypatch.setattr(engine_module, "CLOSE_GRACE_S", 0.2)
    path = book(tmp_path)
    path.write_text(path.read_text().replace("far.example}", "far.example, connect_timeout: 100ms}"))
    engine = Engine(load_runbook(path), RunOptions(log_dir=tmp_path / "logs"), Reporter(), transport_factory=factory)
    started = time.monotonic()
    assert asyncio.run(engine.run()) == 0
    assert time.monotonic() - started < 5
    assert "TimeoutError: not closed within 0.3s" in (engine.run_dir / "debug.log").read_text()
