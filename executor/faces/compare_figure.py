"""The figure of `runbook compare` (executor/faces/compare.py): per matched cell, each metric's change in percent
with its 95% interval, regressions marked.

As steps/*_figures.py: matplotlib's object API imported inside the function (only a comparison that draws needs
it), a PNG without software metadata (steps/benchmark_report.py `save_figure`: every text drawn as written).
A panel per metric, a row per matched cell (its first FIGURE_MAX_CELLS: the title says how many more the table
and the JSON hold); a change without a noise estimate is a hollow marker without a bar.
"""

from __future__ import annotations

import os
from pathlib import Path

from executor.faces.compare import FIGURE_MAX_CELLS, METRICS, CellChange, Comparison
from steps.benchmark_report import save_figure
from steps.benchmark_workloads import slice_key

REGRESSION, OTHER = "tab:red", "tab:blue"


def _row_label(cell: CellChange) -> str:
    return f"{cell.cell} ({slice_key(cell.workload, cell.category)}) c={cell.concurrency}"


def draw(comparison: Comparison, path: Path) -> None:
    """Write the comparison's figure to `path` (a PNG); PermissionError (an OSError, exit 2 where it is caught)
    for a path inside either run's folder: its files are that run's record (`--figure RUN/report.json`, a slip
    of a person or an agent, would overwrite its report with a PNG)."""
    from matplotlib.figure import Figure as MplFigure

    where = Path(os.path.realpath(path))  # realpath: links and `..` followed, never an error (a link loop)
    if any(where.is_relative_to(os.path.realpath(side.run_dir)) for side in (comparison.a, comparison.b)):
        raise PermissionError(f"{path} is inside a compared run's folder: its files are the run's record")

    cells = comparison.cells[:FIGURE_MAX_CELLS]
    shown = [m for m in METRICS if any(c.metric == m.name for cell in cells for c in cell.metrics)]
    none = not shown  # every metric not compared (a run whose repeats measured 0): one empty panel, said so
    shown = shown or list(METRICS[:1])
    figure = MplFigure(figsize=(4 * len(shown) + 3, 1.5 + 0.3 * len(cells)), dpi=100, layout="constrained")
    panels = figure.subplots(1, len(shown), sharey=True, squeeze=False)[0]
    for axes, metric in zip(panels, shown, strict=True):
        for row, cell in enumerate(cells):
            change = next((c for c in cell.metrics if c.metric == metric.name), None)
            if change is None:
                continue
            colour = REGRESSION if change.regression else OTHER
            if change.ci_low_pct is None or change.ci_high_pct is None:
                axes.plot([change.change_pct], [row], marker="o", mfc="none", color=colour)
                continue
            bar = [[change.change_pct - change.ci_low_pct], [change.ci_high_pct - change.change_pct]]
            marker = "X" if change.regression else "o"
            axes.errorbar([change.change_pct], [row], xerr=bar, marker=marker, color=colour, capsize=3)
        axes.axvline(0, color="grey", linewidth=1)
        worse = -comparison.threshold_pct if metric.higher_is_better else comparison.threshold_pct
        axes.axvline(worse, color=REGRESSION, linestyle="--", linewidth=1)
        better = "higher" if metric.higher_is_better else "lower"
        axes.set(title=f"{metric.label} ({better} is better)", xlabel="change B vs A, % (95% CI)")
        axes.grid(True, axis="x", alpha=0.3)
    panels[0].set_yticks(range(len(cells)), labels=[_row_label(c) for c in cells])
    panels[0].invert_yaxis()
    more = len(comparison.cells) - len(cells)
    title = f"{comparison.b.run} vs {comparison.a.run}: {len(comparison.regressions)} regression(s) beyond "
    title += f"{comparison.threshold_pct:g}% and noise (red X; dashed: the threshold)"
    title += "; no metric compared (the table says why)" if none else ""
    figure.suptitle(title + (f"; {more} more cells in the table" if more > 0 else ""))
    save_figure(figure, path)
