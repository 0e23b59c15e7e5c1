"""What a run knows of its matrices while it runs: each instance's `matrix_*` environment and gate context,
which instances it needs, and how its cells stand (passed, failed and why, skipped, running).

`executor.runbook.campaign` says what the loader expanded; this module is the engine's and the resume planner's
reading of it, kept apart from the run loop so that the rules (which cells a failure fails, which
instances it takes down with it) are tested without a host.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from executor.runbook.campaign import AxisValue, MatrixGroup, matrix_environment
from executor.runbook.loader import Runbook
from executor.stepkind import StepSpec

#: How the message of a step skipped by its `when:` begins, and that of one left out with a failed cell.
WHEN_FALSE = "when: "
CELL_FAILED = "cell failed:"


def instance_environment(runbook: Runbook, step_id: str) -> dict[str, str]:
    """The `matrix_*` variables a step's commands get besides its vars (none outside a matrix): one
    place for the engine's commands and the plan's."""
    instance = runbook.instances.get(step_id)
    return matrix_environment(instance.values) if instance else {}


def matrix_context(values: Mapping[str, AxisValue]) -> dict[str, Any]:
    """`matrix` as gates and `when` see it: each axis's value, a mapping value as a dict."""
    return {axis: dict(value) if isinstance(value, Mapping) else value for axis, value in values.items()}


class Index:
    """A runbook's matrices looked up by instance (its group, its mates, what it needs), built once per run
    or plan: a runbook may hold 10 000 instances, and every step asks."""

    def __init__(self, runbook: Runbook) -> None:
        self.runbook = runbook
        self.groups = {group.name: group for group in runbook.groups}
        self._by_cell: dict[tuple[str, str, str], str] = {}  # (group, base id, cell) -> the instance
        #: group -> cell -> the instances that belong to it, in run order
        self.members: dict[str, dict[str, list[str]]] = {g.name: {c.id: [] for c in g.cells} for g in runbook.groups}
        for instance in runbook.instances.values():
            for cell in instance.cells:
                self._by_cell.setdefault((instance.group, instance.base, cell), instance.id)
                self.members[instance.group].setdefault(cell, []).append(instance.id)

    def group_of(self, step_id: str) -> MatrixGroup | None:
        """The matrix group `step_id` is an instance of (None outside a matrix)."""
        instance = self.runbook.instances.get(step_id)
        return None if instance is None else self.groups[instance.group]

    def aliases(self, step_id: str) -> dict[str, str]:
        """`steps.<base id>` of each group mate as the instance `step_id` sees it: base id -> the mate's
        instance in the same cell (empty outside a matrix). An instance uses the axes of the mates it refers
        to, so each of its cells names the same mate."""
        instance = self.runbook.instances.get(step_id)
        if instance is None:
            return {}
        found = ((base, self.mate(step_id, base)) for base in self.groups[instance.group].bases)
        return {base: mate for base, mate in found if mate is not None}

    def mate(self, step_id: str, base: str) -> str | None:
        """The instance of group mate `base` that `step_id` sees as `steps.<base>` (None outside a matrix, for
        its own base id or a name that is no mate): one lookup, where `aliases` makes them all."""
        instance = self.runbook.instances.get(step_id)
        if instance is None or not instance.cells or base == instance.base:
            return None
        return self._by_cell.get((instance.group, base, instance.cells[0]))

    def needs(self, group: MatrixGroup) -> dict[str, set[str]]:
        """What each instance of `group` needs (`needed`): a placed group keeps it on the host of those."""
        specs = {spec.id: spec for spec in self.runbook.steps}
        return {iid: self.needed(specs[iid]) for iid in group.instances if iid in specs}

    def needed(self, spec: StepSpec) -> set[str]:
        """The ids of the steps `spec` needs: those whose facts its parameters, gates and `when` use
        (`StepSpec.needs`), and the server instance it runs against; a group mate named by its base id as the
        same cell's instance."""
        variants = [spec, *self.runbook.fallbacks.get(spec.id, [])]
        ids = {self.mate(spec.id, name) or name for name in set().union(*(v.needs() for v in variants))}
        instance = self.runbook.instances.get(spec.id)
        if instance is not None and instance.server is not None:
            ids.add(instance.server)
        ids.discard(spec.id)
        return ids


@dataclass
class CellBook:
    """How the cells of a run's matrices stand: what `CellsProgress` counts and `runbook status` lists."""

    index: Index
    #: (group, cell id) -> why it failed: `INSTANCE: REASON` of the first instance that failed in it
    failed: dict[tuple[str, str], str] = field(default_factory=dict)
    #: instance id -> why it was left out (a `when:` that was false, a failed cell): its dependents say it
    dropped: dict[str, str] = field(default_factory=dict)
    #: instance id -> its status in this run (passed, failed, skipped, running; reused ones as passed)
    status: dict[str, str] = field(default_factory=dict)

    def left_out(self, step_id: str, message: str) -> None:
        """A step was skipped (`message`: its `when:` was false, or why a step it needs was left out): what
        needs it is left out too, saying so."""
        self.dropped[step_id] = f"{step_id} skipped: {message}" if message.startswith(WHEN_FALSE) else message
        self.status[step_id] = "skipped"

    def fail(self, instance_id: str, reason: str) -> None:
        """An instance failed: each of its cells fails, with the first reason it got."""
        instance = self.index.runbook.instances[instance_id]
        first = reason.partition("\n")[0]
        for cell in instance.cells:
            self.failed.setdefault((instance.group, cell), f"{instance_id}: {first}")
        self.dropped[instance_id] = f"{CELL_FAILED} {instance_id}: {first}"

    def why_not(self, spec: StepSpec) -> str | None:
        """Why an instance is not to run (None: it runs): every cell it belongs to failed, or it needs an
        instance that failed or was left out."""
        instance = self.index.runbook.instances.get(spec.id)
        for step in sorted(self.index.needed(spec)):
            if step in self.dropped:
                return self.dropped[step]
        if instance is not None and instance.cells and all((instance.group, c) in self.failed for c in instance.cells):
            return f"{CELL_FAILED} {self.failed[(instance.group, instance.cells[0])]}"
        return None

    def counts(self, group: MatrixGroup) -> dict[str, int]:
        """Of a group's cells: total, passed (every instance passed), failed, skipped (an instance left out,
        none failed), running (some instance started, not every one done)."""
        members = self.index.members[group.name]
        counts = {"total": len(members), "passed": 0, "failed": 0, "skipped": 0, "running": 0}
        for cell, ids in members.items():
            states = [self.status.get(i) for i in ids]
            if (group.name, cell) in self.failed:
                counts["failed"] += 1
            elif "skipped" in states:
                counts["skipped"] += 1
            elif states and all(s == "passed" for s in states):
                counts["passed"] += 1
            elif any(s is not None for s in states):
                counts["running"] += 1
        return counts

    def launches(self, group: MatrixGroup) -> dict[str, int]:
        """The group's server launches: done (its server instances that started one, whether it came up or
        died at start-up: either cost a launch) and planned (one per server configuration; a search's worst case,
        its launch budget, where lower)."""
        done = sum(1 for s in group.servers if self.status.get(s) in ("passed", "failed"))
        return {"done": done, "planned": group.most_launches}

    def failed_cells(self) -> list[dict[str, str]]:
        """The failed cells as `runbook status` lists them, in the order they failed."""
        return [{"group": g, "cell": c, "reason": r} for (g, c), r in self.failed.items()]


def lanes(specs: Iterable[StepSpec], hosts_of: Mapping[str, list[str]], pool: Iterable[str]) -> dict[str, list[str]]:
    """The instances each host of a placed group's pool runs, in group order: one lane per host."""
    order = list(specs)
    return {host: [s.id for s in order if host in hosts_of[s.id]] for host in pool}
