"""The comparison report of two benchmarks (a baseline and a candidate, e.g. DFlash), built from facts.

Everything here is a pure function of the facts of the steps, so a report can be rebuilt and
tested offline, and the same facts always give the same files:

- `report.json`: a generic document, `{"title", "notes", "tables": [{"title", "columns", "rows"}],
  "figures": [{"title", "path"}], "data": {...}}`. Cells are display strings, formatted here once,
  so `runbook report RUN_DIR` prints exactly the tables of report.md without knowing what they mean;
  `data` keeps the numbers;
- `report.md`: the same tables in Markdown;
- `speedup.png`: output throughput and speedup against concurrency (matplotlib, no pyplot state).

The speedup at a concurrency is the candidate's median output throughput over the baseline's (the
medians over each side's repeats). It is null where it cannot be computed (a throughput unknown or
zero at one side), with the reason, and so is `min` when any is: a gate `facts.speedup.min >= 1.0`
then fails instead of passing on fewer points. The tables show medians, with the throughput's
min-max and relative MAD, and mark a noisy point.
"""

from __future__ import annotations

import io
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

from pydantic import BaseModel, ConfigDict

from executor import durable
from steps.benchmark_results import BenchPoint, BenchRun, Spread

REPORT_JSON, REPORT_MD, FIGURE_PNG = "report.json", "report.md", "speedup.png"
NA = "n/a"


class Side(BaseModel):
    """One benchmark of the comparison: the step's id, its label, its runs and its points (one per concurrency)."""

    step: str
    label: str
    input_len: int
    output_len: int
    runs: list[BenchRun]
    points: list[BenchPoint]


class AcceptanceSet(BaseModel):
    """One prompt set of an `eval_acceptance` step's facts (`sets.<name>`); other keys are ignored."""

    model_config = ConfigDict(extra="ignore")

    requests: int | None = None
    mean: float | None = None
    median: float | None = None
    p10: float | None = None
    min: float | None = None
    max: float | None = None
    tokens_per_s: float | None = None


class Speedup(BaseModel):
    """Candidate median output throughput / baseline median output throughput, per concurrency (keys: "1",
    "4", ...): the medians over each side's repeats."""

    metric: str = "output_throughput"
    by_concurrency: dict[str, float | None]
    min: float | None
    max: float | None
    mean: float | None
    unknown: dict[str, str]  # a concurrency (or min/max/mean) -> why it is null


class Table(BaseModel):
    title: str
    columns: list[str]
    rows: list[list[str]]


class Figure(BaseModel):
    title: str
    path: str  # relative to the run folder


class Report(BaseModel):
    """The generic document of report.json."""

    title: str
    notes: list[str]
    tables: list[Table]
    figures: list[Figure]
    data: dict[str, Any]


class ReportFiles(BaseModel):
    json_file: str
    markdown_file: str
    figure_file: str


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    """numerator / denominator, or None when either is unknown or the denominator is not positive."""
    if numerator is None or denominator is None or denominator <= 0:
        return None
    value = numerator / denominator
    return value if math.isfinite(value) else None


def _by_concurrency(side: Side) -> dict[int, BenchPoint]:
    return {point.max_concurrency: point for point in side.points}


def common_concurrencies(baseline: Side, candidate: Side) -> list[int]:
    return sorted(set(_by_concurrency(baseline)) & set(_by_concurrency(candidate)))


def median(spread: Spread | None) -> float | None:
    return None if spread is None else spread.median


def speedup(baseline: Side, candidate: Side) -> Speedup:
    base, cand = _by_concurrency(baseline), _by_concurrency(candidate)
    values: dict[str, float | None] = {}
    unknown: dict[str, str] = {}
    for c in common_concurrencies(baseline, candidate):
        cand_tps, base_tps = median(cand[c].output_throughput), median(base[c].output_throughput)
        values[str(c)] = ratio(cand_tps, base_tps)
        if values[str(c)] is None:
            unknown[str(c)] = (
                f"median output throughput at concurrency {c}: {candidate.label} {cand_tps}, "
                f"{baseline.label} {base_tps}"
            )
    known = [v for v in values.values() if v is not None]
    if not values:
        ran = f"{baseline.label}: {sorted(base)}, {candidate.label}: {sorted(cand)}"
        why = f"no concurrency ran in both benchmarks ({ran})"
    elif len(known) < len(values):
        why = f"the speedup is unknown at concurrency {', '.join(k for k, v in values.items() if v is None)}"
    else:
        return Speedup(
            by_concurrency=values, min=min(known), max=max(known), mean=sum(known) / len(known), unknown=unknown
        )
    unknown |= dict.fromkeys(("min", "max", "mean"), why)
    return Speedup(by_concurrency=values, min=None, max=None, mean=None, unknown=unknown)


def _fmt(digits: int, suffix: str = "") -> Callable[[float | None], str]:
    def show(value: float | None) -> str:
        return NA if value is None else f"{value:,.{digits}f}{suffix}"

    return show


tok_s, ms, times, plain = _fmt(1), _fmt(1), _fmt(2, "x"), _fmt(2)
NOISY = " (noisy)"  # after a median whose relative MAD is above the step's spread_threshold


def range_of(spread: Spread | None) -> str:
    return NA if spread is None else f"{tok_s(spread.min)}-{tok_s(spread.max)}"


def rel_mad(spread: Spread | None) -> str:
    return NA if spread is None or spread.rel_mad is None else f"{spread.rel_mad:.1%}"


def throughput_cell(point: BenchPoint) -> str:
    return tok_s(median(point.output_throughput)) + (NOISY if point.noisy else "")


def acceptance_table(sets: dict[str, AcceptanceSet]) -> Table:
    columns = ["prompt set", "prompts", "mean", "median", "p10", "min", "max", "tokens/s"]
    rows = [
        [
            name,
            NA if s.requests is None else str(s.requests),
            *map(plain, (s.mean, s.median, s.p10, s.min, s.max)),
            tok_s(s.tokens_per_s),
        ]
        for name, s in sets.items()
    ]
    return Table(title="Acceptance length per prompt set", columns=columns, rows=rows)


def throughput_table(baseline: Side, candidate: Side, gain: Speedup) -> Table:
    base, cand = _by_concurrency(baseline), _by_concurrency(candidate)
    b, c = baseline.label, candidate.label
    columns = ["concurrency", f"{b} output tok/s", f"{c} output tok/s", "speedup"]
    columns += [f"{b} min-max", f"{b} rel MAD", f"{c} min-max", f"{c} rel MAD", f"{b} req/s", f"{c} req/s"]
    rows = [
        [
            str(k),
            throughput_cell(base[k]),
            throughput_cell(cand[k]),
            times(gain.by_concurrency[str(k)]),
            range_of(base[k].output_throughput),
            rel_mad(base[k].output_throughput),
            range_of(cand[k].output_throughput),
            rel_mad(cand[k].output_throughput),
            plain(median(base[k].request_throughput)),
            plain(median(cand[k].request_throughput)),
        ]
        for k in common_concurrencies(baseline, candidate)
    ]
    return Table(title="Output throughput per concurrency", columns=columns, rows=rows)


def latency_table(baseline: Side, candidate: Side) -> Table:
    base, cand = _by_concurrency(baseline), _by_concurrency(candidate)
    columns = ["concurrency", "deployment", "TTFT median", "TTFT p99", "TPOT median", "TPOT p99"]
    columns += ["ITL median", "E2E median", "accept length"]
    rows = []
    for k in common_concurrencies(baseline, candidate):
        for side, point in ((baseline, base[k]), (candidate, cand[k])):
            latencies = [point.median_ttft_ms, point.p99_ttft_ms, point.median_tpot_ms, point.p99_tpot_ms]
            latencies += [point.median_itl_ms, point.median_e2e_latency_ms]
            rows.append([str(k), side.label, *(ms(median(v)) for v in latencies), plain(median(point.accept_length))])
    return Table(title="Latency per concurrency (ms)", columns=columns, rows=rows)


def spread_notes(baseline: Side, candidate: Side) -> list[str]:
    """What the medians are of, and what "noisy" means."""
    notes = []
    for side in (baseline, candidate):
        counts = " or ".join(str(n) for n in sorted({point.repeats for point in side.points})) or "0"
        notes.append(f"{side.label}: each number is the median of {counts} clean run(s) per concurrency.")
    notes.append(
        f"rel MAD = median absolute deviation / median of the runs' output throughput;{NOISY} marks one above "
        "the benchmark step's spread_threshold."
    )
    for c in common_concurrencies(baseline, candidate):
        seeds = [[run.seed for run in side.runs if run.max_concurrency == c] for side in (baseline, candidate)]
        if seeds[0] != seeds[1]:
            notes.append(
                f"concurrency {c}: {baseline.label} ran seeds {seeds[0]}, {candidate.label} {seeds[1]}: "
                "not the same prompts (give both steps the same concurrencies, repeats and seed)."
            )
    return notes


def build_report(baseline: Side, candidate: Side, acceptance: dict[str, AcceptanceSet] | None = None) -> Report:
    """The report of `candidate` against `baseline` (and the acceptance sets, when given)."""
    gain = speedup(baseline, candidate)
    notes = [
        f"{candidate.label} (step {candidate.step}) against {baseline.label} (step {baseline.step}), "
        f"random-ids prompts of {candidate.input_len} input and {candidate.output_len} output tokens.",
        f"speedup = {candidate.label} median output throughput / {baseline.label} median output throughput at the "
        "same concurrency.",
        *spread_notes(baseline, candidate),
    ]
    for side, other in ((baseline, candidate), (candidate, baseline)):
        only = sorted(set(_by_concurrency(side)) - set(_by_concurrency(other)))
        if only:
            notes.append(f"concurrency {', '.join(map(str, only))} ran only for {side.label}: not compared.")
    tables = [acceptance_table(acceptance)] if acceptance else []
    tables += [throughput_table(baseline, candidate, gain), latency_table(baseline, candidate)]
    data = {
        "baseline": baseline.model_dump(mode="json"),
        "candidate": candidate.model_dump(mode="json"),
        "acceptance": {k: v.model_dump(mode="json") for k, v in (acceptance or {}).items()},
        "speedup": gain.model_dump(mode="json"),
    }
    return Report(
        title=f"Benchmark: {candidate.label} vs {baseline.label}",
        notes=notes,
        tables=tables,
        figures=[Figure(title="Output throughput and speedup against concurrency", path=FIGURE_PNG)],
        data=data,
    )


def _md_cell(text: str) -> str:
    """One cell on one line: line breaks become spaces, backslashes and pipes are escaped."""
    return " ".join(text.splitlines()).replace("\\", "\\\\").replace("|", "\\|")


def markdown(report: Report) -> str:
    lines = [f"# {report.title}", "", *(f"- {note}" for note in report.notes)]
    for table in report.tables:
        lines += ["", f"## {table.title}", "", "| " + " | ".join(map(_md_cell, table.columns)) + " |"]
        lines.append("|" + "|".join("---" for _ in table.columns) + "|")
        lines += ["| " + " | ".join(map(_md_cell, row)) + " |" for row in table.rows]
    for figure in report.figures:
        lines += ["", f"![{figure.title}]({figure.path})"]
    return "\n".join(lines) + "\n"


def _throughputs(side: Side) -> tuple[list[int], list[float], list[list[float]]]:
    """Concurrencies, median output throughputs and their distances to min and max (error bars)."""
    known = sorted((p.max_concurrency, p.output_throughput) for p in side.points if p.output_throughput is not None)
    bars = [[s.median - s.min for _, s in known], [s.max - s.median for _, s in known]]
    return [c for c, _ in known], [s.median for _, s in known], bars


def plot(baseline: Side, candidate: Side, gain: Speedup, path: Path | BinaryIO) -> None:
    """speedup.png: median throughput of both sides with min-max bars (left), the speedup of medians (right),
    against concurrency."""
    from matplotlib.figure import Figure as MplFigure  # imported here: only writing a report needs it

    figure = MplFigure(figsize=(11, 4.5), dpi=100, layout="constrained")
    left, right = figure.subplots(1, 2)
    for side, marker in ((baseline, "o"), (candidate, "s")):
        cs, medians, bars = _throughputs(side)
        left.errorbar(cs, medians, yerr=bars, marker=marker, capsize=3, label=side.label)
    left.set(title="Output throughput (median, min-max)", xlabel="concurrency", ylabel="tokens/s")
    cs = sorted(int(k) for k, v in gain.by_concurrency.items() if v is not None)
    right.plot(cs, [gain.by_concurrency[str(c)] for c in cs], marker="s", color="tab:green")
    right.axhline(1.0, color="grey", linestyle="--", linewidth=1)
    right.set(title=f"Speedup of medians ({candidate.label} / {baseline.label})", xlabel="concurrency", ylabel="x")
    ticks = sorted({point.max_concurrency for point in (*baseline.points, *candidate.points)})
    for axes in (left, right):
        axes.set_xscale("log", base=2)
        axes.set_xticks(ticks, labels=[str(c) for c in ticks])  # the concurrencies run, not powers of 2
        axes.minorticks_off()
        axes.grid(True, alpha=0.3)
    left.legend()
    figure.savefig(path, format="png", metadata={"Software": None})


def write_report(
    run_dir: Path, baseline: Side, candidate: Side, acceptance: dict[str, AcceptanceSet] | None = None
) -> tuple[Report, ReportFiles]:
    """Write report.json, report.md and speedup.png into `run_dir`."""
    report = build_report(baseline, candidate, acceptance)
    files = ReportFiles(
        json_file=str(run_dir / REPORT_JSON),
        markdown_file=str(run_dir / REPORT_MD),
        figure_file=str(run_dir / FIGURE_PNG),
    )
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise durable.failed(exc, run_dir, "the report") from None
    # each through durable.replace_file: a full or failing disk raises DurableWriteError, which stops the run
    # (never a failed step, never retried), and leaves no half-written report behind
    document = json.dumps(report.model_dump(mode="json"), indent=2) + "\n"
    durable.replace_file(Path(files.json_file), document.encode("utf-8"), REPORT_JSON, mode=0o644)
    durable.replace_file(Path(files.markdown_file), markdown(report).encode("utf-8"), REPORT_MD, mode=0o644)
    figure = io.BytesIO()
    plot(baseline, candidate, Speedup.model_validate(report.data["speedup"]), figure)
    durable.replace_file(Path(files.figure_file), figure.getvalue(), FIGURE_PNG, mode=0o644)
    return report, files
