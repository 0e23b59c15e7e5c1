"""Test your own runbook offline: the `runbook_offline` pytest fixture.

runbook registers this module as a pytest plugin (entry point `pytest11` in pyproject.toml), so a project
that installs runbook gets the fixture without a conftest. `runbook_offline.host(name)` is the
`ScriptedTransport` (executor/transport/scripted.py) that plays the runbook's host `name`: say what it
answers, then `runbook_offline.run(path)` runs the runbook in-process through the real Engine (order,
gates, retries, fallbacks, `when`, cells, resume, state and audit log), with no host, no SSH and no
network, in a fraction of a second. `OfflineRun` is what the run did: its exit code, its events as `--json` prints
them, each step's record, the commands each host received.

A pytest fixture rather than a `runbook test` command: what a runbook should do is asserted in Python
(a fact's value, a gate's message, which steps ran), where a callable can answer a command from its
config or count its attempts, and where the user's other tests already are.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

# The engine is imported when a test runs one: pytest loads this plugin in every session of a project that
# installed runbook, most of which run no runbook.
if TYPE_CHECKING:
    from executor.diagnostics import Log
    from executor.redact import Redactor
    from executor.run.event_models import Event
    from executor.run.state import StepRecord
    from executor.runbook.model import Host, VarValue
    from executor.transport.scripted import ScriptedCommand, ScriptedTransport


#: What the probe program printed on the sandbox's H200 test host (one NVIDIA H200 as the real host of
#: ../shared/fixtures/gpu-host-h200 reports it, SGLang 0.5.23 with DFLASH, a Hub token, the flagship's two
#: repos on the Hub), with its paths as the flagship's defaults name them.
H200_PROBE = Path(__file__).with_name("testing_h200_probe.json")


def h200_probe() -> dict[str, Any]:
    """A probe document of a host that passes the flagship's probe gates: change what a test needs
    (`doc["gpu"]["gpus"] = []`), then answer with it: `host.program("probe", doc)`."""
    document: dict[str, Any] = json.loads(H200_PROBE.read_text(encoding="utf-8"))
    return document


@dataclass
class OfflineRun:
    """What one offline run did."""

    exit_code: int
    events: list[dict[str, Any]]  # as `runbook run --json` prints them
    run_dir: Path
    records: list[StepRecord] = field(default_factory=list)  # every step's row of state.db, in step order

    @property
    def run_id(self) -> str:
        return self.run_dir.name

    @property
    def status(self) -> str:
        """The run's status as `runbook status` says it (passed, failed, cells-failed, ...)."""
        return str(next(e["status"] for e in self.events if e["event"] == "run_finished"))

    @property
    def started(self) -> list[str]:
        """The steps that started, in order (a step left out by a failed cell starts and is skipped)."""
        return [e["step"] for e in self.events if e["event"] == "step_started"]

    def ran(self, status: str | None = None) -> list[str]:
        """The steps that finished (with `status`: passed, failed, skipped), in the order they finished."""
        return [e["step"] for e in self.events if e["event"] == "step_finished" and status in (None, e["status"])]

    def step(self, step_id: str, host: str | None = None) -> StepRecord:
        """The record of `step_id` (on `host`, where it runs on several)."""
        found = [r for r in self.records if r.step == step_id and host in (None, r.host)]
        if len(found) != 1:
            raise KeyError(f"{step_id}{'@' + host if host else ''}: {len(found)} records")
        return found[0]

    def facts(self, step_id: str, host: str | None = None) -> Any:
        return self.step(step_id, host).facts

    def failures(self) -> list[str]:
        """Why attempts failed, as the run said it (attempt_failed events), in order."""
        return [f"{e['step']}@{e['host']}: {e['message']}" for e in self.events if e["event"] == "attempt_failed"]


class Offline:
    """Scripted hosts, and runs of a runbook against them, into `log_dir`."""

    def __init__(self, log_dir: Path, environ: Mapping[str, str] | None = None) -> None:
        self.log_dir = log_dir
        self.environ: dict[str, str] = dict(environ or {})  # the controller's environment a run sees (secrets)
        self.hosts: dict[str, ScriptedTransport] = {}

    def host(self, name: str) -> ScriptedTransport:
        """The scripted host `name` (one per name, kept across runs: a resume finds the files of the run before)."""
        from executor.transport.scripted import ScriptedTransport

        if name not in self.hosts:
            self.hosts[name] = ScriptedTransport(name)
        return self.hosts[name]

    def transport(self, name: str, host: Host, redactor: Redactor, log: Log) -> ScriptedTransport:
        """The Engine's transport factory: host `name`'s scripted transport, bound to the run as
        `executor.transport.transport_for` binds a real one."""
        made = self.host(name)
        made.redactor = redactor
        made.log = log.bind(host=name)
        return made

    def commands(self, host: str) -> list[ScriptedCommand]:
        return self.host(host).commands

    def run(
        self,
        runbook: Path | str,
        *,
        inventory: Path | str | None = None,
        var: Mapping[str, VarValue] | Sequence[str] = (),
        resume: str | None = None,
        from_step: str | None = None,
        only_step: str | None = None,
    ) -> OfflineRun:
        """Run `runbook` as `runbook run` would (`var`: --var pairs, or a mapping of them, a bool given as `true`
        or `false`; `resume`: a run id or "latest"), against the scripted hosts; returns when the run has ended.
        In an async test: `run_async`."""
        return asyncio.run(
            self.run_async(
                runbook, inventory=inventory, var=var, resume=resume, from_step=from_step, only_step=only_step
            )
        )

    async def run_async(
        self,
        runbook: Path | str,
        *,
        inventory: Path | str | None = None,
        var: Mapping[str, VarValue] | Sequence[str] = (),
        resume: str | None = None,
        from_step: str | None = None,
        only_step: str | None = None,
    ) -> OfflineRun:
        """`run`, on the running event loop."""
        from executor.run.engine import Engine, RunOptions
        from executor.run.state import open_state
        from executor.runbook.loader import load_runbook
        from executor.runbook.model import var_text

        site = None if inventory is None else Path(inventory)
        pairs = [f"{k}={var_text(v)}" for k, v in var.items()] if isinstance(var, Mapping) else list(var)
        options = RunOptions(
            log_dir=self.log_dir,
            var_args=pairs,
            inventory=site,
            resume=resume,
            from_step=from_step,
            only_step=only_step,
        )
        reporter = _collector()
        loaded = load_runbook(Path(runbook), site)
        code = await Engine(loaded, options, reporter, self.environ, transport_factory=self.transport).run()
        run_dir = Path(next(e["run_dir"] for e in reporter.events if e["event"] == "run_started"))
        with open_state(run_dir) as state:
            records = state.records()  # in step order
        return OfflineRun(code, reporter.events, run_dir, records)


def _collector() -> Any:
    """A reporter keeping every event as `--json` prints it (in `.events`)."""
    from executor.run.events import Reporter, json_line

    class Collected(Reporter):
        def __init__(self) -> None:
            self.events: list[dict[str, Any]] = []

        def emit(self, event: Event) -> None:
            self.events.append(json.loads(json_line(event)))

    return Collected()


@pytest.fixture
def runbook_offline(tmp_path: Path) -> Iterator[Offline]:
    """Scripted hosts and in-process runs of a runbook against them (executor.faces.testing); runs go to a
    temporary log folder, and no variable of the test's environment reaches them (give secrets in
    `runbook_offline.environ`)."""
    yield Offline(tmp_path / "runs")
