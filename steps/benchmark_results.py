"""What one run of SGLang's serving benchmark measured, read from the JSONL line it appends.

`python -m sglang.bench_serving --output-file F` appends one JSON object per run to F, with the
field names of sglang 0.5.23 (benchmark/serving.py, `result`). The benchmark step prints that
file after a marker line, and this module turns the line into a typed `BenchRun`.

The benchmark writes its line even when every request failed (with `completed: 0`), so a line is
no proof of success: `BenchRun.shortfall` says when fewer requests completed than were asked.
A metric the line lacks (another release) or reports as NaN is null with its reason in `unknown`,
never a number that looks measured.
"""

from __future__ import annotations

import json
import math
from typing import Any

from pydantic import BaseModel

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
NO_ACCEPT_LENGTH = (
    "the server reported no speculative acceptance length (/server_info has no avg_spec_accept_length): "
    "no speculative decoding"
)


class BenchRun(BaseModel):
    """One concurrency's result. `max_concurrency` and `num_prompts` are what was asked; `concurrency`
    is what bench_serving measured (mean requests in flight)."""

    max_concurrency: int
    num_prompts: int
    completed: int
    duration: float | None
    total_input_tokens: int | None
    total_output_tokens: int | None
    request_throughput: float | None  # requests/s
    input_throughput: float | None  # tokens/s
    output_throughput: float | None  # tokens/s
    total_throughput: float | None  # tokens/s
    max_output_tokens_per_s: float | None
    concurrency: float | None
    mean_ttft_ms: float | None
    median_ttft_ms: float | None
    p99_ttft_ms: float | None
    mean_tpot_ms: float | None
    median_tpot_ms: float | None
    p99_tpot_ms: float | None
    mean_itl_ms: float | None
    median_itl_ms: float | None
    p99_itl_ms: float | None
    mean_e2e_latency_ms: float | None
    median_e2e_latency_ms: float | None
    p99_e2e_latency_ms: float | None
    accept_length: float | None  # the server's average acceptance length; null without speculative decoding
    unknown: dict[str, str]  # field -> why it is null

    @property
    def shortfall(self) -> str | None:
        """Why this run does not count, or None when every request completed."""
        if self.completed >= self.num_prompts:
            return None
        return f"only {self.completed} of {self.num_prompts} requests completed"


def _number(line: dict[str, Any], name: str, unknown: dict[str, str]) -> float | None:
    value = line.get(name)
    if name not in line:
        unknown[name] = f"bench_serving's JSONL line has no {name!r}"
    elif value is None:
        unknown[name] = f"bench_serving reported {name} as null"
    elif isinstance(value, bool) or not isinstance(value, int | float):
        unknown[name] = f"bench_serving reported {name} as {value!r}, not a number"
    elif not math.isfinite(value):
        unknown[name] = f"bench_serving reported {name} as {value}"
    else:
        return float(value)
    return None


def parse_run(text: str, max_concurrency: int, num_prompts: int) -> BenchRun:
    """A `BenchRun` from one JSONL line; ValueError when it is no JSON object or lacks `completed`."""
    try:
        line = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"the JSONL line is not JSON: {exc}") from None
    if not isinstance(line, dict):
        raise ValueError(f"the JSONL line is {type(line).__name__}, not a JSON object")
    completed = line.get("completed")
    if isinstance(completed, bool) or not isinstance(completed, int):
        raise ValueError(f"the JSONL line has no request count ('completed' is {completed!r})")
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
    return BenchRun(
        max_concurrency=max_concurrency, num_prompts=num_prompts, completed=completed, unknown=unknown, **values
    )


def jsonl_lines(stdout: str) -> list[str] | None:
    """The non-empty lines after the last marker line; None when the marker never came."""
    _, marker, after = stdout.rpartition(JSONL_MARKER + "\n")
    if not marker:
        return None
    return [line for line in after.splitlines() if line.strip()]
