"""Exact acceptance length of one run, from SGLang's Prometheus counters (`--enable-metrics`).

SGLang 0.5.23 (srt/observability/metrics_collector.py, TokenizerMetricsCollector.observe_one_finished_request)
adds, when a request finishes, its completion tokens to the counter `sglang:generation_tokens_total` (labels
model_name, engine_type and is_streaming, plus any custom ones) and, when it speculated, its verify steps
(`spec_verify_ct`) to `sglang:spec_verify_calls_total` (no is_streaming label). prometheus_client in
multiprocess mode (srt/utils/common.py add_prometheus_middleware) exposes them as `NAME_total` samples under
`# TYPE NAME_total counter`, one series per label set, a series appearing only once it was first incremented
(a server that never speculated has no `spec_verify_calls_total` at all). A flush does not reset them; a
restart does. So, scraped before and after a run on an otherwise idle server, Δgeneration_tokens /
Δspec_verify_calls is the run's acceptance length exactly: every token over every verify call, each request's
first token (from prefill) included, as in meta_info's `completion_tokens / spec_verify_ct`.

The host only fetches `/metrics` and keeps the lines of `FAMILIES` (hostprograms/kit.py `scrape_metrics`); this
module parses them strictly: a line that is not Prometheus text format 0.0.4, a value that is NaN, infinite,
negative or not a whole number below 2**53 (a float counter is exact only below it), a series given twice,
more than MAX_LINES lines or MAX_LINE_CHARS in one: each is a `MetricsError` with the line, never a guess.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from executor.runbook.model import Model
from steps.sglang_metrics import GENERATION_TOKENS, NUM_REQUESTS, SPEC_ACCEPT_LENGTH, SPEC_VERIFY_CALLS

# the release's names (steps/sglang_metrics.py, which the release tier checks), as this module calls them
VERIFY_CALLS = SPEC_VERIFY_CALLS
REQUESTS = NUM_REQUESTS  # finished requests: each one's first token came from prefill, not a verify
ACCEPT_GAUGE = SPEC_ACCEPT_LENGTH  # the last decode-log window's mean: shown, never used for the value
#: The metric families the host keeps from /metrics (the rest, histograms and gauges by the hundred, stays there).
FAMILIES = (GENERATION_TOKENS, VERIFY_CALLS, REQUESTS, ACCEPT_GAUGE)
#: Limits, checked before parsing: a real scrape of these families is a few lines per label set.
MAX_LINES = 10_000
MAX_LINE_CHARS = 4096
#: A counter's value is a float: whole numbers are exact only below this.
EXACT_BELOW = 2**53
#: How far an estimate may lie from the exact value before the report flags it, relative to it. The running average
#: (/server_info avg_spec_accept_length, 0.5.23 internal_state.py: accepted tokens / verify calls) counts no
#: request's first token (prefill, no verify call), so it is compared with the counters' value of the same
#: definition, (Δgeneration_tokens - Δnum_requests) / Δspec_verify_calls; what is left is its lag (the scheduler
#: adds to its totals every `--decode-log-interval` decode batches, 40 by default: a run's last steps may be
#: missing). meta_info's token-weighted mean (Σcompletion_tokens / Σspec_verify_ct of the run's own requests) is
#: compared with the exact value: alone on the server they are equal. 5% holds the lag on runs of a few hundred
#: verify calls; more is a real disagreement: requests from outside the run in the window, a flush or restart
#: mid-run, counters that miss requests. The per-request (equal-weight) mean is shown, never flagged: it weights a
#: short answer as much as a long one, another quantity.
TOLERANCE = 0.05

_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_LABEL = r'[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\[\\"n])*"'
_SAMPLE = re.compile(
    rf"^(?P<name>{_NAME})(?:\{{(?P<labels>(?:{_LABEL}(?:,{_LABEL})*)?,?)\}})?"
    r"[ \t]+(?P<value>\S+)(?:[ \t]+(?P<ts>-?[0-9]+))?[ \t]*$"
)
_LABEL_PAIR = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\n]|\\[\\"n])*)"')
_TYPES = "counter|gauge|histogram|summary|untyped"
_TYPE = re.compile(rf"^#[ \t]+TYPE[ \t]+(?P<name>{_NAME})[ \t]+(?P<type>{_TYPES})[ \t]*$")
_VALUE = re.compile(r"^(?:[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|[+-]?Inf|NaN)$")


class MetricsError(ValueError):
    """Text that is not what SGLang's /metrics serves; the message names the line and what was expected."""


@dataclass(frozen=True)
class Sample:
    name: str
    labels: tuple[tuple[str, str], ...]
    value: float


@dataclass(frozen=True)
class Exposition:
    """Samples by metric name, and the declared type of each name that had a `# TYPE` line."""

    samples: dict[str, list[Sample]]
    types: dict[str, str]


def parse(text: str) -> Exposition:
    """Prometheus text format 0.0.4 (what prometheus_client's generate_latest writes): `# HELP`/`# TYPE` and other
    comments, blank lines, samples `name{l="v",...} value [timestamp]`. MetricsError on anything else."""
    lines = text.split("\n")
    if len(lines) > MAX_LINES:
        raise MetricsError(f"{len(lines)} lines, more than the {MAX_LINES} a scrape of {len(FAMILIES)} families holds")
    samples: dict[str, list[Sample]] = {}
    types: dict[str, str] = {}
    seen: set[tuple[str, tuple[tuple[str, str], ...]]] = set()
    for number, line in enumerate(lines, start=1):
        if len(line) > MAX_LINE_CHARS:
            raise MetricsError(f"line {number}: {len(line)} characters, more than {MAX_LINE_CHARS}")
        if not line.strip():
            continue
        if line.startswith("#"):
            _comment(line, number, types)
            continue
        sample = _sample(line, number)
        key = (sample.name, sample.labels)
        if key in seen:
            raise MetricsError(f"line {number}: the series {sample.name}{dict(sample.labels)} appears twice")
        seen.add(key)
        samples.setdefault(sample.name, []).append(sample)
    return Exposition(samples, types)


def _comment(line: str, number: int, types: dict[str, str]) -> None:
    """A `# TYPE` line's declaration into `types`; HELP and other comments are skipped."""
    if re.match(r"^#[ \t]+TYPE\b", line) is None:
        return
    found = _TYPE.match(line)
    if found is None:
        raise MetricsError(f"line {number}: expected `# TYPE NAME counter|gauge|histogram|summary|untyped`")
    if found["name"] in types:
        raise MetricsError(f"line {number}: a second # TYPE line for {found['name']}")
    types[found["name"]] = found["type"]


def _sample(line: str, number: int) -> Sample:
    found = _SAMPLE.match(line)
    if found is None or _VALUE.match(found["value"]) is None:
        raise MetricsError(f'line {number}: expected `NAME{{label="value",...}} VALUE`, got {line[:80]!r}')
    labels = tuple(sorted(_LABEL_PAIR.findall(found["labels"] or "")))
    if len({name for name, _ in labels}) != len(labels):
        raise MetricsError(f"line {number}: a label appears twice in {line[:80]!r}")
    return Sample(found["name"], labels, float(found["value"]))


def counter_total(exposition: Exposition, name: str) -> int | None:
    """The sum of a counter's series (None when it has none: never incremented); MetricsError when it is declared
    another type or a series is not a whole number in [0, EXACT_BELOW)."""
    declared = exposition.types.get(name)
    if declared not in (None, "counter"):
        raise MetricsError(f"{name} is declared a {declared}, not a counter")
    series = exposition.samples.get(name)
    if not series:
        return None
    total = 0
    for sample in series:
        value = sample.value
        if not math.isfinite(value) or value < 0 or value >= EXACT_BELOW or value != int(value):
            raise MetricsError(f"{name}{dict(sample.labels)} is {value}: a counter is a whole number in [0, 2**53)")
        total += int(value)
    if total >= EXACT_BELOW:
        raise MetricsError(f"{name} sums to {total} over its series, past 2**53")
    return total


def gauge_value(exposition: Exposition, name: str) -> float | None:
    """A gauge's value (of its only series; None when absent, several or not finite): shown, never trusted."""
    series = exposition.samples.get(name) or []
    return series[0].value if len(series) == 1 and math.isfinite(series[0].value) else None


class Scrape(Model):
    """One scrape of /metrics as the host reported it (hostprograms/kit.py scrape_metrics)."""

    status: int | None  # HTTP status; None when the server did not answer
    error: str | None  # why there is no answer, or the host's refusal (too big)
    lines: list[str]  # the lines of FAMILIES (and their # TYPE lines)


class Counters(Model):
    generation_tokens: int
    verify_calls: int
    requests: int
    accept_gauge: float | None  # sglang:spec_accept_length at this scrape


class ExactAcceptance(Model):
    """A run's acceptance length from the server's counters: None everywhere it is not known, with the reason."""

    value: float | None  # Δgeneration_tokens / Δspec_verify_calls
    #: (Δgeneration_tokens - Δnum_requests) / Δspec_verify_calls: without each request's first token, as the
    #: server's running average counts
    decode_value: float | None
    generation_tokens: int | None  # Δ over the run
    verify_calls: int | None
    requests: int | None
    accept_gauge: float | None  # sglang:spec_accept_length after the run (the last decode-log window's)
    unknown_reason: str | None


def counters(scrape: Scrape, when: str) -> Counters:
    """The counters of one scrape; MetricsError naming `when` (before/after the run) and what is wrong."""
    if scrape.status is None:
        raise MetricsError(f"/metrics did not answer {when} the run: {scrape.error}")
    if scrape.status == 404:
        raise MetricsError("the server serves no /metrics (HTTP 404): it was launched without --enable-metrics")
    if scrape.status != 200:
        raise MetricsError(f"/metrics answered HTTP {scrape.status} {when} the run: {scrape.error or ''}".rstrip(": "))
    if scrape.error:
        raise MetricsError(f"/metrics {when} the run: {scrape.error}")
    try:
        exposition = parse("\n".join(scrape.lines))
        totals = [counter_total(exposition, name) for name in (GENERATION_TOKENS, VERIFY_CALLS, REQUESTS)]
    except MetricsError as exc:
        raise MetricsError(f"/metrics {when} the run: {exc}") from None
    # a series exists from its first increment on: none yet is zero (a fresh server, a baseline's verify calls)
    generated, verify, requests = (total or 0 for total in totals)
    gauge = gauge_value(exposition, ACCEPT_GAUGE)
    return Counters(generation_tokens=generated, verify_calls=verify, requests=requests, accept_gauge=gauge)


def exact_acceptance(before: Scrape | None, after: Scrape | None) -> ExactAcceptance:
    """The run's acceptance length from the scrapes around it, or None with why (metrics off, unreadable, the
    counters went down: the server restarted, no verify call in the run)."""
    unknown = dict.fromkeys(("value", "decode_value", "generation_tokens", "verify_calls", "requests", "accept_gauge"))
    if before is None or after is None:
        return ExactAcceptance(**unknown, unknown_reason="/metrics was not scraped around this run")
    try:
        start, end = counters(before, "before"), counters(after, "after")
    except MetricsError as exc:
        return ExactAcceptance(**unknown, unknown_reason=str(exc))
    generated = end.generation_tokens - start.generation_tokens
    verify, requests = end.verify_calls - start.verify_calls, end.requests - start.requests
    found: dict[str, Any] = {"generation_tokens": generated, "verify_calls": verify, "requests": requests}
    found |= {"accept_gauge": end.accept_gauge, "value": None, "decode_value": None}
    if min(generated, verify, requests) < 0:
        deltas = {GENERATION_TOKENS: generated, VERIFY_CALLS: verify, REQUESTS: requests}
        went = ", ".join(f"{name} by {-d}" for name, d in deltas.items() if d < 0)
        return ExactAcceptance(**found, unknown_reason=f"the counters went down ({went}): the server restarted")
    if verify == 0:
        why = f"no verify call during the run ({VERIFY_CALLS} did not grow): no speculative decoding"
        return ExactAcceptance(**found, unknown_reason=why)
    found |= {"value": round(generated / verify, 4), "decode_value": round(max(generated - requests, 0) / verify, 4)}
    return ExactAcceptance(**found, unknown_reason=None)


def disagreement(exact: float | None, estimate: float | None, what: str, definition: str = "") -> str | None:
    """Why `estimate` is flagged against the exact value (relative difference beyond TOLERANCE), or None."""
    if exact is None or estimate is None or exact <= 0:
        return None
    off = (estimate - exact) / exact
    if abs(off) <= TOLERANCE:
        return None
    return f"{what} {estimate:.3g} is {off:+.1%} off the exact {exact:.4g}{definition} (tolerance {TOLERANCE:.0%})"


class RunAcceptance(Model):
    """A run's three acceptance lengths: the exact one from the counters and the estimates shown beside it,
    with each estimate's disagreement beyond TOLERANCE said, never hidden."""

    exact: ExactAcceptance
    running_average: float | None  # /server_info's avg_spec_accept_length after the run (since the last flush)
    weighted_mean: float | None  # meta_info: Σcompletion_tokens / Σspec_verify_ct over the run's requests
    per_request_mean: float | None  # the mean of meta_info's per-request completion_tokens / spec_verify_ct
    disagreements: list[str]


def run_acceptance(
    before: Scrape | None,
    after: Scrape | None,
    running_average: float | None,
    weighted_mean: float | None = None,
    per_request_mean: float | None = None,
) -> RunAcceptance:
    """The exact value of a run and its estimates, each compared with the exact value of its definition."""
    exact = exact_acceptance(before, after)
    found = [
        disagreement(
            exact.decode_value, running_average, "the running average (/server_info)", " without first tokens"
        ),
        disagreement(exact.value, weighted_mean, "meta_info's token-weighted mean"),
    ]
    return RunAcceptance(
        exact=exact,
        running_average=running_average,
        weighted_mean=weighted_mean,
        per_request_mean=per_request_mean,
        disagreements=[said for said in found if said],
    )


#: The line after which a benchmark run's script prints its two scrapes (steps/benchmark.py `metered`).
METRICS_MARKER = "==> runbook: /metrics before and after the run follow <=="


def scrapes(stdout: str) -> tuple[Scrape | None, Scrape | None]:
    """The two scrape documents after the last METRICS_MARKER (None for one missing or unreadable: the reason is
    then `exact_acceptance`'s "not scraped")."""
    _, marker, after = stdout.rpartition(METRICS_MARKER + "\n")
    lines = [line for line in after.splitlines() if line.strip()] if marker else []
    found: list[Scrape | None] = []
    for line in lines[:2]:
        try:
            found.append(Scrape.model_validate_json(line))
        except ValueError:
            found.append(None)
    found += [None] * (2 - len(found))
    return found[0], found[1]
