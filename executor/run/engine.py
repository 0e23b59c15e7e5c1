"""The Engine: one run of a runbook, composed of its pieces.

The run folder (`executor.run.run_folder`: lock, state, audit log and seal, events, debug log) is opened and
closed around the run; the scheduler (`executor.run.scheduler`) runs the steps in order, a placed group's
lanes and the matrix cells; attempts (`executor.run.attempts`) run one step on one host, with retries,
fallbacks, gates and `when`, through the transports the transport factory makes. How a run is started
(`RunOptions`) is `executor.run.run_options`'; what it reuses of an earlier run is `executor.run.resume`'s.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from executor.redact import Redactor
from executor.run import event_models, seal
from executor.run.attempts import Attempts, TransportFactory
from executor.run.events import RedactingReporter, Reporter
from executor.run.resume import Fingerprints, Plan, begin
from executor.run.run_folder import Records, RunFolder
from executor.run.run_options import RunOptions as RunOptions  # its home: executor.run.run_options
from executor.run.scheduler import Scheduler
from executor.run.state import WRITE_FAILED as WRITE_FAILED  # the run's status then; the CLI reads it here
from executor.run.state import RunMeta, new_run_id, now
from executor.runbook.gates import GateWorkers
from executor.runbook.loader import Runbook, secret_values
from executor.runbook.model import var_text
from executor.runbook.planner import host_env
from executor.transport import Transport, transport_for

#: How much longer than its host's connect timeout a transport may take to close before the run stops waiting.
CLOSE_GRACE_S = 5.0


class Engine:
    """Runs one runbook once: `await Engine(...).run()` returns the exit code.

    The Engine starts the run as `executor.run.resume.begin` says, for the CLI and an API caller alike: a
    `RunOptions(resume=...)` continues its source run as that run was started (its --var pairs and
    --inventory carried over, under those given now), and every step must render with the vars it
    runs with (InvalidRunbook). `say` gets the notes the CLI prints (the carried flags, a source run of
    another runbook file); `self.start.notes` keeps them. `self.runbook` and `self.options` are the
    run's as it starts (a carried inventory laid over the runbook, every --var parsed).
    `transport_factory` makes each host's transport (`executor.transport.transport_for` unless given:
    a test gives a scripted one, and the run never reaches a host).
    """

    def __init__(
        self,
        runbook: Runbook,
        options: RunOptions,
        reporter: Reporter,
        environ: Mapping[str, str] | None = None,
        say: Callable[[str], None] | None = None,
        *,
        transport_factory: TransportFactory = transport_for,
    ) -> None:
        environ = os.environ if environ is None else environ
        self.start = begin(runbook, options, environ, say)  # the source run found once, the vars carried
        runbook, options = self.start.runbook, self.start.options
        self.runbook = runbook
        self.options = options
        self.variables: dict[str, Any] = {**runbook.header.vars, **options.var_overrides}
        self.env = {name: var_text(value) for name, value in self.variables.items()}
        # refused (InvalidRunbook, at the secret's line) before anything connects or a run folder is written
        self.secrets = secret_values(runbook, environ)
        self.redactor = Redactor(self.secrets.values())
        self.fingerprints = self._fingerprints()
        self.positions = {spec.id: index for index, spec in enumerate(runbook.steps)}
        self._transport_factory = transport_factory
        self.transports: dict[str, Transport] = {}
        self.gates = GateWorkers()
        self.folder = RunFolder(
            options.log_dir,
            self.redactor,
            RedactingReporter(reporter, self.redactor),  # events and the console: masked as stored
            audit_key=seal.configured_key(),  # opt-in: sealing when the user made a key (AuditKeyError if unusable)
            verbose=options.verbose,
            summary=lambda: self.scheduler.summary(),
            release=self._release,
        )
        self.scheduler = Scheduler(runbook, self.folder, self.fingerprints, self.positions)

    def _fingerprints(self) -> Fingerprints:
        """What a resume compares each step by. The vars count once per run, a var holding a secret by its
        redacted text (no digest of a secret is stored)."""
        shown = self.redactor.text
        hosts_shown = {
            host: {name: shown(text) for name, text in host_env(self.runbook, host, self.options.var_overrides).items()}
            for host in self.runbook.hosts
        }
        env_shown = {name: shown(text) for name, text in self.env.items()}
        return Fingerprints(self.runbook, env_shown, sorted(self.secrets), hosts_shown)

    @property
    def records(self) -> Records:
        """Every step's row by (step, host), as last saved."""
        return self.folder.records

    @property
    def run_dir(self) -> Path:
        return self.folder.run_dir

    async def run(self) -> int:
        async with self.folder as folder:
            source = self.start.source
            folder.open_source(source)
            self.runbook = self.scheduler.place()
            plan = self.scheduler.plan(
                source.run_id if source else None, self.options.from_step, self.options.only_step
            )
            meta = self._meta(folder.source_link())
            self.scheduler.open_rows(plan, meta.resumed_from)
            folder.create(meta)
            attempts = Attempts(
                self.runbook,
                folder,
                secrets=self.secrets,
                redactor=self.redactor,
                var_overrides=self.options.var_overrides,
                fingerprints=self.fingerprints,
                positions=self.positions,
                index=self.scheduler.index,
                gates=self.gates,
                transports=self.transports,
                transport_factory=self._transport_factory,
            )
            self._started(meta, plan)
            folder.record_abandoned()
            folder.end(*await self.scheduler.run(attempts))
        return folder.code

    def _meta(self, link: str) -> RunMeta:
        """The new run's run.json: where it comes from, how it was started (a --var holding a secret by its
        name only), and what it trusts."""
        source, options, shown = self.start.source, self.options, self.redactor.text
        return RunMeta(
            run_id=new_run_id(),
            runbook=self.runbook.name,
            path=str(self.runbook.path.resolve()),
            started_at=now(),
            resumed_from=source.run_id if source else None,
            audit_prev_hash=link,
            vars={k: shown(v) for k, v in self.env.items()},
            secrets=sorted(self.secrets),
            runbook_sha256=self.runbook.sha256,
            var_args=[pair for pair in options.var_args if shown(pair) == pair],
            var_args_withheld=[p.partition("=")[0] for p in options.var_args if shown(p) != p],
            inventory=str(options.inventory) if options.inventory else None,
            host_key_unverified=self.scheduler.unverified_hosts(),
        )

    def _started(self, meta: RunMeta, plan: Plan) -> None:
        """Say the run started, with every step's plan; then, once per run and before anything connects,
        each host whose key is not verified."""
        folder, why = self.folder, plan.why
        reused_ids, run_ids = set(plan.reused), set(plan.to_run)
        folder.log.info(
            "run started", run_dir=str(folder.run_dir), resumed_from=meta.resumed_from, runs=sorted(run_ids)
        )
        folder.events.emit(
            event_models.RunStarted,
            run_dir=str(folder.run_dir),
            runbook=self.runbook.name,
            resumed_from=meta.resumed_from,
            steps=[
                {
                    "id": s.id,
                    "kind": s.kind,
                    "hosts": self.runbook.step_hosts[s.id],
                    "reused": s.id in reused_ids,
                    "runs": s.id in run_ids,
                    "plan": why[s.id],
                }
                for s in self.runbook.steps
            ],
            carried=self._carried(),
        )
        for host in meta.host_key_unverified:
            folder.audit.host_key_unverified(host)
            folder.events.emit(
                event_models.Note,
                host=host,
                message="host key verification is OFF (verify_host_key: false): any server answering at"
                f" {self.runbook.hosts[host].address} is trusted",
            )

    def _carried(self) -> dict[str, Any] | None:
        """`run_started.carried`: what a resume carries over from the run it continues (None: no resume)."""
        carry = self.start.carry
        if carry is None:
            return None
        inventory = str(carry.inventory) if carry.carried_inventory and carry.inventory else None
        return {"inventory": inventory, "vars": carry.carried, "unset": carry.unset}

    async def _release(self) -> None:
        """Close what the run holds on hosts: its transports, then its gate workers (even while cancelled). A
        transport that fails to close, or does not within its host's connect timeout and CLOSE_GRACE_S (the
        bound of a dead network's close), changes nothing the run recorded: the debug log says so."""
        hosts = list(self.transports)
        closing = asyncio.gather(*(self._close(host) for host in hosts), return_exceptions=True)
        try:
            for host, closed in zip(hosts, await asyncio.shield(closing), strict=True):
                if isinstance(closed, BaseException):
                    error = f"{type(closed).__name__}: {closed}"
                    self.folder.log.warning("transport close failed", host=host, error=error)
        finally:  # a second cancellation stops the wait above, never the gate workers' close
            await asyncio.shield(self.gates.close())

    async def _close(self, host: str) -> None:
        limit = self.runbook.hosts[host].connect_timeout + CLOSE_GRACE_S
        try:
            await asyncio.wait_for(self.transports[host].close(), limit)
        except TimeoutError:
            raise TimeoutError(f"not closed within {limit:g}s") from None
