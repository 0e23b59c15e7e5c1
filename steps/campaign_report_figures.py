"""The figures of a campaign report, drawn from its cells (steps/campaign_report_cells.py).

As steps/benchmark_figures.py: matplotlib's object API imported inside each function, PNGs without
software metadata (the same cells give the same bytes). Each figure is built by its `*_figure` function (what
the tests read, artist by artist) and written by the function of its name.

No two configurations of a figure share a colour and a marker (`styles`): each configuration (cell name) of
the report gets its own pair, by its place among the report's names sorted, so it looks the same in every
figure of the report whatever order the records came in.
"""

from __future__ import annotations

import colorsys
import os
from collections.abc import Sequence
from typing import Any, BinaryIO, NamedTuple

from steps.benchmark_report import ratio, save_figure
from steps.campaign_report_cells import Best, CellReport, Comparison

#: matplotlib's tab10, then the markers: 10 x 12 configurations each get a pair of these (the star marks the best)
COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<", ">", "h", "p", "8")


class Style(NamedTuple):
    colour: str
    marker: str


def styles(names: Sequence[str]) -> dict[str, Style]:
    """A (colour, marker) per name, no two alike: the i-th name sorted gets colour i mod 10 and marker i div 10;
    past 120 names each gets a hue of its own (HSV, evenly spread), as no palette of named colours is that long."""
    ordered = sorted(set(names))
    if len(ordered) <= len(COLOURS) * len(MARKERS):
        return {name: Style(COLOURS[i % len(COLOURS)], MARKERS[i // len(COLOURS)]) for i, name in enumerate(ordered)}
    return {name: Style(_hue(i / len(ordered)), MARKERS[i % len(MARKERS)]) for i, name in enumerate(ordered)}


def _hue(h: float) -> str:
    r, g, b = colorsys.hsv_to_rgb(h, 0.85, 0.8)
    return f"#{round(r * 255):02x}{round(g * 255):02x}{round(b * 255):02x}"


def _figure(width: float, height: float) -> Any:
    from matplotlib.figure import Figure as MplFigure

    return MplFigure(figsize=(width, height), dpi=100, layout="constrained")


def _save(figure: Any, out: BinaryIO) -> None:
    save_figure(figure, out)


#: The most legend entries a column holds beside a figure 5.5 inches tall (at font size 7), and the inches a
#: column of configuration names takes
LEGEND_ROWS, LEGEND_COLUMN_WIDTH = 28, 2.6


def _legend(axes: Any, loc: str) -> None:
    """The axes' legend at `loc` inside them while it fits; past LEGEND_ROWS entries beside them, in as many
    columns as it needs, the figure widened to hold them: inside, in one column, its top ran off the figure
    (the first configurations' entries cut, their colour and marker named nowhere) and it hid the lines."""
    count = len(axes.get_legend_handles_labels()[1])
    if count <= LEGEND_ROWS:
        axes.legend(fontsize=7, loc=loc)
        return
    columns = -(-count // LEGEND_ROWS)
    axes.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), ncols=columns)
    figure = axes.get_figure()
    figure.set_figwidth(figure.get_figwidth() + columns * LEGEND_COLUMN_WIDTH)


def _log2_concurrency(axes: Any, concurrencies: Sequence[int]) -> None:
    axes.set_xscale("log", base=2)
    ticks = sorted(set(concurrencies))
    axes.set_xticks(ticks, labels=[str(c) for c in ticks])
    axes.minorticks_off()


def throughput(cells: Sequence[CellReport], comparisons: Sequence[Comparison], out: BinaryIO) -> None:
    _save(throughput_figure(cells, comparisons), out)


def throughput_figure(cells: Sequence[CellReport], comparisons: Sequence[Comparison]) -> Any:
    """Median output throughput (min-max bars) against concurrency, a line per passed configuration, the best
    configuration per concurrency starred (an open star where the top configurations are tied: the cheapest)."""
    figure = _figure(9, 5.5)
    axes = figure.subplots()
    style = styles([c.name for c in cells])
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
        colour, marker = style[cell.name]
        line = "--" if cell.baseline else "-"
        axes.errorbar(cs, ys, yerr=bars, color=colour, marker=marker, linestyle=line, capsize=3, label=cell.name)
        drawn += cs
    if drawn:
        _best_marks(axes, cells, [b for c in comparisons for b in c.best])
        _log2_concurrency(axes, drawn)
        _legend(axes, "best")
    else:
        axes.text(0.5, 0.5, "no cell passed", ha="center", transform=axes.transAxes)
    axes.set(title="Output throughput (median, min-max)", xlabel="concurrency", ylabel="tokens/s")
    axes.grid(True, alpha=0.3)
    return figure


BEST_LABEL, TIED_LABEL = "best per concurrency", "tied at the top: the cheapest (recommended)"


def _best_marks(axes: Any, cells: Sequence[CellReport], best: Sequence[Best]) -> None:
    """A gold star on the best configuration's median at each concurrency; on a tie an open star on the one
    recommended, with `tie` written beside it."""
    by_name = {c.name: c for c in cells}
    for tied, label, face in ((False, BEST_LABEL, "gold"), (True, TIED_LABEL, "white")):
        marks = [
            (b.concurrency, y)
            for b in best
            if bool(b.tied) is tied and (y := by_name[b.best].throughput_at(b.concurrency))
        ]
        if not marks:
            continue
        xs, ys = [m[0] for m in marks], [m[1] for m in marks]
        axes.plot(
            xs, ys, marker="*", markersize=16, linestyle="", color=face, markeredgecolor="black", label=label, zorder=5
        )
        for x, y in marks if tied else ():
            axes.annotate("tie", (x, y), textcoords="offset points", xytext=(7, -12), fontsize=7)


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
    _save(pareto_figure(cells, comparisons), out)


def pareto_figure(cells: Sequence[CellReport], comparisons: Sequence[Comparison]) -> Any:
    """One panel per comparison: every configuration's points, the front as a line, the best points starred."""
    figure = _figure(max(7.5 * len(comparisons), 7.5), 5.5)
    panels = figure.subplots(1, max(len(comparisons), 1), squeeze=False)[0]
    by_name = {c.name: c for c in cells}
    style = styles([c.name for c in cells])
    for axes, comparison in zip(panels, comparisons, strict=False):
        found: list[Point] = []
        for name in comparison.cells:
            mine = points(by_name[name])
            if mine:
                colour, marker = style[name]
                xs, ys = [p.per_user for p in mine], [p.per_gpu for p in mine]
                axes.plot(xs, ys, color=colour, marker=marker, linestyle="", label=name)
                found += mine
        line = front(found)
        if line:
            axes.plot([p.per_user for p in line], [p.per_gpu for p in line], color="grey", linewidth=1, label="front")
        tied = {(b.best, b.concurrency): bool(b.tied) for b in comparison.best}
        starred = [p for p in found if (p.cell, p.concurrency) in tied]
        for tie, label, face in ((False, BEST_LABEL, "gold"), (True, TIED_LABEL, "white")):
            mine = [p for p in starred if tied[(p.cell, p.concurrency)] is tie]
            axes.plot([p.per_user for p in mine], [p.per_gpu for p in mine], marker="*", markersize=14,
                      linestyle="", color=face, markeredgecolor="black", label=label if mine else "_none")  # fmt: skip
        for p in starred:
            said = f"c={p.concurrency}" + (" tie" if tied[(p.cell, p.concurrency)] else "")
            axes.annotate(said, (p.per_user, p.per_gpu), textcoords="offset points", xytext=(6, 6))
        axes.set(
            title=f"{comparison.gpus}, {comparison.shown_workload}",
            xlabel="tokens/s per user (1000 / median TPOT ms)",
            ylabel="output tokens/s per GPU",
        )
        if found:
            _legend(axes, "upper right")
        else:
            axes.text(
                0.5, 0.5, "no point has a throughput, a TPOT and a GPU count", ha="center", transform=axes.transAxes
            )
        axes.grid(True, alpha=0.3)
    if not comparisons:
        panels[0].text(0.5, 0.5, "no cell passed", ha="center", transform=panels[0].transAxes)
    return figure


def acceptance(cells: Sequence[CellReport], out: BinaryIO) -> None:
    _save(acceptance_figure(cells), out)


def acceptance_figure(cells: Sequence[CellReport]) -> Any:
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
    style = styles([label for lines in series.values() for label in lines])
    for axes, (name, lines) in zip(panels, sorted(series.items()), strict=False):
        for label, values in sorted(lines.items()):
            values.sort()
            colour, marker = style[label]
            axes.plot([v[0] for v in values], [v[1] for v in values], color=colour, marker=marker, label=label)
        axes.set(
            title=name,
            xlabel="draft tokens (DFLASH) / tree budget (DDTREE)",
            ylabel="acceptance length (token-weighted)",
        )
        axes.legend(fontsize=7, loc="best")
        axes.grid(True, alpha=0.3)
    if not series:
        panels[0].text(0.5, 0.5, "no eval of a speculative cell", ha="center", transform=panels[0].transAxes)
    return figure
