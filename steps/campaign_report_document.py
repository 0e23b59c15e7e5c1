"""The campaign report's document, `CampaignReport`: report.json's generic part (schema_version, then title,
notes, tables, figures, which `runbook report` prints and report.md shows) plus `campaign` (the cells and the
choices, as numbers) and `provenance` (steps/provenance.py's, one per host). Its JSON Schema, with the
benchmark's `Report`: `runbook schema --report`.

The tables come in the order a reader asks: the best configuration per concurrency, the crossover, the
launch command to paste per concurrency range, the failed cells, then what each cell measured, then the
provenance of each host.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from executor.documents import Figure, Table
from executor.runbook.model import DataModel
from steps import campaign_report_search, campaign_report_sla
from steps.benchmark_report import NA, Document, or_na, plain, provenance_tables, times, tok_s
from steps.campaign_report_cells import CellReport, Comparison, Recommendation, percent
from steps.provenance import Provenance

THROUGHPUT_PNG, PARETO_PNG, ACCEPTANCE_PNG = "campaign_throughput.png", "campaign_pareto.png", "campaign_acceptance.png"


class Failed(DataModel):
    name: str
    host: str
    status: str  # failed | skipped
    reason: str


class Counts(DataModel):
    cells: int  # benchmark instances of the matrices, per host (baselines not counted)
    passed: int
    failed: int
    skipped: int
    benchmarked: int  # passed with at least one measured concurrency
    launches: int  # distinct deploy instances the passed and failed cells ran against, per host


class Campaign(DataModel):
    """`campaign` of report.json."""

    baseline: str
    tolerance: float
    compare_across_gpus: bool
    gpu_kinds: dict[str, str]  # host -> "8x NVIDIA H200" (or why it is unknown)
    counts: Counts
    comparisons: list[Comparison]  # per GPU kind and workload: best per concurrency, crossover, recommended
    failed: list[Failed]
    cells: list[CellReport]  # the baselines first, then the cells in run order
    #: per group a search left configurations of unlaunched (strategy: search): launches and GPU time against the grid's
    search: list[campaign_report_search.SearchAccount] = []


class CampaignReport(Document):
    """report.json of a `campaign_report` step."""

    campaign: Campaign
    provenance: dict[str, Provenance]  # host -> what its numbers are of


def counts(cells: Sequence[CellReport]) -> Counts:
    """Per benchmark instance and host: a benchmark of several workloads is one cell (a report each), as a cell
    that never ran (skipped, no workload known) is."""
    instances: dict[tuple[str, str], list[CellReport]] = {}
    for c in cells:
        if not c.baseline:
            instances.setdefault((c.host, c.benchmark), []).append(c)
    measured = [reports[0] for reports in instances.values()]
    return Counts(
        cells=len(measured),
        passed=sum(c.status == "passed" for c in measured),
        failed=sum(c.status == "failed" for c in measured),
        skipped=sum(c.status == "skipped" for c in measured),
        benchmarked=sum(any(c.status == "passed" and c.points for c in r) for r in instances.values()),
        launches=len({(c.host, c.launch.deploy) for c in measured if c.launch.deploy and c.status != "skipped"}),
    )


def _concurrencies(values: Sequence[int]) -> str:
    return ", ".join(map(str, values))


def _workload(c: Comparison) -> str:
    return c.shown_workload


def _three(three: tuple[float, float, float] | None) -> str:
    return NA if three is None else f"{tok_s(three[0])} ({tok_s(three[1])}-{tok_s(three[2])})"


def _lossless(cell: CellReport) -> str:
    checked = [
        f"{name}: {or_na(s.identical)}/{or_na(s.compared)} identical"
        + (f" (a search's screen: {s.compared} of its {s.set_prompts} prompts)" if s.set_prompts else "")
        for a in cell.acceptance
        for name, s in (a.lossless or {}).items()
    ]
    return "; ".join(checked) or "not checked"


def _recommended(r: Recommendation) -> str:
    tie = f" (the cheapest of a tie at {_concurrencies(r.on_tie)})" if r.on_tie else ""
    return r.best + tie


def choice_tables(
    comparisons: Sequence[Comparison],
    failed: Sequence[Failed],
    search: Sequence[campaign_report_search.SearchAccount] = (),
) -> list[Table]:
    """Best per concurrency, crossover, recommended commands, failed cells: what `runbook report` shows first."""
    best = [
        [
            c.gpus,
            _workload(c),
            str(b.concurrency),
            ("tied: " + ", ".join(b.tied)) if b.tied else b.best,
            b.best,
            b.host,
            tok_s(b.output_throughput),
            b.why,
        ]
        for c in comparisons
        for b in c.best
    ]
    columns = ["GPUs", "workload", "concurrency", "best", "recommended", "host", "output tok/s", "why"]
    return [
        Table(title="Best configuration per concurrency", columns=columns, rows=best),
        Table(
            title="Crossover: where speculation stops paying",
            columns=["GPUs", "workload", "crossover concurrency", "why"],
            rows=[[c.gpus, _workload(c), or_na(c.crossover.concurrency), c.crossover.why] for c in comparisons],
        ),
        Table(
            title="Recommended launch command per concurrency range",
            columns=["GPUs", "workload", "concurrencies", "configuration", "host", "command"],
            rows=[
                [
                    c.gpus,
                    _workload(c),
                    _concurrencies(r.concurrencies),
                    _recommended(r),
                    r.host,
                    r.command or r.unknown or NA,
                ]
                for c in comparisons
                for r in c.recommended
            ],
        ),
        *campaign_report_sla.tables(comparisons, searched=bool(search)),
        *campaign_report_search.tables(search),
        Table(
            title="Failed and skipped cells",
            columns=["cell", "host", "status", "reason"],
            rows=[[f.name, f.host, f.status, f.reason] for f in failed],
        ),
    ]


def cell_tables(cells: Sequence[CellReport]) -> list[Table]:
    """What each cell (and each host's baseline) measured and ran."""
    summary = [
        [
            c.name,
            c.host,
            c.status,
            c.launch.algorithm or ("none (baseline)" if c.launch.argv else NA),  # no argv: its deploy did not pass
            or_na(c.launch.draft_tokens),
            or_na(c.launch.budget),
            or_na(c.launch.gpus),
            or_na(c.launch.server_version),
            "-" if c.baseline else _lossless(c),
        ]
        for c in cells
    ]
    points = [
        [
            c.name,
            c.host,
            str(p.concurrency),
            str(p.repeats),
            _three(p.output_throughput) + (" (noisy)" if p.noisy else ""),
            "-" if c.baseline else times(p.speedup),
            _three(p.tpot_ms),
            _three(p.ttft_ms),
        ]
        for c in cells
        for p in c.points
    ]
    acceptance = [
        [
            c.name,
            a.step,
            "n/a" if a.thinking is None else ("on" if a.thinking else "off"),
            name,
            or_na(s.requests),
            plain(s.mean),
            plain(s.weighted_mean),
        ]
        for c in cells
        for a in c.acceptance
        for name, s in a.sets.items()
    ]
    return [
        Table(
            title="Cells",
            columns=["cell", "host", "status", "algorithm", "draft tokens", "budget", "GPUs", "SGLang", "lossless"],
            rows=summary,
        ),
        Table(
            title="Output throughput and latency per cell and concurrency (median (min-max) over the repeats)",
            columns=["cell", "host", "concurrency", "repeats", "output tok/s", "speedup", "TPOT ms", "TTFT ms"],
            rows=points,
        ),
        Table(
            title="Acceptance length per cell and prompt set",
            columns=["cell", "eval", "thinking", "prompt set", "requests", "mean (per request)", "token-weighted mean"],
            rows=acceptance,
        ),
        Table(
            title="Launch commands",
            columns=["cell", "host", "command"],
            rows=[[c.name, c.host, c.launch.command or NA] for c in cells if c.status == "passed"],
        ),
    ]


def notes(campaign: Campaign) -> list[str]:
    n, kinds = campaign.counts, campaign.gpu_kinds
    said = [
        f"{n.cells} cell(s): {n.passed} passed, {n.failed} failed, {n.skipped} skipped; "
        f"{n.launches} server launch(es); speedups are of medians over the repeats, against the baseline "
        f"{campaign.baseline} of the same host.",
        f"best = the fastest median output throughput, named only when it beats every other beyond the noise of "
        f"the repeats (its slowest repeat above their fastest) and by more than {percent(campaign.tolerance)}; the "
        "configurations it does not beat so are tied, and the cheapest of a tie is recommended: fewest GPUs, then "
        "no speculation, then fewest draft tokens, then smallest tree budget.",
    ]
    said += campaign_report_sla.note(campaign.comparisons)
    said += campaign_report_search.notes(campaign.search)
    distinct = sorted(set(kinds.values()))
    if len(distinct) > 1:
        hosts = "; ".join(f"{host}: {kind}" for host, kind in kinds.items())
        said.append(
            f"the hosts' GPUs differ ({hosts}): compared across them as told (compare_across_gpus)."
            if campaign.compare_across_gpus
            else f"the hosts' GPUs differ ({hosts}): cells of different GPUs are not compared; the best "
            "configuration is given per GPU kind (compare_across_gpus: true compares them)."
        )
    if not any(c.baseline and c.status == "passed" for c in campaign.cells):
        said.append(f"the baseline {campaign.baseline} passed on no host as a benchmark: no speedup is known.")
    if n.passed == 0:
        said.append("no cell passed: there is no best configuration to recommend; the failed cells say why.")
    return said


def figures(cells: Sequence[CellReport]) -> list[Figure]:
    shown = [
        Figure(title="Output throughput against concurrency, per configuration", path=THROUGHPUT_PNG),
        Figure(title="Output tokens/s per GPU against tokens/s per user, best points marked", path=PARETO_PNG),
    ]
    if any(c.acceptance for c in cells):
        shown.append(Figure(title="Acceptance length against draft tokens / tree budget", path=ACCEPTANCE_PNG))
    return shown


def build(campaign: Campaign, provenance: dict[str, Provenance], title: str) -> CampaignReport:
    tables = choice_tables(campaign.comparisons, campaign.failed, campaign.search) + cell_tables(campaign.cells)
    for host, origin in provenance.items():
        tables += [dataclasses.replace(t, title=f"{t.title} (host {host})") for t in provenance_tables(origin)]
    return CampaignReport(
        title=title,
        notes=notes(campaign),
        tables=tables,
        figures=figures(campaign.cells),
        campaign=campaign,
        provenance=provenance,
    )
