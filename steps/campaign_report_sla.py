"""The campaign report's answer under an SLA: where the benchmarks state SLOs (`slo:`, steps/benchmark_slo.py),
per configuration the highest concurrency that meets them and the goodput there, and the configuration with the
most goodput per GPU, with its margin to the runner-up.

Meeting the SLOs: a concurrency meets them when, in every repeat, at least ATTAINMENT_TARGET of the requests
sent were good by the client's own accounting (SGLang's `slo_attainment`: good requests / requests sent, a failed
request counting against it). The goodput there is the median over the repeats of the client's
`request_goodput` (good requests per second); per GPU, divided by the GPUs its launch runs on (`Launch.gpus`: tp x
pp x dp of its argv; SGLang's tp spans the nodes, so a two-node tp 16 is 16). A configuration whose GPU count is
unknown (no launch recorded, a size out of range) is given its highest concurrency but not ranked per GPU. Ties of
goodput per GPU go to the cheaper configuration (`CellReport.cost`). The margin is the best's goodput per GPU over
the runner-up's, minus 1; `beyond_noise` when the best's slowest repeat beats the runner-up's fastest.
Pure functions of the cells, as the rest of the report's choices (steps/campaign_report_cells.py).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Protocol

from executor.documents import Table
from executor.runbook.model import DataModel
from steps.benchmark_slo import shown

#: The share of a run's requests that must be good for its concurrency to meet the SLOs (in every repeat).
#: AIPerf's goodput guide gives "95% of requests under SLO" as its attainment target (good_request_fraction,
#: errors in the denominator, as SGLang's slo_attainment): one request in twenty may miss, so that one slow
#: request in a short run does not condemn a concurrency, while a tail beyond the SLOs does.
ATTAINMENT_TARGET = 0.95

Three = tuple[float, float, float]


# What the answer reads of the report's cells (steps/campaign_report_cells.py, which holds the answer in its
# `Comparison`: so this module does not import it).
class CellPoint(Protocol):
    @property
    def concurrency(self) -> int: ...
    @property
    def goodput(self) -> Three | None: ...
    @property
    def slo_attainment(self) -> Three | None: ...


class Launch(Protocol):
    @property
    def gpus(self) -> int | None: ...


class CellReport(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def host(self) -> str: ...
    @property
    def launch(self) -> Launch: ...
    @property
    def points(self) -> Sequence[CellPoint]: ...
    @property
    def slo_ms(self) -> dict[str, float] | None: ...
    @property
    def cost(self) -> tuple[float, int, float, float, str]: ...


class SlaConfiguration(DataModel):
    """One configuration under the SLOs."""

    name: str
    host: str
    gpus: int | None  # None: unknown (not ranked per GPU)
    concurrency: int | None  # the highest that meets the SLOs; None: none does
    goodput: Three | None  # there: requests/s that met every SLO, (median, min, max) over the repeats
    goodput_per_gpu: float | None  # the median over gpus
    why: str  # where it meets them and where not, or why it is not ranked


class SlaAnswer(DataModel):
    """A comparison's answer under its SLOs."""

    slo_ms: dict[str, float] | None  # the client's keys -> ms; None when the benchmarks state different SLOs
    attainment_target: float
    configurations: list[SlaConfiguration]
    best: str | None  # the most goodput per GPU at its highest concurrency meeting the SLOs
    runner_up: str | None
    margin: float | None  # best's goodput per GPU / runner-up's - 1
    beyond_noise: bool | None  # the best's slowest repeat per GPU above the runner-up's fastest
    why: str

    def facts(self) -> SlaFacts:
        return SlaFacts(
            slo_ms=self.slo_ms,
            attainment_target=self.attainment_target,
            best=self.best,
            runner_up=self.runner_up,
            margin=self.margin,
            beyond_noise=self.beyond_noise,
            highest={c.name: c.concurrency for c in self.configurations},
            goodput={c.name: None if c.goodput is None else c.goodput[0] for c in self.configurations},
            goodput_per_gpu={c.name: c.goodput_per_gpu for c in self.configurations},
        )


class SlaFacts(DataModel):
    """The answer in short, for a gate (`facts.sla.best`, `facts.sla.highest['benchmark_baseline'] >= 16`)."""

    slo_ms: dict[str, float] | None
    attainment_target: float
    best: str | None
    runner_up: str | None
    margin: float | None
    beyond_noise: bool | None
    highest: dict[str, int | None]  # configuration -> its highest concurrency meeting the SLOs
    goodput: dict[str, float | None]  # configuration -> its median goodput there (requests/s)
    goodput_per_gpu: dict[str, float | None]


def _usable(three: Three | None) -> Three | None:
    """A (median, min, max) whose numbers are all finite and not negative; else None (a tampered state.db)."""
    if three is None or not all(isinstance(v, int | float) and math.isfinite(v) and v >= 0 for v in three):
        return None
    return three


def meets(point: CellPoint) -> bool:
    """Whether every repeat at this point had at least ATTAINMENT_TARGET of its requests good."""
    attained = _usable(point.slo_attainment)
    return attained is not None and attained[1] >= ATTAINMENT_TARGET


def _worst(point: CellPoint) -> str:
    attained = _usable(point.slo_attainment)
    return "unknown" if attained is None else f"{attained[1]:.0%}"


def configuration(cell: CellReport) -> SlaConfiguration:
    """The cell's highest concurrency meeting the SLOs, its goodput there and per GPU."""
    gpus = cell.launch.gpus if cell.launch.gpus is not None and cell.launch.gpus >= 1 else None
    meeting = [p for p in cell.points if meets(p)]
    missed = [p for p in cell.points if not meets(p)]
    said = [f"meets them at {', '.join(str(p.concurrency) for p in meeting)}"] if meeting else []
    said += [
        "not at " + ", ".join(f"{p.concurrency} (worst repeat {_worst(p)} good)" for p in missed) if missed else ""
    ]
    why = "; ".join(filter(None, said)) or "no concurrency measured"
    top = max(meeting, key=lambda p: p.concurrency) if meeting else None
    goodput = None if top is None else _usable(top.goodput)
    per_gpu = None if goodput is None or gpus is None else goodput[0] / gpus
    if top is not None and top.concurrency == max(p.concurrency for p in cell.points):
        why += f"; {top.concurrency} is the highest measured: its limit is there or beyond"
    if top is not None and goodput is None:
        why += f"; its goodput at {top.concurrency} is unknown"
    if gpus is None:
        why += "; its GPU count is unknown (no launch recorded): not ranked per GPU"
    return SlaConfiguration(
        name=cell.name,
        host=cell.host,
        gpus=gpus,
        concurrency=None if top is None else top.concurrency,
        goodput=goodput,
        goodput_per_gpu=per_gpu,
        why=why,
    )


def answer(cells: Sequence[CellReport]) -> SlaAnswer | None:
    """The answer for cells of one comparison; None when none of them stated SLOs."""
    stated = [c for c in cells if c.slo_ms]
    if not stated:
        return None
    kinds = {tuple(sorted(c.slo_ms.items())) for c in stated if c.slo_ms}
    if len(kinds) > 1:
        said = "; ".join(f"{c.name}: {shown(c.slo_ms or {})}" for c in stated)
        return SlaAnswer(
            slo_ms=None,
            attainment_target=ATTAINMENT_TARGET,
            configurations=[],
            best=None,
            runner_up=None,
            margin=None,
            beyond_noise=None,
            why=f"the benchmarks state different SLOs ({said}): no answer compares them",
        )
    configurations = [configuration(c) for c in stated]
    cost = {c.name: c.cost for c in stated}
    ranked = sorted(
        (c for c in configurations if c.goodput_per_gpu is not None),
        key=lambda c: (-(c.goodput_per_gpu or 0.0), cost[c.name]),
    )
    best, runner = [*ranked, None, None][:2]
    margin = noise = None
    if best is not None and runner is not None and runner.goodput_per_gpu:
        ratio = (best.goodput_per_gpu or 0.0) / runner.goodput_per_gpu
        if math.isfinite(ratio):  # a runner-up of 1e-300 req/s (a tampered state.db) would give +inf%
            margin, noise = ratio - 1, _beyond_noise(best, runner)
    return SlaAnswer(
        slo_ms=dict(stated[0].slo_ms or {}),
        attainment_target=ATTAINMENT_TARGET,
        configurations=configurations,
        best=None if best is None else best.name,
        runner_up=None if runner is None else runner.name,
        margin=margin,
        beyond_noise=noise,
        why=_why(best, runner, margin, noise),
    )


def _beyond_noise(best: SlaConfiguration, runner: SlaConfiguration) -> bool:
    """Whether the best's slowest repeat per GPU beats the runner-up's fastest."""
    if best.goodput is None or runner.goodput is None or not best.gpus or not runner.gpus:
        return False
    return best.goodput[1] / best.gpus > runner.goodput[2] / runner.gpus


def _at(c: SlaConfiguration) -> str:
    return f"{c.goodput_per_gpu or 0.0:.4g} req/s per GPU at concurrency {c.concurrency} ({c.gpus} GPUs)"


def _why(
    best: SlaConfiguration | None, runner: SlaConfiguration | None, margin: float | None, noise: bool | None
) -> str:
    if best is None:
        return "no configuration meets the SLOs at any concurrency measured (with a known goodput and GPU count)"
    if runner is None:
        return f"{best.name}: {_at(best)}, the only configuration that meets them"
    if margin is None:
        return (
            f"{best.name}: {_at(best)}; no margin over the runner-up {runner.name} ({_at(runner)}): too little goodput"
        )
    said = "beyond the noise of the repeats" if noise else "within the noise of the repeats (their ranges overlap)"
    return f"{best.name}: {_at(best)}, +{margin:.1%} over the runner-up {runner.name} ({_at(runner)}), {said}"


class Comparison(Protocol):
    @property
    def gpus(self) -> str: ...
    @property
    def shown_workload(self) -> str: ...
    @property
    def sla(self) -> SlaAnswer | None: ...


def tables(comparisons: Sequence[Comparison], searched: bool = False) -> list[Table]:
    """The answer's two tables, where some comparison has SLOs; none otherwise (the report as without them).
    `searched`: a search left configurations unlaunched, which have no goodput (it prunes by throughput)."""
    answered = [(c, c.sla) for c in comparisons if c.sla is not None]
    if not answered:
        return []
    per_configuration = [
        [
            c.gpus,
            c.shown_workload,
            shown(sla.slo_ms or {}),
            k.name,
            "none" if k.concurrency is None else str(k.concurrency),
            "n/a" if k.goodput is None else f"{k.goodput[0]:.4g} ({k.goodput[1]:.4g}-{k.goodput[2]:.4g})",
            "n/a" if k.goodput_per_gpu is None else f"{k.goodput_per_gpu:.4g}",
            k.why,
        ]
        for c, sla in answered
        for k in sla.configurations
    ]
    best = [
        [c.gpus, c.shown_workload, shown(sla.slo_ms or {}) or "n/a", sla.best or "none",
         "n/a" if sla.margin is None else f"+{sla.margin:.1%}", sla.why]
        for c, sla in answered
    ]  # fmt: skip
    return [
        Table(
            title=f"Under the SLOs: the highest concurrency meeting them ({ATTAINMENT_TARGET:.0%} of requests good in "
            "every repeat) and the goodput there (requests/s, median (min-max) over the repeats)",
            columns=["GPUs", "workload", "SLOs", "configuration", "highest concurrency", "goodput", "per GPU", "why"],
            rows=per_configuration,
        ),
        Table(
            title="Under the SLOs: the most goodput per GPU"
            + (
                " (among the configurations a search launched: it prunes by throughput, not goodput)"
                if searched
                else ""
            ),
            columns=["GPUs", "workload", "SLOs", "best", "margin", "why"],
            rows=best,
        ),
    ]


def note(comparisons: Sequence[Comparison]) -> list[str]:
    """The rule in words, where some comparison has SLOs."""
    if not any(c.sla is not None for c in comparisons):
        return []
    return [
        f"under the SLOs: a concurrency meets them when at least {ATTAINMENT_TARGET:.0%} of the requests of every "
        "repeat were good by SGLang's own --goodput accounting (succeeded, and TTFT, TPOT, E2E latency each within "
        "its SLO); goodput is the client's request_goodput (good requests/s), the median over the repeats at the "
        "highest such concurrency, per GPU of the launch (tp x pp x dp); a tie goes to the cheaper configuration."
    ]
