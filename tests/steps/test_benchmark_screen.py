"""A campaign search's screen inside the benchmark step (README "Search"): a launched configuration runs one repeat of
every band first, the search says where it still contends, and only those bands get the other repeats; outside a
search the runs keep their order and every repeat runs. In-process, against a context that answers each run with a
line as sglang 0.5.23's serving benchmark writes it."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, cast

from executor.redact import Redactor
from executor.runbook.search import Band, Measure
from executor.stepkind import StepContext
from steps.benchmark import BenchmarkStep, Measuring
from steps.benchmark_report import BenchmarkFacts
from steps.benchmark_results import points
from steps.request_records import RecordsFile
from tests.steps.test_benchmark import finished, printed, real_line

STEP = BenchmarkStep(id="bench", server="deploy", concurrencies=[1, 32], repeats=3, num_prompts=16)
Screen = Callable[[Mapping[Band, Measure]], frozenset[Band]]


class Host:
    """What the step asks of its context here: run (each run's throughput from its concurrency), progress, screen."""

    def __init__(self, run_dir: Path, screen: Screen | None) -> None:
        self.run_dir, self.host_name, self._screen = run_dir, "gpu", screen
        self.ran: list[tuple[int, int]] = []  # (concurrency, seed) in order
        self.screened: list[dict[str, float]] = []

    def screen(self) -> Screen | None:
        if self._screen is None:
            return None
        inner = self._screen

        def seen(measures: Mapping[Band, Measure]) -> frozenset[Band]:
            self.screened.append({band: m.median for band, m in measures.items()})
            return inner(measures)

        return seen

    async def run(self, script: str, **_: Any) -> Any:
        concurrency = int(re.findall(r"--max-concurrency (\d+)", script)[-1])
        seed = int(re.findall(r"--seed (\d+)", script)[-1])
        self.ran.append((concurrency, seed))
        line = real_line(max_concurrency=concurrency, output_throughput=100.0 * concurrency, completed=16)
        return finished(printed(line))

    def progress(self, message: str, /, **fields: Any) -> None:
        pass


def measured(tmp_path: Path, screen: Screen | None) -> tuple[Host, BenchmarkFacts]:
    host = Host(tmp_path, screen)
    ctx = cast(StepContext, host)
    slots = [(slot, STEP.resolved_workloads(False)[0]) for slot in STEP.schedule()]
    facts = BenchmarkFacts(
        label="b", server="deploy", base_url="http://127.0.0.1:1", input_len=1024, output_len=512,
        concurrencies=[1, 32], repeats=3, spread_threshold=0.05, runs=[], points=[], failure=None, compare_to=None,
        speedup=None, report=None,
    )  # fmt: skip
    records = RecordsFile(tmp_path, "bench", Redactor([]))
    _, stopped = asyncio.run(STEP._measure(Measuring(ctx, "http://127.0.0.1:1", facts, records), slots))
    assert stopped is None
    return host, facts


def test_outside_a_search_every_repeat_runs_in_the_schedules_order(tmp_path: Path) -> None:
    host, facts = measured(tmp_path, None)
    assert host.ran == [(s.concurrency, s.seed) for s in STEP.schedule()]
    assert facts.screened == [] and len(facts.runs) == 6


def test_a_screen_runs_one_repeat_per_band_then_the_repeats_only_where_it_contends(tmp_path: Path) -> None:
    host, facts = measured(tmp_path, lambda measures: frozenset({"random-ids c=1"}))
    assert host.screened == [{"random-ids c=1": 100.0, "random-ids c=32": 3200.0}]  # the first pass, one run each
    assert [c for c, _ in host.ran] == [1, 32, 1, 1]  # then the repeats of the band still contending
    assert {(s.concurrency, s.seed) for s in STEP.schedule()} >= set(host.ran)  # each run keeps its schedule's seed
    assert facts.screened == ["random-ids c=32"]
    summed = points(facts.runs, STEP.spread_threshold)
    assert [(p.max_concurrency, p.repeats) for p in summed] == [(1, 3), (32, 1)]
