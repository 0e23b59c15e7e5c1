"""A benchmark's SLOs: `--goodput` on each measured run (never the warm-up), the goodput the client writes parsed
per run and summed per point (median over repeats), a tampered line never a number that looks measured; and the
SGLang stand-in's client counting goodput as 0.5.23's benchmark/goodput.py does."""

from __future__ import annotations

import json
import math
import shlex
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sandbox.sglang_standin import bench_client
from steps.benchmark import BenchmarkStep
from steps.benchmark_results import RunInfo, parse_run, points
from steps.benchmark_slo import Slo

SLO = Slo(ttft_ms=100, tpot_ms=10, e2e_ms=500)
ASKED = {"ttft": 100.0, "tpot": 10.0, "e2el": 500.0}


def info(repeat: int = 1, slo_ms: dict[str, float] | None = ASKED) -> RunInfo:
    return RunInfo(
        max_concurrency=4, num_prompts=4, repeat=repeat, seed=repeat, started_at="", finished_at="", command="",
        slo_ms=slo_ms,
    )  # fmt: skip


def outputs() -> list[bench_client.Output]:
    """Four requests: good; TTFT 150 ms (misses ttft); 11 tokens in 0.6 s (TPOT 50 ms, E2E 600: misses tpot and
    e2el); failed (counts against attainment)."""
    made = [
        bench_client.Output(prompt_len=8, success=True, ttft=0.05, latency=0.09, output_len=6),
        bench_client.Output(prompt_len=8, success=True, ttft=0.15, latency=0.19, output_len=6),
        bench_client.Output(prompt_len=8, success=True, ttft=0.1, latency=0.6, output_len=11),
        bench_client.Output(prompt_len=8, success=False),
    ]
    return made


def test_the_standins_client_counts_goodput_as_the_release() -> None:
    goodput = bench_client.calculate_goodput(outputs(), dict(ASKED), duration=2.0)
    assert goodput == {
        "goodput_slos_ms": ASKED,
        "request_goodput": 0.5,  # one good request in 2 s
        "slo_attainment": 0.25,  # of the 4 sent
        "slo_attainment_by_metric": {"ttft": 0.5, "tpot": 0.5, "e2el": 0.5},
    }


def line(goodput: dict[str, Any], throughput: float = 100.0) -> str:
    return json.dumps({"completed": 4, "output_throughput": throughput, **goodput})


def test_a_run_with_slos_parses_the_clients_goodput_and_a_point_takes_the_median() -> None:
    runs = [
        parse_run(line(bench_client.calculate_goodput(outputs(), dict(ASKED), duration=d)), info(r))
        for r, d in ((1, 2.0), (2, 1.0), (3, 4.0))
    ]
    assert [r.request_goodput for r in runs] == [0.5, 1.0, 0.25] and runs[0].slo_attainment == 0.25
    assert runs[0].slo_attainment_by_metric == {"ttft": 0.5, "tpot": 0.5, "e2el": 0.5} and runs[0].unknown.keys() == {
        name for name in runs[0].unknown if name not in ("request_goodput", "slo_attainment")
    }
    [point] = points(runs, 0.05)
    assert point.request_goodput is not None and point.request_goodput.median == 0.5
    assert point.slo_attainment is not None and point.slo_attainment.min == 0.25
    plain = parse_run(line({}), info(slo_ms=None))
    assert plain.request_goodput is None and "request_goodput" not in plain.unknown
    [without] = points([plain], 0.05)
    assert without.request_goodput is None and "request_goodput" not in without.unknown


junk = st.one_of(
    st.none(),
    st.just(math.nan),
    st.just(math.inf),
    st.floats(-10, -1e-9),
    st.floats(1.0001, 1e300),
    st.text(max_size=4),
)


@settings(max_examples=60, deadline=None)
@given(
    st.fixed_dictionaries(
        {},
        optional={
            "goodput_slos_ms": st.one_of(st.just(ASKED), st.just({"ttft": 1.0}), st.none(), st.text(max_size=3)),
            "request_goodput": st.one_of(junk, st.floats(0, 1e6)),
            "slo_attainment": st.one_of(junk, st.floats(0, 1)),
            "slo_attainment_by_metric": st.one_of(st.none(), st.dictionaries(st.sampled_from(list(ASKED)), junk)),
        },
    )
)
def test_a_tampered_goodput_is_unknown_with_its_reason_never_a_number(goodput: dict[str, Any]) -> None:
    run = parse_run(line(goodput), info())
    share, rate = goodput.get("slo_attainment"), goodput.get("request_goodput")
    usable_share = isinstance(share, float) and 0 <= share <= 1 and goodput.get("goodput_slos_ms") == ASKED
    assert (run.slo_attainment is not None) == usable_share
    if run.slo_attainment is None:
        assert "slo_attainment" in run.unknown
    if run.request_goodput is None:
        assert "request_goodput" in run.unknown
    else:
        assert run.request_goodput == rate
    assert all(0 <= v <= 1 for v in run.slo_attainment_by_metric.values())
    json.dumps(run.model_dump(mode="json"), allow_nan=False)


def test_goodput_goes_on_each_measured_run_not_on_the_warm_up() -> None:
    step = BenchmarkStep(id="b", server="d", slo=SLO)
    measured = shlex.split(step.command("http://127.0.0.1:1", 4, 1, {}, "f", module="m"))
    at = measured.index("--goodput")
    assert measured[at + 1 : at + 4] == ["ttft:100", "tpot:10", "e2el:500"]
    warm = step.command("http://127.0.0.1:1", 4, 1, {}, "f", module="m", warmup=True)
    assert "--goodput" not in warm
    assert "--goodput" not in BenchmarkStep(id="b", server="d").command("http://127.0.0.1:1", 4, 1, {}, "f")


@pytest.mark.parametrize(
    ("slo", "message"),
    [
        ({}, "expected at least one of ttft_ms, tpot_ms, e2e_ms"),
        ({"ttft_ms": 0}, "greater than 0"),
        ({"e2e_ms": math.nan}, "finite number"),
        ({"tpot_ms": 1e9}, "less than or equal to 86400000"),
        ({"e2el": 5}, "Extra inputs are not permitted"),
    ],
)
def test_a_bad_slo_is_refused_naming_what_was_expected(slo: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        BenchmarkStep.model_validate({"id": "b", "server": "d", "slo": slo})
