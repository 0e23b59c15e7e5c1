"""`runbook compare RUN_A RUN_B` (and the MCP `compare`): did a metric change between two runs beyond the noise of
their repeats, and did it get worse (README "Comparing two runs").

Each run is read as `runbook report --format csv` reads it (executor/faces/report_csv.py: its report through the
model its step wrote it with, one row per cell x workload x concurrency); cells are matched by (cell, workload,
SPEED-Bench category, concurrency), and those in one run only are listed. The per-repeat values an interval needs
are where the runs keep them: a benchmark's report holds them (each point's `Spread.values`); a campaign's
report holds medians and ranges only, so each cell's values are its benchmark step's facts in the run's
state.db (read as the campaign's report read them, steps/campaign_report_cells.py `checked_facts`).

The change of a metric is the ratio of the geometric means of B's repeats to A's, in percent; its interval is
Welch's t-interval of the difference of the means of the logarithms (unequal variances; the
Welch-Satterthwaite degrees of freedom rounded down, the conservative side), taken back to a ratio: a ratio
of positive numbers is symmetric on a log scale, and A's noise counts as much as B's. With fewer than two
repeats on either side there is no noise estimate: the change is shown and never flagged. A change is beyond
noise when its interval excludes 0, and a regression when it is also worse (throughput or acceptance length
down, TTFT or TPOT up) by more than the threshold: the exit status is 1 when any is (`EXIT_REGRESSED`).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, NamedTuple

from executor.errors import ResumeError, StateError
from executor.faces import report_csv, views
from executor.faces.inputs import COMPARE_THRESHOLD_PCT
from executor.run.state import StepRecord, open_state
from executor.runbook.model import DataModel
from executor.stepkind import StepView
from steps.benchmark_report import BenchmarkFacts, Report
from steps.benchmark_results import BenchPoint
from steps.benchmark_workloads import slice_key
from steps.campaign_report_cells import checked_facts
from steps.campaign_report_document import CampaignReport

#: The exit status of a comparison that found a regression (0: none; 2: bad input).
EXIT_REGRESSED = 1
CONFIDENCE = 0.95
#: Student's t, two-sided 95%, for 1 to 30 degrees of freedom (NIST/SEMATECH e-Handbook of Statistical Methods,
#: 1.3.6.7.2); past 30 the normal's 1.96. The stdlib has no t distribution and numpy/scipy are no dependency.
T95: tuple[float, ...] = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160)
T95 += (2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048)
T95 += (2.045, 2.042)
Z95 = statistics.NormalDist().inv_cdf(0.5 + CONFIDENCE / 2)
#: The widest span (largest / smallest) of one metric's repeats in both runs that is compared: a real change is
#: never a factor of a million, and a wider span (a tampered 1e-250) would put the change past a float's range.
SPAN_MAX = 1e6
#: The matched cells the figure draws (a row each, a panel per metric); more are in the table and the JSON.
FIGURE_MAX_CELLS = 60
METHOD = (
    "change: ratio of the geometric means of the repeats (B / A - 1); interval: Welch's t-interval (95%) of the "
    "difference of the means of the logs, degrees of freedom rounded down; no interval with fewer than 2 repeats "
    "on either side"
)


class Metric(NamedTuple):
    name: str  # the tidy row's column (report_csv.COLUMNS)
    point: str  # the BenchPoint's field holding its repeats
    label: str
    higher_is_better: bool


METRICS = (
    Metric("output_throughput", "output_throughput", "output tok/s", True),
    Metric("ttft_ms", "median_ttft_ms", "TTFT median ms", False),
    Metric("tpot_ms", "median_tpot_ms", "TPOT median ms", False),
    Metric("accept_length", "accept_length", "acceptance length", True),
)

#: A measured cell: (cell, workload, SPEED-Bench category, concurrency).
Key = tuple[str, str, str | None, int]


class MetricChange(DataModel):
    """One metric of a matched cell: A and B (geometric means of their repeats), the change and its interval."""

    metric: str
    better: Literal["higher", "lower"]
    a: float
    b: float
    repeats_a: int
    repeats_b: int
    change_pct: float  # (B / A - 1) x 100
    ci_low_pct: float | None  # the interval's ends, in percent; None: no noise estimate (`note` says why)
    ci_high_pct: float | None
    beyond_noise: bool  # the interval excludes 0
    worse: bool  # in the direction that is worse (throughput down, latency up), beyond noise or not
    regression: bool  # worse, beyond noise and by more than the threshold
    note: str | None


class CellChange(DataModel):
    """A cell measured in both runs at one workload and concurrency: each metric both measured."""

    cell: str
    workload: str
    category: str | None
    concurrency: int
    metrics: list[MetricChange]
    unknown: dict[str, str]  # a metric not compared -> why (one run lacks it)


class Unmatched(DataModel):
    cell: str
    workload: str
    category: str | None
    concurrency: int


class RunSide(DataModel):
    run: str  # the run folder's name (its id)
    run_dir: str
    kind: Literal["benchmark", "campaign"]
    only_here: list[Unmatched]  # measured cells the other run has not


class Comparison(DataModel):
    """`runbook compare --json`, the MCP `compare`: its JSON Schema is `runbook schema --compare`."""

    schema_version: Literal[1] = 1
    a: RunSide
    b: RunSide
    threshold_pct: float
    confidence: float
    method: str
    cells: list[CellChange]
    regressions: list[str]  # one line each: cell, workload, concurrency, metric, change and interval
    regressed: bool  # any regression: the exit status is 1
    figure: str | None  # the figure drawn, or None


class Measured(NamedTuple):
    """A run's measured cells: each metric's repeats (or the median alone, `why` says why) per cell."""

    kind: Literal["benchmark", "campaign"]
    values: dict[Key, dict[str, list[float]]]
    why: dict[Key, str]  # a cell whose repeats are unknown -> why (its medians stand alone)


# ---- reading -------------------------------------------------------------------------------------------


def measured(run_dir: Path) -> Measured:
    """The run's measured cells, read through `runbook report`'s reader (its size, shape and provenance checked,
    views.read_report) and the tidy rows; ResumeError (exit 2) for a run without such a report."""
    document, _ = views.read_report(run_dir)
    report = report_csv.report_of(document, run_dir)
    if isinstance(report, CampaignReport):
        kind: Literal["benchmark", "campaign"] = "campaign"
        repeats, why = campaign_repeats(report, run_dir)
    else:
        kind, (repeats, why) = "benchmark", (benchmark_repeats(report), {})
    values: dict[Key, dict[str, list[float]]] = {}
    for row in report_csv.tidy_rows(report, run_dir.name):
        if row.get("concurrency") is None:  # a failed or skipped cell: nothing measured
            continue
        key: Key = (row["cell"], row["workload"], row["workload_category"], row["concurrency"])
        if key in values:  # two sides of one label (a tampered report): which one B is compared with is unknowable
            raise ResumeError(f"{run_dir / views.REPORT_FILE}: two rows of {key[0]!r} at concurrency {key[3]}")
        medians = {m.name: [row[m.name]] for m in METRICS if row.get(m.name) is not None}
        disagree = _disagreeing(repeats.get(key, {}), medians, row.get("repeats"))
        values[key] = medians if disagree or key not in repeats else repeats[key]
        if disagree:
            why[key] = (
                f"the repeats of its {disagree} do not give the report's median and number of repeats (changed "
                "after the report)"
            )
        elif key not in repeats:
            why.setdefault(key, "the report holds no per-repeat values of it")
    return Measured(kind, values, why)


def _disagreeing(
    repeats: Mapping[str, list[float]], medians: Mapping[str, list[float]], count: int | None
) -> str | None:
    """The first metric whose repeats are not the report's (a state.db rewritten after the report, a tampered
    report): their median is not its median, or they are not as many as its repeats (none; or the same values
    many times over, which would narrow the interval on no new measurement); None when all agree."""
    return next(
        (
            name
            for name, [median] in medians.items()
            if name in repeats
            and not (
                repeats[name]
                and (count is None or len(repeats[name]) == count)
                and math.isclose(statistics.median(repeats[name]), median, rel_tol=1e-9)
            )
        ),
        None,
    )


def _point_repeats(cell: str, point: BenchPoint) -> tuple[Key, dict[str, list[float]]]:
    spreads = {m.name: getattr(point, m.point) for m in METRICS}
    values = {name: list(spread.values) for name, spread in spreads.items() if spread is not None}
    return (cell, point.workload, point.category, point.max_concurrency), values


def benchmark_repeats(report: Report) -> dict[Key, dict[str, list[float]]]:
    """A benchmark report's repeats: each side's points hold them."""
    sides = (report.data.baseline, report.data.candidate)
    return dict(_point_repeats(side.label, point) for side in sides for point in side.points)


def campaign_repeats(report: CampaignReport, run_dir: Path) -> tuple[dict[Key, dict[str, list[float]]], dict[Key, str]]:
    """A campaign's repeats: each passed cell's benchmark facts in the run's state.db (those of its workload);
    a cell whose facts are unusable (tampered) is said with why. StateError (exit 2) for a state.db that
    cannot be read: without it no change of a campaign could be told from noise."""
    try:
        with open_state(run_dir) as state:
            records = {(r.host, r.step): r for r in state.records()}
    except StateError as exc:
        raise ResumeError(f"{run_dir}: a campaign's per-repeat values are in its state.db: {exc.reason}") from None
    repeats: dict[Key, dict[str, list[float]]] = {}
    why: dict[Key, str] = {}
    for cell in report.campaign.cells:
        record = records.get((cell.host, cell.benchmark))
        facts, unusable = checked_facts(BenchmarkFacts, None if record is None else _view(record))
        for point in cell.points:
            key: Key = (cell.name, *_split(cell.workload), point.concurrency)
            found = [p for p in (facts.points if facts else []) if _at(p, cell.workload, point.concurrency)]
            if found:
                repeats[key] = _point_repeats(cell.name, found[0])[1]
            elif unusable:
                why[key] = f"its benchmark's facts in state.db are unusable: {unusable}"
            else:
                why[key] = f"state.db holds no repeats of {cell.benchmark} on {cell.host} at this point"
    return repeats, why


def _view(record: StepRecord) -> StepView:
    """A stored step record as a later step sees it (what `checked_facts` reads)."""
    return StepView(record.step, record.step, "benchmark", record.host, record.status, record.message, record.facts)


def _split(workload: str) -> tuple[str, str | None]:
    """A campaign cell's workload (`speed-bench/low_entropy`) as the tidy rows split it."""
    name, _, category = workload.partition("/")
    return name, category or None


def _at(point: BenchPoint, workload: str, concurrency: int) -> bool:
    return slice_key(point.workload, point.category) == workload and point.max_concurrency == concurrency


# ---- comparing -----------------------------------------------------------------------------------------


def log_interval(a: Sequence[float], b: Sequence[float]) -> tuple[float, float | None, float | None]:
    """The difference of the means of the logs of `b` and `a`, and its Welch t-interval (module docstring); no
    interval (None, None) with fewer than 2 values on either side. Every value is above 0."""
    la, lb = [math.log(v) for v in a], [math.log(v) for v in b]
    difference = statistics.fmean(lb) - statistics.fmean(la)
    if len(la) < 2 or len(lb) < 2:
        return difference, None, None
    va, vb = statistics.variance(la) / len(la), statistics.variance(lb) / len(lb)
    if va + vb == 0:  # every repeat alike on both sides: no noise at all
        return difference, difference, difference
    df = (va + vb) ** 2 / (va**2 / (len(la) - 1) + vb**2 / (len(lb) - 1))
    t = T95[int(df) - 1] if int(df) <= len(T95) else Z95
    spread = t * math.sqrt(va + vb)
    return difference, difference - spread, difference + spread


def _pct(log_ratio: float) -> float:
    return math.expm1(log_ratio) * 100


def metric_change(metric: Metric, a: Sequence[float], b: Sequence[float], threshold_pct: float) -> MetricChange:
    """A metric's change from `a`'s repeats to `b`'s (each above 0), its interval, and whether it regressed."""
    difference, low, high = log_interval(a, b)
    change = _pct(difference)
    beyond = low is not None and high is not None and (low > 0 or high < 0)
    worse = change < 0 if metric.higher_is_better else change > 0
    few = [f"{len(v)} repeat in {side}" for side, v in (("A", a), ("B", b)) if len(v) < 2]
    return MetricChange(
        metric=metric.name,
        better="higher" if metric.higher_is_better else "lower",
        a=math.exp(statistics.fmean(map(math.log, a))),
        b=math.exp(statistics.fmean(map(math.log, b))),
        repeats_a=len(a),
        repeats_b=len(b),
        change_pct=change,
        ci_low_pct=None if low is None else _pct(low),
        ci_high_pct=None if high is None else _pct(high),
        beyond_noise=beyond,
        worse=worse,
        regression=worse and beyond and abs(change) > threshold_pct,
        note=f"no noise estimate ({', '.join(few)})" if few else None,
    )


def cell_change(key: Key, first: Measured, second: Measured, threshold: float) -> CellChange:
    """Each metric both runs measured at `key` (every repeat above 0: a ratio needs it), the others said; a
    metric without a noise estimate says why its run has no repeats of it where the run says."""
    changes, unknown = [], {}
    why = first.why.get(key) or second.why.get(key)
    for metric in METRICS:
        a, b = first.values[key].get(metric.name), second.values[key].get(metric.name)
        if not a or not b:
            if a or b:
                unknown[metric.name] = f"only run {'A' if a else 'B'} measured it"
        elif min(*a, *b) <= 0:
            unknown[metric.name] = "a repeat measured 0: no ratio"
        elif max(*a, *b) > SPAN_MAX * min(*a, *b):
            unknown[metric.name] = f"its repeats span more than a factor of {SPAN_MAX:.0e}: no measurement to compare"
        else:
            change = metric_change(metric, a, b, threshold)
            change.note = f"{change.note}: {why}" if change.note and why else change.note
            changes.append(change)
    cell, workload, category, concurrency = key
    return CellChange(
        cell=cell, workload=workload, category=category, concurrency=concurrency, metrics=changes, unknown=unknown
    )


def _unmatched(keys: Iterable[Key]) -> list[Unmatched]:
    return [Unmatched(cell=k[0], workload=k[1], category=k[2], concurrency=k[3]) for k in keys]


def _regression_line(cell: CellChange, change: MetricChange) -> str:
    workload = slice_key(cell.workload, cell.category)
    return (
        f"{cell.cell} ({workload}, concurrency {cell.concurrency}): {change.metric} {change.change_pct:+.1f}% "
        f"(95% CI {change.ci_low_pct:+.1f}% to {change.ci_high_pct:+.1f}%)"
    )


def compare(run_a: Path, run_b: Path, threshold_pct: float = COMPARE_THRESHOLD_PCT) -> Comparison:
    """The comparison of two run folders (module docstring); ResumeError (exit 2) for a run without a benchmark's
    or campaign's report, and for two runs that measured no cell in common."""
    first, second = measured(run_a), measured(run_b)
    common = [key for key in first.values if key in second.values]
    if not common:
        raise ResumeError(
            f"{run_a} and {run_b} measured no cell in common (matched by cell, workload and concurrency): "
            f"A has {_names(first.values)}; B has {_names(second.values)}"
        )
    cells = [cell_change(key, first, second, threshold_pct) for key in common]
    regressions = [_regression_line(c, m) for c in cells for m in c.metrics if m.regression]
    return Comparison(
        a=_side(run_a, first, [k for k in first.values if k not in second.values]),
        b=_side(run_b, second, [k for k in second.values if k not in first.values]),
        threshold_pct=threshold_pct,
        confidence=CONFIDENCE,
        method=METHOD,
        cells=cells,
        regressions=regressions,
        regressed=bool(regressions),
        figure=None,
    )


def _side(run_dir: Path, run: Measured, only: Iterable[Key]) -> RunSide:
    return RunSide(run=run_dir.name, run_dir=str(run_dir), kind=run.kind, only_here=_unmatched(only))


def _names(values: Mapping[Key, Any], most: int = 5) -> str:
    cells = list(dict.fromkeys(key[0] for key in values))
    more = f" and {len(cells) - most} more" if len(cells) > most else ""
    return (", ".join(cells[:most]) or "no measured cell") + more


# ---- showing -------------------------------------------------------------------------------------------


def verdict(change: MetricChange) -> str:
    """A change in words: a regression, worse or better beyond noise, within noise, or no noise estimate."""
    if change.regression:
        return "REGRESSION"
    if change.ci_low_pct is None:
        return "no noise estimate"
    if not change.beyond_noise:
        return "within noise"
    return "worse, within threshold" if change.worse else "better"


def _number(value: float) -> str:
    """A metric's value for the table: tokens/s whole with thousands separated (`60,020`), a small one to 4 digits."""
    return f"{value:,.0f}" if value >= 1000 else f"{value:.4g}"


def comparison_rows(comparison: Comparison) -> list[list[str]]:
    """The table `runbook compare` prints: a row per matched cell and metric (one not compared says why)."""
    labels = {m.name: m.label for m in METRICS}
    rows = []
    for cell in comparison.cells:
        where = [cell.cell, slice_key(cell.workload, cell.category), str(cell.concurrency)]
        for m in cell.metrics:
            interval = "" if m.ci_low_pct is None else f"{m.ci_low_pct:+.1f}% to {m.ci_high_pct:+.1f}%"
            shown = [f"{_number(m.a)} (x{m.repeats_a})", f"{_number(m.b)} (x{m.repeats_b})", f"{m.change_pct:+.1f}%"]
            shown.append(interval)
            rows.append([*where, labels[m.metric], *shown, verdict(m)])
        rows += [[*where, labels[name], "", "", "", "", f"not compared: {why}"] for name, why in cell.unknown.items()]
    return rows


def compare_schema() -> dict[str, Any]:
    """The JSON Schema of `runbook compare --json` (`runbook schema --compare`)."""
    from executor.runbook.schema import _REF, DRAFT

    document = Comparison.model_json_schema(ref_template=_REF)
    return {"$schema": DRAFT, **document, "title": "runbook compare"}
