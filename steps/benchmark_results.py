"""What one run of SGLang's serving benchmark measured, read from the JSONL line it appends.

`python -m sglang.benchmark.serving --output-file F` (or the deprecated `sglang.bench_serving`, the same writer in
0.5.23) appends one JSON object per run to F, with the field names of sglang 0.5.23 (benchmark/serving.py, `result`;
tests/release/ checks them against the pinned release). The benchmark step prints that
file after a marker line, and this module turns the line into a typed `BenchRun`.

The benchmark writes its line even when every request failed (with `completed: 0`), so a line is
no proof of success: `BenchRun.shortfall` says when fewer requests completed than were asked.
A metric the line lacks (another release) or reports as no usable number (NaN, infinite, negative, at or
above MEASURED_MAX, a string) is null with its reason in `unknown`, never a number that looks measured.

A concurrency is run `repeats` times; `points` sums its runs up as a `BenchPoint`: per metric the
`Spread` of the repeats (median, min, max, relative median absolute deviation and relative range),
and `noisy` when the output throughput's relative MAD exceeds the step's threshold, or its relative
range twice that: the MAD shows a point whose runs all scatter, but with three repeats it ignores one
bad run (1000, 1000, 500 has a MAD of 0), which the range shows. A metric unknown in any repeat
has no spread (with the reason), rather than a median of fewer runs that looks like all of them.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Annotated, Any

from pydantic import Field

from executor.files import json_data
from executor.runbook.model import DataModel
from steps.benchmark_slo import attainment
from steps.benchmark_workloads import RANDOM_IDS, slice_key
from steps.server_metrics import RunAcceptance

#: Printed by the step's script before the JSONL file's content; what follows it is the file.
JSONL_MARKER = "==> runbook: the JSONL of sglang.bench_serving follows <=="

#: Latency metrics the facts keep (ms), as bench_serving names them: mean, median and p99 of each.
LATENCIES = ("ttft", "tpot", "itl", "e2e_latency")
STATS = ("mean", "median", "p99")
LATENCY_FIELDS = tuple(f"{stat}_{metric}_ms" for metric in LATENCIES for stat in STATS)
#: Every float metric of the line the facts keep.
FLOAT_FIELDS = (
    "duration",
    "request_throughput",
    "input_throughput",
    "output_throughput",
    "total_throughput",
    "max_output_tokens_per_s",
    "concurrency",
    *LATENCY_FIELDS,
)
INT_FIELDS = ("total_input_tokens", "total_output_tokens")
#: No count, rate or time a benchmark measures reaches this (10^12 tokens/s, ms or tokens): a value at or above
#: it (1e308, an integer of 400 digits) is unusable, as a negative one is, rather than a median that overflows.
MEASURED_MAX = 1e12
#: A metric as the facts hold it: finite, not negative, below MEASURED_MAX (a state.db holding another is refused).
Measured = Annotated[float, Field(ge=0, lt=MEASURED_MAX, allow_inf_nan=False)]
#: A count as the facts hold it (requests, tokens, a histogram bin's): an integer from 0, below MEASURED_MAX.
MeasuredCount = Annotated[int, Field(ge=0, lt=MEASURED_MAX)]
NO_ACCEPT_LENGTH = (
    "the server reported no speculative acceptance length (/server_info has no avg_spec_accept_length): "
    "no speculative decoding"
)


class RunInfo(DataModel):
    """What one run was asked and when it ran, as the controller saw it (provenance of its numbers)."""

    # the label of its workload (steps/benchmark_workloads.py) and SPEED-Bench category (None: the whole
    # workload); the defaults are a run's from before workloads: random ids
    workload: str = RANDOM_IDS
    category: str | None = None
    max_concurrency: int
    num_prompts: int
    repeat: int  # 1-based, within its concurrency
    seed: int  # bench_serving's --seed: it alone decides the prompts
    #: the module that ran (steps/bench_entry.py): sglang.benchmark.serving or the deprecated sglang.bench_serving;
    #: None where the host chose none (no SGLang, or neither module) or the run was recorded before runbook chose
    entry_point: str | None = None
    started_at: str  # ISO-8601 UTC: the command's start
    finished_at: str  # and its end
    command: str  # the bench_serving command line as rendered (it holds no secret)
    #: the SLOs it measured goodput against (`--goodput`, the client's keys -> ms: steps/benchmark_slo.py); None: none
    slo_ms: dict[str, float] | None = None


class BenchRun(RunInfo):
    """One run's result. `max_concurrency` and `num_prompts` are what was asked; `concurrency` is what
    bench_serving measured (mean requests in flight)."""

    completed: int
    duration: Measured | None
    total_input_tokens: MeasuredCount | None
    total_output_tokens: MeasuredCount | None
    request_throughput: Measured | None  # requests/s
    input_throughput: Measured | None  # tokens/s
    output_throughput: Measured | None  # tokens/s
    total_throughput: Measured | None  # tokens/s
    max_output_tokens_per_s: Measured | None
    concurrency: Measured | None
    mean_ttft_ms: Measured | None
    median_ttft_ms: Measured | None
    p99_ttft_ms: Measured | None
    mean_tpot_ms: Measured | None
    median_tpot_ms: Measured | None
    p99_tpot_ms: Measured | None
    mean_itl_ms: Measured | None
    median_itl_ms: Measured | None
    p99_itl_ms: Measured | None
    mean_e2e_latency_ms: Measured | None
    median_e2e_latency_ms: Measured | None
    p99_e2e_latency_ms: Measured | None
    # the server's average acceptance length since the flush just before this run: this run's own
    # (null without speculative decoding)
    accept_length: Measured | None
    unknown: dict[str, str]  # field -> why it is null
    #: the exact acceptance length from /metrics around the run, beside accept_length (steps/server_metrics.py)
    acceptance: RunAcceptance | None = None
    # with `slo_ms` (else None): the client's goodput, requests/s that met every SLO, and the share of the requests
    # sent that did (a failed one counts against it), overall and per SLO (steps/benchmark_slo.py)
    request_goodput: Measured | None = None
    slo_attainment: Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)] | None = None
    slo_attainment_by_metric: dict[str, Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)]] = {}

    @property
    def shortfall(self) -> str | None:
        """Why this run does not count, or None when every request completed."""
        if self.completed >= self.num_prompts:
            return None
        return f"only {self.completed} of {self.num_prompts} requests completed"


def unusable(value: Any) -> str | None:
    """Why a number a host reported cannot be a measurement (not a number, NaN, infinite, negative, at or above
    MEASURED_MAX), or None when it can. Compared, never converted: float() of a 400-digit integer overflows."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return "not a number"
    if isinstance(value, float) and not math.isfinite(value):
        return "not a finite number"
    if value < 0:
        return "negative"
    if value >= MEASURED_MAX:
        return f"not below {MEASURED_MAX:.0e}"
    return None


def _shown(value: Any) -> str:
    """A host's value in a message, cut short (an integer of 400 digits, a long string)."""
    if isinstance(value, int) and abs(value) >= 10**30:  # str() of one of 5000 digits raises
        return f"an integer of {int(value.bit_length() * math.log10(2)) + 1} digits"
    text = repr(value)
    return text if len(text) <= 40 else text[:40] + "..."


def _number(line: dict[str, Any], name: str, unknown: dict[str, str]) -> float | None:
    value = line.get(name)
    if name not in line:
        unknown[name] = f"bench_serving's JSONL line has no {name!r}"
    elif value is None:
        unknown[name] = f"bench_serving reported {name} as null"
    elif (why := unusable(value)) is not None:
        unknown[name] = f"bench_serving reported {name} as {_shown(value)}: {why}, unusable"
    else:
        return float(value)
    return None


def parse_run(text: str, info: RunInfo) -> BenchRun:
    """A `BenchRun` from one JSONL line; ValueError when it is no JSON object or lacks `completed`."""
    try:
        line = json_data(text)
    except ValueError as exc:  # no JSON, or nested past the parser's depth
        raise ValueError(f"the JSONL line is not JSON: {exc}") from None
    if not isinstance(line, dict):
        raise ValueError(f"the JSONL line is {type(line).__name__}, not a JSON object")
    completed = line.get("completed")
    if isinstance(completed, bool) or not isinstance(completed, int) or unusable(completed):
        raise ValueError(f"the JSONL line has no request count ('completed' is {_shown(completed)})")
    unknown: dict[str, str] = {}
    values: dict[str, Any] = {name: _number(line, name, unknown) for name in FLOAT_FIELDS}
    for name in INT_FIELDS:
        number = _number(line, name, unknown)
        values[name] = None if number is None else int(number)
    if line.get("accept_length") is None and "accept_length" in line:
        values["accept_length"] = None
        unknown["accept_length"] = NO_ACCEPT_LENGTH
    else:
        values["accept_length"] = _number(line, "accept_length", unknown)
    if info.slo_ms:
        values["request_goodput"] = _number(line, "request_goodput", unknown)
        values |= attainment(line, info.slo_ms, unknown)
    return BenchRun(**info.model_dump(), completed=completed, unknown=unknown, **values)


def jsonl_lines(stdout: str) -> list[str] | None:
    """The non-empty lines after the last marker line; None when the marker never came."""
    _, marker, after = stdout.rpartition(JSONL_MARKER + "\n")
    if not marker:
        return None
    return [line for line in after.splitlines() if line.strip()]


#: The metrics a `BenchPoint` sums up over its repeats.
POINT_METRICS = (
    "output_throughput",
    "request_throughput",
    "median_ttft_ms",
    "median_tpot_ms",
    "median_itl_ms",
    "median_e2e_latency_ms",
    "p99_ttft_ms",
    "p99_tpot_ms",
    "accept_length",
)
#: The goodput metrics a point sums up where its runs measured goodput against SLOs (`RunInfo.slo_ms`).
GOODPUT_METRICS = ("request_goodput", "slo_attainment")


class Spread(DataModel):
    """A metric over the repeats of one concurrency."""

    values: list[Measured]  # the repeats' values, in run order
    median: Measured
    min: Measured
    max: Measured
    rel_mad: float | None  # median absolute deviation / |median|; None when the median is 0
    rel_range: float | None  # (max - min) / |median|; None when the median is 0

    @classmethod
    def of(cls, values: Sequence[float]) -> Spread:
        """The spread of at least one value."""
        middle = statistics.median(values)
        mad = statistics.median(abs(value - middle) for value in values)
        low, high = min(values), max(values)
        rel_mad, rel_range = (mad / abs(middle), (high - low) / abs(middle)) if middle else (None, None)
        return cls(values=list(values), median=middle, min=low, max=high, rel_mad=rel_mad, rel_range=rel_range)

    def noisy(self, threshold: float) -> bool:
        """Whether the runs scatter (relative MAD above `threshold`) or one stands out (range above twice it)."""
        return (self.rel_mad or 0.0) > threshold or (self.rel_range or 0.0) > 2 * threshold


class BenchPoint(DataModel):
    """One concurrency of one workload (and category): the spread of each metric over the runs that completed."""

    workload: str = RANDOM_IDS
    category: str | None = None
    max_concurrency: int
    repeats: int  # runs that completed
    output_throughput: Spread | None
    request_throughput: Spread | None
    median_ttft_ms: Spread | None
    median_tpot_ms: Spread | None
    median_itl_ms: Spread | None
    median_e2e_latency_ms: Spread | None
    p99_ttft_ms: Spread | None
    p99_tpot_ms: Spread | None
    accept_length: Spread | None
    # where the runs measured goodput against SLOs (else None, with no reason: none was asked)
    request_goodput: Spread | None = None
    slo_attainment: Spread | None = None
    noisy: bool  # output_throughput's Spread.noisy at the step's spread_threshold
    unknown: dict[str, str]  # metric -> why its Spread is None


def point(runs: Sequence[BenchRun], spread_threshold: float) -> BenchPoint:
    """The point of one concurrency's runs (at least one)."""
    spreads: dict[str, Spread | None] = {}
    unknown: dict[str, str] = {}
    asked_goodput = any(run.slo_ms for run in runs)
    for metric in POINT_METRICS + (GOODPUT_METRICS if asked_goodput else ()):
        values = [getattr(run, metric) for run in runs]
        missing = [run for run, value in zip(runs, values, strict=True) if value is None]
        if missing:
            which = "every repeat" if len(missing) == len(runs) else f"repeat {missing[0].repeat}"
            spreads[metric] = None
            unknown[metric] = f"unknown in {which}: {missing[0].unknown.get(metric, 'no value')}"
        else:
            spreads[metric] = Spread.of(values)
    throughput = spreads["output_throughput"]
    noisy = throughput is not None and throughput.noisy(spread_threshold)
    first = runs[0]
    return BenchPoint(
        workload=first.workload,
        category=first.category,
        max_concurrency=first.max_concurrency,
        repeats=len(runs),
        noisy=noisy,
        unknown=unknown,
        **spreads,
    )


def points(runs: Sequence[BenchRun], spread_threshold: float) -> list[BenchPoint]:
    """One point per workload (and category) and concurrency, in the order they first ran."""
    by_concurrency: dict[tuple[str, int], list[BenchRun]] = {}
    for run in runs:
        by_concurrency.setdefault((slice_key(run.workload, run.category), run.max_concurrency), []).append(run)
    return [point(group, spread_threshold) for group in by_concurrency.values()]
