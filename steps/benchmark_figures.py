"""The figures of a benchmark report (steps/benchmark_report.py), drawn from the same facts as its tables.

matplotlib's object API (no pyplot state, so a run draws nothing anywhere else), imported inside each
function: only writing a report needs it, and `runbook report` never does. Each figure is written as a
PNG with no software metadata, so the same facts give the same bytes.

`write_report` writes a report with its figures: here, above both the tables and the drawings, so that
steps/benchmark_report.py (the tables) never imports this module, which reads its models.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

from executor.redact import NO_SECRETS, Redactor
from steps.benchmark_report import (
    ACCEPTANCE_PNG,
    FIGURE_PNG,
    PARETO_PNG,
    REPORT_JSON,
    REPORT_MD,
    Acceptance,
    ParetoPoint,
    Report,
    ReportFiles,
    Side,
    Speedup,
    build_report,
    or_na,
    pareto_points,
    save_figure,
    write_document,
)
from steps.provenance import Provenance


def _throughputs(side: Side) -> tuple[list[int], list[float], list[list[float]]]:
    """Concurrencies, median output throughputs and their distances to min and max (error bars)."""
    known = sorted((p.max_concurrency, p.output_throughput) for p in side.points if p.output_throughput is not None)
    bars = [[s.median - s.min for _, s in known], [s.max - s.median for _, s in known]]
    return [c for c, _ in known], [s.median for _, s in known], bars


def speedup(baseline: Side, candidate: Side, gain: Speedup, path: Path | BinaryIO) -> None:
    """speedup.png: median throughput of both sides with min-max bars (left), the speedup of medians (right),
    against concurrency; with several workloads (or SPEED-Bench categories), a line for each."""
    from matplotlib.figure import Figure as MplFigure

    figure = MplFigure(figsize=(11, 4.5), dpi=100, layout="constrained")
    left, right = figure.subplots(1, 2)
    keys = candidate.slices()
    for side, marker in ((baseline, "o"), (candidate, "s")):
        for key in keys:
            cs, medians, bars = _throughputs(side.sliced(key))
            label = side.label if len(keys) == 1 else f"{side.label} {key}"
            left.errorbar(cs, medians, yerr=bars, marker=marker, capsize=3, label=label)
    left.set(title="Output throughput (median, min-max)", xlabel="concurrency", ylabel="tokens/s")
    for key, part in (gain.by_workload or {"": gain}).items():
        cs = sorted(int(k) for k, v in part.by_concurrency.items() if v is not None)
        shown: dict[str, Any] = {"color": "tab:green"} if len(gain.by_workload) <= 1 else {"label": key}
        right.plot(cs, [part.by_concurrency[str(c)] for c in cs], marker="s", **shown)
    if len(gain.by_workload) > 1:
        right.legend()
    right.axhline(1.0, color="grey", linestyle="--", linewidth=1)
    right.set(title=f"Speedup of medians ({candidate.label} / {baseline.label})", xlabel="concurrency", ylabel="x")
    ticks = sorted({point.max_concurrency for point in (*baseline.points, *candidate.points)})
    for axes in (left, right):
        axes.set_xscale("log", base=2)
        axes.set_xticks(ticks, labels=[str(c) for c in ticks])  # the concurrencies run, not powers of 2
        axes.minorticks_off()
        axes.grid(True, alpha=0.3)
    left.legend()
    save_figure(figure, path)


def pareto(baseline: Side, candidate: Side, gpus: dict[str, int | None], path: Path | BinaryIO) -> None:
    """pareto.png: a line per side through its concurrencies, each point labelled with its concurrency.

    Up and to the right is better: more tokens per GPU (cost) at more tokens per user (speed)."""
    from matplotlib.figure import Figure as MplFigure

    figure = MplFigure(figsize=(7.5, 5.5), dpi=100, layout="constrained")
    axes = figure.subplots()
    drawn: list[ParetoPoint] = []
    for side, marker in ((baseline, "o"), (candidate, "s")):
        points = pareto_points(side, gpus.get(side.label))
        if not points:
            continue
        drawn += points
        count = gpus[side.label]
        xs, ys = [p.tokens_per_s_per_user for p in points], [p.tokens_per_s_per_gpu for p in points]
        (line,) = axes.plot(xs, ys, marker=marker, label=f"{side.label} ({count} GPU{'s' if count != 1 else ''})")
        for p in points:
            axes.annotate(
                f"c={p.concurrency}",
                (p.tokens_per_s_per_user, p.tokens_per_s_per_gpu),
                textcoords="offset points",
                xytext=(6, 6),
                fontsize=9,
                color=line.get_color(),
            )
    if drawn:  # from 0, with room on the right and the top for the labels
        axes.set_xlim(0, max(p.tokens_per_s_per_user for p in drawn) * 1.15 or 1.0)  # all zero: still a scale
        axes.set_ylim(0, max(p.tokens_per_s_per_gpu for p in drawn) * 1.12 or 1.0)
        axes.legend(loc="upper right")  # a Pareto front runs from top left to bottom right
    else:
        axes.text(0.5, 0.5, "no point has both an output throughput and a TPOT", ha="center", transform=axes.transAxes)
    axes.set(
        title="Output tokens/s per GPU against tokens/s per user\n"
        "(one point per concurrency c; up and right is better)",
        xlabel="tokens/s per user (1000 / median TPOT ms)",
        ylabel="output tokens/s per GPU (median output throughput / GPUs)",
    )
    axes.grid(True, alpha=0.3)
    save_figure(figure, path)


def acceptance_histograms(acceptance: Acceptance, path: Path | BinaryIO) -> None:
    """acceptance.png: one histogram per prompt set (requests per acceptance-length bin), side by side,
    on the same x scale so that the sets compare at a glance."""
    from matplotlib.figure import Figure as MplFigure
    from matplotlib.ticker import MaxNLocator

    sets = list(acceptance.sets.items())
    figure = MplFigure(figsize=(max(4.0 * len(sets), 6.0), 4.0), dpi=100, layout="constrained")
    grid = figure.subplots(1, len(sets), sharex=True, squeeze=False)[0]
    # the widest set sets the scale: its last bin, or its largest value or mean where a set has no bins
    ends = [b.high for _, s in sets for b in s.histogram or []]
    ends += [value + 0.5 for _, s in sets for value in (s.max, s.mean) if value is not None]
    high = max(ends, default=2.0)
    low = min([1.0, *(b.low for _, s in sets for b in s.histogram or [])])  # bins start lower for a value below 1
    for axes, (name, s) in zip(grid, sets, strict=True):
        histogram = s.histogram or []
        axes.bar(
            [b.low for b in histogram],
            [b.count for b in histogram],
            width=[b.high - b.low for b in histogram],
            align="edge",
            edgecolor="white",
        )
        if s.mean is not None:
            axes.axvline(s.mean, color="tab:red", linestyle="--", linewidth=1, label=f"mean {s.mean:.2f} (per request)")
            axes.legend(loc="best")
        if histogram:
            axes.yaxis.set_major_locator(MaxNLocator(integer=True))  # requests are counted
        else:
            axes.text(0.5, 0.5, "no histogram in the eval's facts", ha="center", transform=axes.transAxes)
            axes.set_yticks([])
        axes.set(title=f"{name} ({or_na(s.requests)} requests)", xlabel="acceptance length (tokens per verify step)")
        axes.set_xlim(low, high)
        axes.grid(True, axis="y", alpha=0.3)
    grid[0].set_ylabel("requests")
    save_figure(figure, path)


def write_report(
    run_dir: Path,
    baseline: Side,
    candidate: Side,
    provenance: Provenance,
    acceptance: Acceptance | None = None,
    *,
    redactor: Redactor = NO_SECRETS,
) -> tuple[Report, ReportFiles]:
    """Write report.json, report.md and the figures it lists into `run_dir`, the run's secrets masked
    (`redactor`: the step's `ctx.redactor`)."""
    report = build_report(baseline, candidate, provenance, acceptance)
    paths = [figure.path for figure in report.figures]
    files = ReportFiles(
        json_file=str(run_dir / REPORT_JSON),
        markdown_file=str(run_dir / REPORT_MD),
        figure_file=str(run_dir / FIGURE_PNG),
        pareto_file=str(run_dir / PARETO_PNG),
        acceptance_file=str(run_dir / ACCEPTANCE_PNG) if ACCEPTANCE_PNG in paths else None,
    )
    gpus = {d.side: d.gpus for d in provenance.deployments}
    first = candidate.slices()[:1]  # pareto.png: the first workload's (the report's notes say so)
    base, cand = (baseline.sliced(first[0]), candidate.sliced(first[0])) if first else (baseline, candidate)
    drawings: dict[str, Callable[[BinaryIO], None]] = {
        FIGURE_PNG: lambda out: speedup(baseline, candidate, report.data.speedup, out),
        PARETO_PNG: lambda out: pareto(base, cand, gpus, out),
    }
    if acceptance is not None:
        drawings[ACCEPTANCE_PNG] = lambda out: acceptance_histograms(acceptance, out)
    write_document(run_dir, report, drawings, redactor)
    return report, files
