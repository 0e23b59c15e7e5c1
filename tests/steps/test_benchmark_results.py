"""The spread of a concurrency's repeats: `Spread` of one metric, `BenchPoint` of a concurrency, `noisy`."""

from __future__ import annotations

import statistics

from hypothesis import given, settings
from hypothesis import strategies as st

from steps.benchmark_results import POINT_METRICS, Spread, point, points
from tests.steps.test_benchmark_report import bench_run

finite = st.floats(min_value=0, max_value=1e12, exclude_max=True, allow_nan=False, allow_infinity=False)


@settings(max_examples=200, deadline=None)
@given(values=st.lists(finite, min_size=1, max_size=9))
def test_a_spread_brackets_its_median_and_its_mad_is_never_negative(values: list[float]) -> None:
    spread = Spread.of(values)
    assert spread.values == values and (spread.min, spread.max) == (min(values), max(values))
    assert spread.min <= spread.median <= spread.max and spread.median == statistics.median(values)
    if spread.median == 0:
        assert spread.rel_mad is None
    else:
        assert spread.rel_mad is not None and spread.rel_mad >= 0


def test_the_relative_mad_of_known_values() -> None:
    spread = Spread.of([100.0, 90.0, 130.0])  # median 100, deviations 0, 10, 30: MAD 10
    assert (spread.median, spread.rel_mad) == (100.0, 0.1)
    assert Spread.of([5.0]).rel_mad == 0.0 and Spread.of([0.0, 0.0, 1.0]).rel_mad is None


@settings(max_examples=50, deadline=None)
@given(
    throughputs=st.lists(st.floats(min_value=1, max_value=1e6), min_size=1, max_size=5),
    threshold=st.floats(min_value=0, max_value=1),
)
def test_a_point_is_noisy_exactly_when_its_throughput_spread_exceeds_the_threshold(
    throughputs: list[float], threshold: float
) -> None:
    runs = [bench_run(4, value, repeat=i + 1) for i, value in enumerate(throughputs)]
    summed = point(runs, threshold)
    spread = summed.output_throughput
    assert spread is not None and spread.rel_mad is not None and summed.repeats == len(runs)
    assert spread.rel_range is not None
    assert summed.noisy == (spread.rel_mad > threshold or spread.rel_range > 2 * threshold) and summed.unknown == {}
    assert all(getattr(summed, metric) is not None for metric in POINT_METRICS)


def test_one_bad_run_of_three_makes_a_point_noisy_though_its_mad_is_zero() -> None:
    bad = point([bench_run(1, value, repeat=r) for r, value in enumerate((1000.0, 1000.0, 500.0), 1)], 0.05)
    assert bad.output_throughput is not None and bad.output_throughput.rel_mad == 0.0 and bad.noisy
    steady = point([bench_run(1, value, repeat=r) for r, value in enumerate((1000.0, 1040.0, 980.0), 1)], 0.05)
    assert steady.output_throughput is not None and steady.output_throughput.rel_range == 0.06 and not steady.noisy


def test_a_metric_unknown_in_a_repeat_has_no_spread_and_says_which() -> None:
    runs = [bench_run(1, 100.0, repeat=1), bench_run(1, None, repeat=2), bench_run(1, 300.0, repeat=3)]
    runs[1].unknown["output_throughput"] = "bench_serving reported output_throughput as NaN"
    summed = point(runs, 0.05)
    assert summed.output_throughput is None and not summed.noisy
    why = "unknown in repeat 2: bench_serving reported output_throughput as NaN"
    assert summed.unknown == {"output_throughput": why}
    assert summed.request_throughput is not None


def test_points_are_one_per_concurrency_in_the_order_they_ran() -> None:
    runs = [bench_run(c, float(c * r), repeat=r) for c in (4, 1) for r in (1, 2)]
    assert [(p.max_concurrency, p.repeats) for p in points(runs, 0.05)] == [(4, 2), (1, 2)]
