"""TEST DOUBLE of SGLang 0.5.23's Prometheus `/metrics` (`--enable-metrics`), in its own text format.

What the real server serves (srt/utils/common.py add_prometheus_middleware: prometheus_client's multiprocess
collector and generate_latest; srt/observability/metrics_collector.py for the names): counters as
`# HELP NAME_total Multiprocess metric` / `# TYPE NAME_total counter` and one `NAME_total{labels} VALUE` line per
label set, a label set appearing at its first increment; the tokenizer's counters labelled `engine_type`,
`model_name` (and `is_streaming` for the token and request counters, not for `spec_verify_calls_total`); the
scheduler's gauges with `tp_rank`, `pp_rank`, `moe_ep_rank` too; histograms as `_bucket{le=...}`, `_count` and
`_sum` lines. A finished request adds its prompt and completion tokens and, when it speculated, its verify
steps (`observe_one_finished_request`). Nothing resets them but a restart: not /flush_cache.
Values are written as prometheus_client's floatToGoString writes them (`12.0`, `1.234567e+06`).
"""

from __future__ import annotations

import threading

#: The e2e latency histogram's buckets (metrics_collector.py's default), for lines a parser must skip.
E2E_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0, 100.0, 200.0, 400.0)


def go_float(value: float) -> str:
    """prometheus_client's floatToGoString: Go switches to an exponent past six digits before the point."""
    text = repr(float(value))
    dot = text.find(".")
    if value > 0 and dot > 6:
        mantissa = f"{text[0]}.{text[1:dot]}{text[dot + 1 :]}".rstrip("0.")
        return f"{mantissa}e+{dot - 1:02d}"
    return text


def _labels(pairs: dict[str, str]) -> str:
    return "{" + ",".join(f'{name}="{value}"' for name, value in sorted(pairs.items())) + "}"


class Metrics:
    """The counters of one server process, by label set."""

    def __init__(self, model_name: str, speculative: bool) -> None:
        self._base = {"engine_type": "unified", "model_name": model_name}
        self._scheduler = {**self._base, "moe_ep_rank": "0", "pp_rank": "0", "tp_rank": "0"}
        self._speculative = speculative
        self._lock = threading.Lock()
        self._counters: dict[str, dict[str, float]] = {}  # NAME_total -> labels text -> value
        self._latencies: dict[str, list[float]] = {}  # is_streaming -> e2e latencies
        self._accept_length = 0.0

    def finished(self, prompt_tokens: int, completion_tokens: int, verify_ct: int, streaming: bool, e2e: float) -> None:
        """One finished request, as observe_one_finished_request counts it."""
        stream = {**self._base, "is_streaming": "true" if streaming else "false"}
        with self._lock:
            self._add("sglang:prompt_tokens_total", stream, prompt_tokens)
            self._add("sglang:generation_tokens_total", stream, completion_tokens)
            if verify_ct > 0:
                self._add("sglang:spec_verify_calls_total", self._base, verify_ct)
                self._accept_length = completion_tokens / verify_ct  # the last window's mean, per request here
            self._add("sglang:num_requests_total", stream, 1)
            self._latencies.setdefault(stream["is_streaming"], []).append(e2e)

    def _add(self, name: str, labels: dict[str, str], amount: float) -> None:
        series = self._counters.setdefault(name, {})
        key = _labels(labels)
        series[key] = series.get(key, 0.0) + amount

    def exposition(self, running: int) -> str:
        """The whole /metrics body."""
        with self._lock:
            lines = self._gauge("sglang:num_running_reqs", running)
            if self._speculative:
                lines += self._gauge("sglang:spec_accept_length", self._accept_length)
            for name in sorted(self._counters):
                lines += [f"# HELP {name} Multiprocess metric", f"# TYPE {name} counter"]
                lines += [f"{name}{key} {go_float(v)}" for key, v in sorted(self._counters[name].items())]
            lines += self._histogram()
        return "\n".join(lines) + "\n"

    def _gauge(self, name: str, value: float) -> list[str]:
        return [
            f"# HELP {name} Multiprocess metric",
            f"# TYPE {name} gauge",
            f"{name}{_labels(self._scheduler)} {go_float(value)}",
        ]

    def _histogram(self) -> list[str]:
        name = "sglang:e2e_request_latency_seconds"
        lines = [f"# HELP {name} Multiprocess metric", f"# TYPE {name} histogram"]
        for streaming, values in sorted(self._latencies.items()):
            labels = {**self._base, "is_streaming": streaming}
            for bound in E2E_BUCKETS:
                count = sum(1 for v in values if v <= bound)
                lines.append(f"{name}_bucket{_labels({**labels, 'le': str(bound)})} {float(count)}")
            lines.append(f"{name}_bucket{_labels({**labels, 'le': '+Inf'})} {float(len(values))}")
            lines.append(f"{name}_count{_labels(labels)} {float(len(values))}")
            lines.append(f"{name}_sum{_labels(labels)} {sum(values)}")
        return lines
