"""The run loop: steps in order, hosts in parallel, retries, fallbacks, gates, state, audit.

An attempt fails on a failed gate, a timeout, unusable output or a transport error; tenacity
repeats it per the retry policy; then each fallback gets the same treatment. Every command is
audited before the step's state is written, so the state never claims more than the log.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import json
import os
import sqlite3
import traceback
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from pydantic import BaseModel
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt, wait_exponential_jitter

from executor import audit as audit_mod
from executor import durable, seal
from executor.audit import AuditContext, AuditLog
from executor.errors import (
    DurableWriteError,
    HostKeyError,
    ResumeError,
    StateError,
    TransportError,
)
from executor.events import RedactingReporter, Reporter
from executor.gates import GateWorkers, GateWorkerUnavailable, roots
from executor.loader import Runbook, secret_values
from executor.model import var_text
from executor.redact import Redactor
from executor.render import render_command
from executor.state import WRITE_FAILED as WRITE_FAILED  # the run's status then; the CLI reads it here
from executor.state import RunLock, RunMeta, RunState, StepRecord, find_run, new_run_id, now, open_state
from executor.stepkind import FACTS_MAX_DEPTH, FactsError, StepContext, StepSpec, check_depth
from executor.transport import Transport, transport_for
from executor.transport.base import (
    Collector,
    CommandInterrupted,
    CommandResult,
    OutputSink,
    Transfer,
    file_sha256,
    kill_report,
)

TAIL_LINES = 20
EXIT_OK, EXIT_FAILED, EXIT_INTERRUPTED = 0, 1, 130
#: A durable write to the run folder failed (DurableWriteError): the exit code (the status: WRITE_FAILED)
EXIT_WRITE_FAILED = 4
#: Statuses of a step that has not run in this run: it has no facts, and resuming runs it.
NOT_STARTED = ("pending", "skipped")


class AttemptFailed(Exception):
    """One attempt did not pass; the message says why (gate, timeout, transport, facts).

    `facts` keeps what the attempt found, so that a failed step's record shows it too; `gate` is
    the expression of the gate that failed (None when the attempt failed before its gates).
    """

    def __init__(self, message: str, facts: Any = None, gate: str | None = None, exit_code: int | None = None) -> None:
        super().__init__(message)
        self.facts = facts
        self.gate = gate
        self.exit_code = exit_code


class HostRefused(Exception):
    """The host cannot be used at all (unknown host key): no retry, no fallback."""


@dataclass
class RunOptions:
    log_dir: Path = Path("logs")
    var_overrides: Mapping[str, Any] = field(default_factory=dict)
    resume: str | None = None  # a run id, or "latest"
    from_step: str | None = None
    only_step: str | None = None
    # how the run was started, recorded in run.json so that `--resume` can start it the same way
    var_args: Sequence[str] = ()
    inventory: Path | None = None


#: The host settings that say where a step runs. The others (timeouts, keys, jump hosts, the runner)
#: only say how commands get there: changing them, e.g. a longer connect_timeout after a timeout, reruns nothing.
WHERE_A_STEP_RUNS = ("address", "port", "user")


def definition_parts(
    runbook: Runbook, spec: StepSpec, host: str, variables: Mapping[str, Any], secrets: Sequence[str] = ()
) -> dict[str, str]:
    """What a step's result depends on, each part as a digest: its definition (`step`), where it runs
    (`host`), the value of each var that reaches it (`var NAME`, given redacted: those in its environment, see
    `StepSpec.env_names`, and those its gates read), which secrets reach it (`secret NAME`: the name
    only, a value is never kept), the contents of each local file it reads (`file PATH`). Kept per step
    so that a resume can say which part changed."""
    variants = [spec, *runbook.fallbacks.get(spec.id, [])]
    texts = {n: var_text(v) for n, v in variables.items()}
    definition = [v.model_dump(mode="json", exclude={"description"}) for v in variants]
    parts = {
        "step": _digest(definition),
        "host": _digest(runbook.hosts[host].model_dump(mode="json", include=set(WHERE_A_STEP_RUNS))),
    }
    for name in sorted({n for v in variants for n in [*v.env_names(texts), *v.gate_vars(texts)]}):
        parts[f"var {name}"] = _digest(texts[name])
    for name in sorted({n for v in variants for n in v.env_names(secrets)}):
        parts[f"secret {name}"] = _digest("received")
    for file in sorted({f for v in variants for f in v.local_files()}):
        parts[f"file {file}"] = _file_digest(runbook.path.parent / Path(file).expanduser())
    return parts


def fingerprint(parts: Mapping[str, str]) -> str:
    """Changes when any part of a step's definition changes."""
    return _digest(dict(parts))


def changed_parts(old: Mapping[str, str] | None, new: Mapping[str, str]) -> str:
    """Which parts differ, for the console: `var models_dir, file conf.txt` (`its definition` when the
    old record predates the parts)."""
    if old is None:
        return "its definition"
    names = sorted(name for name in old.keys() | new.keys() if old.get(name) != new.get(name))
    return ", ".join(names) or "its definition"


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()


def _file_digest(path: Path) -> str:
    """The sha256 of a local file, or why there is none (a missing file fails the step when it runs)."""
    try:
        return file_sha256(path)
    except OSError as exc:
        return f"unreadable: {exc.strerror}"


def tail(text: str, lines: int = TAIL_LINES, width: int = 300) -> str:
    """The last lines of an output, each cut to `width` (a one-line JSON document can be megabytes).

    Lines end at newlines only: a CR, form feed or U+2028 stays in its line, where the display
    shows it escaped (executor.terminal), instead of passing for a line break the host never sent."""
    body = text.rstrip("\n")
    kept = body.split("\n")[-lines:] if body else []
    return "\n".join(f"    | {line[:width]}{' ...' if len(line) > width else ''}" for line in kept)


def _bounded_facts(facts: Any) -> Any:
    """Facts as JSON data, nested at most FACTS_MAX_DEPTH deep (checked before anything recurses into them)."""
    if isinstance(facts, BaseModel):
        facts = facts.model_dump(mode="json")
    check_depth(facts)
    return json.loads(json.dumps(facts, default=str))


class HostContext(StepContext):
    """One attempt of one step on one host: audited command execution and file transfer."""

    def __init__(self, engine: Engine, spec: StepSpec, host: str, attempt: int, via: str) -> None:
        self.engine = engine
        self.spec = spec
        self.host_name = host
        self.vars = engine.env
        self.attempt = attempt
        self.base_dir = engine.runbook.path.parent
        self.output_dir = engine.run_dir / "hosts" / host
        self.run_dir = engine.run_dir
        self.audit_context = AuditContext(step=spec.id, host=host, attempt=attempt, via=via)

    def fact(self, step_id: str, path: str) -> Any:
        value: Any = self.engine.facts_view(self.host_name)[step_id]["facts"]
        for part in path.split("."):
            value = value[int(part)] if isinstance(value, list) else value[part]
        return value

    async def run(
        self, script: str | bytes, *, timeout: float | None = None, on_output: OutputSink | None = None
    ) -> CommandResult:
        engine = self.engine
        if engine.write_failure is not None:  # the run folder cannot be written: no new command starts
            raise engine.write_failure
        command = render_command(script, *self.spec.environment(engine.env, engine.secrets))
        transport = engine.transports[self.host_name]
        limit = timeout or self.spec.timeout or engine.runbook.header.defaults.timeout
        try:
            result = await transport.run(command, limit, on_output)
            result.timeout_s = limit
        except CommandInterrupted as exc:
            self._record(command.display, exc.result)
            raise
        except TransportError as exc:
            collect = Collector(redactor=engine.redactor)
            collect.stdout.feed(exc.partial_stdout)
            collect.stderr.feed(exc.partial_stderr + f"\n[runbook] transport error: {exc}".encode())
            partial = collect.result(None)
            self._record(command.display, partial)
            if isinstance(exc, HostKeyError):
                raise HostRefused(engine.redactor.text(str(exc))) from None
            raise AttemptFailed(f"transport error: {engine.redactor.text(str(exc))}") from None
        finally:
            for note in transport.take_notes():
                engine.reporter.emit("note", host=self.host_name, step=self.spec.id, message=note)
        self._record(command.display, result)
        return result

    def _record(self, display: str, result: CommandResult) -> None:
        engine = self.engine  # the output was redacted as it arrived (transport.base.Captured)
        engine.audit.command(self.audit_context, display, result)
        engine.reporter.emit(
            "command_finished",
            step=self.spec.id,
            host=self.host_name,
            attempt=self.attempt,
            exit_code=result.exit_code,
            timed_out=result.timed_out,
            duration_s=result.duration_s,
        )

    def progress(self, message: str, **fields: Any) -> None:
        self.engine.reporter.emit(
            "progress",
            step=self.spec.id,
            host=self.host_name,
            message=message,
            fields=fields,
        )

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
            raise AttemptFailed(f"file transfer timed out after {limit:g}s") from None
        except OSError as exc:
            if into is not None and exc.errno in durable.DISK_ERRNOS:
                raise durable.failed(exc, into.parent, "a fetched file") from None
            raise AttemptFailed(f"file transfer failed: {self.engine.redactor.text(str(exc))}") from None
        except TransportError as exc:
            raise AttemptFailed(f"file transfer failed: {self.engine.redactor.text(str(exc))}") from None
        self.engine.audit.transfer(self.audit_context, done.direction, done.local, done.remote, done.size, done.sha256)
        return done


class Engine:
    """Runs one runbook once: `await Engine(...).run()` returns the exit code."""

    def __init__(
        self, runbook: Runbook, options: RunOptions, reporter: Reporter, environ: Mapping[str, str] | None = None
    ) -> None:
        self.runbook = runbook
        self.options = options
        header = runbook.header
        self.variables: dict[str, Any] = {**header.vars, **options.var_overrides}
        self.env = {name: var_text(value) for name, value in self.variables.items()}
        # refused (InvalidRunbook, at the secret's line) before anything connects or a run folder is written
        self.secrets = secret_values(runbook, os.environ if environ is None else environ)
        self.redactor = Redactor(self.secrets.values())
        #: the vars as the fingerprint counts them, once per run: a var holding a secret by its redacted
        #: text (no digest of a secret is stored)
        self._env_shown = {name: self.redactor.text(text) for name, text in self.env.items()}
        self.reporter = RedactingReporter(reporter, self.redactor)  # events and the console: masked as stored
        self.audit_key = seal.configured_key()  # opt-in: sealing when the user made a key (AuditKeyError if unusable)
        self.records: dict[tuple[str, str], StepRecord] = {}
        self.hosts_to_run: dict[str, list[str]] = {}  # steps that run on fewer than their hosts (see _plan)
        self.positions = {spec.id: index for index, spec in enumerate(runbook.steps)}
        self._parts: dict[tuple[str, str], dict[str, str]] = {}
        self.transports: dict[str, Transport] = {}
        self.gates = GateWorkers()

    def parts(self, spec: StepSpec, host: str) -> dict[str, str]:
        """The step's definition parts on a host, computed once per run (it renders the step's scripts)."""
        key = (spec.id, host)
        if key not in self._parts:
            self._parts[key] = definition_parts(self.runbook, spec, host, self._env_shown, sorted(self.secrets))
        return self._parts[key]

    def fingerprint(self, spec: StepSpec, host: str) -> str:
        return fingerprint(self.parts(spec, host))

    def _what_changed(self, spec: StepSpec, records: list[StepRecord | None]) -> str:
        """The parts that differ (`var models_dir, file conf.txt`) on the first host where one does."""
        for record in records:
            if record is not None and record.fingerprint != self.fingerprint(spec, record.host):
                return changed_parts(record.parts, self.parts(spec, record.host))
        return "its definition"

    # ---- planning: what runs, what is reused -------------------------------------------------

    def _source_run(self) -> RunMeta | None:
        wanted = self.options.resume
        if not (wanted or self.options.from_step or self.options.only_step):
            return None
        # a run id, a unique prefix of one, or (None) the latest: never past a newer folder it cannot read
        meta = find_run(self.options.log_dir, None if wanted in (None, "latest") else wanted, self.runbook.name)
        if meta is None and wanted:
            raise ResumeError(f"nothing to resume: no earlier run of '{self.runbook.name}' in {self.options.log_dir}")
        return meta

    def _plan(
        self, source: dict[tuple[str, str], StepRecord], source_id: str | None
    ) -> tuple[list[StepSpec], list[StepSpec], dict[str, str]]:
        """(reused, to_run, why) in runbook order; `why` says for each step what happens and why.

        A step that passed on some of its hosts and not on others (and is unchanged) runs again only
        on the others: `self.hosts_to_run` holds, for each step to run, the hosts it runs on.
        """
        start_id = self.options.only_step or self.options.from_step
        if start_id is not None and start_id not in self.positions:
            raise ResumeError(f"no step '{start_id}' in the runbook (steps: {', '.join(self.positions)})")
        reused: list[StepSpec] = []
        to_run: list[StepSpec] = []
        why: dict[str, str] = {}
        rerun_cause: str | None = None  # once a step runs again, every later step does too
        for spec in self.runbook.steps:
            records = [source.get((spec.id, h)) for h in self.runbook.step_hosts[spec.id]]
            passed = all(r is not None and r.status == "passed" for r in records)
            same = all(r is not None and r.fingerprint == self.fingerprint(spec, r.host) for r in records)
            if start_id is not None:
                position, start = self.positions[spec.id], self.positions[start_id]
                if position < start:
                    if passed:
                        reused.append(spec)
                    why[spec.id] = f"facts reused from {source_id}" if passed else "skipped (never passed)"
                    if passed and not same:  # --from/--only trust the earlier facts; say that they may be stale
                        why[spec.id] += (
                            f" although the step changed since ({self._what_changed(spec, records)}; "
                            f"--from {spec.id} runs it again)"
                        )
                elif self.options.only_step and position > start:
                    why[spec.id] = "skipped (--only)"
                else:
                    to_run.append(spec)
                    why[spec.id] = "runs (--only)" if self.options.only_step else "runs (--from)"
            elif source_id is None:
                to_run.append(spec)
                why[spec.id] = "runs"
            elif rerun_cause is None and passed and same:
                reused.append(spec)
                why[spec.id] = f"reused (passed in {source_id})"
            elif rerun_cause is None and (done := self._passed_hosts(spec, source)):
                self.hosts_to_run[spec.id] = [h for h in self.runbook.step_hosts[spec.id] if h not in done]
                rerun_cause = spec.id
                to_run.append(spec)
                again = self.hosts_to_run[spec.id]
                changed = all((r := source.get((spec.id, h))) is not None and r.status == "passed" for h in again)
                what = self._what_changed(spec, [source.get((spec.id, h)) for h in again])
                reason = f"changed there since {source_id}: {what}" if changed else f"did not pass there in {source_id}"
                why[spec.id] = f"runs again on {', '.join(again)} ({reason}); reused on {', '.join(done)}"
            else:
                started = any(r is not None and r.status not in NOT_STARTED for r in records)
                if not started:
                    left_out = any(r is not None and r.status == "skipped" for r in records)
                    why[spec.id] = f"runs ({'skipped' if left_out else 'not reached'} in {source_id})"
                elif rerun_cause is None:
                    why[spec.id] = (
                        f"runs again (changed since {source_id}: {self._what_changed(spec, records)})"
                        if passed
                        else f"runs again (did not pass in {source_id})"
                    )
                else:
                    why[spec.id] = f"runs again (after '{rerun_cause}')"
                rerun_cause = rerun_cause or spec.id
                to_run.append(spec)
        self._check_needs(reused, to_run)
        return reused, to_run, why

    def _passed_hosts(self, spec: StepSpec, source: dict[tuple[str, str], StepRecord]) -> list[str]:
        """The hosts on which an unchanged step passed in the source run."""
        return [
            host
            for host in self.runbook.step_hosts[spec.id]
            if (record := source.get((spec.id, host))) is not None
            and record.status == "passed"
            and record.fingerprint == self.fingerprint(spec, host)
        ]

    def _check_needs(self, reused: list[StepSpec], to_run: list[StepSpec]) -> None:
        available = {s.id for s in reused}
        for spec in to_run:
            variants = [spec, *self.runbook.fallbacks.get(spec.id, [])]
            for needed in sorted(set().union(*(v.needs() for v in variants))):
                if needed not in available:
                    raise ResumeError(
                        f"step '{spec.id}' needs facts from step '{needed}', which has never passed; "
                        f"run it first (e.g. --from {needed})"
                    )
            available.add(spec.id)

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
        source_meta = self._source_run()
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
            reused, to_run, why = self._plan(source_records, source_meta.run_id if source_meta else None)
        except BaseException:
            if source_lock is not None:
                source_lock.release()
            raise
        run_id = new_run_id()
        run_dir = self.options.log_dir / run_id
        link = audit_mod.chain_tail(source_dir) if source_dir is not None else audit_mod.GENESIS
        meta = RunMeta(
            run_id=run_id,
            runbook=self.runbook.name,
            path=str(self.runbook.path.resolve()),
            started_at=now(),
            resumed_from=source_meta.run_id if source_meta else None,
            audit_prev_hash=link,
            vars={k: self.redactor.text(v) for k, v in self.env.items()},
            secrets=sorted(self.secrets),
            runbook_sha256=hashlib.sha256(self.runbook.path.read_bytes()).hexdigest(),
            var_args=[pair for pair in self.options.var_args if self.redactor.text(pair) == pair],
            var_args_withheld=[p.partition("=")[0] for p in self.options.var_args if self.redactor.text(p) != p],
            inventory=str(self.options.inventory) if self.options.inventory else None,
            host_key_unverified=self._unverified_hosts(to_run),
        )
        reused_ids, run_ids = {s.id for s in reused}, {s.id for s in to_run}
        for spec in self.runbook.steps:  # every step of the run has a row from the start
            runs_on = self.hosts_to_run.get(spec.id, self.runbook.step_hosts[spec.id])
            for host in self.runbook.step_hosts[spec.id]:
                if spec.id in reused_ids or (spec.id in run_ids and host not in runs_on):
                    old = source_records[(spec.id, host)]
                    origin = old.reused_from or meta.resumed_from
                    self.records[(spec.id, host)] = dataclasses.replace(old, reused_from=origin)
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
        for host in meta.host_key_unverified:  # said once per run, before anything connects
            self.audit.host_key_unverified(host)
            self.reporter.emit(
                "note",
                host=host,
                message="host key verification is OFF (verify_host_key: false): any server answering at"
                f" {self.runbook.hosts[host].address} is trusted",
            )
        self.reporter.emit(
            "run_started",
            run_id=run_id,
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
        try:
            if source_meta is not None and source_dir is not None:
                self._record_abandoned(source_meta.run_id, source_dir, source_records)
            for spec in to_run:
                if not await self._run_step(spec):
                    status, code = "failed", EXIT_FAILED
                    break
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
                # finished_at first: a run whose status says passed has every write behind it
                state.set("finished_at", now())
                state.set("status", status)
            except DurableWriteError as exc:  # the status stays what it was (running: a resume continues it)
                self.write_failure = self.write_failure or exc
                status, code = WRITE_FAILED, EXIT_WRITE_FAILED
            self.reporter.emit(
                "run_finished",
                run_id=run_id,
                status=status,
                exit_code=code,
                audit=str(run_dir / audit_mod.AUDIT_FILE),
                **({"error": str(self.write_failure)} if self.write_failure else {}),
            )
            await asyncio.shield(self._close_transports())
            await asyncio.shield(self.gates.close())
            self.audit.close()
            state.close()
            if source_lock is not None:
                source_lock.release()
        if self.write_failure is not None:
            raise self.write_failure
        return code

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
        hosts = self.runbook.hosts
        return sorted(name for name in used if not hosts[name].is_local and not hosts[name].verify_host_key)

    async def _close_transports(self) -> None:
        await asyncio.gather(*(t.close() for t in self.transports.values()), return_exceptions=True)

    async def _run_step(self, spec: StepSpec) -> bool:
        hosts = self.hosts_to_run.get(spec.id, self.runbook.step_hosts[spec.id])
        for host in hosts:
            if host not in self.transports:
                self.transports[host] = transport_for(host, self.runbook.hosts[host], self.redactor)
        self.reporter.emit("step_started", step=spec.id, kind=spec.kind, hosts=hosts)
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
        passed = all(r.status == "passed" for r in records)
        self.reporter.emit(
            "step_finished",
            step=spec.id,
            status="passed" if passed else "failed",
            via=records[0].via if records else None,
            duration_s=max((r.duration_s or 0 for r in records), default=0),
            hosts={r.host: {"status": r.status, "attempts": r.attempts, "via": r.via} for r in records},
            failures=[f"{spec.id}@{r.host}: {r.message}" for r in records if r.status != "passed"],
        )
        return passed

    async def _run_on_host(self, spec: StepSpec, host: str) -> StepRecord:
        record = StepRecord(
            step=spec.id,
            host=host,
            position=self.positions[spec.id],
            status="running",
            fingerprint=self.fingerprint(spec, host),
            parts=self.parts(spec, host),
            started_at=now(),
        )
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        variants = [("primary", spec)] + [
            (f"fallback {i}", fb) for i, fb in enumerate(self.runbook.fallbacks.get(spec.id, []), start=1)
        ]
        failures: list[str] = []
        unsaved = False
        try:
            for via, variant in variants:
                policy = variant.retry_policy(self.runbook.header.defaults.retry)
                retrying = AsyncRetrying(
                    stop=stop_after_attempt(policy.attempts),
                    wait=wait_exponential_jitter(
                        multiplier=policy.delay, exp_base=policy.backoff, max=policy.max_delay, jitter=policy.delay
                    ),
                    retry=retry_if_exception_type(AttemptFailed),
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

    def _save(self, record: StepRecord) -> None:
        self.records[(record.step, record.host)] = record
        self.state.save(record, audit=self.audit.position)  # what the log holds by now: audit verify checks it

    async def _attempt(self, spec: StepSpec, host: str, attempt: int, via: str) -> tuple[Any, int | None]:
        ctx = HostContext(self, spec, host, attempt, via)
        try:
            outcome = await spec.execute(ctx)
        except FactsError as exc:
            self._attempt_failed(spec, host, attempt, str(exc))
        except (AttemptFailed, HostRefused, DurableWriteError):  # a failed write to the run folder stops the run
            raise
        except RecursionError:  # host output nested past what a kind's own parser bounds
            self._attempt_failed(spec, host, attempt, f"facts nested deeper than {FACTS_MAX_DEPTH} levels")
        except Exception as exc:  # a bug in a step kind fails the attempt; it does not crash the run
            where = "".join(traceback.format_exception(exc)[-3:]).rstrip()
            self._attempt_failed(spec, host, attempt, f"step kind '{spec.kind}' failed unexpectedly:\n{where}")
        result = outcome.result
        if result.timed_out:
            self._attempt_failed(
                spec,
                host,
                attempt,
                f"timed out after {result.timeout_s or 0:g}s; {kill_report(result)}\n"
                + tail(result.stdout_text + result.stderr_text),
            )
        try:
            facts = self.redactor.deep(_bounded_facts(outcome.facts))
        except FactsError as exc:
            self._attempt_failed(spec, host, attempt, str(exc))
        gates = spec.effective_gates()
        expressions = [g.that for g in gates]
        read = set().union(*(roots(e) for e in expressions))
        seen: dict[str, Callable[[], Any]] = {  # worked out only when a gate reads it (steps: every record)
            "stdout": lambda: result.stdout_text,
            "stderr": lambda: result.stderr_text,
            "exit_code": lambda: result.exit_code,
            "facts": lambda: facts,
            "steps": lambda: self.facts_view(host),
            "vars": lambda: self.redactor.deep(self.variables),  # as the output: a failed gate shows no secret
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
                        self._attempt_failed(spec, host, attempt, message, facts, gate.that, result.exit_code)
        except GateWorkerUnavailable as exc:
            self._attempt_failed(spec, host, attempt, str(exc), facts)
        return facts, result.exit_code

    def _attempt_failed(
        self,
        spec: StepSpec,
        host: str,
        attempt: int,
        message: str,
        facts: Any = None,
        gate: str | None = None,
        exit_code: int | None = None,
    ) -> NoReturn:
        message = self.redactor.text(message)
        self.reporter.emit("attempt_failed", step=spec.id, host=host, attempt=attempt, message=message)
        raise AttemptFailed(message, facts, gate, exit_code)
