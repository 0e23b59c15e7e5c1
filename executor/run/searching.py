"""The engine's side of a campaign's search (`strategy: search`): which unit a lane runs next, what each measured,
and the record of every decision.

`executor.runbook.search` decides from measures; this module gives it the measures (each unit's measuring step's
facts, read by its kind: `StepSpec.search_measures`), checks the budget before each launch, and keeps the
decisions in the run's state (SEARCH_KEY, after each one) and its events, so that `--resume` after a kill
restores them: a configuration pruned or measured stays so, one launched and not measured runs first.
A unit is a server instance with the instances that run against it (executor.runbook.placement); an instance
before the server (a drafter's download) runs before the first unit that shares a cell with it, so a drafter
the search never launches is never downloaded.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from executor.errors import StateError
from executor.files import json_data
from executor.run.state import SEARCH_KEY, StepRecord
from executor.runbook.campaign import MatrixGroup
from executor.runbook.cells import Index
from executor.runbook.search import LEFT_OUT, NOT_REACHED, Band, Decision, Measure, Position, Search
from executor.stepkind import StepSpec

#: The most a run's search record holds: 10 000 configurations (the matrix's limit) x a few decisions' reasons
RECORD_MAX = 64 * 1024 * 1024

#: How deep a run's record nests: {group: [{decision, evidence: {band: [bound, incumbent]}}]} is 5 levels
RECORD_MAX_DEPTH = 8


_SAID = {"prune": "pruned", "unexplored": "not launched", "launch": "launched"}

Records = Mapping[tuple[str, str], StepRecord]


def source_decisions(raw: str | None, where: str) -> dict[str, list[Decision]]:
    """A source run's recorded decisions (None: none); StateError when the record is not what a run writes."""
    if raw is None:
        return {}
    if len(raw) > RECORD_MAX:
        why = f"the search's record (`{SEARCH_KEY}`) is {len(raw)} characters, more than a run writes ({RECORD_MAX})"
        raise StateError(f"{where}: {why}", why)
    try:
        data = json_data(raw, RECORD_MAX_DEPTH)
        return {str(group): [Decision.from_json(d) for d in decisions] for group, decisions in data.items()}
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        why = f"the search's record (`{SEARCH_KEY}`) is not as a run writes it: {exc}"
        raise StateError(f"{where}: {why}", why) from exc


class SearchDriver:
    """One group's search during a run."""

    def __init__(
        self,
        group: MatrixGroup,
        specs: Mapping[str, StepSpec],
        index: Index,
        restored: list[Decision],
        hosts: Mapping[str, list[str]],
    ) -> None:
        """`hosts`: each instance's hosts as the run placed them (a placed group's unit on one host of its pool)."""
        assert group.search is not None
        self.group, self.spec, self.specs, self.index = group, group.search, specs, index
        unknown = Position(None, None, None, (1.0, math.inf, 0.0), "")
        positions = {s: specs[s].search_position() or unknown for s in group.servers}
        self.search = Search(positions, self.spec.tolerance)
        #: prunes and launches kept; a spent budget is judged again (a resume may raise it)
        self.search.decisions = [d for d in restored if d.config in positions and d.action != "unexplored"]
        for seq, decision in enumerate(self.search.decisions, 1):
            decision.seq = seq
        self.hosts = hosts
        #: launches the source run decided: each is taken up first, once, by the lane of its host
        self.restored = {d.config for d in self.search.decisions if d.action == "launch"}
        self.measure = {s: index.mate(s, self.spec.measure) for s in group.servers}
        runbook = index.runbook
        self.members = {s: [i for i in group.instances if runbook.instances[i].server == s] for s in group.servers}
        self.started: set[tuple[str, str | None]] = set()  # (instance, lane host) run or leaving this run
        self.resumed: set[str] = set()  # restored launches a lane has taken up again
        self.gpu_seconds = 0.0

    # ---- what was measured ----------------------------------------------------------------------

    def observe(self, records: Records) -> None:
        """Read the baseline's measure and every launched unit's from the run's records (kept or new)."""
        search = self.search
        if self.spec.baseline and not search.baseline:
            found = [r for (step, _), r in records.items() if step == self.spec.baseline and r.status == "passed"]
            if found:
                search.baseline = self.specs[self.spec.baseline].search_measures(found[0].facts)
        self.gpu_seconds = 0.0
        for server in self.group.servers:
            self.gpu_seconds += self._gpu_seconds(server, records)
            decision = search.decided(server)
            measure = self.measure.get(server)
            if measure is None or server in search.measured:
                continue
            rows = [r for (step, _), r in records.items() if step == measure]
            if decision is None or decision.action != "launch":  # a measure passed all the same (a record that
                rows = [r for r in rows if r.status == "passed"]  # says it was pruned) is a measure still
            if any(r.status == "passed" for r in rows):
                row = next(r for r in rows if r.status == "passed")
                measured = self.specs[measure].search_measures(row.facts)
                if measured:
                    search.measured[server] = measured
                    if decision is not None and decision.action != "launch":  # the record contradicts the measure
                        decision.action, decision.reason = "launch", f"measured, though recorded: {decision.reason}"
                else:
                    search.lost.add(server)
            elif any(r.status in ("failed", "skipped") for r in rows):
                search.lost.add(server)

    def _gpu_seconds(self, server: str, records: Records) -> float:
        """The unit's time (its instances' durations, this run's and those it kept) times its launch's GPUs."""
        rows = [r for (step, _), r in records.items() if step in self.members[server]]
        launch = next((r for r in rows if r.step == server and r.facts is not None), None)
        gpus = (self.specs[server].search_gpus(launch.facts) if launch else None) or 1
        return sum(r.duration_s or 0 for r in rows) * gpus

    def launches(self, records: Records) -> int:
        """The group's server launches so far: those decided, the lanes' running ones among them (two lanes must
        not both take the budget's last), less those whose server step was skipped by its `when:` (no launch)."""
        skipped = {step for (step, _), r in records.items() if step in self.members and r.status == "skipped"}
        return sum(1 for d in self.search.decisions if d.action == "launch" and d.config not in skipped)

    # ---- what runs next ---------------------------------------------------------------------------

    def next_unit(self, host: str | None, records: Records, emit: Callable[[Decision], None]) -> str | None:
        """The server instance this lane (`host`, None for an unplaced group) runs next, decisions emitted: a
        launch the source run decided and did not measure first, then the search's choice within the budget."""
        search = self.search
        for pruned in search.prune():
            emit(pruned)
        mine = [s for s in self.group.servers if host is None or host in self.hosts.get(s, [])]
        for server in mine:
            unmeasured = server not in search.measured and server not in search.lost
            if server in self.restored and unmeasured and server not in self.resumed:
                self.resumed.add(server)
                return server
        spent = self._spent(records)
        candidates = [s for s in mine if s in search.open()]
        if spent is not None and candidates:
            if self._measuring(records):  # the lane that measures it last judges the rest, with its measure
                return None
            for server in search.open():
                emit(search.unexplored(server, spent))
            return None
        chosen = search.next_launch(candidates)
        if chosen is None:
            return None
        emit(search.decide("launch", *chosen))
        return chosen[0]

    def _measuring(self, records: Records) -> bool:
        """Whether a launch is still being measured on another lane (its measure not yet ended there)."""
        ended = {step for (step, _), r in records.items() if r.status in ("passed", "failed", "skipped")}
        return any(
            d.action == "launch"
            and d.config not in self.search.measured
            and d.config not in self.search.lost
            and (measure := self.measure.get(d.config)) is not None
            and measure not in ended
            for d in self.search.decisions
        )

    def _spent(self, records: Records) -> str | None:
        """Why the budget allows no further launch (None: it does): checked before the launch, never after."""
        budget, launched = self.spec.budget, self.launches(records)
        if budget.launches is not None and launched >= budget.launches:
            return f"the search's budget of {budget.launches} launches was spent"
        hours = self.gpu_seconds / 3600
        if budget.gpu_hours is not None and hours >= budget.gpu_hours:
            return f"the search's budget of {budget.gpu_hours:g} GPU-hours was spent ({hours:.3g} used)"
        return None

    def steps_for(self, server: str, host: str | None, to_run: Mapping[str, StepSpec]) -> list[str]:
        """The instances a lane runs for `server`: those before any server sharing a cell with it, not yet run
        on this lane, then the unit's own, in group order (those the run reruns)."""
        runbook = self.index.runbook
        cells = set(runbook.instances[server].cells)
        chosen = []
        for iid in self.group.instances:
            instance = runbook.instances[iid]
            shared = instance.server is None and cells & set(instance.cells)
            on_lane = host is None or host in self.hosts.get(iid, [])
            if iid in to_run and on_lane and (shared or instance.server == server) and (iid, host) not in self.started:
                self.started.add((iid, host))
                chosen.append(iid)
        return chosen

    def why_not(self, instance_id: str) -> str:
        """Why an instance of the group did not run: its configuration's decision, or none of its cells launched."""
        instance = self.index.runbook.instances[instance_id]
        if instance.server is not None:
            decision = self.search.decided(instance.server)
            if decision is not None and decision.action != "launch":
                return f"{LEFT_OUT}{_SAID[decision.action]} {instance.server}: {decision.reason}"
            return f"{LEFT_OUT}{instance.server} {NOT_REACHED}"
        return f"{LEFT_OUT}no configuration of its cells was launched (each was pruned or not reached)"

    def left_out_facts(self, instance_id: str) -> dict[str, Any] | None:
        """The facts of a server instance the budget left open: the bands whose answer it might still change
        (`unproven`), which the campaign report marks; None for any other instance."""
        decision = self.search.decided(instance_id)
        if decision is None or decision.action != "unexplored" or not decision.unproven:
            return None
        return {"unproven": list(decision.unproven)}

    def screens(self) -> dict[str, Callable[[Mapping[Band, Measure]], frozenset[Band]]]:
        """Each configuration's measuring instance -> its screen (`StepContext.screen`): the bands it contends in."""
        return {measure: self.search.contending for measure in self.measure.values() if measure is not None}

    def record(self) -> list[dict[str, Any]]:
        return [d.as_json() for d in self.search.decisions]
