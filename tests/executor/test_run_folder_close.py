"""The run folder is closed whole however the run ends, in-process through the Engine's transport seam: a
transport factory that raises, a second cancellation while the hosts' transports close, a step kind that calls
sys.exit. Its lock is never left held, its status and finished_at are written, and every transport made is
closed."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import Literal

import pytest

from executor import Engine, RunOptions
from executor.diagnostics import Log
from executor.errors import EXIT_FAILED
from executor.redact import Redactor
from executor.render import RenderedCommand
from executor.run.events import Reporter
from executor.run.state import RunLock, open_state
from executor.runbook.loader import load_runbook
from executor.runbook.model import Host
from executor.stepkind import Outcome, StepContext, StepSpec
from executor.transport.base import Collector, CommandResult, OutputSink, Transfer, Transport

RUNBOOK = """\
name: closing
hosts:
  first: {address: 127.0.0.1, port: 9, user: nobody}
  second: {address: 127.0.0.1, port: 9, user: nobody}
steps:
  - id: one
    kind: shell
    hosts: [first]
    script: echo one
    gates:
      - that: "stdout.strip() == 'ok'"  # read by a gate worker (a process), which the run closes
  - id: two
    kind: shell
    hosts: [second]
    script: echo two
"""


class Held(Transport):
    """Answers at once, or holds each command until cancelled (`hold`); its close waits until `closing` is
    set (a host slow to say goodbye), and says it began and ended."""

    def __init__(self, hold: bool = False) -> None:
        self.hold = hold
        self.running = asyncio.Event()
        self.closing = asyncio.Event()
        self.close_began = asyncio.Event()
        self.closed = False

    async def run(self, command: RenderedCommand, timeout: float, on_output: OutputSink | None = None) -> CommandResult:
        self.running.set()
        if self.hold:
            await asyncio.Event().wait()
        collect = Collector(on_output, self.redactor)
        collect.stdout.feed(b"ok\n")
        return collect.result(0)

    async def put(self, local: Path, remote: str) -> Transfer:
        raise NotImplementedError

    async def get(self, remote: str, local: Path) -> Transfer:
        raise NotImplementedError

    async def close(self) -> None:
        self.close_began.set()
        await self.closing.wait()
        self.closed = True


def engine(tmp_path: Path, factory: object) -> Engine:
    path = tmp_path / "closing.yaml"
    path.write_text(RUNBOOK)
    return Engine(load_runbook(path), RunOptions(log_dir=tmp_path / "logs"), Reporter(), transport_factory=factory)  # type: ignore[arg-type]


def assert_closed(run_dir: Path, status: str) -> None:
    """The run's lock is free (a resume could take it) and its state says how it ended, and when."""
    lock = RunLock(run_dir)
    lock.acquire()
    lock.release()
    with open_state(run_dir) as state:
        assert state.get("status") == status and state.get("finished_at")


def open_files() -> list[str]:
    """What this process's descriptors point at."""
    return sorted(
        os.readlink(f"/proc/self/fd/{fd}")
        for fd in os.listdir("/proc/self/fd")
        if os.path.lexists(f"/proc/self/fd/{fd}")
    )


def test_a_transport_factory_that_raises_fails_its_hosts_steps_and_the_run_closes_whole(tmp_path: Path) -> None:
    """A factory that raises fails the steps of its host (tests/executor/test_offline_misuse.py says how); the
    run ends failed, the transport made before closed and the run folder closed whole."""
    made: list[Held] = []

    def factory(name: str, host: Host, redactor: Redactor, log: Log, /) -> Transport:
        if name == "second":
            raise RuntimeError("no transport for second")
        made.append(Held())
        made[-1].redactor = redactor
        made[-1].closing.set()
        return made[-1]

    run = engine(tmp_path, factory)
    assert asyncio.run(run.run()) == EXIT_FAILED
    assert [t.closed for t in made] == [True]  # the transport made before is closed
    assert_closed(run.run_dir, "failed")
    assert run.records[("one", "first")].status == "passed"


def test_a_second_cancellation_while_the_transports_close_leaves_nothing_open(tmp_path: Path) -> None:
    """An API caller cancelling twice (a timeout after a Ctrl-C) stops the transports' close it interrupts,
    never the closing of the run folder after it nor of the gate workers: its lock, state, audit log and files
    are closed, and the status (interrupted) and finished_at written before."""
    made = {"first": Held(), "second": Held(hold=True)}

    def factory(name: str, host: Host, redactor: Redactor, log: Log, /) -> Transport:
        made[name].redactor = redactor
        return made[name]

    before = open_files()
    run = engine(tmp_path, factory)
    workers: list[object] = []

    async def main() -> None:
        task = asyncio.ensure_future(run.run())
        await made["second"].running.wait()
        workers.extend(run.gates._all)  # step one's gate worker, idle
        task.cancel()  # the first: the run is interrupted, its folder closing
        await made["second"].close_began.wait()
        task.cancel()  # the second, while the transports close
        with pytest.raises(asyncio.CancelledError):
            await task
        for transport in made.values():
            transport.closing.set()

    asyncio.run(main())
    assert_closed(run.run_dir, "interrupted")
    assert workers and not run.gates._all  # closed: its workers killed and let go
    assert run.records[("two", "second")].status == "interrupted"
    assert open_files() == before  # the audit log, state.db, debug log, events file, the gate worker's pipes


class Exiting(StepSpec):
    """A step kind (a plugin's, say) that calls sys.exit: a bug of the kind, as any exception of it."""

    kind: Literal["test_exiting"] = "test_exiting"

    async def execute(self, ctx: StepContext) -> Outcome:
        sys.exit(3)


def test_a_step_kind_that_calls_sys_exit_fails_its_step_not_the_run_nor_the_process(tmp_path: Path) -> None:
    """Not a run `interrupted` that nobody interrupted, its step failed without a reason, and the process
    ending with the kind's exit code (3: "the run is locked" to a caller) without a word."""
    path = tmp_path / "exiting.yaml"
    path.write_text("name: exiting\nhosts: {here: {address: local}}\nsteps:\n  - {id: x, kind: test_exiting}\n")
    run = Engine(load_runbook(path), RunOptions(log_dir=tmp_path / "logs"), Reporter())
    assert asyncio.run(run.run()) == 1
    assert_closed(run.run_dir, "failed")
    message = run.records[("x", "here")].message or ""
    assert "step kind 'test_exiting' failed unexpectedly" in message and "SystemExit: 3" in message
