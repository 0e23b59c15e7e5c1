"""Attempts: one step on one host, with its `when`, its retries, its fallbacks and its gates.

An attempt fails on a failed gate, a timeout, unusable output or a transport error; tenacity repeats it
per the retry policy (`_should_retry` says which failures are tried again); then each fallback gets the
same treatment. Every command is audited (`HostContext`, what a step kind sees) before the step's row is
saved, so the state never claims more than the log.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import traceback
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, NoReturn, Protocol

from pydantic import BaseModel
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    stop_after_attempt,
    wait_exponential_jitter,
)

from executor import durable
from executor.errors import (
    FAILURE_CLASSES,
    AttemptFailed,
    CommandInterrupted,
    CommandTimedOut,
    DurableWriteError,
    FactsError,
    FactsUnreadable,
    GateWorkerUnavailable,
    HostRefused,
    StepKindCrashed,
    TransportError,
    TransportFailed,
    failure_text,
)
from executor.redact import Redactor
from executor.render import render_command
from executor.run import event_models
from executor.run.audit import AuditContext
from executor.run.resume import Fingerprints
from executor.run.run_folder import RunFolder
from executor.run.state import NOT_STARTED, StepRecord, now
from executor.runbook import cells
from executor.runbook.gates import DETAIL_MAX, GateVerdict, GateWorkers, lookups_used, roots
from executor.runbook.loader import Runbook
from executor.runbook.model import Host, RetryPolicy, host_variables, var_text
from executor.runbook.planner import host_env
from executor.runbook.search import Band, Measure
from executor.stepkind import (
    FACTS_MAX_DEPTH,
    FactHost,
    StepContext,
    StepSpec,
    StepView,
    UnknownFact,
    check_depth,
    fact_field,
)
from executor.transport.base import Collector, CommandResult, OutputSink, Transfer, Transport, kill_report

if TYPE_CHECKING:
    from pathlib import Path

    from executor.diagnostics import Log

TAIL_LINES = 20
#: The most of a cause's value (`Attempts._cause`) a failure quotes: it leads the headline, status and the line
#: that ends the run, and a var may hold a document.
CAUSE_VALUE_MAX = 200
#: The most other failed gates (`Attempts._also_failed`) a failure says beside the first; the rest are counted.
ALSO_FAILED_MAX = 8


class TransportFactory(Protocol):
    """Makes the transport of one host of the run: its name, its definition, the redactor that masks the
    run's secrets in what it reads, and the run's debug log (`executor.transport.transport_for` by default;
    a test gives another, e.g. a scripted one)."""

    def __call__(self, name: str, host: Host, redactor: Redactor, log: Log, /) -> Transport: ...


def _should_retry(policy: RetryPolicy, log: Log, state: RetryCallState) -> bool:
    """tenacity's retry condition: whether a failed attempt is tried again (while the policy has attempts
    left). A failed attempt is, unless its failure class is one of the policy's `non_retryable` (README,
    "Retries"), which then says so in its message; anything else (a refused host, a failed write to the
    run folder, a signal) ends the variant."""
    failure = state.outcome.exception() if state.outcome is not None else None
    if not isinstance(failure, AttemptFailed):
        return False
    if policy.retries(failure):
        return True
    if state.attempt_number < policy.attempts:
        failure.not_retried()
        log.info("not retried", attempt=state.attempt_number, failure=type(failure).__name__)
    return False


def gate_failure(spec: StepSpec, facts: Any, gate: str, undecided: bool) -> tuple[type[AttemptFailed], str]:
    """The failure class of an attempt whose gate did not hold, as its kind decides it (`StepSpec.gate_failure`,
    which a kind overrides through `failure_class`), and a line to add to the attempt's message. A kind whose
    decision raises, or gives no class of FAILURE_CLASSES (a name, a subclass of its own, which `non_retryable`
    cannot name), has a bug: the attempt is StepKindCrashed saying so, as for a bug in `execute`; the run goes
    on."""
    try:
        failure = spec.gate_failure(facts, gate, undecided)
    except Exception as exc:  # a bug in a step kind fails the attempt; it does not crash the run
        return (
            StepKindCrashed,
            f"\n  step kind '{spec.kind}' could not class this failure: {type(exc).__name__}: {str(exc)[:300]}",
        )
    if failure in FAILURE_CLASSES.values():
        return failure, ""
    given = repr(failure)[:200]
    return StepKindCrashed, f"\n  step kind '{spec.kind}' classed this failure as {given}, no class of executor.errors"


def _unknown_facts(owner: StepSpec, facts: Any, path: tuple[Any, ...], host: FactHost) -> list[UnknownFact]:
    """`owner.unknown_facts`; a kind whose explanation raises has a bug, which the failure names instead of the
    reason (as `gate_failure` does for its failure class): the gate's failure stands either way."""
    try:
        return owner.unknown_facts(facts, path, host)
    except Exception as exc:  # a bug in a step kind must not hide why its gate failed
        return [UnknownFact(f"step kind '{owner.kind}' could not say: {type(exc).__name__}: {str(exc)[:300]}")]


def tail(text: str, lines: int = TAIL_LINES, width: int = 300) -> str:
    """The last lines of an output, each cut to `width` (a one-line JSON document can be megabytes).

    Lines end at newlines only: a CR, form feed or U+2028 stays in its line, where the display
    shows it escaped (executor.terminal), instead of passing for a line break the host never sent."""
    body = text.rstrip("\n")
    kept = body.split("\n")[-lines:] if body else []
    return "\n".join(f"    | {line[:width]}{' ...' if len(line) > width else ''}" for line in kept)


def peers(runbook: Runbook, spec: StepSpec) -> list[str]:
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
        self, attempts: Attempts, spec: StepSpec, host: str, attempt: int, via: str, *, strict: bool = False
    ) -> None:
        self.attempts = attempts
        self.folder = attempts.folder
        self.spec = spec
        self.host_name = host
        self.host_address = attempts.runbook.hosts[host].address
        self.vars = attempts.env_for(host)
        self.attempt = attempt
        self.via = via
        self.strict = strict  # a peer's view: only the facts of the steps that passed on this host
        self.base_dir = attempts.runbook.path.parent
        self.output_dir = self.folder.run_dir / "hosts" / host
        self.run_dir = self.folder.run_dir
        self.redactor = attempts.redactor
        self.audit_context = AuditContext(step=spec.id, host=host, attempt=attempt, via=via)
        self.events = self.folder.events.bind(step=spec.id, host=host, attempt=attempt)
        self.debug_log = self.folder.log.bind(step=spec.id, host=host, attempt=attempt, via=via)

    def fact(self, step_id: str, path: str) -> Any:
        if self.strict:
            record = self.folder.records.get((step_id, self.host_name))
            if record is None or record.status != "passed":
                raise KeyError(step_id)
            value: Any = record.facts
        else:
            value = self.attempts.facts_view(self.host_name)[step_id]["facts"]
        for part in path.split("."):
            value = value[int(part)] if isinstance(value, list) else value[part]
        return value

    def fetches(self) -> tuple[str, ...]:
        return self.attempts.runbook.fetches_on(self.host_name)

    def peer(self, host: str) -> HostContext:
        runbook = self.attempts.runbook
        if host not in {*runbook.step_hosts[self.spec.id], *peers(runbook, self.spec)}:  # connected before it started
            raise FactsError(f"step '{self.spec.id}' has no connection to host '{host}' (not one of its peer hosts)")
        return HostContext(self.attempts, self.spec, host, self.attempt, self.via, strict=True)

    def screen(self) -> Callable[[Mapping[Band, Measure]], frozenset[Band]] | None:
        return self.attempts.screens.get(self.spec.id)

    def screened(self) -> bool:
        return self.spec.id in self.attempts.screened

    def facts_of_kind(self, kind: str) -> dict[str, Any]:
        attempts, view = self.attempts, self.attempts.facts_view(self.host_name)
        earlier = attempts.runbook.steps[: attempts.positions[self.spec.id]]
        return {
            spec.id: view[spec.id]["facts"]
            for spec in earlier
            if spec.kind == kind and spec.id in view and view[spec.id]["facts"] is not None
        }

    def steps_before(self, kinds: Iterable[str] | None = None) -> list[StepView]:
        runbook, wanted = self.attempts.runbook, None if kinds is None else set(kinds)
        views: list[StepView] = []
        for spec in runbook.steps[: self.attempts.positions[self.spec.id]]:
            if wanted is not None and spec.kind not in wanted:
                continue
            instance = runbook.instances.get(spec.id)
            for host in runbook.step_hosts[spec.id]:
                record = self.folder.records.get((spec.id, host))
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
                        duration_s=record.duration_s,
                    )
                )
        return views

    async def run(
        self, script: str | bytes, *, timeout: float | None = None, on_output: OutputSink | None = None
    ) -> CommandResult:
        attempts = self.attempts
        if self.folder.write_failure is not None:  # the run folder cannot be written: no new command starts
            raise self.folder.write_failure
        variables, secrets = self.spec.environment(self.vars, attempts.secrets)
        command = render_command(
            script, {**variables, **cells.instance_environment(attempts.runbook, self.spec.id)}, secrets
        )
        transport = attempts.transport(self.host_name)
        limit = timeout or self.spec.timeout or attempts.runbook.header.defaults.timeout
        try:
            result = await transport.run(command, limit, on_output)
            result.timeout_s = limit
        except CommandInterrupted as exc:
            self.debug_log.info("command interrupted", kill_confirmed=exc.result.kill_confirmed)
            self._record(command.display, exc.result)
            raise
        except TransportError as exc:
            self.debug_log.warning("transport error", error=str(exc), kind=type(exc).__name__)
            collect = Collector(redactor=attempts.redactor)
            collect.stdout.feed(exc.partial_stdout)
            collect.stderr.feed(exc.partial_stderr + f"\n[runbook] transport error: {exc}".encode())
            partial = collect.result(None)
            self._record(command.display, partial)
            if exc.refuses_host:
                raise HostRefused(attempts.redactor.text(str(exc))) from None
            raise transport_failed("transport error", exc, attempts.redactor) from None
        finally:
            for note in transport.take_notes():
                self.events.emit(event_models.Note, message=note)
        self.debug_log.debug(
            "command finished", exit_code=result.exit_code, timed_out=result.timed_out, duration_s=result.duration_s
        )
        self._record(command.display, result)
        return result

    def _record(self, display: str, result: CommandResult) -> None:
        # the output was redacted as it arrived (transport.base.Captured)
        self.folder.audit.command(self.audit_context, display, result)
        self.events.emit(
            event_models.CommandFinished,
            exit_code=result.exit_code,
            timed_out=result.timed_out,
            duration_s=result.duration_s,
        )

    def progress(self, message: str, /, **fields: Any) -> None:
        self.events.emit(event_models.Progress, message=message, fields=fields)

    async def put(self, local: Path, remote: str) -> Transfer:
        return await self._transfer(self.attempts.transport(self.host_name).put(local, remote))

    async def get(self, remote: str, local: Path) -> Transfer:
        return await self._transfer(self.attempts.transport(self.host_name).get(remote, local), into=local)

    async def _transfer(self, transfer: Awaitable[Transfer], into: Path | None = None) -> Transfer:
        """`into`: the file of the run folder that a fetch writes; a full or failing disk there stops the run."""
        limit = self.spec.timeout or self.attempts.runbook.header.defaults.timeout  # a stalled SFTP must not hang
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
            raise TransportFailed(f"file transfer failed: {self.redactor.text(str(exc))}") from None
        except TransportError as exc:
            raise transport_failed("file transfer failed", exc, self.redactor) from None
        self.folder.audit.transfer(self.audit_context, done.direction, done.local, done.remote, done.size, done.sha256)
        return done


def transport_failed(what: str, exc: TransportError, redactor: Redactor) -> TransportFailed:
    """The attempt's failure for a transport error, `{what}: {error}`, carrying what to check (said once, with the
    step's failure: `Attempts.run_on_host`)."""
    failed = TransportFailed(f"{what}: {redactor.text(str(exc))}")
    failed.check = None if exc.check is None else redactor.text(exc.check)
    return failed


class Attempts:
    """Runs one step on one host (`run_on_host`) for a run: its transports (made by `transport_factory`,
    one per host, as the steps first need them), its gate workers, and what gates and `when` read."""

    def __init__(
        self,
        runbook: Runbook,
        folder: RunFolder,
        *,
        secrets: Mapping[str, str],
        redactor: Redactor,
        var_overrides: Mapping[str, Any],
        fingerprints: Fingerprints,
        positions: Mapping[str, int],
        index: cells.Index,
        gates: GateWorkers,
        transports: dict[str, Transport],
        transport_factory: TransportFactory,
    ) -> None:
        self.runbook = runbook  # as placed
        self.folder = folder
        self.secrets = secrets
        self.redactor = redactor
        self.var_overrides = var_overrides
        self.fingerprints = fingerprints
        self.positions = positions
        self.index = index
        self.gates = gates
        self.gates.log = folder.log
        self.transports = transports
        self.transport_factory = transport_factory
        self.refused: dict[str, str] = {}  # why a host has no transport (`_make_transport`)
        #: a searched group's measuring instances -> their screen (`StepContext.screen`; the scheduler's search)
        self.screens: dict[str, Callable[[Mapping[Band, Measure]], frozenset[Band]]] = {}
        #: the instances run against a searched launch (`RenderContext.screened`; the scheduler's search)
        self.screened: set[str] = set()

    def connect(self, spec: StepSpec, hosts: Iterable[str]) -> None:
        """Make the transports of `hosts` and the step's peer hosts the run has none of yet."""
        for host in [*hosts, *peers(self.runbook, spec)]:
            if host not in self.transports and host not in self.refused:
                self._make_transport(host)

    def _make_transport(self, host: str) -> None:
        """Host `host`'s transport, from the factory; where it raises or makes no Transport, the host is
        refused for the run: each step fails there at once saying why (`transport`), and the run ends as
        any failed run does (its state and audit log closed), not with the factory's traceback."""
        try:
            made = self.transport_factory(host, self.runbook.hosts[host], self.redactor, self.folder.log)
        except Exception as exc:
            why = f"the transport factory raised {type(exc).__name__}: {failure_text(exc)}"
        else:
            if isinstance(made, Transport):
                self.transports[host] = made
                return
            why = f"the transport factory returned {type(made).__name__}, not a Transport"
        self.refused[host] = self.redactor.text(f"no transport for host '{host}': {why}")
        self.folder.log.warning("transport not made", host=host, error=self.refused[host])

    def transport(self, host: str) -> Transport:
        """Host `host`'s transport (HostRefused where none could be made)."""
        if host in self.refused:
            raise HostRefused(self.refused[host])
        return self.transports[host]

    # ---- what a step sees on a host -----------------------------------------------------------

    def gate_names(self, spec: StepSpec, host: str) -> dict[str, Callable[[], Any]]:
        """What gates and `when` read besides the command's output: `steps` (with each group mate by its
        base id as the same cell's instance), `vars`, and `matrix` (the instance's axis values)."""
        instance = self.runbook.instances.get(spec.id)

        def steps() -> dict[str, Any]:
            view = self.facts_view(host)
            for base, mate in self.index.aliases(spec.id).items():
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
        return host_variables(self.runbook.header.vars, self.runbook.hosts[host], self.var_overrides)

    def env_for(self, host: str) -> dict[str, str]:
        """`variables_for(host)` as the step's environment gets them."""
        return host_env(self.runbook, host, self.var_overrides)

    def facts_view(self, host: str) -> dict[str, Any]:
        """`steps.<id>` as gates see it on `host`: facts, status, and per-host facts."""
        view: dict[str, Any] = {}
        for (step_id, step_host), rec in self.folder.records.items():
            if rec.status in NOT_STARTED:
                continue
            entry = view.setdefault(step_id, {"hosts": {}, "facts": None, "status": rec.status})
            entry["hosts"][step_host] = {"facts": rec.facts, "status": rec.status}
            if step_host == host or (entry["facts"] is None and len(self.runbook.step_hosts[step_id]) == 1):
                entry["facts"] = rec.facts
                entry["status"] = rec.status
        return view

    # ---- one step on one host -----------------------------------------------------------------

    async def run_on_host(self, spec: StepSpec, host: str) -> StepRecord:
        """The step on `host`: skipped by its `when`, else each variant (the step, then its fallbacks) until
        one passes. Its row is saved as it goes and as it ends, but never after a failed write."""
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
        failures: list[str] = []
        checks: list[str] = []  # what to check for a connection not made: said once, after the failures
        unsaved = False
        try:
            if spec.when is not None and (skipped := await self._when_false(spec, host)) is not None:
                record.status, record.message = "skipped", skipped
                return record
            await self._variants(spec, host, record, failures, checks)
        except HostRefused as exc:
            failures.append(str(exc))
        except DurableWriteError:
            # the run stops: the step's row stays as last saved (running), never `failed` for a disk's fault;
            # what its log holds of the attempt is said by the resumed run's `abandoned` record
            unsaved = True
            raise
        except asyncio.CancelledError as exc:
            record.status = "interrupted"
            record.message = "\n".join([self._interrupted(exc), *failures])
            raise
        finally:
            record.duration_s = round(loop.time() - t0, 3)
            if record.status == "running":
                record.status = "failed"
                record.message = "\n".join([*failures, *dict.fromkeys(checks)])
            if not unsaved:
                self.folder.save(record)
        return record

    def _interrupted(self, exc: asyncio.CancelledError) -> str:
        """Why a step stopped: cancelled by a signal, or because another host's write to the run folder failed."""
        why = "stopped: a write to the run folder failed" if self.folder.write_failure else "interrupted by a signal"
        if isinstance(exc, CommandInterrupted):
            return f"{why}; the command still running was stopped: {kill_report(exc.result)}"
        return f"{why} between the step's commands"

    async def _variants(
        self, spec: StepSpec, host: str, record: StepRecord, failures: list[str], checks: list[str]
    ) -> None:
        """Each variant (the step, then its fallbacks), retried per its policy, until one passes (`record`
        says which); why each other failed goes into `failures`, what to check for a connection not made into
        `checks`."""
        log = self.folder.log.bind(step=spec.id, host=host)
        variants = [("primary", spec)] + [
            (f"fallback {i}", fb) for i, fb in enumerate(self.runbook.fallbacks.get(spec.id, []), start=1)
        ]
        for via, variant in variants:
            if failures:
                log.info("fallback taken", via=via, after=failures[-1].partition("\n")[0])
            last: AttemptFailed | None = None
            try:
                async for attempt in self._retrying(variant, record, log):
                    with attempt:
                        record.attempts += 1
                        self.folder.save(record)  # `runbook status` shows the attempt under way
                        try:
                            facts, exit_code = await self._attempt(variant, host, record.attempts, via)
                        except AttemptFailed as exc:
                            last = exc
                            record.facts, record.gate, record.exit_code = exc.facts, exc.gate, exc.exit_code
                            record.cause = exc.cause
                            raise
                record.status, record.facts, record.exit_code, record.via = "passed", facts, exit_code, via
                record.message = record.gate = record.cause = None
                return
            except AttemptFailed as exc:
                failures.append(f"[{via}] {exc}")
                checks += [exc.check] if isinstance(exc, TransportFailed) and exc.check else []
            except asyncio.CancelledError:
                if last is not None:  # keep why the attempt before the signal failed (often: a retry delay)
                    failures.append(f"[{via}] {last}")
                raise

    def _retrying(self, variant: StepSpec, record: StepRecord, log: Log) -> AsyncRetrying:
        """The attempts of one variant, per its retry policy (the runbook's defaults under its own)."""
        policy = variant.retry_policy(self.runbook.header.defaults.retry)

        def retry_scheduled(state: RetryCallState) -> None:
            failure = state.outcome.exception() if state.outcome is not None else None
            delay = state.next_action.sleep if state.next_action is not None else None
            log.info("retry scheduled", attempt=record.attempts, delay_s=delay, after=str(failure).partition("\n")[0])

        return AsyncRetrying(
            stop=stop_after_attempt(policy.attempts),
            wait=wait_exponential_jitter(
                multiplier=policy.delay, exp_base=policy.backoff, max=policy.max_delay, jitter=policy.delay
            ),
            retry=functools.partial(_should_retry, policy, log),
            before_sleep=retry_scheduled,
            reraise=True,
        )

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
            unknown = self._unknowns_read(spec, host, that, None)
            raise HostRefused(f"{cells.WHEN_FALSE}{that} could not be evaluated\n{verdict.detail}{unknown}")
        said = f"{cells.WHEN_FALSE}{that} is false"
        return f"{said}: {spec.when.message}" if spec.when.message else said

    async def _attempt(self, spec: StepSpec, host: str, attempt: int, via: str) -> tuple[Any, int | None]:
        ctx = HostContext(self, spec, host, attempt, via)
        try:
            outcome = await spec.execute(ctx)
        except FactsError as exc:
            self._attempt_failed(FactsUnreadable, spec, host, attempt, str(exc))
        except AttemptFailed as exc:  # a command's transport error or a file transfer's failure that the kind let
            # through (a kind that catches one, as a node group's cleanup does, has no failed attempt): said here
            self.folder.events.emit(
                event_models.AttemptFailed, step=spec.id, host=host, attempt=attempt, message=str(exc)
            )
            raise
        except (HostRefused, DurableWriteError):  # a failed write to the run folder stops the run
            raise
        except RecursionError:  # host output nested past what a kind's own parser bounds
            self._attempt_failed(
                FactsUnreadable, spec, host, attempt, f"facts nested deeper than {FACTS_MAX_DEPTH} levels"
            )
        except (Exception, SystemExit) as exc:  # a bug in a step kind (a sys.exit too) fails the attempt, not the run
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
        await self._check_gates(spec, host, attempt, result, facts, outcome.facts)
        return facts, result.exit_code

    async def _check_gates(
        self, spec: StepSpec, host: str, attempt: int, result: CommandResult, facts: Any, raw_facts: Any
    ) -> None:
        """The step's gates on the attempt's output and facts, every one evaluated; the first that fails fails the
        attempt, with the failure class the kind gives it from its facts as read (`raw_facts`, before masking),
        and the message says the others that failed too."""
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
            async with self.gates.session(names, expressions) as worker:  # bounded: executor.runbook.gates
                verdicts = [await worker.evaluate(gate.that, gate.message) for gate in gates]
        except GateWorkerUnavailable as exc:
            self._attempt_failed(FactsUnreadable, spec, host, attempt, str(exc), facts)
        failing = [(gate, verdict) for gate, verdict in zip(gates, verdicts, strict=True) if not verdict.passed]
        if not failing:
            return
        (gate, verdict), later = failing[0], [verdict for _, verdict in failing[1:]]
        detail = verdict.describe() + self._unknowns_read(spec, host, gate.that, facts)
        detail += self._also_failed(spec, host, facts, later)
        if not result.stdout.strip():
            detail += "\n  (stdout was empty)"
        out = tail(result.stdout_text + ("\n" if result.stdout_text else "") + result.stderr_text)
        message = f"{detail}\n  output tail:\n{out}" if out else detail
        failure, why = gate_failure(spec, raw_facts, gate.that, verdict.undecided)
        message += why
        cause = self._cause(spec, host, failure, raw_facts)
        if cause is not None:  # the headline: the var and its value first, then what happened
            said = fact_field(raw_facts, "failure") or gate.message or gate.that
            message = f"{cause['var']}={cause['value']}: {str(said).partition(chr(10))[0]}\n{message}"
        self._attempt_failed(failure, spec, host, attempt, message, facts, gate.that, result.exit_code, cause)

    def _also_failed(self, spec: StepSpec, host: str, facts: Any, verdicts: list[GateVerdict]) -> str:
        """The other gates that failed on the same output, each with why its unknown facts are unknown: a
        newcomer's host without a token and without SGLang was told one of them per run, so fixed one per run.
        The first failed gate still decides the failure class and the cause; at most ALSO_FAILED_MAX are said."""
        said = [
            f"also failed: {verdict.describe()}{self._unknowns_read(spec, host, verdict.expression, facts)}"
            for verdict in verdicts[:ALSO_FAILED_MAX]
        ]
        if len(verdicts) > ALSO_FAILED_MAX:
            said.append(f"... and {len(verdicts) - ALSO_FAILED_MAX} more failed gates")
        return "".join("\n  " + text.replace("\n", "\n  ") for text in said)

    def _unknowns_read(self, spec: StepSpec, host: str, expression: str, facts: Any) -> str:
        """Why each fact the failed gate (or `when:` that could not be evaluated) `expression` read is unknown,
        what was tried and the next step (`StepSpec.unknown_facts`, of the attempt's facts, None for a `when:`,
        and of the earlier steps' it read), as lines after the gate's values: one place, so the console, the
        events, the step's record and every answer made of them say the same. Facts with one reason are named
        together."""
        said: dict[UnknownFact, list[str]] = {}
        secrets = tuple((name, ref.env) for name, ref in self.runbook.header.secrets.items())
        for name, keys in lookups_used(expression).items():
            read = (spec, facts, keys[1:], host) if keys[:1] == ("facts",) else self._earlier_facts(spec, host, keys)
            if read is not None:
                for unknown in _unknown_facts(*read[:3], FactHost(self.runbook.hosts[read[3]].address, secrets)):
                    said.setdefault(unknown, []).append(name)
        text = "\n".join(line for unknown, names in said.items() for line in unknown.lines(names))
        return "\n" + text[:DETAIL_MAX] if text else ""

    def _earlier_facts(
        self, spec: StepSpec, host: str, keys: tuple[Any, ...]
    ) -> tuple[StepSpec, Any, tuple[Any, ...], str] | None:
        """What a gate's lookup `steps.ID.facts...` (or `steps.ID.hosts.HOST.facts...`) reads: the step, its
        recorded facts, the path inside them and the host they were read on (as `facts_view` picks it)."""
        if len(keys) < 3 or keys[0] != "steps" or not isinstance(keys[1], str):
            return None
        step_id = self.index.aliases(spec.id).get(keys[1], keys[1])
        if step_id not in self.positions:
            return None
        ran_on = self.runbook.step_hosts[step_id]
        if keys[2] == "facts":
            on, path = (host if host in ran_on else ran_on[0]), keys[3:]
        elif keys[2] == "hosts" and len(keys) > 4 and keys[4] == "facts" and keys[3] in ran_on:
            on, path = keys[3], keys[5:]
        else:
            return None
        record = self.folder.records.get((step_id, on))
        if record is None or record.facts is None:
            return None
        return self.runbook.steps[self.positions[step_id]], record.facts, path, on

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
        cause: dict[str, str] | None = None,
    ) -> NoReturn:
        message = self.redactor.text(message)
        self.folder.events.emit(
            event_models.AttemptFailed, step=spec.id, host=host, attempt=attempt, message=message, cause=cause
        )
        failed = failure(message, facts, gate, exit_code)
        failed.cause = cause
        raise failed

    def _cause(self, spec: StepSpec, host: str, failure: type[AttemptFailed], facts: Any) -> dict[str, str] | None:
        """The var whose value caused the failure (`StepSpec.failure_var`) with its value on `host`, masked as the
        run stores it, and the parameter that holds it; None where the kind names none, or names a var the run
        does not have. A kind's bug here costs the failure its cause, never the attempt its class."""
        try:
            found = spec.failure_var(failure, facts)
        except Exception:  # a bug in a step kind: the failure stands without a cause
            return None
        values = self.variables_for(host)
        if found is None or found[0] not in values:
            return None
        var, param = found
        value = self.redactor.text(var_text(values[var]))  # masked, then cut: no part of a secret is left over
        if len(value) > CAUSE_VALUE_MAX:
            value = f"{value[:CAUSE_VALUE_MAX]}... ({len(value)} characters)"
        return {"var": var, "value": value, "param": param}
