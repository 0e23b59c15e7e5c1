"""The comparison report of two benchmarks (a baseline and a candidate, e.g. DFlash), built from facts.

Everything here is a pure function of the facts of the steps, so a report can be rebuilt and
tested offline, and the same facts always give the same files:

- `report.json`: `Report`, `{"schema_version", "title", "notes", "tables": [{"title", "columns", "rows"}],
  "figures": [{"title", "path"}], "data": {...}, "provenance": {...}}` (its JSON Schema: `runbook schema
  --report`). Cells are display strings, formatted here once, so `runbook report RUN_DIR` prints exactly the
  tables of report.md without knowing what they mean (executor/documents.py's `Shown`); `data` keeps the numbers;
- `report.md`: the same tables in Markdown;
- the figures (steps/benchmark_figures.py): `speedup.png` (output throughput and speedup against
  concurrency), `pareto.png` (output tokens/s per GPU against tokens/s per user, one point per
  concurrency, a line per side), `acceptance.png` (the acceptance-length histogram of each prompt set,
  when the eval's facts have one).

report.json's `provenance` (steps/provenance.py) says what the numbers are of: repos' commits, servers and
their launch commands, GPUs, bench_serving commands with seeds and times; report.md shows it as tables.
`runbook report` refuses a report.json without it.

The speedup at a concurrency is the candidate's median output throughput over the baseline's (the
medians over each side's repeats). It is null where it cannot be computed (a throughput unknown or
zero at one side), with the reason, and so is `min` when any is: a gate `facts.speedup.min >= 1.0`
then fails instead of passing on fewer points. The tables show medians, with the throughput's
min-max and relative MAD, and mark a noisy point.
"""

from __future__ import annotations

import io
import math
import re
import shlex
import statistics
from collections.abc import Callable, Mapping
from contextvars import ContextVar
from pathlib import Path
from typing import Any, BinaryIO, Literal

from pydantic import AliasChoices, ConfigDict, Field

from executor import durable, strict_json
from executor.documents import SCHEMA_VERSION, Figure, Shown, Table
from executor.redact import NO_SECRETS, Redactor
from executor.runbook.model import DataModel
from executor.terminal import shown
from steps.benchmark_results import BenchPoint, BenchRun, Measured, MeasuredCount, Spread
from steps.benchmark_workloads import DEFAULT, RANDOM_IDS, WorkloadFacts, slice_key
from steps.provenance import Provenance
from steps.server_metrics import TOLERANCE, RunAcceptance

REPORT_JSON, REPORT_MD, FIGURE_PNG = "report.json", "report.md", "speedup.png"
PARETO_PNG, ACCEPTANCE_PNG = "pareto.png", "acceptance.png"
NA = "n/a"


class Side(DataModel):
    """One benchmark of the comparison: the step's id, its label, its runs and its points (one per concurrency)."""

    step: str
    label: str
    input_len: int
    output_len: int
    # as they ran; the default is a benchmark's from before workloads: random ids
    workloads: list[WorkloadFacts] = Field(default_factory=lambda: [DEFAULT.resolved(False)])
    runs: list[BenchRun]
    points: list[BenchPoint]

    def slices(self) -> list[str]:
        """Its workloads' runs as the report splits them (`speed-bench/low_entropy`, `random-ids`), in run order."""
        return list(dict.fromkeys(slice_key(p.workload, p.category) for p in self.points))

    def sliced(self, key: str) -> Side:
        """This side with the runs and points of one slice only: what the per-concurrency tables compare."""
        return self.model_copy(
            update={
                "runs": [r for r in self.runs if slice_key(r.workload, r.category) == key],
                "points": [p for p in self.points if slice_key(p.workload, p.category) == key],
            }
        )

    def workload(self, key: str) -> WorkloadFacts | None:
        return next((w for w in self.workloads if w.label == key.partition("/")[0]), None)


class HistogramBin(DataModel):
    """Requests whose acceptance length is in [low, high)."""

    model_config = ConfigDict(extra="ignore")

    low: Measured  # bounded, as every number the report reads from stored facts (a tampered state.db's count of
    high: Measured  # 400 digits or a bin from -1e308 to 1e308 made drawing the histogram raise)
    count: MeasuredCount


class AcceptanceSet(DataModel):
    """One prompt set of an `eval_acceptance` step's facts (`sets.<name>`); other keys are ignored, and
    what an older eval's facts lack is None (shown n/a)."""

    model_config = ConfigDict(extra="ignore")

    requests: MeasuredCount | None = Field(default=None, validation_alias=AliasChoices("requests", "prompts"))
    mean: Measured | None = None  # per request, each weighing the same
    weighted_mean: Measured | None = None  # completion tokens / verify steps over the set
    median: Measured | None = None
    p10: Measured | None = None
    min: Measured | None = None
    max: Measured | None = None
    tokens_per_s: Measured | None = None
    histogram: list[HistogramBin] | None = None


class LosslessSet(DataModel):
    """The greedy outputs of one prompt set, the candidate's against the baseline's."""

    model_config = ConfigDict(extra="ignore")

    compared: MeasuredCount | None = None
    identical: MeasuredCount | None = None
    differing: MeasuredCount | None = None
    first_divergence: list[MeasuredCount] = []  # the token index where each differing output first differs
    max_differing_fraction: float | None = None  # the tolerance the gate allows
    set_prompts: MeasuredCount | None = None  # the set's prompts, where a campaign search's screen sent some


class Acceptance(DataModel):
    """The facts of an `eval_acceptance` step that the report shows (other keys are ignored)."""

    model_config = ConfigDict(extra="ignore")

    step: str
    sets: dict[str, AcceptanceSet]
    api: str | None = None  # "chat" | "generate"
    template: str | None = None  # what was applied to the prompts
    thinking: bool | None = None  # None for raw text
    lossless: dict[str, LosslessSet] | None = None
    speculation_on: bool | None = None  # every answered request had spec_verify_ct > 0
    requests_file: str | None = None  # its per-request records (JSONL), relative to the run folder
    acceptance: RunAcceptance | None = None  # exact (from /metrics) beside the estimates, for the whole eval


class SliceSpeedup(DataModel):
    """Candidate median output throughput / baseline median output throughput, per concurrency (keys: "1",
    "4", ...): the medians over each side's repeats, of one workload (and category)."""

    metric: str = "output_throughput"
    by_concurrency: dict[str, float | None]
    min: float | None
    max: float | None
    mean: float | None
    unknown: dict[str, str]  # a concurrency (or min/max/mean) -> why it is null


class Speedup(SliceSpeedup):
    """The speedups of every workload: `by_workload` per workload (`random-ids`) or SPEED-Bench category
    (`speed-bench/low_entropy`); `min`, `max`, `mean` over all of them and `by_concurrency` the worst workload's
    at each concurrency, so that a gate `facts.speedup.min >= 1.0` holds only where no workload loses. One
    workload: these are its own."""

    by_workload: dict[str, SliceSpeedup] = {}


class Document(DataModel):
    """What every report holds: its version, and what `runbook report` prints and report.md show, whatever the
    report is of (executor/documents.py's `Shown`, whose tables and figures these are)."""

    schema_version: Literal[1] = SCHEMA_VERSION
    title: str
    notes: list[str]
    tables: list[Table]
    figures: list[Figure]

    def shown(self) -> Shown:
        return Shown(title=self.title, notes=self.notes, tables=self.tables, figures=self.figures)


class ParetoPoint(DataModel):
    concurrency: int
    tokens_per_s_per_gpu: float  # median output throughput / the deployment's GPUs
    tokens_per_s_per_user: float  # 1000 / median TPOT (ms): the decode speed one user sees


class BenchmarkData(DataModel):
    """`data` of report.json: the numbers its tables show, unformatted."""

    baseline: Side
    candidate: Side
    acceptance: Acceptance | None
    speedup: Speedup
    pareto: dict[str, list[ParetoPoint]]  # a side's label -> its points of pareto.png


class Report(Document):
    """report.json of a `benchmark` step with a baseline: the comparison."""

    data: BenchmarkData
    provenance: Provenance


class ReportFiles(DataModel):
    json_file: str
    markdown_file: str
    figure_file: str  # speedup.png
    pareto_file: str
    acceptance_file: str | None  # None: the eval's facts have no histogram (or there is no eval)


class BenchmarkFacts(DataModel):
    """The facts of a `benchmark` step (steps/benchmark.py): its runs, their points and, with `compare_to`, the
    speedups and the report's files. Here, with the models it holds, so that the step's module (which
    `validate` imports) defines none of them."""

    label: str
    server: str  # the deploy step whose server was measured
    base_url: str
    input_len: int
    output_len: int
    workloads: list[WorkloadFacts] = []  # as they ran (none: from before workloads, random ids)
    concurrencies: list[int]  # as asked, in order
    repeats: int  # runs asked per concurrency
    spread_threshold: float  # relative MAD of output throughput above which a point is noisy (range: twice it)
    runs: list[BenchRun]  # those that completed, in order (every repeat)
    points: list[BenchPoint]  # one per concurrency that completed a run, in order
    failure: str | None  # why the benchmark did not complete, one line; None when every run did
    compare_to: str | None  # the baseline benchmark step
    speedup: Speedup | None  # None without compare_to (or when the benchmark failed)
    report: ReportFiles | None
    # the per-request records (steps/request_records.py), relative to the run folder; None: none were kept
    requests_file: str | None = None
    #: bands (`random-ids c=32`) a campaign search's screen measured once and left at that: no contender there
    screened: list[str] = []


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
    """The speedup of each workload both sides ran, and over all of them."""
    keys = [key for key in candidate.slices() if key in baseline.slices()]
    by_workload = {key: slice_speedup(baseline.sliced(key), candidate.sliced(key)) for key in keys}
    if len(by_workload) == 1:  # one workload: the speedups are its own, as they were before workloads
        return Speedup(**next(iter(by_workload.values())).model_dump(), by_workload=by_workload)
    cells = {f"{key} at {c}": v for key, gain in by_workload.items() for c, v in gain.by_concurrency.items()}
    worst: dict[str, float | None] = {}
    for gain in by_workload.values():
        for c, value in gain.by_concurrency.items():
            before = worst.get(c, value)
            worst[c] = None if value is None or before is None else min(value, before)
    known = [v for v in cells.values() if v is not None]
    unknown = {c: "; ".join(f"{k}: {g.unknown[c]}" for k, g in by_workload.items() if c in g.unknown) for c in worst}
    unknown = {c: why for c, why in unknown.items() if why}
    if not cells or len(known) < len(cells):
        why = "; ".join(f"{k}: {g.unknown['min']}" for k, g in by_workload.items() if g.min is None)
        why = why or f"no workload ran in both benchmarks ({baseline.slices()}, {candidate.slices()})"
        unknown |= dict.fromkeys(("min", "max", "mean"), why)
        return Speedup(by_concurrency=worst, min=None, max=None, mean=None, unknown=unknown, by_workload=by_workload)
    mean = sum(known) / len(known)
    return Speedup(
        by_concurrency=worst, min=min(known), max=max(known), mean=mean, unknown=unknown, by_workload=by_workload
    )


def slice_speedup(baseline: Side, candidate: Side) -> SliceSpeedup:
    """The speedups of two sides of one slice (one point per concurrency)."""
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
        return SliceSpeedup(
            by_concurrency=values, min=min(known), max=max(known), mean=sum(known) / len(known), unknown=unknown
        )
    unknown |= dict.fromkeys(("min", "max", "mean"), why)
    return SliceSpeedup(by_concurrency=values, min=None, max=None, mean=None, unknown=unknown)


def _fmt(digits: int, suffix: str = "") -> Callable[[float | None], str]:
    def show(value: float | None) -> str:
        return NA if value is None else f"{value:,.{digits}f}{suffix}"

    return show


tok_s, times, plain = _fmt(1), _fmt(2, "x"), _fmt(2)


def ms(value: float | None) -> str:
    """A latency in ms: one decimal, and below 1 ms two significant digits, so that a sub-millisecond TPOT (a
    small model, the demo's stand-in) does not read as 0.0 beside a speedup."""
    if value is not None and 0 < abs(value) < 1:
        return f"{value:#.2g}"
    return _fmt(1)(value)


NOISY = " (noisy)"  # after a median of a noisy point (BenchPoint.noisy)


def range_of(spread: Spread | None) -> str:
    return NA if spread is None else f"{tok_s(spread.min)}-{tok_s(spread.max)}"


def rel_mad(spread: Spread | None) -> str:
    return NA if spread is None or spread.rel_mad is None else f"{spread.rel_mad:.1%}"


def throughput_cell(point: BenchPoint) -> str:
    return tok_s(median(point.output_throughput)) + (NOISY if point.noisy else "")


def acceptance_table(acceptance: Acceptance) -> Table:
    columns = ["prompt set", "requests", "mean (per request)", "token-weighted mean", "median", "p10", "min", "max"]
    rows = [
        [
            name,
            NA if s.requests is None else str(s.requests),
            *map(plain, (s.mean, s.weighted_mean, s.median, s.p10, s.min, s.max)),
            tok_s(s.tokens_per_s),
        ]
        for name, s in acceptance.sets.items()
    ]
    return Table(title="Acceptance length per prompt set", columns=[*columns, "tokens/s"], rows=rows)


def acceptance_note(acceptance: Acceptance) -> str:
    """How the eval's prompts reached the model: what its acceptance lengths are comparable with."""
    return (
        f"acceptance length (step {acceptance.step}): api {acceptance.api or NA}, template "
        f"{acceptance.template or NA}, thinking {_on_off(acceptance.thinking)}; "
        "mean = per request (each weighs the same), token-weighted = completion tokens / verify steps, both from "
        "each request's meta_info, per prompt set: estimates; the exact length of the whole eval, from the "
        "server's counters, is the first row of the table of runs."
    )


#: Divergence indexes a cell lists before it says how many more there are.
DIVERGENCES_SHOWN = 10


def _divergences(indexes: list[int]) -> str:
    shown = ", ".join(map(str, indexes[:DIVERGENCES_SHOWN]))
    more = len(indexes) - DIVERGENCES_SHOWN
    return (shown + (f" (+{more} more)" if more > 0 else "")) or "-"


def lossless_table(lossless: dict[str, LosslessSet], baseline: str, candidate: str) -> Table:
    columns = ["prompt set", "compared", "identical", "differing", "first divergence (token index)", "tolerance"]
    rows = [
        [
            name,
            *(NA if n is None else str(n) for n in (s.compared, s.identical, s.differing)),
            _divergences(s.first_divergence),
            NA if s.max_differing_fraction is None else f"{s.max_differing_fraction:.1%} of outputs may differ",
        ]
        for name, s in lossless.items()
    ]
    return Table(title=f"Lossless check: greedy outputs of {candidate} against {baseline}", columns=columns, rows=rows)


def speculation_table(acceptance: Acceptance) -> Table:
    verdict = {True: "yes", False: "NO", None: NA}[acceptance.speculation_on]
    why = {
        True: "every answered request had spec_verify_ct > 0",
        False: "some answered request had no verify steps: the server did not speculate on it",
        None: "the eval's facts do not say",
    }[acceptance.speculation_on]
    return Table(
        title="Speculative decoding was on",
        columns=["eval step", "speculation on", "evidence"],
        rows=[[acceptance.step, verdict, why]],
    )


def or_na(value: object) -> str:
    return NA if value is None else str(value)


def _on_off(value: bool | None) -> str:
    return NA if value is None else ("on" if value else "off")


def provenance_tables(p: Provenance) -> list[Table]:
    """What the numbers are of, as tables; the commands (long) in a table of their own, the unknowns last."""
    tables = [_repos_table(p), _deployments_table(p)]
    groups = _node_groups_table(p)
    if groups.rows:  # only where a server ran across several nodes: a one-host report is as before
        tables.append(groups)
    tables += [_gpus_table(p), _runs_table(p), _commands_table(p)]
    if p.acceptance is not None:
        a = p.acceptance
        tables.append(
            Table(
                title="Provenance: acceptance eval",
                columns=["step", "api", "template", "thinking"],
                rows=[[a.step, or_na(a.api), or_na(a.template), _on_off(a.thinking)]],
            )
        )
    if p.unknown:
        tables.append(
            Table(title="Provenance: not known", columns=["what", "why"], rows=[[k, v] for k, v in p.unknown.items()])
        )
    return tables


def _repos_table(p: Provenance) -> Table:
    yes_no = {True: "yes", False: "no"}
    repos = [[r.repo, or_na(r.revision), or_na(r.commit), yes_no[r.verified], r.local_dir, r.step] for r in p.repos]
    return Table(
        title="Provenance: repos", columns=["repo", "revision", "commit", "verified", "local dir", "step"], rows=repos
    )


def _deployments_table(p: Provenance) -> Table:
    deployments = [
        [
            d.side,
            d.step,
            d.host,
            or_na(d.server_version),
            d.speculative_algorithm or "none (baseline)",
            or_na(d.gpus),
            or_na(d.model_path),
            d.draft_model_path or "-",
        ]
        for d in p.deployments
    ]
    return Table(
        title="Provenance: deployments",
        columns=["side", "step", "host", "SGLang", "algorithm", "GPUs", "model", "drafter"],
        rows=deployments,
    )


def _node_groups_table(p: Provenance) -> Table:
    """Each node of each deployment served by a node group (none: no rows)."""
    groups = [
        [
            d.side,
            d.step,
            str(n.rank),
            n.host,
            or_na(n.gpu_model),
            str(n.gpus),
            str(d.group.tp_size),
            d.group.dist_init_addr,
        ]
        for d in p.deployments
        if d.group is not None
        for n in d.group.nodes
    ]
    columns = ["side", "step", "rank", "node", "GPU model", "GPUs", "tp size", "dist-init address"]
    return Table(title="Provenance: node groups", columns=columns, rows=groups)


def _gpus_table(p: Provenance) -> Table:
    gpus = (
        []
        if p.gpus is None
        else [
            [
                or_na(p.gpus.model),
                str(p.gpus.count),
                or_na(p.gpus.driver_version),
                or_na(p.gpus.cuda_version),
                p.gpus.step,
            ]
        ]
    )
    return Table(title="Provenance: GPUs", columns=["model", "count", "driver", "CUDA", "step"], rows=gpus)


def _runs_table(p: Provenance) -> Table:
    runs = [
        [
            b.side,
            slice_key(r.workload or RANDOM_IDS, r.category),
            str(r.concurrency),
            or_na(r.repeat),
            or_na(r.seed),
            or_na(r.started_at),
            or_na(r.finished_at),
        ]
        for b in p.benchmarks
        for r in b.runs
    ]
    return Table(
        title="Provenance: benchmark runs",
        columns=["side", "workload", "concurrency", "repeat", "seed", "started (UTC)", "finished (UTC)"],
        rows=runs,
    )


def _commands_table(p: Provenance) -> Table:
    commands = [[d.side, "launch_server", NA if d.argv is None else shlex.join(d.argv)] for d in p.deployments]
    # one bench_serving command a side: its runs differ only in concurrency, prompt count and seed (the runs
    # table); report.json's provenance keeps every run's command
    commands += [
        [b.side, f"bench_serving (the first of {len(b.runs)} runs)", b.runs[0].command] for b in p.benchmarks if b.runs
    ]
    return Table(title="Provenance: commands", columns=["side", "what", "command"], rows=commands)


def throughput_table(baseline: Side, candidate: Side, gain: SliceSpeedup, of: str = "") -> Table:
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
    return Table(title=f"Output throughput per concurrency{of}", columns=columns, rows=rows)


def latency_table(baseline: Side, candidate: Side, of: str = "") -> Table:
    base, cand = _by_concurrency(baseline), _by_concurrency(candidate)
    columns = ["concurrency", "deployment", "TTFT median", "TTFT p99", "TPOT median", "TPOT p99"]
    columns += ["ITL median", "E2E median", "accept length (estimate)"]
    rows = []
    for k in common_concurrencies(baseline, candidate):
        for side, point in ((baseline, base[k]), (candidate, cand[k])):
            latencies = [point.median_ttft_ms, point.p99_ttft_ms, point.median_tpot_ms, point.p99_tpot_ms]
            latencies += [point.median_itl_ms, point.median_e2e_latency_ms]
            rows.append([str(k), side.label, *(ms(median(v)) for v in latencies), plain(median(point.accept_length))])
    return Table(title=f"Latency per concurrency (ms){of}", columns=columns, rows=rows)


def workload_table(baseline: Side, candidate: Side, gain: Speedup) -> Table:
    """Speedup and acceptance per workload and SPEED-Bench category, at each concurrency: a drafter can win on
    chat and lose on code, which one number over all of them hides. The row's key and what a configuration is
    chosen by come first, so that a terminal too narrow for the whole table shows them in its first part."""
    columns = ["workload", "category", "concurrency", "speedup"]
    columns += [f"{candidate.label} accept length, exact (counters)", f"{candidate.label} accept length, estimate"]
    columns += [f"{baseline.label} output tok/s", f"{candidate.label} output tok/s", "dataset", "chat template"]
    rows = []
    for key, part in gain.by_workload.items():
        sliced = candidate.sliced(key)
        base, cand = _by_concurrency(baseline.sliced(key)), _by_concurrency(sliced)
        workload, _, category = key.partition("/")
        facts = candidate.workload(key)
        prompts = [or_na(facts and facts.dataset), or_na(facts and facts.template_shown())]
        for c, value in part.by_concurrency.items():
            b, k = base[int(c)], cand[int(c)]
            lengths = [exact_median(sliced.runs, int(c)), plain(median(k.accept_length))]
            throughputs = [throughput_cell(b), throughput_cell(k)]
            rows.append([workload, category or "all", c, times(value), *lengths, *throughputs, *prompts])
    return Table(title="Speedup and acceptance per workload", columns=columns, rows=rows)


def exact_lengths(runs: list[BenchRun], concurrency: int) -> tuple[list[float], int]:
    """The exact acceptance lengths (from the server's counters) of the runs at `concurrency` that have one, and
    how many runs there were: the number to choose a drafter by, where the running average is an estimate."""
    runs = [run for run in runs if run.max_concurrency == concurrency]
    values = [run.acceptance.exact.value for run in runs if run.acceptance and run.acceptance.exact.value is not None]
    return values, len(runs)


def exact_median(runs: list[BenchRun], concurrency: int) -> str:
    """The median of `exact_lengths` over the repeats, saying how many runs had one when not all did."""
    values, count = exact_lengths(runs, concurrency)
    if not values:
        return NA
    shown = plain(statistics.median(values))
    return shown if len(values) == count else f"{shown} ({len(values)} of {count} runs)"


def workload_notes(candidate: Side) -> list[str]:
    """What each workload's prompts are (dataset, file, chat template), and which accept length is exact."""
    notes = []
    for w in candidate.workloads:
        source = (
            f"random token ids of {candidate.input_len} input tokens" if w.path is None else f"{w.dataset} {w.path}"
        )
        per = f", one run per category ({', '.join(w.categories)})" if w.categories else ""
        notes.append(
            f"workload {w.label}: {source}{per}, {candidate.output_len} output tokens, chat template "
            f"{w.template_shown()}."
        )
    notes.append(
        f"{candidate.label} accept length per workload: exact (counters) is the median over the repeats of each run's "
        "exact acceptance length (the table of runs below); estimate is the client's accept_length, the server's "
        "running average (/server_info) after the run, as in the latency tables."
    )
    return notes


def exact_rows(name: str, where: str, found: RunAcceptance | None) -> list[str]:
    """One row of the exact-acceptance table: the counters' values and deltas, the estimates, and the verdict."""
    if found is None:
        return [name, where, *[NA] * 8, "not recorded (facts from before /metrics was scraped)"]
    exact = found.exact
    verdict = "; ".join(found.disagreements) or (exact.unknown_reason or f"agree within {TOLERANCE:.0%}")
    counts = [NA if n is None else f"{n:,}" for n in (exact.generation_tokens, exact.verify_calls, exact.requests)]
    values = [plain(exact.value), plain(exact.decode_value), *counts]
    estimates = [plain(found.running_average), plain(found.weighted_mean), plain(found.per_request_mean)]
    return [name, where, *values, *estimates, ("DISAGREE: " if found.disagreements else "") + verdict]


def eval_name(step: str) -> str:
    """How the exact-acceptance table names the eval's row: its step id, marked as the eval unless the id says it
    (the flagship's `eval` was shown "eval eval")."""
    return step if "eval" in step.lower() else f"eval {step}"


def run_where(run: BenchRun) -> str:
    """How the exact-acceptance table names a run: `speed-bench/mixed, concurrency 4, repeat 2`."""
    return f"{slice_key(run.workload, run.category)}, concurrency {run.max_concurrency}, repeat {run.repeat}"


def exact_acceptance_table(sides: list[Side], acceptance: Acceptance | None) -> Table:
    """Per run (and for the eval), the exact acceptance length from the server's counters beside the estimates."""
    rows = [exact_rows(eval_name(acceptance.step), "all sets", acceptance.acceptance)] if acceptance else []
    for side in sides:
        if not never_verified(side):
            rows += [exact_rows(side.label, run_where(run), run.acceptance) for run in side.runs]
    columns = ["deployment", "run", "exact (counters)", "exact without first tokens", "Δ generation tokens"]
    columns += ["Δ verify calls", "Δ requests", "running average (/server_info)", "meta_info token-weighted"]
    columns += ["meta_info per-request mean"]
    return Table(title="Acceptance length per run: exact and estimates", columns=[*columns, "agreement"], rows=rows)


def never_verified(side: Side) -> bool:
    """Whether every run of the side counted no verify call (a baseline without speculative decoding): its rows
    would all say so, with n/a for every length, so the table leaves them out and a note says why."""
    return bool(side.runs) and all(r.acceptance and r.acceptance.exact.verify_calls == 0 for r in side.runs)


def exact_acceptance_notes(sides: list[Side], acceptance: Acceptance | None) -> list[str]:
    """Which acceptance length is exact and which are estimates, and every disagreement beyond the tolerance."""
    notes = [
        "exact acceptance length = Δsglang:generation_tokens_total / Δsglang:spec_verify_calls_total over the run "
        "(/metrics scraped before and after it, the client's warm-up outside); without first tokens = "
        "(Δgeneration tokens - Δsglang:num_requests_total) / Δverify calls, the running average's definition (a "
        "request's first token comes from prefill). The running average (/server_info: since the last flush, added "
        "to every decode-log interval, compared with the value without first tokens) and meta_info's "
        f"token-weighted mean are estimates, flagged where more than {TOLERANCE:.0%} off; the per-request mean "
        "weighs each request the same: another quantity, shown, never flagged. A benchmark run's meta_info columns "
        "are n/a: the serving client's per-request details (--output-details) carry no meta_info."
    ]
    notes += [
        f"{side.label}: none of its {len(side.runs)} runs made a verify call (sglang:spec_verify_calls_total did not "
        "grow: no speculative decoding), so it has no acceptance length and no rows in the table of runs."
        for side in sides
        if never_verified(side)
    ]
    found = [(eval_name(acceptance.step), acceptance.acceptance)] if acceptance else []
    found += [(f"{s.label} {run_where(r)}", r.acceptance) for s in sides for r in s.runs]
    notes += [f"acceptance DISAGREES at {name}: {said}" for name, run in found if run for said in run.disagreements]
    return notes


def spread_notes(baseline: Side, candidate: Side) -> list[str]:
    """What the medians are of, and what "noisy" means."""
    notes = []
    for side in (baseline, candidate):
        counts = " or ".join(str(n) for n in sorted({point.repeats for point in side.points})) or "0"
        notes.append(f"{side.label}: each number is the median of {counts} clean run(s) per concurrency.")
    notes.append(
        f"rel MAD = median absolute deviation / median of the runs' output throughput;{NOISY} marks one above "
        "the benchmark step's spread_threshold, or whose min-max range exceeds twice it."
    )
    keys = [key for key in candidate.slices() if key in baseline.slices()]
    for key in keys:
        base, cand = baseline.sliced(key), candidate.sliced(key)
        where = "" if len(keys) == 1 else f"{key}, "
        for c in common_concurrencies(base, cand):
            seeds = [[run.seed for run in side.runs if run.max_concurrency == c] for side in (base, cand)]
            if seeds[0] != seeds[1]:
                notes.append(
                    f"{where}concurrency {c}: {baseline.label} ran seeds {seeds[0]}, {candidate.label} {seeds[1]}: "
                    "not the same prompts (give both steps the same concurrencies, repeats and seed)."
                )
    return notes


def build_report(
    baseline: Side, candidate: Side, provenance: Provenance, acceptance: Acceptance | None = None
) -> Report:
    """The report of `candidate` against `baseline` (and the acceptance eval, when given), with its provenance."""
    gain = speedup(baseline, candidate)
    legacy = [w.label for w in candidate.workloads] == [DEFAULT.label]
    notes = [
        f"{candidate.label} (step {candidate.step}) against {baseline.label} (step {baseline.step}), "
        + (
            f"random-ids prompts of {candidate.input_len} input and {candidate.output_len} output tokens."
            if legacy
            else f"{len(candidate.workloads)} workload(s), each compared on its own:"
        ),
        *([] if legacy else workload_notes(candidate)),
        f"speedup = {candidate.label} median output throughput / {baseline.label} median output throughput at the "
        "same concurrency.",
        *spread_notes(baseline, candidate),
        f"generated at {provenance.generated_at}; what the numbers are of is in the provenance tables"
        + (f", and {len(provenance.unknown)} thing(s) it does not know." if provenance.unknown else "."),
    ]
    keys = list(gain.by_workload)
    for side, other in ((baseline, candidate), (candidate, baseline)):
        only = {
            c for key in keys for c in set(_by_concurrency(side.sliced(key))) - set(_by_concurrency(other.sliced(key)))
        }
        if only:
            notes.append(f"concurrency {', '.join(map(str, sorted(only)))} ran only for {side.label}: not compared.")
    tables = []
    if acceptance:
        notes.append(acceptance_note(acceptance))
        if legacy and any(point.accept_length is not None for point in candidate.points):
            notes.append(
                f"the latency table's accept length is of {candidate.label}'s benchmark prompts (random token ids, "
                "no chat template), which a drafter guesses worse than text: the acceptance table's numbers are "
                "those of real prompts."
            )
        tables.append(acceptance_table(acceptance))
        if acceptance.lossless is not None:
            tables.append(lossless_table(acceptance.lossless, baseline.label, candidate.label))
        tables.append(speculation_table(acceptance))
    if not legacy:
        tables.append(workload_table(baseline, candidate, gain))
    for key, part in (gain.by_workload or {"": gain}).items():  # none in common: the empty tables say so
        of = "" if legacy or not key else f": {key}"
        base, cand = (baseline.sliced(key), candidate.sliced(key)) if key else (baseline, candidate)
        tables += [throughput_table(base, cand, part, of), latency_table(base, cand, of)]
    tables.append(exact_acceptance_table([baseline, candidate], acceptance))
    notes += exact_acceptance_notes([baseline, candidate], acceptance)
    tables += provenance_tables(provenance)
    gpus = {d.side: d.gpus for d in provenance.deployments}
    first = keys[:1]
    if first and not legacy:
        notes.append(f"pareto.png is of the first workload, {first[0]}; the tables have every workload.")
    pareto_sides = (baseline.sliced(first[0]), candidate.sliced(first[0])) if first else (baseline, candidate)
    notes += pareto_notes(*pareto_sides, gpus)
    figures = [
        Figure(title="Output throughput and speedup against concurrency", path=FIGURE_PNG),
        Figure(title="Output tokens/s per GPU against tokens/s per user (Pareto view)", path=PARETO_PNG),
    ]
    if acceptance and any(s.histogram for s in acceptance.sets.values()):
        figures.append(Figure(title="Acceptance length histogram per prompt set", path=ACCEPTANCE_PNG))
    elif acceptance:
        notes.append(f"no acceptance histogram: the facts of {acceptance.step} have none.")
    data = BenchmarkData(
        baseline=baseline,
        candidate=candidate,
        acceptance=acceptance,
        speedup=gain,
        pareto={side.label: pareto_points(side, gpus.get(side.label)) for side in pareto_sides},
    )
    return Report(
        title=f"Benchmark: {candidate.label} vs {baseline.label}",
        notes=notes,
        tables=tables,
        figures=figures,
        data=data,
        provenance=provenance,
    )


def medians(side: Side, metric: str) -> dict[int, float]:
    """The median of a metric per concurrency, over the side's repeats (its points); a concurrency
    without a value is left out."""
    return {p.max_concurrency: spread.median for p in side.points if (spread := getattr(p, metric)) is not None}


def pareto_points(side: Side, gpus: int | None) -> list[ParetoPoint]:
    """One point per concurrency with both a throughput and a TPOT; none without a GPU count."""
    throughput, tpot = medians(side, "output_throughput"), medians(side, "median_tpot_ms")
    if not gpus:
        return []
    per_user = {c: speed for c, ms in tpot.items() if (speed := ratio(1000.0, ms)) is not None}  # 5e-324 ms: inf
    return [
        ParetoPoint(concurrency=c, tokens_per_s_per_gpu=throughput[c] / gpus, tokens_per_s_per_user=per_user[c])
        for c in sorted(throughput)
        if c in per_user
    ]


def pareto_notes(baseline: Side, candidate: Side, gpus: dict[str, int | None]) -> list[str]:
    """How pareto.png is computed, and what it leaves out."""
    notes = [
        "pareto.png: output tokens/s per GPU (median output throughput / the deployment's GPUs) against tokens/s "
        "per user (1000 / median TPOT ms, the decode speed a user sees once the first token came); "
        "vLLM's plot_pareto divides the throughput by the concurrency instead, which counts the wait for the "
        "first token too."
    ]
    for side in (baseline, candidate):
        shown = {p.concurrency for p in pareto_points(side, gpus.get(side.label))}
        left = [c for c in sorted({r.max_concurrency for r in side.runs}) if c not in shown]
        if not gpus.get(side.label):
            notes.append(f"pareto.png has no {side.label} line: the GPU count of its deployment is not known.")
        elif left:
            notes.append(
                f"pareto.png leaves out {side.label} at concurrency {', '.join(map(str, left))}: "
                "no output throughput or TPOT there."
            )
    return notes


def _md_line(text: str) -> str:
    """Text on one line, as a terminal may show it: line breaks become spaces, control and format characters
    are escaped (executor.terminal.shown). Report text holds the host's words (/server_info's version,
    nvidia-smi's names, an expanded argv), and `cat report.md` must not let them drive the terminal."""
    return shown(" ".join(text.splitlines()), keep="")


#: What Markdown (CommonMark; GitHub's tables, strikethrough, autolinks, math and emoji shortcodes) could read in
#: text as a tag, a link, an image, emphasis, code, math or a cell's end; each is written with a backslash, which
#: shows it as itself.
_MD_ACTIVE = re.compile(r"[\\`*_~\[\]<&|@#$]|:(?=//|[+-]1:|[0-9]*[A-Za-z_][\w+-]*:)|(?<=www)\.", re.IGNORECASE)
#: What opens a block at the start of a line (a note is one: `- TEXT`): a quote, a list item, a rule (two
#: dashes are one after a note's own `- `).
_MD_BLOCK = re.compile(r"^(?:>|[+-](?=\s|$)|-(?=(?:\s*-)+\s*$)|\d{1,9}[.)](?=\s|$))")


def md_text(text: str) -> str:
    """`text` inert in report.md, on one line (`_md_line`, stripped): no tag, link, image, emphasis, code or block
    comes from it, and no `|` ends a cell. Report text holds the host's words (failure reasons, stderr lines,
    model names, versions, paths, argv): a reader's Markdown viewer must show them, not follow or run them."""
    inline = _MD_ACTIVE.sub(lambda m: "\\" + m.group(), _md_line(text).strip())
    return _MD_BLOCK.sub(lambda m: m.group()[:-1] + "\\" + m.group()[-1], inline)


def markdown(report: Document | Shown) -> str:
    """report.md: a report's title, notes, tables and figures (what `runbook report` prints), inert Markdown."""
    lines = [f"# {md_text(report.title)}", "", *(f"- {md_text(note)}" for note in report.notes)]
    for table in report.tables:
        lines += ["", f"## {md_text(table.title)}", "", "| " + " | ".join(map(md_text, table.columns)) + " |"]
        lines.append("|" + "|".join("---" for _ in table.columns) + "|")
        lines += ["| " + " | ".join(map(md_text, row)) + " |" for row in table.rows]
    for figure in report.figures:
        lines += ["", f"![{md_text(figure.title)}]({figure.path})"]
    return "\n".join(lines) + "\n"


#: The redactor of the report `write_document` is drawing the figures of: `save_figure` masks their texts.
_FIGURE_REDACTOR: ContextVar[Redactor] = ContextVar("figure_redactor", default=NO_SECRETS)


def write_document(
    run_dir: Path, report: Document, drawings: Mapping[str, Callable[[BinaryIO], None]], redactor: Redactor
) -> None:
    """Write report.json, report.md and each figure the report lists (drawn by `drawings[path]`) into `run_dir`.

    A report is built from facts (stored redacted) but also from what the runbook wrote (a benchmark's
    `label`, a campaign's `title`, cell values, host names): every text of the document and of each figure
    is masked with `redactor` here, where the report leaves for the run folder, as the engine masks what
    it stores."""
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise durable.failed(exc, run_dir, "the report") from None
    # each through durable.replace_file: a full or failing disk raises DurableWriteError, which stops the run
    # (never a failed step, never retried), and leaves no half-written report behind
    masked = type(report).model_validate(redactor.deep(report.model_dump()))
    document = strict_json.dumps(masked.model_dump(mode="json"), indent=2) + "\n"
    durable.replace_file(run_dir / REPORT_JSON, document.encode("utf-8"), REPORT_JSON, mode=0o644)
    durable.replace_file(run_dir / REPORT_MD, markdown(masked).encode("utf-8"), REPORT_MD, mode=0o644)
    for figure_of in report.figures:
        figure = io.BytesIO()
        masking = _FIGURE_REDACTOR.set(redactor)
        try:
            drawings[figure_of.path](figure)
        finally:
            _FIGURE_REDACTOR.reset(masking)
        durable.replace_file(run_dir / figure_of.path, figure.getvalue(), figure_of.path, mode=0o644)


def save_figure(figure: Any, out: Path | BinaryIO) -> None:
    """A matplotlib figure as PNG without software metadata (the same facts give the same bytes), each of its
    texts (title, axis and tick labels, legend, annotations) masked first with the redactor of the report
    being written (`write_document`): a label pasted from a secret is never drawn. Each is drawn as written,
    never read as TeX: a `$...$` in a host's or a runbook's words (a prompt set's name, a label, a model path)
    would be mathtext, which fails the drawing (`$x^$`, a ParseFatalException) or recurses past Python's limit."""
    from matplotlib.text import Text

    redactor = _FIGURE_REDACTOR.get()
    for text in figure.findobj(Text):
        text.set_text(redactor.text(text.get_text()))
        text.set_parse_math(False)
    figure.savefig(out, format="png", metadata={"Software": None})
