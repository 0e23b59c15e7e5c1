"""The Prometheus metrics runbook reads from an SGLang server's `/metrics` (launched with `--enable-metrics`).

One place for their names, as SGLang 0.5.23 declares them (srt/observability/metrics_collector.py): what scrapes
them imports these, and the release tier (tests/release/test_release_facts.py) checks each name and kind against
the pinned release's file, so a release that renames one fails there, naming it.

A run's exact acceptance length is Δ GENERATION_TOKENS / Δ SPEC_VERIFY_CALLS around it (both counters of the
server's whole life); SPEC_ACCEPT_LENGTH is a gauge of the latest logging interval, not of a run.
"""

from __future__ import annotations

#: "Number of generation tokens processed." (the release's documentation of each, quoted)
GENERATION_TOKENS = "sglang:generation_tokens_total"
#: "Number of speculative decoding verification calls."
SPEC_VERIFY_CALLS = "sglang:spec_verify_calls_total"
#: "Number of requests processed." (finished requests: each one's first token came from prefill, not a verify)
NUM_REQUESTS = "sglang:num_requests_total"
#: "Mean acceptance length of speculative decoding (accepted drafts + bonus token per forward)." (last interval)
SPEC_ACCEPT_LENGTH = "sglang:spec_accept_length"

#: name -> the prometheus_client class the release declares it with
METRICS = {
    GENERATION_TOKENS: "Counter",
    SPEC_VERIFY_CALLS: "Counter",
    NUM_REQUESTS: "Counter",
    SPEC_ACCEPT_LENGTH: "Gauge",
}
