"""Exact acceptance per run: the strict Prometheus parser (steps/server_metrics.py), the stand-in's /metrics, and
through the CLI on the stand-in the exact value of an eval and of a benchmark run, a server without metrics and a
planted disagreement."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from executor.faces.cli import main
from hostprograms import kit
from sandbox.sglang_standin.metrics import Metrics, go_float
from steps.server_metrics import (
    FAMILIES,
    GENERATION_TOKENS,
    MAX_LINES,
    REQUESTS,
    TOLERANCE,
    VERIFY_CALLS,
    MetricsError,
    Scrape,
    counter_total,
    exact_acceptance,
    parse,
    run_acceptance,
)
from tests.steps import test_benchmark
from tests.steps.test_benchmark import dflash_deploy, facts_of, yaml_steps

standin = test_benchmark.standin  # the fixture: the test host and a fast stand-in, stopped afterwards

#: What SGLang 0.5.23 serves for these families, as prometheus_client's generate_latest writes multiprocess
#: counters (`# HELP NAME_total Multiprocess metric`, floatToGoString values: 2e+06), with a histogram between.
REAL = """# HELP sglang:generation_tokens_total Multiprocess metric
# TYPE sglang:generation_tokens_total counter
sglang:generation_tokens_total{engine_type="unified",is_streaming="false",model_name="moonshotai/Kimi-K2.6"} 2e+06
sglang:generation_tokens_total{engine_type="unified",is_streaming="true",model_name="moonshotai/Kimi-K2.6"} 1234.0
# HELP sglang:e2e_request_latency_seconds Multiprocess metric
# TYPE sglang:e2e_request_latency_seconds histogram
sglang:e2e_request_latency_seconds_bucket{engine_type="unified",is_streaming="true",le="+Inf",model_name="m"} 3.0
sglang:e2e_request_latency_seconds_sum{engine_type="unified",is_streaming="true",model_name="m"} NaN
# HELP sglang:spec_verify_calls_total Multiprocess metric
# TYPE sglang:spec_verify_calls_total counter
sglang:spec_verify_calls_total{engine_type="unified",model_name="moonshotai/Kimi-K2.6"} 400000.0
"""


def scrape(text: str, status: int = 200) -> Scrape:
    return Scrape(status=status, error=None, lines=text.split("\n"))


def counts(generated: float, verify: float, requests: float = 0) -> Scrape:
    return scrape(
        f'# TYPE {GENERATION_TOKENS} counter\n{GENERATION_TOKENS}{{is_streaming="true"}} {go_float(generated)}\n'
        f"{VERIFY_CALLS} {go_float(verify)}\n{REQUESTS} {go_float(requests)}\n"
    )


def test_the_counters_are_summed_over_their_series_and_other_families_skipped() -> None:
    exposition = parse(REAL)
    assert counter_total(exposition, GENERATION_TOKENS) == 2_001_234
    assert counter_total(exposition, VERIFY_CALLS) == 400_000
    assert counter_total(exposition, REQUESTS) is None  # never incremented: no series at all


def test_the_stand_ins_exposition_parses_and_its_counters_count_every_token_and_verify_call() -> None:
    metrics = Metrics("kimi", speculative=True)
    metrics.finished(prompt_tokens=8, completion_tokens=100, verify_ct=25, streaming=True, e2e=0.5)
    metrics.finished(prompt_tokens=8, completion_tokens=2_000_000, verify_ct=400_000, streaming=False, e2e=3.0)
    exposition = parse(metrics.exposition(running=0))
    assert exposition.types[GENERATION_TOKENS] == "counter" and exposition.types["sglang:spec_accept_length"] == "gauge"
    assert counter_total(exposition, GENERATION_TOKENS) == 2_000_100
    assert counter_total(exposition, VERIFY_CALLS) == 400_025 and counter_total(exposition, REQUESTS) == 2
    assert "sglang:e2e_request_latency_seconds_bucket" in exposition.samples  # what the parser skips is there


def test_the_exact_value_is_the_ratio_of_the_deltas_and_the_first_tokens_are_named() -> None:
    found = exact_acceptance(counts(1000, 200, 10), counts(1000 + 4 * 96, 280, 14))
    assert (found.generation_tokens, found.verify_calls, found.requests) == (384, 80, 4)
    assert found.value == 4.8 and found.decode_value == round(380 / 80, 4) and found.unknown_reason is None


@pytest.mark.parametrize(
    ("before", "after", "reason"),
    [
        (counts(500, 100), counts(10, 2), "the counters went down"),
        (counts(500, 100), counts(900, 100), "no verify call during the run"),
        (scrape("", 404), scrape("", 404), "launched without --enable-metrics"),
        (Scrape(status=None, error="127.0.0.1:1: refused", lines=[]), counts(1, 1), "did not answer before the run"),
        (counts(1, 1), scrape(f"{GENERATION_TOKENS} NaN"), "a counter is a whole number"),
        (counts(1, 1), scrape(f"{GENERATION_TOKENS} -5"), "a counter is a whole number"),
        (counts(1, 1), scrape(f"{GENERATION_TOKENS} +Inf"), "a counter is a whole number"),
        (counts(1, 1), scrape(f"{GENERATION_TOKENS} 1e300"), "a counter is a whole number"),
        (counts(1, 1), scrape(f"{GENERATION_TOKENS} 2.5"), "a counter is a whole number"),
        (counts(1, 1), scrape(f"{GENERATION_TOKENS}"), "expected `NAME"),
        (counts(1, 1), scrape(f'{GENERATION_TOKENS}{{a="1",a="2"}} 3'), "a label appears twice"),
        (counts(1, 1), scrape(f"{VERIFY_CALLS} 3\n{VERIFY_CALLS} 4"), "appears twice"),
        (counts(1, 1), scrape(f"# TYPE {VERIFY_CALLS} gauge\n{VERIFY_CALLS} 4"), "not a counter"),
        (counts(1, 1), scrape("x 1\n" * MAX_LINES), f"more than the {MAX_LINES}"),
        (counts(1, 1), scrape("x" * 5000 + " 1"), "characters, more than"),
        (None, counts(1, 1), "was not scraped"),
    ],
)
def test_hostile_or_missing_counters_give_none_with_the_reason(before: Any, after: Any, reason: str) -> None:
    found = exact_acceptance(before, after)
    assert found.value is None and found.unknown_reason is not None and reason in found.unknown_reason, found


@given(st.text(max_size=400))
def test_any_text_is_parsed_or_refused_with_a_reason_never_a_traceback(text: str) -> None:
    try:
        parse(text)
    except MetricsError as exc:
        assert str(exc)
    found = exact_acceptance(counts(0, 0), scrape(text))
    assert (found.value is None) == (found.unknown_reason is not None)


@given(
    st.lists(
        st.tuples(
            st.sampled_from([GENERATION_TOKENS, VERIFY_CALLS, REQUESTS]),
            st.dictionaries(st.from_regex(r"[a-z_]{1,8}", fullmatch=True), st.text(max_size=8), max_size=3),
            st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-(2**60), 2**60)),
        ),
        max_size=6,
    )
)
def test_any_counter_values_give_a_ratio_of_whole_numbers_or_a_reason(series: list[Any]) -> None:
    def quoted(value: str) -> str:
        return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")

    lines = []
    for name, labels, value in series:
        shown = ",".join(f'{k}="{quoted(v)}"' for k, v in labels.items())
        lines.append(f"{name}{{{shown}}} {value if isinstance(value, int) else go_float(value)}")
    found = exact_acceptance(counts(0, 0), scrape("\n".join(lines)))
    if found.value is not None:
        assert found.generation_tokens is not None and found.verify_calls is not None and found.verify_calls > 0
        assert found.value == round(found.generation_tokens / found.verify_calls, 4)
    else:
        assert found.unknown_reason


def test_an_estimate_beyond_the_tolerance_is_flagged_and_one_within_is_not() -> None:
    before, after = counts(0, 0, 0), counts(1000, 250, 10)  # exact 4.0; without first tokens 3.96
    near = run_acceptance(before, after, running_average=3.96 * (1 + TOLERANCE * 0.9), weighted_mean=4.0)
    assert near.disagreements == []
    far = run_acceptance(before, after, running_average=3.96, weighted_mean=4.0 * (1 + TOLERANCE * 1.5))
    (said,) = far.disagreements
    assert said.startswith("meta_info's token-weighted mean 4.3 is +7.5% off the exact 4") and "tolerance 5%" in said


def test_the_host_keeps_only_the_families_lines(monkeypatch: pytest.MonkeyPatch) -> None:
    """kit.scrape_metrics against the stand-in's body: the counters' and their # TYPE lines, nothing else."""
    metrics = Metrics("kimi", speculative=True)
    metrics.finished(prompt_tokens=8, completion_tokens=100, verify_ct=25, streaming=True, e2e=0.5)
    body = metrics.exposition(running=0).encode()
    monkeypatch.setattr(kit, "exchange", lambda *args, **kwargs: (200, body))
    kept = kit.scrape_metrics("http://127.0.0.1:1", list(FAMILIES), 1.0)
    assert kept["status"] == 200 and kept["error"] is None
    assert all(line.split("{")[0].split()[-2 if line.startswith("#") else 0] in FAMILIES for line in kept["lines"])
    assert any(line.startswith("# TYPE sglang:generation_tokens_total counter") for line in kept["lines"])
    assert exact_acceptance(counts(0, 0), Scrape.model_validate(kept)).value == 4.0
    monkeypatch.setattr(kit, "exchange", lambda *args, **kwargs: (200, b"x" * (kit.METRICS_MAX_BYTES + 1)))
    refused = kit.scrape_metrics("http://127.0.0.1:1", list(FAMILIES), 1.0)
    assert refused["error"] == "more than 8 MiB, the most a scrape reads" and refused["lines"] == []
    assert "more than 8 MiB" in str(exact_acceptance(counts(0, 0), Scrape.model_validate(refused)).unknown_reason)


# ---- through the CLI on the stand-in ----------------------------------------------------------------------

#: A shell step printing the stand-in's counters as JSON, read by the test's own sums of /metrics.
COUNTERS = """python3 - <<'EOF'
import json, urllib.request
text = urllib.request.urlopen("http://127.0.0.1:PORT/metrics", timeout=10).read().decode()
sums = {}
for line in text.splitlines():
    if line and not line.startswith("#"):
        name, value = line.split("{")[0].split()[0], float(line.rsplit(" ", 1)[1])
        sums[name] = sums.get(name, 0) + value
print(json.dumps({"gen": sums.get("GEN", 0), "verify": sums.get("VERIFY", 0)}))
EOF
"""


def counters_step(name: str, port: int) -> dict[str, Any]:
    script = COUNTERS.replace("PORT", str(port)).replace("GEN", GENERATION_TOKENS).replace("VERIFY", VERIFY_CALLS)
    return {"id": name, "kind": "shell", "parse": "json", "script": script}


def run_steps(standin: dict[str, Any], write_runbook: Any, tmp_path: Path, capsys: Any, *steps: Any) -> Path:
    body = "name: exact\n__HOSTS__\n" + yaml_steps(*steps)
    path = write_runbook(body, hosts=standin["host"].host_yaml())
    log_dir = tmp_path / "logs"
    assert main(["run", str(path), "--log-dir", str(log_dir)]) == 0, capsys.readouterr().err
    return log_dir


def test_the_exact_value_of_an_eval_and_a_benchmark_run_is_the_delta_of_the_servers_counters(
    standin: dict[str, Any], write_runbook: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The stand-in launched by `deploy` (with --enable-metrics): the eval's exact value is Δ of the stand-in's own
    counters around it and equals meta_info's token-weighted mean; a benchmark run's counts only its measured
    requests (its warm-up ran before the window) and agrees with the running average of the same definition."""
    port = standin["port"]
    eval_step = {"id": "eval", "kind": "eval_acceptance", "server": "deploy", "prompt_sets": ["math"], "limit": 2}
    bench = {"id": "bench", "kind": "benchmark", "server": "deploy", "concurrencies": [2], "repeats": 1}
    bench |= {"input_len": 16, "output_len": 96, "num_prompts": 4}
    log_dir = run_steps(
        standin,
        write_runbook,
        tmp_path,
        capsys,
        {"id": "deploy", **dflash_deploy(standin)},
        counters_step("before", port),
        eval_step | {"max_new_tokens": 128},
        counters_step("between", port),
        bench,
        counters_step("after", port),
    )
    facts = facts_of(log_dir, capsys)
    assert "--enable-metrics" in facts["deploy"]["argv"]
    before, between, after = facts["before"], facts["between"], facts["after"]
    exact = facts["eval"]["acceptance"]["exact"]
    assert exact["generation_tokens"] == between["gen"] - before["gen"] == facts["eval"]["overall"]["completion_tokens"]
    assert exact["verify_calls"] == between["verify"] - before["verify"] == facts["eval"]["overall"]["verify_ct"]
    assert exact["value"] == round(exact["generation_tokens"] / exact["verify_calls"], 4) > 1
    assert facts["eval"]["acceptance"]["disagreements"] == []
    assert facts["eval"]["acceptance"]["weighted_mean"] == facts["eval"]["overall"]["weighted_mean"]

    (run,) = facts["bench"]["runs"]
    measured = run["acceptance"]["exact"]
    assert measured["generation_tokens"] == 4 * 96 and measured["requests"] == 4  # the measured requests only
    assert after["gen"] - between["gen"] == 4 * 96 + 32  # and its one warm-up request (32 tokens), outside the window
    assert measured["value"] > 1 and run["acceptance"]["running_average"] == run["accept_length"]
    assert run["acceptance"]["disagreements"] == [], run["acceptance"]


def test_a_server_without_metrics_gives_none_with_the_reason(
    standin: dict[str, Any], write_runbook: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    eval_step = {"id": "eval", "kind": "eval_acceptance", "server": "deploy", "prompt_sets": ["math"], "limit": 1}
    deploy = {"id": "deploy", **dflash_deploy(standin), "metrics": False}
    log_dir = run_steps(standin, write_runbook, tmp_path, capsys, deploy, eval_step | {"max_new_tokens": 32})
    facts = facts_of(log_dir, capsys)
    assert "--enable-metrics" not in facts["deploy"]["argv"]
    found = facts["eval"]["acceptance"]
    assert found["exact"]["value"] is None and found["disagreements"] == []
    assert found["exact"]["unknown_reason"] == (
        "the server serves no /metrics (HTTP 404): it was launched without --enable-metrics"
    )
    assert found["weighted_mean"] > 1  # the estimates are still there, next to the reason


def test_a_planted_disagreement_is_flagged_in_the_facts_and_the_report(
    standin: dict[str, Any], write_runbook: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The stand-in's `miscount_metrics` fault counts every verify call twice in /metrics: both estimates are then
    about +100% off the exact value, and the report says so in its table and notes."""
    switches = standin["host"].home / "sglang-standin.json"
    switches.write_text(json.dumps(json.loads(switches.read_text()) | {"fault": "miscount_metrics"}))
    lengths = {"concurrencies": [2], "repeats": 1, "input_len": 16, "output_len": 64, "num_prompts": 2}
    eval_step = {"id": "eval", "kind": "eval_acceptance", "server": "dflash", "prompt_sets": ["math"], "limit": 1}
    log_dir = run_steps(
        standin,
        write_runbook,
        tmp_path,
        capsys,
        {"id": "dflash", **dflash_deploy(standin)},
        eval_step | {"max_new_tokens": 64},
        {"id": "base", "kind": "benchmark", "server": "dflash", "label": "same", **lengths},
        {"id": "bench", "kind": "benchmark", "server": "dflash", "compare_to": "base", "acceptance": "eval", **lengths},
    )
    facts = facts_of(log_dir, capsys)
    average, weighted = facts["eval"]["acceptance"]["disagreements"]
    assert average.startswith("the running average (/server_info)") and "tolerance 5%" in average
    assert weighted.startswith("meta_info's token-weighted mean") and "off the exact" in weighted
    (run,) = facts["bench"]["runs"]
    (said,) = run["acceptance"]["disagreements"]
    assert said.startswith("the running average (/server_info)") and "without first tokens" in said
    report = json.loads(Path(facts["bench"]["report"]["json_file"]).read_text())
    table = next(t for t in report["tables"] if t["title"] == "Acceptance length per run: exact and estimates")
    assert [row[0] for row in table["rows"]] == ["eval", "same", "bench"]
    assert all(row[-1].startswith("DISAGREE: ") for row in table["rows"])
    assert sum(note.startswith("acceptance DISAGREES at ") for note in report["notes"]) == 4
