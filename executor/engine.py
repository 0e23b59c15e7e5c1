"""The run loop: steps in order, hosts in parallel, retries, fallbacks, gates, state, audit.

An attempt fails on a failed gate, a timeout, unusable output or a transport error; tenacity
repeats it per the retry policy; then each fallback gets the same treatment. Every command is
audited before the step's state is written, so the state never claims more than the log.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import itertools
import json
import os
import sqlite3
import traceback
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from pydantic import BaseModel
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    stop_after_attempt,
    wait_exponential_jitter,
)

from executor import audit as audit_mod
from executor import cells, diagnostics, durable, event_models, seal
from executor.audit import AuditContext, AuditLog
from executor.campaign import EXIT_CELLS_FAILED, MatrixGroup, value_text
from executor.emitter import Emitter, EventStream
from executor.errors import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    AttemptFailed,
    CommandInterrupted,
    CommandTimedOut,
    DurableWriteError,
    FactsError,
    FactsUnreadable,
    GateWorkerUnavailable,
    HostKeyError,
    HostRefused,
    StateError,
    StepKindCrashed,
    TransportError,
    TransportFailed,
)
from executor.events import EVENTS_FILE, EventsFile, RedactingReporter, Reporter
from executor.gates import GateWorkers, roots
from executor.loader import Runbook, secret_values
from executor.model import RetryPolicy, host_variables, var_text
from executor.planner import host_env, placed_hosts
from executor.redact import Redactor
from executor.render import render_command
from executor.resume import Fingerprints, begin, plan_steps
from executor.state import (
    NOT_STARTED,
    ONLY_SKIPPED,
    RunLock,
    RunMeta,
    RunState,
    StepRecord,
    new_run_id,
    now,
    open_state,
    passed_before,
)
from executor.state import WRITE_FAILED as WRITE_FAILED  # the run's status then; the CLI reads it here
from executor.stepkind import FACTS_MAX_DEPTH, StepContext, StepSpec, StepView, check_depth
from executor.transport import Transport, transport_for
from executor.transport.base import (
    Collector,
    CommandResult,
    OutputSink,
    Transfer,
    kill_report,
)

TAIL_LINES = 20
#: A durable write to the run folder failed (DurableWriteError): the exit code (the status: WRITE_FAILED)
EXIT_WRITE_FAILED = DurableWriteError.exit_code


@dataclass
class RunOptions:
    """How a run is started: what the CLI's flags say, and what an API caller gives the Engine alike."""

    log_dir: Path = Path("logs")
    var_overrides: Mapping[str, Any] = field(default_factory=dict)  # var values, over the `var_args`
    resume: str | None = None  # a run id, or "latest"
    from_step: str | None = None
    only_step: str | None = None
    # how the run was started, recorded in run.json so that `--resume` can start it the same way
    var_args: Sequence[str] = ()  # --var K=V pairs
    inventory: Path | None = None  # the inventory the runbook was loaded with
    verbose: bool = False  # the run's diagnostics (debug.log) on stderr too: `runbook run -v`


def tail(text: str, lines: int = TAIL_LINES, width: int = 300) -> str:
    """The last lines of an output, each cut to `width` (a one-line JSON document can be megabytes).

    Lines end at newlines only: a CR, form feed or U+2028 stays in its line, where the display
    shows it escaped (executor.terminal), instead of passing for a line break the host never sent."""
    body = text.rstrip("\n")
    kept = body.split("\n")[-lines:] if body else []
    return "\n".join(f"    | {line[:width]}{' ...' if len(line) > width else ''}" for line in kept)


def _in_group(group: MatrixGroup, spec: StepSpec) -> bool:
    return spec.id in group.instances


def _peers(runbook: Runbook, spec: StepSpec) -> list[str]:
    """The hosts the step's commands also run on (`StepSpec.peer_hosts`), of the step and its fallbacks."""
    return list(
        dict.fromkeys(host for variant in [spec, *runbook.fallbacks.get(spec.id, [])] for host in variant.peer_hosts())
    )


def _bounded_facts(facts: Any) -> Any:
    """Facts as JSON data, nested at most FACTS_MAX_DEPTH deep (checked before anything recurses into them)."""
    if isinstance(facts, BaseModel):
        facts = facts.model_dump(mode="json")
    check_depth(facts)
    return json.loads(json.dumps(facts, default=str))


class HostContext(StepContext):
    """One attempt of one step on one host: audited command execution and file transfer."""

    def __init__(
        self, engine: Engine, spec: StepSpec, host: str, attempt: int, via: str, *, strict: bool = False
    ) -> None:
        self.engine = engine
        self.spec = spec
        self.host_name = host
        self.host_address = engine.runbook.hosts[host].address
        self.vars = engine.env_for(host)
        self.attempt = attempt
        self.via = via
        self.strict = strict  # a peer's view: only the facts of the steps that passed on this host
        self.base_dir = engine.runbook.path.parent
        self.output_dir = engine.run_dir / "hosts" / host
        self.run_dir = engine.run_dir
        self.redactor = engine.redactor
        self.audit_context = AuditContext(step=spec.id, host=host, attempt=attempt, via=via)
        self.events = engine.events.bind(step=spec.id, host=host, attempt=attempt)
        self.debug_log = engine.log.bind(step=spec.id, host=host, attempt=attempt, via=via)

    def fact(self, step_id: str, path: str) -> Any:
        if self.strict:
            record = self.engine.records.get((step_id, self.host_name))
            if record is None or record.status != "passed":
                raise KeyError(step_id)
            value: Any = record.facts
        else:
            value = self.engine.facts_view(self.host_name)[step_id]["facts"]
        for part in path.split("."):
            value = value[int(part)] if isinstance(value, list) else value[part]
        return value

    def peer(self, host: str) -> HostContext:
        runbook = self.engine.runbook
        if host not in {*runbook.step_hosts[self.spec.id], *_peers(runbook, self.spec)}:  # connected before it started
            raise FactsError(f"step '{self.spec.id}' has no connection to host '{host}' (not one of its peer hosts)")
        return HostContext(self.engine, self.spec, host, self.attempt, self.via, strict=True)

    def facts_of_kind(self, kind: str) -> dict[str, Any]:
        engine, view = self.engine, self.engine.facts_view(self.host_name)
        earlier = engine.runbook.steps[: engine.positions[self.spec.id]]
        return {
            spec.id: view[spec.id]["facts"]
            for spec in earlier
            if spec.kind == kind and spec.id in view and view[spec.id]["facts"] is not None
        }

    def steps_before(self, kinds: Iterable[str] | None = None) -> list[StepView]:
        engine, wanted = self.engine, None if kinds is None else set(kinds)
        views: list[StepView] = []
        for spec in engine.runbook.steps[: engine.positions[self.spec.id]]:
            if wanted is not None and spec.kind not in wanted:
                continue
            instance = engine.runbook.instances.get(spec.id)
            for host in engine.runbook.step_hosts[spec.id]:
                record = engine.records.get((spec.id, host))
                if record is None:
                    continue
                views.append(
                    StepView(
                        step=spec.id,
                        base=instance.base if instance else spec.id,
                        kind=spec.kind,
                        host=host,
                        status=record.status,
                        message=record.message,
                        facts=record.facts,
                        group=instance.group if instance else None,
                        cell=instance.values if instance else {},
                    )
                )
        return views

    async def run(
        self, script: str | bytes, *, timeout: float | None = None, on_output: OutputSink | None = None
    ) -> CommandResult:
        engine = self.engine
        if engine.write_failure is not None:  # the run folder cannot be written: no new command starts
            raise engine.write_failure
        variables, secrets = self.spec.environment(self.vars, engine.secrets)
        command = render_command(
            script, {**variables, **cells.instance_environment(engine.runbook, self.spec.id)}, secrets
        )
        transport = engine.transports[self.host_name]
        limit = timeout or self.spec.timeout or engine.runbook.header.defaults.timeout
        try:
            result = await transport.run(command, limit, on_output)
            result.timeout_s = limit
        except CommandInterrupted as exc:
            self.debug_log.info("command interrupted", kill_confirmed=exc.result.kill_confirmed)
            self._record(command.display, exc.result)
            raise
        except TransportError as exc:
            self.debug_log.warning("transport error", error=str(exc), kind=type(exc).__name__)
            collect = Collector(redactor=engine.redactor)
            collect.stdout.feed(exc.partial_stdout)
            collect.stderr.feed(exc.partial_stderr + f"\n[runbook] transport error: {exc}".encode())
            partial = collect.result(None)
            self._record(command.display, partial)
            if isinstance(exc, HostKeyError):
                raise HostRefused(engine.redactor.text(str(exc))) from None
            raise TransportFailed(f"transport error: {engine.redactor.text(str(exc))}") from None
        finally:
            for note in transport.take_notes():
                self.events.emit(event_models.Note, message=note)
        self.debug_log.debug(
            "command finished", exit_code=result.exit_code, timed_out=result.timed_out, duration_s=result.duration_s
        )
        self._record(command.display, result)
        return result

    def _record(self, display: str, result: CommandResult) -> None:
        engine = self.engine  # the output was redacted as it arrived (transport.base.Captured)
        engine.audit.command(self.audit_context, display, result)
        self.events.emit(
            event_models.CommandFinished,
            exit_code=result.exit_code,
            timed_out=result.timed_out,
            duration_s=result.duration_s,
        )

    def progress(self, message: str, /, **fields: Any) -> None:
        self.events.emit(event_models.Progress, message=message, fields=fields)

    async def put(self, local: Path, remote: str) -> Transfer:
        return await self._transfer(self.engine.transports[self.host_name].put(local, remote))

    async def get(self, remote: str, local: Path) -> Transfer:
        return await self._transfer(self.engine.transports[self.host_name].get(remote, local), into=local)

    async def _transfer(self, transfer: Awaitable[Transfer], into: Path | None = None) -> Transfer:
        """`into`: the file of the run folder that a fetch writes; a full or failing disk there stops the run."""
        limit = self.spec.timeout or self.engine.runbook.header.defaults.timeout  # a stalled SFTP must not hang
        try:
            try:
                done = await asyncio.wait_for(transfer, limit)
            except BaseException:
                if into is not None:  # no half-fetched file is left behind (on a full disk, it filled it)
                    with contextlib.suppress(OSError):
                        into.unlink(missing_ok=True)
                raise
        except TimeoutError:
            raise CommandTimedOut(f"file transfer timed out after {limit:g}s") from None
        except OSError as exc:
            if into is not None and exc.errno in durable.DISK_ERRNOS:
                raise durable.failed(exc, into.parent, "a fetched file") from None
            raise TransportFailed(f"file transfer failed: {self.engine.redactor.text(str(exc))}") from None
        except TransportError as exc:
            raise TransportFailed(f"file transfer failed: {self.engine.redactor.text(str(exc))}") from None
        self.engine.audit.transfer(self.audit_context, done.direction, done.local, done.remote, done.size, done.sha256)
        return done


def _worth_retrying(policy: RetryPolicy, log: Any, state: RetryCallState) -> bool:
    """tenacity's retry condition: a failed attempt is retried unless its failure class is one of the policy's
    `non_retryable` (README, "Retries"); a failure that ends attempts still left says so in its message."""
    failure = state.outcome.exception() if state.outcome is not None else None
    if not isinstance(failure, AttemptFailed):
        return False
    if policy.retries(failure):
        return True
    if state.attempt_number < policy.attempts:
        failure.not_retried()
        log.info("not retried", attempt=state.attempt_number, failure=type(failure).__name__)
    return False


class Engine:
    """Runs one runbook once: `await Engine(...).run()` returns the exit code.

    The Engine starts the run as `executor.resume.begin` says, for the CLI and an API caller alike: a
    `RunOptions(resume=...)` continues its source run as that run was started (its --var pairs and
    --inventory carried over, under those given now), and every step must render with the vars it
    runs with (InvalidRunbook). `say` gets the notes the CLI prints (the carried flags, a source run of
    another runbook file); `self.start.notes` keeps them. `self.runbook` and `self.options` are the
    run's as it starts (a carried inventory laid over the runbook, every --var parsed).
    """

    def __init__(
        self,
        runbook: Runbook,
        options: RunOptions,
        reporter: Reporter,
        environ: Mapping[str, str] | None = None,
        say: Callable[[str], None] | None = None,
    ) -> None:
        environ = os.environ if environ is None else environ
        self.start = begin(runbook, options, environ, say)  # the source run found once, the vars carried
        runbook, options = self.start.runbook, self.start.options
        self.runbook = runbook
        self.options = options
        header = runbook.header
        self.variables: dict[str, Any] = {**header.vars, **options.var_overrides}
        self.env = {name: var_text(value) for name, value in self.variables.items()}
        # refused (InvalidRunbook, at the secret's line) before anything connects or a run folder is written
        self.secrets = secret_values(runbook, environ)
        self.redactor = Redactor(self.secrets.values())
        #: the vars as the fingerprint counts them, once per run: a var holding a secret by its redacted
        #: text (no digest of a secret is stored)
        self._env_shown = {name: self.redactor.text(text) for name, text in self.env.items()}
        hosts_shown = {
            host: {name: self.redactor.text(text) for name, text in self.env_for(host).items()}
            for host in runbook.hosts
        }
        self.reporter = RedactingReporter(reporter, self.redactor)  # events and the console: masked as stored
        self.audit_key = seal.configured_key()  # opt-in: sealing when the user made a key (AuditKeyError if unusable)
        self.records: dict[tuple[str, str], StepRecord] = {}
        self.hosts_to_run: dict[str, list[str]] = {}  # the hosts each step that runs runs on (see plan_steps)
        self.positions = {spec.id: index for index, spec in enumerate(runbook.steps)}
        self.fingerprints = Fingerprints(runbook, self._env_shown, sorted(self.secrets), hosts_shown)
        self.transports: dict[str, Transport] = {}
        self.gates = GateWorkers()
        self.cells = cells.CellBook(cells.Index(runbook))
        self.stopping = False  # a step failed outside `on_failure: continue`: the lanes start nothing new

    def gate_names(self, spec: StepSpec, host: str) -> dict[str, Callable[[], Any]]:
        """What gates and `when` read besides the command's output: `steps` (with each group mate by its
        base id as the same cell's instance), `vars`, and `matrix` (the instance's axis values)."""
        instance = self.runbook.instances.get(spec.id)

        def steps() -> dict[str, Any]:
            view = self.facts_view(host)
            for base, mate in self.cells.index.aliases(spec.id).items():
                if mate in view:
                    view[base] = view[mate]
            return view

        return {
            "steps": steps,
            "vars": lambda: self.redactor.deep(self.variables_for(host)),  # masked: a failed gate shows no secret
            "matrix": lambda: cells.matrix_context(instance.values if instance else {}),
        }

    def variables_for(self, host: str) -> dict[str, Any]:
        """The vars of a step on `host`: the host's own `vars` over the runbook's, `--var` over both."""
        return host_variables(self.runbook.header.vars, self.runbook.hosts[host], self.options.var_overrides)

    def env_for(self, host: str) -> dict[str, str]:
        """`variables_for(host)` as the step's environment gets them."""
        return host_env(self.runbook, host, self.options.var_overrides)

    def facts_view(self, host: str) -> dict[str, Any]:
        """`steps.<id>` as gates see it on `host`: facts, status, and per-host facts."""
        view: dict[str, Any] = {}
        for (step_id, step_host), rec in self.records.items():
            if rec.status in NOT_STARTED:
                continue
            entry = view.setdefault(step_id, {"hosts": {}, "facts": None, "status": rec.status})
            entry["hosts"][step_host] = {"facts": rec.facts, "status": rec.status}
            if step_host == host or (entry["facts"] is None and len(self.runbook.step_hosts[step_id]) == 1):
                entry["facts"] = rec.facts
                entry["status"] = rec.status
        return view

    # ---- running ------------------------------------------------------------------------------

    async def run(self) -> int:
        source_meta = self.start.source
        source_records: dict[tuple[str, str], StepRecord] = {}
        source_dir: Path | None = None
        source_lock: RunLock | None = None
        if source_meta is not None:
            source_dir = self.options.log_dir / source_meta.run_id
            source_lock = RunLock(source_dir)
            source_lock.acquire()  # a run being resumed must not be running, nor resumed twice
            try:
                with open_state(source_dir) as source_state:
                    source_records = {(r.step, r.host): r for r in source_state.records()}
            except BaseException:
                source_lock.release()
                raise
        try:
            self._place(source_records)
            plan = plan_steps(
                self.runbook,
                self.fingerprints,
                source_records,
                source_meta.run_id if source_meta else None,
                self.options.from_step,
                self.options.only_step,
            )
            # read now, inside this try: a source log that cannot be read (StateError) must not keep it locked
            link = audit_mod.chain_tail(source_dir) if source_dir is not None else audit_mod.GENESIS
        except BaseException:
            if source_lock is not None:
                source_lock.release()
            raise
        self.hosts_to_run, why = plan.hosts_to_run, plan.why
        to_run = [spec for spec in self.runbook.steps if spec.id in self.hosts_to_run]
        run_id = new_run_id()
        run_dir = self.options.log_dir / run_id
        meta = RunMeta(
            run_id=run_id,
            runbook=self.runbook.name,
            path=str(self.runbook.path.resolve()),
            started_at=now(),
            resumed_from=source_meta.run_id if source_meta else None,
            audit_prev_hash=link,
            vars={k: self.redactor.text(v) for k, v in self.env.items()},
            secrets=sorted(self.secrets),
            runbook_sha256=self.runbook.sha256,
            var_args=[pair for pair in self.options.var_args if self.redactor.text(pair) == pair],
            var_args_withheld=[p.partition("=")[0] for p in self.options.var_args if self.redactor.text(p) != p],
            inventory=str(self.options.inventory) if self.options.inventory else None,
            host_key_unverified=self._unverified_hosts(to_run),
        )
        reused_ids, run_ids = set(plan.reused), set(plan.to_run)
        kept = {p.step: p.reused_on for p in plan.steps}  # the hosts whose record each step keeps from the source
        for spec in self.runbook.steps:  # every step of the run has a row from the start
            for host in self.runbook.step_hosts[spec.id]:
                old = source_records.get((spec.id, host))
                origin = (old.reused_from if old else None) or meta.resumed_from
                if host in kept[spec.id]:
                    assert old is not None
                    if old.status != "passed" and passed_before(old):  # an --only run left it out after it passed
                        old = dataclasses.replace(old, status="passed", message=None)
                    self.records[(spec.id, host)] = dataclasses.replace(old, reused_from=origin)
                    if old.status == "skipped":  # left out unchanged (a `when:` still false): so are its dependents
                        self.cells.left_out(spec.id, old.message or "")
                    elif old.status == "failed":  # kept as it ended last (`--from`/`--only` after it)
                        self.cells.status[spec.id] = "failed"
                    else:
                        self.cells.status[spec.id] = "passed"
                elif why[spec.id] == ONLY_SKIPPED and passed_before(old):
                    assert old is not None  # left out by this --only run: the record keeps the facts of its pass
                    self.records[(spec.id, host)] = dataclasses.replace(
                        old, status="skipped", message=ONLY_SKIPPED, reused_from=origin
                    )
                elif why[spec.id] == ONLY_SKIPPED and old is not None and old.status == "failed":
                    self.records[(spec.id, host)] = dataclasses.replace(old, reused_from=origin)  # as it ended last
                else:
                    status = "pending" if spec.id in run_ids else "skipped"
                    self.records[(spec.id, host)] = StepRecord(
                        step=spec.id,
                        host=host,
                        position=self.positions[spec.id],
                        status=status,
                        fingerprint="",
                        message=why[spec.id] if status == "skipped" else None,
                    )
        state: RunState | None = None
        try:
            self.options.log_dir.mkdir(parents=True, exist_ok=True)
            # published whole: locked, with its status and every step's row, before its run.json appears
            state = RunState.create(run_dir, meta, list(self.records.values()))
            sealer = seal.HeadSeal(self.audit_key, run_id, link, meta.resumed_from) if self.audit_key else None
            self.audit = AuditLog(run_dir, run_id, self.redactor, prev_hash=link, seal=sealer)
        except (OSError, sqlite3.Error, DurableWriteError) as exc:  # a full disk, a log dir that is a file, ...
            if state is not None:
                state.close()
            if source_lock is not None:
                source_lock.release()
            if isinstance(exc, DurableWriteError):
                raise
            if isinstance(exc, OSError) and exc.errno in durable.DISK_ERRNOS:  # full, read-only, failing
                raise durable.failed(exc, self.options.log_dir, "the run folder") from None
            reason = getattr(exc, "strerror", None) or str(exc)
            raise StateError(f"cannot write the run folder {run_dir}: {reason}", reason=reason) from None
        self.state = state
        self.run_dir = run_dir
        self.write_failure: DurableWriteError | None = None  # set by the first failed write: the run stops
        self.debug = diagnostics.DebugLog(run_dir / diagnostics.DEBUG_FILE, self.redactor, echo=self.options.verbose)
        self.log = self.debug.log.bind(run_id=run_id)  # every diagnostic line of the run names it
        self.gates.log = self.log
        current_run = diagnostics.CURRENT.set(self.log)  # asyncssh's records from this run's tasks go here
        self.log.info("run started", run_dir=str(run_dir), resumed_from=meta.resumed_from, runs=sorted(run_ids))
        events_file = EventsFile(run_dir / EVENTS_FILE)  # masked as the console is: the same lines as --json
        self.events = Emitter(
            EventStream(self.reporter, run_id, self.redactor, tees=[RedactingReporter(events_file, self.redactor)])
        )
        self.events.emit(
            event_models.RunStarted,
            run_dir=str(run_dir),
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
        )
        status, code = "passed", EXIT_OK
        try:  # from here on every way out closes the run (a failed write of the first record included)
            for host in meta.host_key_unverified:  # said once per run, before anything connects
                self.audit.host_key_unverified(host)
                self.events.emit(
                    event_models.Note,
                    host=host,
                    message="host key verification is OFF (verify_host_key: false): any server answering at"
                    f" {self.runbook.hosts[host].address} is trusted",
                )
            if source_meta is not None and source_dir is not None:
                self._record_abandoned(source_meta.run_id, source_dir, source_records)
            if not await self._run_steps(to_run):
                status, code = "failed", EXIT_FAILED
            elif self.cells.failed:
                status, code = "cells-failed", EXIT_CELLS_FAILED
        except DurableWriteError as exc:  # never a step failure, never retried, never a passed run
            self.write_failure = self.write_failure or exc
        except asyncio.CancelledError:
            status, code = "interrupted", EXIT_INTERRUPTED
        except BaseException:
            status = "crashed"
            raise
        finally:
            if self.write_failure is not None:
                status, code = WRITE_FAILED, EXIT_WRITE_FAILED
            try:
                if self.write_failure is None:  # a finished run's head matches its log exactly (audit verify)
                    self.audit.finish()
                if self.cells.failed:  # what `runbook status` lists
                    state.set("failed_cells", json.dumps(self.cells.failed_cells()))
                # finished_at first: a run whose status says passed has every write behind it
                state.set("finished_at", now())
                state.set("status", status)
            except DurableWriteError as exc:  # the status stays what it was (running: a resume continues it)
                self.write_failure = self.write_failure or exc
                status, code = WRITE_FAILED, EXIT_WRITE_FAILED
            self.events.emit(
                event_models.RunFinished,
                status=status,
                exit_code=code,
                audit=str(run_dir / audit_mod.AUDIT_FILE),
                error=str(self.write_failure) if self.write_failure else None,
            )
            await asyncio.shield(self._close_transports())
            await asyncio.shield(self.gates.close())
            self.audit.close()
            state.close()
            self.log.info("run finished", status=status, exit_code=code)
            self.debug.close()
            events_file.close()
            diagnostics.CURRENT.reset(current_run)
            if source_lock is not None:
                source_lock.release()
        if self.write_failure is not None:
            raise self.write_failure
        return code

    def _place(self, source: Mapping[tuple[str, str], StepRecord]) -> None:
        """Each instance of a placed group on its pool's hosts (`executor.placement.place`), a resumed run's
        servers kept on the hosts they ran on: the run's `step_hosts` say so from here on."""
        if any(group.placement is not None for group in self.runbook.groups):
            previous = {step: host for (step, host) in source}  # a unit's id is its server's, or its own
            hosts = placed_hosts(self.runbook, previous, self.cells.index)
            self.runbook = dataclasses.replace(self.runbook, step_hosts=hosts)

    def _record_abandoned(self, run_id: str, run_dir: Path, records: dict[tuple[str, str], StepRecord]) -> None:
        """Open the log with an `abandoned` record for each step the resumed run's process stopped in
        (killed, or stopped by a failed write), saying what that run's log holds of its last attempt."""
        running = [old for old in records.values() if old.status == "running"]
        if not running:
            return
        found = audit_mod.attempt_records(run_dir, [(old.step, old.host, old.attempts) for old in running])
        for old in running:
            key = (old.step, old.host, old.attempts)
            self.audit.abandoned(AuditContext(*key), run_id, old.started_at, old.attempts, found[key])

    def _unverified_hosts(self, to_run: list[StepSpec]) -> list[str]:
        """The SSH hosts this run connects to whose host key is not verified (`verify_host_key: false`)."""
        used = {host for spec in to_run for host in self.hosts_to_run.get(spec.id, self.runbook.step_hosts[spec.id])}
        used |= {host for spec in to_run for host in _peers(self.runbook, spec)}
        hosts = self.runbook.hosts
        return sorted(name for name in used if not hosts[name].is_local and not hosts[name].verify_host_key)

    async def _close_transports(self) -> None:
        await asyncio.gather(*(t.close() for t in self.transports.values()), return_exceptions=True)

    async def _run_steps(self, to_run: list[StepSpec]) -> bool:
        """Every step to run, in order; the instances of a placed matrix group in lanes, one per host of its
        pool. False when a step failed outside `on_failure: continue` (the run fails)."""
        index = 0
        while index < len(to_run):
            group = self.cells.index.group_of(to_run[index].id)
            if group is None or group.placement is None:
                passed = await self._run_step(to_run[index])
                index += 1
            else:
                members = list(itertools.takewhile(functools.partial(_in_group, group), to_run[index:]))
                passed = await self._run_lanes(group, members)
                index += len(members)
            if not passed:
                return False
        return True

    async def _run_lanes(self, group: MatrixGroup, members: list[StepSpec]) -> bool:
        """A placed group's instances: each host of its pool runs those placed on it, in group order (so one
        server at a time per host), the hosts in parallel. A failure that stops the run lets the running
        instances finish and starts nothing new."""
        hosts_of = {s.id: self.hosts_to_run.get(s.id, self.runbook.step_hosts[s.id]) for s in members}
        by_id = {s.id: s for s in members}

        async def lane(host: str, ids: list[str]) -> None:
            for step_id in ids:
                if self.stopping:
                    return
                if not await self._run_step(by_id[step_id], [host]):
                    self.stopping = True

        tasks = [asyncio.ensure_future(lane(h, ids)) for h, ids in cells.lanes(members, hosts_of, group.pool).items()]
        try:
            await asyncio.gather(*tasks)
        finally:  # one lane's error (a failed write, a signal) stops the others
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        return not self.stopping

    def _skip(self, spec: StepSpec, hosts: list[str], reason: str) -> None:
        """Record a step left out on `hosts` (a failed cell, a needed step left out) without running it."""
        for host in hosts:
            old = self.records[(spec.id, host)]
            self._save(
                dataclasses.replace(
                    old,
                    status="skipped",
                    message=reason,
                    started_at=now(),
                    duration_s=0,
                    fingerprint=self.fingerprints.fingerprint(spec, host),  # a resume tells whether it changed
                    parts=self.fingerprints.parts(spec, host),
                )
            )

    def _cell_of(self, step_id: str) -> tuple[str | None, dict[str, str] | None]:
        """The group and the axis values (as text) of a matrix instance, for its events."""
        instance = self.runbook.instances.get(step_id)
        if instance is None:
            return None, None
        return instance.group, {axis: value_text(value) for axis, value in instance.values.items()}

    def _cells_progress(self, step_id: str) -> None:
        group = self.cells.index.group_of(step_id)
        if group is not None:
            self.events.emit(
                event_models.CellsProgress,
                group=group.name,
                cells=self.cells.counts(group),
                launches=self.cells.launches(group),
            )

    async def _run_step(self, spec: StepSpec, lane: list[str] | None = None) -> bool:
        """One step on its hosts (or on `lane`'s one host). False when it failed and the run stops; a
        failed instance of an `on_failure: continue` group fails its cells instead, and the run goes on."""
        hosts = lane or self.hosts_to_run.get(spec.id, self.runbook.step_hosts[spec.id])
        group, cell = self._cell_of(spec.id)
        reason = self.cells.why_not(spec)
        if reason is not None:
            self._skip(spec, hosts, reason)
            self.events.emit(
                event_models.StepStarted, step=spec.id, kind=spec.kind, hosts=hosts, group=group, cell=cell
            )
            self.events.emit(
                event_models.StepFinished,
                step=spec.id,
                status="skipped",
                via=None,
                duration_s=0,
                hosts={h: {"status": "skipped", "attempts": 0, "via": None} for h in hosts},
                failures=[],
                group=group,
                cell=cell,
            )
            self.cells.left_out(spec.id, reason)
            self._cells_progress(spec.id)
            return True
        for host in [*hosts, *_peers(self.runbook, spec)]:
            if host not in self.transports:
                self.transports[host] = transport_for(host, self.runbook.hosts[host], self.redactor, self.log)
        if group is not None:
            self.cells.status.setdefault(spec.id, "running")
        self.events.emit(event_models.StepStarted, step=spec.id, kind=spec.kind, hosts=hosts, group=group, cell=cell)
        limit = asyncio.Semaphore(self.runbook.header.defaults.max_parallel)

        async def bounded(host: str) -> StepRecord:
            async with limit:
                if self.write_failure is not None:  # another host's write failed: start nothing more
                    raise self.write_failure
                try:
                    return await self._run_on_host(spec, host)
                except DurableWriteError as exc:
                    self.write_failure = self.write_failure or exc
                    for task in tasks:  # the run stops at once: the other hosts' commands are killed
                        if task is not asyncio.current_task():
                            task.cancel()
                    raise

        tasks = [asyncio.ensure_future(bounded(h)) for h in hosts]
        results = await asyncio.gather(*tasks, return_exceptions=True)
        cancelled = [r for r in results if isinstance(r, BaseException)]
        if cancelled:
            raise next((r for r in cancelled if isinstance(r, DurableWriteError)), cancelled[0])
        records = [r for r in results if isinstance(r, StepRecord)]
        failed = [r for r in records if r.status not in ("passed", "skipped")]
        skipped = [r for r in records if r.status == "skipped"]
        outcome = "failed" if failed else "skipped" if skipped and len(skipped) == len(records) else "passed"
        self.events.emit(
            event_models.StepFinished,
            step=spec.id,
            status=outcome,
            via=records[0].via if records else None,
            duration_s=max((r.duration_s or 0 for r in records), default=0),
            hosts={r.host: {"status": r.status, "attempts": r.attempts, "via": r.via} for r in records},
            failures=[f"{spec.id}@{r.host}: {r.message}" for r in failed],
            group=group,
            cell=cell,
        )
        if outcome == "skipped":  # a `when:` that was false: what needs it is left out too
            self.cells.left_out(spec.id, skipped[0].message or "")
        if failed and self._continues(spec.id):
            self.cells.fail(spec.id, str(failed[0].message))
        if group is not None and self.cells.status.get(spec.id) != "failed":
            self.cells.status[spec.id] = "failed" if failed else outcome
        self._cells_progress(spec.id)
        return not failed or self._continues(spec.id)

    def _continues(self, step_id: str) -> bool:
        """Whether a failure of `step_id` fails only its cells (`on_failure: continue`), not the run."""
        group = self.cells.index.group_of(step_id)
        return group is not None and group.on_failure == "continue"

    async def _run_on_host(self, spec: StepSpec, host: str) -> StepRecord:
        record = StepRecord(
            step=spec.id,
            host=host,
            position=self.positions[spec.id],
            status="running",
            fingerprint=self.fingerprints.fingerprint(spec, host),
            parts=self.fingerprints.parts(spec, host),
            started_at=now(),
        )
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        variants = [("primary", spec)] + [
            (f"fallback {i}", fb) for i, fb in enumerate(self.runbook.fallbacks.get(spec.id, []), start=1)
        ]
        failures: list[str] = []
        unsaved = False
        log = self.log.bind(step=spec.id, host=host)

        def retry_scheduled(state: RetryCallState) -> None:
            failure = state.outcome.exception() if state.outcome is not None else None
            delay = state.next_action.sleep if state.next_action is not None else None
            log.info("retry scheduled", attempt=record.attempts, delay_s=delay, after=str(failure).partition("\n")[0])

        try:
            if spec.when is not None and (skipped := await self._when_false(spec, host)) is not None:
                record.status, record.message = "skipped", skipped
                return record
            for via, variant in variants:
                if failures:
                    log.info("fallback taken", via=via, after=failures[-1].partition("\n")[0])
                policy = variant.retry_policy(self.runbook.header.defaults.retry)
                retrying = AsyncRetrying(
                    stop=stop_after_attempt(policy.attempts),
                    wait=wait_exponential_jitter(
                        multiplier=policy.delay, exp_base=policy.backoff, max=policy.max_delay, jitter=policy.delay
                    ),
                    retry=functools.partial(_worth_retrying, policy, log),
                    before_sleep=retry_scheduled,
                    reraise=True,
                )
                last: AttemptFailed | None = None
                try:
                    async for attempt in retrying:
                        with attempt:
                            record.attempts += 1
                            self._save(record)  # `runbook status` shows the attempt under way
                            try:
                                facts, exit_code = await self._attempt(variant, host, record.attempts, via)
                            except AttemptFailed as exc:
                                last = exc
                                record.facts, record.gate, record.exit_code = exc.facts, exc.gate, exc.exit_code
                                raise
                    record.status, record.facts, record.exit_code, record.via = "passed", facts, exit_code, via
                    record.message = record.gate = None
                    return record
                except AttemptFailed as exc:
                    failures.append(f"[{via}] {exc}")
                except asyncio.CancelledError:
                    if last is not None:  # keep why the attempt before the signal failed (often: a retry delay)
                        failures.append(f"[{via}] {last}")
                    raise
        except HostRefused as exc:
            failures.append(str(exc))
        except DurableWriteError:
            # the run stops: the step's row stays as last saved (running), never `failed` for a disk's fault;
            # what its log holds of the attempt is said by the resumed run's `abandoned` record
            unsaved = True
            raise
        except asyncio.CancelledError as exc:
            record.status = "interrupted"
            # cancelled by a signal, or because another host's write to the run folder failed
            why = "stopped: a write to the run folder failed" if self.write_failure else "interrupted by a signal"
            said = (
                f"{why}; the command still running was stopped: {kill_report(exc.result)}"
                if isinstance(exc, CommandInterrupted)
                else f"{why} between the step's commands"
            )
            record.message = "\n".join([said, *failures])
            raise
        finally:
            record.duration_s = round(loop.time() - t0, 3)
            if record.status == "running":
                record.status = "failed"
                record.message = failures[-1] if len(failures) == 1 else "\n".join(failures)
            if not unsaved:
                self._save(record)
        return record

    async def _when_false(self, spec: StepSpec, host: str) -> str | None:
        """Why the step is skipped on `host` (`when: EXPR is false`, with its message), or None: it runs."""
        assert spec.when is not None
        that, read = spec.when.that, roots(spec.when.that)
        names = {name: value() for name, value in self.gate_names(spec, host).items() if name in read}
        try:
            async with self.gates.session(names, [that]) as worker:
                verdict = await worker.evaluate(that, spec.when.message)
        except GateWorkerUnavailable as exc:
            raise HostRefused(str(exc)) from None  # the step fails on the host: nothing says it may be left out
        if verdict.passed:
            return None
        if verdict.undecided:  # an error is no `false`: skipping would hide it (a typo in a fact's path)
            raise HostRefused(f"{cells.WHEN_FALSE}{that} could not be evaluated\n{verdict.detail}")
        said = f"{cells.WHEN_FALSE}{that} is false"
        return f"{said}: {spec.when.message}" if spec.when.message else said

    def _save(self, record: StepRecord) -> None:
        self.records[(record.step, record.host)] = record
        self.state.save(record, audit=self.audit.position)  # what the log holds by now: audit verify checks it

    async def _attempt(self, spec: StepSpec, host: str, attempt: int, via: str) -> tuple[Any, int | None]:
        ctx = HostContext(self, spec, host, attempt, via)
        try:
            outcome = await spec.execute(ctx)
        except FactsError as exc:
            self._attempt_failed(FactsUnreadable, spec, host, attempt, str(exc))
        except (AttemptFailed, HostRefused, DurableWriteError):  # a failed write to the run folder stops the run
            raise
        except RecursionError:  # host output nested past what a kind's own parser bounds
            self._attempt_failed(
                FactsUnreadable, spec, host, attempt, f"facts nested deeper than {FACTS_MAX_DEPTH} levels"
            )
        except Exception as exc:  # a bug in a step kind fails the attempt; it does not crash the run
            where = "".join(traceback.format_exception(exc)[-3:]).rstrip()
            message = f"step kind '{spec.kind}' failed unexpectedly:\n{where}"
            self._attempt_failed(StepKindCrashed, spec, host, attempt, message)
        result = outcome.result
        if result.timed_out:
            self._attempt_failed(
                CommandTimedOut,
                spec,
                host,
                attempt,
                f"timed out after {result.timeout_s or 0:g}s; {kill_report(result)}\n"
                + tail(result.stdout_text + result.stderr_text),
            )
        try:
            facts = self.redactor.deep(_bounded_facts(outcome.facts))
        except FactsError as exc:
            self._attempt_failed(FactsUnreadable, spec, host, attempt, str(exc))
        gates = spec.effective_gates()
        expressions = [g.that for g in gates]
        read = set().union(*(roots(e) for e in expressions))
        seen: dict[str, Callable[[], Any]] = {  # worked out only when a gate reads it (steps: every record)
            "stdout": lambda: result.stdout_text,
            "stderr": lambda: result.stderr_text,
            "exit_code": lambda: result.exit_code,
            "facts": lambda: facts,
            **self.gate_names(spec, host),
        }
        names = {name: value() for name, value in seen.items() if name in read}
        try:
            async with self.gates.session(names, expressions) as worker:  # bounded: executor.gates
                for gate in gates:
                    verdict = await worker.evaluate(gate.that, gate.message)
                    if not verdict.passed:
                        detail = verdict.describe()
                        if not result.stdout.strip():
                            detail += "\n  (stdout was empty)"
                        out = tail(result.stdout_text + ("\n" if result.stdout_text else "") + result.stderr_text)
                        message = f"{detail}\n  output tail:\n{out}" if out else detail
                        failure = spec.gate_failure(outcome.facts, gate.that, verdict.undecided)
                        self._attempt_failed(failure, spec, host, attempt, message, facts, gate.that, result.exit_code)
        except GateWorkerUnavailable as exc:
            self._attempt_failed(FactsUnreadable, spec, host, attempt, str(exc), facts)
        return facts, result.exit_code

    def _attempt_failed(
        self,
        failure: type[AttemptFailed],
        spec: StepSpec,
        host: str,
        attempt: int,
        message: str,
        facts: Any = None,
        gate: str | None = None,
        exit_code: int | None = None,
    ) -> NoReturn:
        message = self.redactor.text(message)
        self.events.emit(event_models.AttemptFailed, step=spec.id, host=host, attempt=attempt, message=message)
        raise failure(message, facts, gate, exit_code)
