"""The scheduler: which steps run, in what order, on which hosts, and how a run's matrix cells stand.

Steps run in runbook order, each on its hosts in parallel (`max_parallel` at once); the instances of a
placed matrix group run in lanes, one per host of its pool. A failure stops the run, except in a group with
`on_failure: continue`, where it fails the instance's cells and the instances that need them are left out.
One step on one host is `executor.run.attempts`' job; the run folder (`executor.run.run_folder`) stores every row.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import itertools
import json
from collections.abc import Coroutine, Mapping
from typing import Any

from executor.errors import EXIT_FAILED, EXIT_OK, DurableWriteError
from executor.run import event_models, searching
from executor.run.attempts import Attempts, peers
from executor.run.resume import Fingerprints, Plan, plan_steps
from executor.run.run_folder import RunFolder
from executor.run.state import ONLY_SKIPPED, SEARCH_KEY, StepRecord, now, passed_before
from executor.runbook import cells
from executor.runbook.campaign import EXIT_CELLS_FAILED, MatrixGroup, value_text
from executor.runbook.loader import Runbook
from executor.runbook.planner import placed_hosts
from executor.runbook.search import Decision
from executor.stepkind import StepSpec


async def _all_lanes(lanes: list[Coroutine[Any, Any, None]]) -> None:
    """A group's lanes at once, until each ends; one lane's error (a failed write, a signal) cancels the others,
    awaited before it is raised, so no lane outlives its group."""
    tasks = [asyncio.ensure_future(lane) for lane in lanes]
    try:
        await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _in_group(group: MatrixGroup, spec: StepSpec) -> bool:
    return spec.id in group.instances


class Scheduler:
    """Runs a run's steps in order and keeps its matrix cells' book (`cells`). `runbook` is the run's as
    placed (`place`); `hosts_to_run` the hosts each step that runs runs on (`plan`)."""

    def __init__(
        self, runbook: Runbook, folder: RunFolder, fingerprints: Fingerprints, positions: Mapping[str, int]
    ) -> None:
        self.runbook = runbook
        self.folder = folder
        self.fingerprints = fingerprints
        self.positions = positions
        self.cells = cells.CellBook(cells.Index(runbook))
        self.hosts_to_run: dict[str, list[str]] = {}
        self.stopping = False  # a step failed outside `on_failure: continue`: the lanes start nothing new
        self.searching = True  # a searched group searches (not under --from/--only: `plan`)
        #: each searched group's decisions (SEARCH_KEY), a resumed run's kept until its group searches again
        self.search_record: dict[str, list[dict[str, Any]]] = {}

    @property
    def index(self) -> cells.Index:
        """The runbook's matrices by instance, built once per run (gates and `when` read it too)."""
        return self.cells.index

    # ---- before the run -----------------------------------------------------------------------

    def place(self) -> Runbook:
        """Each instance of a placed group on its pool's hosts (`executor.runbook.placement.place`), a resumed run's
        servers kept on the hosts they ran on: the run's `step_hosts` say so from here on."""
        if any(group.placement is not None for group in self.runbook.groups):
            previous = {step: host for (step, host) in self.folder.source_records}  # a unit's id is its server's
            hosts = placed_hosts(self.runbook, previous, self.cells.index)
            self.runbook = dataclasses.replace(self.runbook, step_hosts=hosts)
        return self.runbook

    def plan(self, source_id: str | None, from_step: str | None, only_step: str | None) -> Plan:
        """What each step does (`executor.run.resume.plan_steps`) against the source run's rows."""
        plan = plan_steps(self.runbook, self.fingerprints, self.folder.source_records, source_id, from_step, only_step)
        self.hosts_to_run = plan.hosts_to_run
        #: `--from`/`--only` run the steps they name: a searched group's among them run as a grid's would
        self.searching = from_step is None and only_step is None
        return plan

    def to_run(self) -> list[StepSpec]:
        return [spec for spec in self.runbook.steps if spec.id in self.hosts_to_run]

    def hosts_of(self, spec: StepSpec) -> list[str]:
        return self.hosts_to_run.get(spec.id, self.runbook.step_hosts[spec.id])

    def unverified_hosts(self) -> list[str]:
        """The SSH hosts this run connects to whose host key is not verified (`verify_host_key: false`)."""
        to_run = self.to_run()
        used = {host for spec in to_run for host in self.hosts_of(spec)}
        used |= {host for spec in to_run for host in peers(self.runbook, spec)}
        hosts = self.runbook.hosts
        return sorted(name for name in used if not hosts[name].is_local and not hosts[name].verify_host_key)

    def open_rows(self, plan: Plan, resumed_from: str | None) -> None:
        """Every step of the run has a row from the start: kept from the source run (its facts reused),
        pending, or skipped with why."""
        kept = {p.step: p.reused_on for p in plan.steps}  # the hosts whose record each step keeps from the source
        why, run_ids = plan.why, set(plan.to_run)
        for spec in self.runbook.steps:
            for host in self.runbook.step_hosts[spec.id]:
                old = self.folder.source_records.get((spec.id, host))
                origin = (old.reused_from if old else None) or resumed_from
                if host in kept[spec.id]:
                    assert old is not None
                    row = self._kept(spec.id, old, origin)
                else:
                    row = self._row(spec.id, host, old, origin, why[spec.id], spec.id in run_ids)
                self.folder.records[(spec.id, host)] = row

    def _kept(self, step_id: str, old: StepRecord, origin: str | None) -> StepRecord:
        """A source run's row the run keeps, its cells standing as the step ended there."""
        if old.status != "passed" and passed_before(old):  # an --only run left it out after it passed
            old = dataclasses.replace(old, status="passed", message=None)
        if old.status == "skipped":  # left out unchanged (a `when:` still false): so are its dependents
            self.cells.left_out(step_id, old.message or "")
        elif old.status == "failed":  # kept as it ended last (`--from`/`--only` after it)
            self.cells.status[step_id] = "failed"
        else:
            self.cells.status[step_id] = "passed"
        return dataclasses.replace(old, reused_from=origin)

    def _row(
        self, step_id: str, host: str, old: StepRecord | None, origin: str | None, why: str, runs: bool
    ) -> StepRecord:
        """The row of a step the run does not reuse: pending, or skipped (an --only run's keeps the record
        of its pass, or of its failure, as it ended last)."""
        if why == ONLY_SKIPPED and passed_before(old):
            assert old is not None  # left out by this --only run: the record keeps the facts of its pass
            return dataclasses.replace(old, status="skipped", message=ONLY_SKIPPED, reused_from=origin)
        if why == ONLY_SKIPPED and old is not None and old.status == "failed":
            return dataclasses.replace(old, reused_from=origin)  # as it ended last
        status = "pending" if runs else "skipped"
        message = why if status == "skipped" else None
        return StepRecord(
            step=step_id, host=host, position=self.positions[step_id], status=status, fingerprint="", message=message
        )

    # ---- running ------------------------------------------------------------------------------

    async def run(self, attempts: Attempts) -> tuple[str, int]:
        """Every step to run; the run's status and exit code (failed, cells-failed or passed)."""
        # a resumed run's decisions are its own too, whether or not its search goes on (read here: the source run
        # is opened after the scheduler is made)
        self.search_record = {g: [d.as_json() for d in ds] for g, ds in self.folder.source_search.items()}
        if self.search_record:
            self.folder.state.set(SEARCH_KEY, json.dumps(self.search_record))
        if not await self._run_steps(self.to_run(), attempts):
            return "failed", EXIT_FAILED
        if self.cells.failed:
            return "cells-failed", EXIT_CELLS_FAILED
        return "passed", EXIT_OK

    def summary(self) -> dict[str, str]:
        """What the run's state keeps besides its status: the failed cells (what `runbook status` lists)."""
        return {"failed_cells": json.dumps(self.cells.failed_cells())} if self.cells.failed else {}

    async def _run_steps(self, to_run: list[StepSpec], attempts: Attempts) -> bool:
        """Every step to run, in order; the instances of a placed matrix group in lanes, one per host of its
        pool. False when a step failed outside `on_failure: continue` (the run fails)."""
        index = 0
        while index < len(to_run):
            group = self.cells.index.group_of(to_run[index].id)
            searched = group is not None and group.search is not None and self.searching
            if group is None or (group.placement is None and not searched):
                passed = await self._run_step(to_run[index], attempts)
                index += 1
            else:
                members = list(itertools.takewhile(functools.partial(_in_group, group), to_run[index:]))
                run_group = self._run_search if searched else self._run_lanes
                passed = await run_group(group, members, attempts)
                index += len(members)
            if not passed:
                return False
        return True

    async def _run_lanes(self, group: MatrixGroup, members: list[StepSpec], attempts: Attempts) -> bool:
        """A placed group's instances: each host of its pool runs those placed on it, in group order (so one
        server at a time per host), the hosts in parallel. A failure that stops the run lets the running
        instances finish and starts nothing new."""
        hosts_of = {s.id: self.hosts_of(s) for s in members}
        by_id = {s.id: s for s in members}

        async def lane(host: str, ids: list[str]) -> None:
            for step_id in ids:
                if self.stopping:
                    return
                if not await self._run_step(by_id[step_id], attempts, [host]):
                    self.stopping = True

        await _all_lanes([lane(h, ids) for h, ids in cells.lanes(members, hosts_of, group.pool).items()])
        return not self.stopping

    async def _run_search(self, group: MatrixGroup, members: list[StepSpec], attempts: Attempts) -> bool:
        """A searched group (`strategy: search`): each lane (a host of a placed group's pool, else one) runs the
        unit the search chooses next until it chooses none; what it never chose is left out with its decision."""
        restored = self.folder.source_search.get(group.name, [])
        specs = {s.id: s for s in self.runbook.steps}
        driver = searching.SearchDriver(group, specs, self.cells.index, restored, self.runbook.step_hosts)
        by_id = {s.id: s for s in members}
        records = self.folder.records

        def emit(decision: Decision) -> None:
            self.search_record[group.name] = driver.record()
            self.folder.state.set(SEARCH_KEY, json.dumps(self.search_record))
            self.folder.events.emit(
                event_models.SearchDecided,
                group=group.name,
                decision=decision.seq,
                action=decision.action,
                config=decision.config,
                reason=decision.reason,
            )

        async def lane(host: str | None) -> None:
            driver.observe(records)
            while not self.stopping and (server := driver.next_unit(host, records, emit)) is not None:
                for step_id in driver.steps_for(server, host, by_id):
                    if self.stopping:  # a failure that stops the run: nothing more starts, as in a grid's lanes
                        break
                    if not await self._run_step(by_id[step_id], attempts, [host] if host else None):
                        self.stopping = True
                driver.observe(records)

        self.search_record[group.name] = driver.record()
        attempts.screens.update(driver.screens())
        attempts.screened |= group.screened(self.runbook.instances)
        pool: list[str | None] = list(group.pool) if group.placement is not None else [None]
        await _all_lanes([lane(host) for host in pool])
        self.search_record[group.name] = driver.record()  # as it ended (a decision observe corrected included)
        self.folder.state.set(SEARCH_KEY, json.dumps(self.search_record))
        ran = {step for step, _ in driver.started}
        for spec in members:
            if spec.id not in ran:
                self._leave_out(spec, self.hosts_of(spec), driver.why_not(spec.id), driver.left_out_facts(spec.id))
        return not self.stopping

    async def _run_step(self, spec: StepSpec, attempts: Attempts, lane: list[str] | None = None) -> bool:
        """One step on its hosts (or on `lane`'s one host). False when it failed and the run stops; a
        failed instance of an `on_failure: continue` group fails its cells instead, and the run goes on."""
        hosts = lane or self.hosts_of(spec)
        group, cell = self._cell_of(spec.id)
        reason = self.cells.why_not(spec)
        if reason is not None:
            self._leave_out(spec, hosts, reason)
            return True
        attempts.connect(spec, hosts)
        if group is not None:
            self.cells.status.setdefault(spec.id, "running")
        self.folder.events.emit(
            event_models.StepStarted, step=spec.id, kind=spec.kind, hosts=hosts, group=group, cell=cell
        )
        return self._finished(spec, await self._on_hosts(spec, hosts, attempts))

    def _leave_out(self, spec: StepSpec, hosts: list[str], reason: str, facts: Any = None) -> None:
        """A step left out without running (a failed cell, a needed step left out): its rows skipped (with
        `facts`, where the reason has some: a search's), its events sent, its dependents left out too."""
        group, cell = self._cell_of(spec.id)
        self._skip(spec, hosts, reason, facts)
        events = self.folder.events
        events.emit(event_models.StepStarted, step=spec.id, kind=spec.kind, hosts=hosts, group=group, cell=cell)
        events.emit(
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

    async def _on_hosts(self, spec: StepSpec, hosts: list[str], attempts: Attempts) -> list[StepRecord]:
        """The step on each of `hosts`, at most `max_parallel` at once. A failed write to the run folder on
        one host stops the run at once: the other hosts' commands are killed, and it is raised."""
        limit = asyncio.Semaphore(self.runbook.header.defaults.max_parallel)
        folder = self.folder

        async def bounded(host: str) -> StepRecord:
            async with limit:
                if folder.write_failure is not None:  # another host's write failed: start nothing more
                    raise folder.write_failure
                try:
                    return await attempts.run_on_host(spec, host)
                except DurableWriteError as exc:
                    folder.failed_write(exc)
                    for task in tasks:
                        if task is not asyncio.current_task():
                            task.cancel()
                    raise

        tasks = [asyncio.ensure_future(bounded(h)) for h in hosts]
        results = await asyncio.gather(*tasks, return_exceptions=True)
        cancelled = [r for r in results if isinstance(r, BaseException)]
        if cancelled:
            raise next((r for r in cancelled if isinstance(r, DurableWriteError)), cancelled[0])
        return [r for r in results if isinstance(r, StepRecord)]

    def _finished(self, spec: StepSpec, records: list[StepRecord]) -> bool:
        """Say how the step ended on its hosts and book its cells; whether the run goes on."""
        group, cell = self._cell_of(spec.id)
        failed = [r for r in records if r.status not in ("passed", "skipped")]
        skipped = [r for r in records if r.status == "skipped"]
        outcome = "failed" if failed else "skipped" if skipped and len(skipped) == len(records) else "passed"
        self.folder.events.emit(
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

    def _skip(self, spec: StepSpec, hosts: list[str], reason: str, facts: Any = None) -> None:
        """Record a step left out on `hosts` (a failed cell, a needed step left out) without running it."""
        for host in hosts:
            old = self.folder.records[(spec.id, host)]
            self.folder.save(
                dataclasses.replace(
                    old,
                    status="skipped",
                    message=reason,
                    facts=old.facts if facts is None else facts,
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
            self.folder.events.emit(
                event_models.CellsProgress,
                group=group.name,
                cells=self.cells.counts(group),
                launches=self.cells.launches(group),
            )
