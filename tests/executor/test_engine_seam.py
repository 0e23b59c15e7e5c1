"""The Engine's transport seam, in-process: the `transport_factory` it is given makes every host's
transport, with the run's redactor and debug log, and the run's commands, gates and retries go through it
(the hosts' addresses are never reached)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from executor import Engine, RunOptions
from executor.diagnostics import Log
from executor.redact import Redactor
from executor.render import RenderedCommand
from executor.run.events import Reporter
from executor.runbook.loader import load_runbook
from executor.runbook.model import Host
from executor.transport.base import Collector, CommandResult, OutputSink, Transfer, Transport

RUNBOOK = """\
name: seam
hosts:
  far: {address: 127.0.0.1, port: 9, user: nobody}
  near: {address: 127.0.0.1, port: 9, user: nobody}
steps:
  - id: probe
    kind: shell
    hosts: [far, near]
    script: echo probing
    retry: {attempts: 3, delay: 0.01}
    gates:
      - that: "stdout.strip() == 'ready'"
"""


class Answering(Transport):
    """Answers every command `not yet` (exit 1) `fails` times, then `ready`; keeps what it was asked."""

    def __init__(self, name: str, fails: int) -> None:
        self.name = name
        self.fails = fails
        self.scripts: list[bytes] = []
        self.closed = False

    async def run(self, command: RenderedCommand, timeout: float, on_output: OutputSink | None = None) -> CommandResult:
        self.scripts.append(command.script)
        collect = Collector(on_output, self.redactor)
        answer = b"not yet\n" if len(self.scripts) <= self.fails else b"ready\n"
        collect.stdout.feed(answer)
        return collect.result(0)

    async def put(self, local: Path, remote: str) -> Transfer:
        raise NotImplementedError

    async def get(self, remote: str, local: Path) -> Transfer:
        raise NotImplementedError

    async def close(self) -> None:
        self.closed = True


def test_the_transport_factory_makes_every_hosts_transport_and_the_run_goes_through_it(tmp_path: Path) -> None:
    path = tmp_path / "seam.yaml"
    path.write_text(RUNBOOK)
    made: dict[str, Answering] = {}
    asked: list[tuple[str, str, Redactor, Log]] = []

    def factory(name: str, host: Host, redactor: Redactor, log: Log, /) -> Transport:
        asked.append((name, host.address, redactor, log))
        made[name] = Answering(name, fails=1 if name == "far" else 0)
        made[name].redactor = redactor
        return made[name]

    engine = Engine(load_runbook(path), RunOptions(log_dir=tmp_path / "logs"), Reporter(), transport_factory=factory)
    assert asyncio.run(engine.run()) == 0
    assert sorted(name for name, *_ in asked) == ["far", "near"]  # once per host, not per attempt
    assert all(redactor is engine.redactor for *_, redactor, _log in asked)
    assert [s.strip() for s in made["far"].scripts] == [b"echo probing"] * 2  # a failed gate retried, then passed
    assert len(made["near"].scripts) == 1
    assert all(t.closed for t in made.values())  # the run closes what it made
    assert (engine.records["probe", "far"].attempts, engine.records["probe", "far"].status) == (2, "passed")
    commands = [json.loads(line) for line in (engine.run_dir / "audit.jsonl").read_text().splitlines()]
    assert sum(r["event"] == "command" for r in commands) == 3  # every answer audited as a real one
