"""The figures of a campaign report, drawn from its cells (steps/campaign_report_cells.py).

As steps/benchmark_figures.py: matplotlib's object API imported inside each function, PNGs without
software metadata (the same cells give the same bytes).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any, BinaryIO, NamedTuple

from steps.benchmark_report import ratio, save_figure
from steps.campaign_report_cells import CellReport, Comparison


def _figure(width: float, height: float) -> Any:
    from matplotlib.figure import Figure as MplFigure

    return MplFigure(figsize=(width, height), dpi=100, layout="constrained")


def _save(figure: Any, out: BinaryIO) -> None:
    save_figure(figure, out)


def _log2_concurrency(axes: Any, concurrencies: Sequence[int]) -> None:
    axes.set_xscale("log", base=2)
    ticks = sorted(set(concurrencies))
    axes.set_xticks(ticks, labels=[str(c) for c in ticks])
    axes.minorticks_off()


def throughput(cells: Sequence[CellReport], out: BinaryIO) -> None:
    """Median output throughput (min-max bars) against concurrency, a line per passed configuration."""
    figure = _figure(9, 5.5)
    axes = figure.subplots()
    drawn: list[int] = []
    for cell in cells:
        known = [p for p in cell.points if p.output_throughput is not None and cell.status == "passed"]
        if not known:
            continue
        cs = [p.concurrency for p in known]
        ys = [p.output_throughput[0] for p in known if p.output_throughput]
        bars = [
            [t[0] - t[1] for p in known if (t := p.output_throughput)],
            [t[2] - t[0] for p in known if (t := p.output_throughput)],
        ]
        style = "--" if cell.baseline else "-"
        axes.errorbar(cs, ys, yerr=bars, marker="o", linestyle=style, capsize=3, label=cell.name)
        drawn += cs
    if drawn:
        _log2_concurrency(axes, drawn)
        axes.legend(fontsize=7, loc="best")
    else:
        axes.text(0.5, 0.5, "no cell passed", ha="center", transform=axes.transAxes)
    axes.set(title="Output throughput (median, min-max)", xlabel="concurrency", ylabel="tokens/s")
    axes.grid(True, alpha=0.3)
    _save(figure, out)


class Point(NamedTuple):
    cell: str
    concurrency: int
    per_user: float  # 1000 / median TPOT ms
    per_gpu: float  # median output throughput / the server's GPUs


def points(cell: CellReport) -> list[Point]:
    """A cell's Pareto points: those with a throughput, a TPOT and a known GPU count."""
    gpus = cell.launch.gpus
    if not gpus or cell.status != "passed":
        return []
    return [
        Point(cell.name, p.concurrency, per_user, p.output_throughput[0] / gpus)
        for p in cell.points
        if p.output_throughput is not None
        and p.tpot_ms is not None
        and (per_user := ratio(1000.0, p.tpot_ms[0])) is not None  # none of 0 ms, nor an infinite one of 5e-324
    ]


def front(found: Sequence[Point]) -> list[Point]:
    """The points no other point beats on both axes, by tokens/s per user."""
    return sorted(
        (p for p in found if not any(q.per_user >= p.per_user and q.per_gpu >= p.per_gpu and q != p for q in found)),
        key=lambda p: p.per_user,
    )


def pareto(cells: Sequence[CellReport], comparisons: Sequence[Comparison], out: BinaryIO) -> None:
    """One panel per comparison: every configuration's points, the front as a line, the best points starred."""
    figure = _figure(max(7.5 * len(comparisons), 7.5), 5.5)
    panels = figure.subplots(1, max(len(comparisons), 1), squeeze=False)[0]
    by_name = {c.name: c for c in cells}
    for axes, comparison in zip(panels, comparisons, strict=False):
        found: list[Point] = []
        for name in comparison.cells:
            mine = points(by_name[name])
            if mine:
                axes.plot([p.per_user for p in mine], [p.per_gpu for p in mine], marker="o", linestyle="", label=name)
                found += mine
        line = front(found)
        if line:
            axes.plot([p.per_user for p in line], [p.per_gpu for p in line], color="grey", linewidth=1, label="front")
        best = [(b.best, b.concurrency) for b in comparison.best]
        starred = [p for p in found if (p.cell, p.concurrency) in best]
        axes.plot([p.per_user for p in starred], [p.per_gpu for p in starred], marker="*", markersize=14,
                  linestyle="", color="gold", markeredgecolor="black", label="best per concurrency")  # fmt: skip
        for p in starred:
            axes.annotate(f"c={p.concurrency}", (p.per_user, p.per_gpu), textcoords="offset points", xytext=(6, 6))
        axes.set(
            title=f"{comparison.gpus}, {comparison.input_len} in / {comparison.output_len} out",
            xlabel="tokens/s per user (1000 / median TPOT ms)",
            ylabel="output tokens/s per GPU",
        )
        if found:
            axes.legend(fontsize=7, loc="upper right")
        else:
            axes.text(
                0.5, 0.5, "no point has a throughput, a TPOT and a GPU count", ha="center", transform=axes.transAxes
            )
        axes.grid(True, alpha=0.3)
    if not comparisons:
        panels[0].text(0.5, 0.5, "no cell passed", ha="center", transform=panels[0].transAxes)
    _save(figure, out)


def acceptance(cells: Sequence[CellReport], out: BinaryIO) -> None:
    """Per prompt set, token-weighted acceptance length against draft tokens (DFLASH) or tree budget (DDTREE), a
    line per algorithm, drafter and thinking setting."""
    series: dict[str, dict[str, list[tuple[int, float]]]] = {}  # set -> series -> (size, acceptance)
    for cell in cells:
        size = cell.launch.draft_tokens or cell.launch.budget
        if size is None:
            continue
        drafter = os.path.basename((cell.launch.draft_model or "").rstrip("/")) or "?"
        for a in cell.acceptance:
            thinking = "" if a.thinking is None else f", thinking {'on' if a.thinking else 'off'}"
            label = f"{cell.launch.algorithm} {drafter}{thinking}"
            for name, s in a.sets.items():
                value = s.weighted_mean if s.weighted_mean is not None else s.mean
                if value is not None:
                    series.setdefault(name, {}).setdefault(label, []).append((size, value))
    figure = _figure(max(5.0 * len(series), 6.0), 4.5)
    panels = figure.subplots(1, max(len(series), 1), squeeze=False)[0]
    for axes, (name, lines) in zip(panels, sorted(series.items()), strict=False):
        for label, values in sorted(lines.items()):
            values.sort()
            axes.plot([v[0] for v in values], [v[1] for v in values], marker="o", label=label)
        axes.set(
            title=name,
            xlabel="draft tokens (DFLASH) / tree budget (DDTREE)",
            ylabel="acceptance length (token-weighted)",
        )
        axes.legend(fontsize=7, loc="best")
        axes.grid(True, alpha=0.3)
    if not series:
        panels[0].text(0.5, 0.5, "no eval of a speculative cell", ha="center", transform=panels[0].transAxes)
    _save(figure, out)
