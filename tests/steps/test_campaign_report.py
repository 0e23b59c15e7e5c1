"""The campaign report: known answers on hand-built step records (real facts models), the step writing its
files through a StepContext test double, and `runbook report` printing (or refusing) what it wrote."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from executor.redact import NO_SECRETS
from executor.runbook.campaign import AxisValue
from executor.runbook.gates import evaluate
from executor.stepkind import StepContext, StepView
from executor.transport.base import CommandResult, Transfer
from steps.benchmark_report import Acceptance, AcceptanceSet, BenchmarkFacts, LosslessSet
from steps.benchmark_results import points
from steps.campaign_report import CampaignReportStep
from steps.campaign_report_cells import CellPoint, CellReport, Launch, choose, collect, compare
from steps.probe_facts import Gpu, GpuFacts
from steps.server.documents import Choice, DeployFacts
from tests.clirun import runbook_cli
from tests.steps.test_benchmark_report import bench_run

BASE_ARGV = ["/venv/bin/python", "-m", "sglang.launch_server", "--model-path", "/models/Kimi-K2.6"]


def gpu_facts(model: str, count: int = 8) -> dict[str, Any]:
    """The `gpu` part of a probe's facts (what the report reads of a probe), through the probe's model."""
    gpus = [
        Gpu(
            index=i,
            name=model,
            uuid=f"GPU-{i}",
            memory_total_mib=143771,
            memory_used_mib=0,
            memory_free_mib=143771,
            driver_version="570.133.20",
            compute_capability="9.0",
            pci_bus_id=f"00000000:{i:02x}:00.0",
        )
        for i in range(count)
    ]
    report = GpuFacts(
        nvidia_smi="/usr/bin/nvidia-smi", gpus=gpus, reason=None, driver_version="570.133.20", cuda_version="12.8",
        unknown={},
    )  # fmt: skip
    return {"gpu": report.model_dump(mode="json")}


def deploy_facts(
    algorithm: str | None = None, tokens: int | None = None, budget: int | None = None, tp: int = 8
) -> dict[str, Any]:
    argv = [*BASE_ARGV, "--tp-size", str(tp)]
    if algorithm:
        argv += ["--speculative-algorithm", algorithm, "--speculative-draft-model-path", "/models/Kimi-K2.6-DFlash"]
    if tokens:
        argv += ["--speculative-num-draft-tokens", str(tokens)]
    if budget:
        argv += ["--speculative-ddtree-budget", str(budget)]
    argv += ["--host", "127.0.0.1", "--port", "30000"]
    choices = {
        "speculative_algorithm": Choice(value=algorithm, source="the runbook"),
        "speculative_num_draft_tokens": Choice(value=tokens, source="the runbook"),
        "speculative_ddtree_budget": Choice(value=budget, source="the runbook"),
        "tp_size": Choice(value=tp, source="the runbook"),
    }
    facts = DeployFacts(
        action="start", port=30000, bind="127.0.0.1", base_url="http://127.0.0.1:30000", argv=argv,
        state_file="/state/server.json", pid=4242, log_file="/state/server.log", reused=False, previous=None,
        ready=True, ready_s=12.0, exit_code=None, health=None, generate=None, error_line=None, log_tail=[],
        failure=None, server_version="0.5.23", speculative_algorithm=algorithm, model_path="/models/Kimi-K2.6",
        draft_model_path="/models/Kimi-K2.6-DFlash" if algorithm else None, env={}, choices=choices,
    )  # fmt: skip
    return facts.model_dump(mode="json")


def bench_facts(
    server: str, throughputs: Mapping[int, float | Sequence[float]], tpot: float = 10.0, output_len: int = 64
) -> dict[str, Any]:
    """A benchmark's facts: two repeats of each throughput, or the repeats given (then as many as given)."""
    repeats = {c: (t, t) if isinstance(t, float) else tuple(t) for c, t in throughputs.items()}
    runs = [bench_run(c, t, repeat=r, median_tpot_ms=tpot) for c, ts in repeats.items() for r, t in enumerate(ts, 1)]
    facts = BenchmarkFacts(
        label="bench", server=server, base_url="http://127.0.0.1:30000", input_len=256, output_len=output_len,
        concurrencies=list(throughputs), repeats=max(map(len, repeats.values())), spread_threshold=0.05, runs=runs,
        points=points(runs, 0.05),
        failure=None, compare_to=None, speedup=None, report=None,
    )  # fmt: skip
    return facts.model_dump(mode="json")


def eval_facts(math: float, lossless_identical: int = 20) -> dict[str, Any]:
    acceptance = Acceptance(
        step="eval",
        sets={"math": AcceptanceSet(requests=20, mean=math - 0.2, weighted_mean=math)},
        api="chat",
        template="the server's chat template",
        thinking=True,
        lossless={"math": LosslessSet(compared=20, identical=lossless_identical, differing=20 - lossless_identical)},
        speculation_on=True,
    )
    return acceptance.model_dump(mode="json", exclude={"step"})


def view(
    step: str,
    kind: str,
    facts: Any = None,
    host: str = "gpu1",
    status: str = "passed",
    message: str | None = None,
    cell: Mapping[str, AxisValue] | None = None,
) -> StepView:
    base = step.partition("[")[0]
    group = "dflash" if cell else None
    return StepView(step, base, kind, host, status, message, facts, group, dict(cell or {}))


def instance(base: str, **values: AxisValue) -> str:
    return f"{base}[" + ",".join(f"{k}={v}" for k, v in values.items()) + "]"


BASELINE = {1: 100.0, 4: 350.0, 16: 1000.0, 32: 1800.0}
TOKENS_4 = {1: 300.0, 4: 890.0, 16: 1100.0, 32: 1700.0}
TOKENS_8 = {1: 306.0, 4: 900.0, 16: 1050.0, 32: 1600.0}


def host_views(host: str = "gpu1", gpu: str = "NVIDIA H200", scale: float = 1.0) -> list[StepView]:
    """One host's campaign: a baseline, DFLASH with 4 and 8 draft tokens, a DDTREE cell whose server ran out of
    memory (its benchmark skipped), and a DDTREE cell skipped by its `when`."""

    def scaled(values: Mapping[int, float]) -> dict[int, float]:
        return {c: t * scale for c, t in values.items()}

    views = [
        view("probe", "probe", gpu_facts(gpu), host),
        view("deploy_baseline", "deploy", deploy_facts(), host),
        view("bench_baseline", "benchmark", bench_facts("deploy_baseline", scaled(BASELINE)), host),
    ]
    for tokens, throughputs, accept in ((4, TOKENS_4, 3.1), (8, TOKENS_8, 3.9)):
        cell: dict[str, AxisValue] = {"drafter": "zlab", "tokens": tokens}
        deploy = instance("deploy_dflash", **cell)
        views += [
            view(deploy, "deploy", deploy_facts("DFLASH", tokens=tokens), host, cell=cell),
            view(instance("eval", **cell), "eval_acceptance", eval_facts(accept), host, cell=cell),
            view(instance("bench", **cell), "benchmark", bench_facts(deploy, scaled(throughputs)), host, cell=cell),
        ]
    oom: dict[str, AxisValue] = {"drafter": "zlab", "tokens": "ddtree-64"}
    oom_deploy = instance("deploy_dflash", **oom)
    said = "the server exited during start-up: torch.OutOfMemoryError: CUDA out of memory"
    views += [
        view(oom_deploy, "deploy", None, host, "failed", said, oom),
        view(instance("bench", **oom), "benchmark", None, host, "skipped", f"cell failed: {oom_deploy}: {said}", oom),
    ]
    off: dict[str, AxisValue] = {"drafter": "zlab", "tokens": "ddtree-16"}
    when = "when: matrix.tokens != 'ddtree-16' or steps.probe.facts.sglang.ddtree is false"
    views += [
        view(instance("deploy_dflash", **off), "deploy", None, host, "skipped", when, off),
        view(instance("bench", **off), "benchmark", None, host, "skipped", f"cell failed: deploy: {when}", off),
    ]
    return views


ZLAB_4, ZLAB_8 = "dflash[drafter=zlab,tokens=4]", "dflash[drafter=zlab,tokens=8]"


def test_the_best_per_concurrency_prefers_the_cheaper_within_the_tolerance_and_the_crossover() -> None:
    cells = collect(host_views(), "bench_baseline")
    [comparison] = compare(cells, {"gpu1": "8x NVIDIA H200"}, 0.02, across_gpus=False)
    best = {b.concurrency: b.best for b in comparison.best}
    # c=1: 8 tokens is fastest (306), 4 tokens within 2% (300 >= 299.88) and cheaper; c=32: the baseline wins
    assert best == {1: ZLAB_4, 4: ZLAB_4, 16: ZLAB_4, 32: "bench_baseline"}
    assert comparison.best[0].fastest == ZLAB_8 and comparison.best[0].tied == [ZLAB_4, ZLAB_8]  # within 2%: a tie
    assert comparison.crossover.concurrency == 32
    assert [(r.concurrencies, r.best) for r in comparison.recommended] == [
        ([1, 4, 16], ZLAB_4),
        ([32], "bench_baseline"),
    ]
    command = comparison.recommended[0].command or ""
    assert "--speculative-num-draft-tokens 4" in command and command.startswith("/venv/bin/python -m sglang")
    assert "--speculative-algorithm" not in (comparison.recommended[1].command or "")


def test_without_tolerance_the_fastest_wins_and_the_ranges_follow() -> None:
    cells = collect(host_views(), "bench_baseline")
    [comparison] = compare(cells, {"gpu1": "8x NVIDIA H200"}, 0.0, across_gpus=False)
    assert [(r.concurrencies, r.best) for r in comparison.recommended] == [
        ([1, 4], ZLAB_8),
        ([16], ZLAB_4),
        ([32], "bench_baseline"),
    ]


def test_cells_carry_speedup_acceptance_lossless_and_launch_and_failed_cells_their_reason() -> None:
    cells = {c.name: c for c in collect(host_views(), "bench_baseline")}
    four = cells[ZLAB_4]
    assert four.status == "passed" and four.launch.draft_tokens == 4 and four.launch.gpus == 8
    assert four.speedup is not None and four.speedup.by_concurrency == {
        "1": 3.0,
        "4": 890 / 350,
        "16": 1.1,
        "32": 1700 / 1800,
    }
    assert four.points[0].output_throughput == (300.0, 300.0, 300.0) and four.points[0].tpot_ms == (10.0, 10.0, 10.0)
    assert four.acceptance[0].sets["math"].weighted_mean == 3.1 and four.acceptance[0].lossless is not None
    oom, off = cells["dflash[drafter=zlab,tokens=ddtree-64]"], cells["dflash[drafter=zlab,tokens=ddtree-16]"]
    assert oom.status == "failed" and "deploy_dflash[drafter=zlab,tokens=ddtree-64]: the server exited" in (
        oom.reason or ""
    )
    assert off.status == "skipped" and "when: matrix.tokens" in (off.reason or "")


def test_no_speculative_cell_beating_at_any_concurrency_is_a_crossover_at_the_first() -> None:
    views = [v for v in host_views(scale=1.0) if "tokens=8" not in v.step]
    slow = bench_facts(instance("deploy_dflash", drafter="zlab", tokens=4), {c: t * 0.5 for c, t in BASELINE.items()})
    views = [
        v if v.step != instance("bench", drafter="zlab", tokens=4) else view(v.step, v.kind, slow, cell=v.cell)
        for v in views
    ]
    [comparison] = compare(collect(views, "bench_baseline"), {}, 0.02, across_gpus=False)
    assert comparison.crossover.concurrency == 1 and "never did" in comparison.crossover.why
    assert {b.best for b in comparison.best} == {"bench_baseline"}


def test_without_a_baseline_there_is_no_crossover_rather_than_one_at_the_first_concurrency() -> None:
    """No speedup is known when the baseline failed: that is no proof that speculation never paid."""
    failed = view("bench_baseline", "benchmark", None, status="failed", message="bench_serving exited 1")
    views = [failed if v.step == "bench_baseline" else v for v in host_views()]
    [comparison] = compare(collect(views, "bench_baseline"), {}, 0.02, across_gpus=False)
    assert comparison.crossover.concurrency is None
    assert "no speedup over a baseline is known" in comparison.crossover.why


def test_a_baseline_launched_unlike_its_cells_gets_them_no_speedup_unless_allowed() -> None:
    """The sweep's old baseline: no inspect step, so flashinfer and no --trust-remote-code where its cells ran
    trtllm_mla with the flag. Its speedups would measure the backend, not speculative decoding."""
    facts = deploy_facts()
    facts["argv"] = [*facts["argv"], "--attention-backend", "flashinfer"]
    views = [view("deploy_baseline", "deploy", facts) if v.step == "deploy_baseline" else v for v in host_views()]
    for v in views:
        if v.kind == "deploy" and v.cell and v.facts:
            v.facts["argv"] += ["--attention-backend", "trtllm_mla", "--trust-remote-code", "--port", "30001"]
    cells = {c.name: c for c in collect(views, "bench_baseline")}
    four = cells[ZLAB_4]
    assert four.speedup is None and all(p.speedup is None for p in four.points)
    assert four.speedup_unknown == (
        "the baseline ran with other flags than this cell, beyond the speculative ones (--attention-backend: "
        "flashinfer vs trtllm_mla; --trust-remote-code: not given vs given): not a comparison of speculative "
        "decoding (list the flags in baseline_may_differ to compare anyway)"
    )
    [comparison] = compare(list(cells.values()), {}, 0.02, across_gpus=False)
    assert comparison.crossover.concurrency is None  # no speedup is known: none is claimed
    allowed = {c.name: c for c in collect(views, "bench_baseline", ["--attention-backend", "--trust-remote-code"])}
    assert allowed[ZLAB_4].speedup is not None and allowed[ZLAB_4].speedup_unknown is None


def test_hosts_with_other_gpus_are_not_compared_unless_told() -> None:
    views = host_views("gpu1", "NVIDIA H200") + host_views("gpu2", "NVIDIA B200", scale=2.0)
    cells = collect(views, "bench_baseline")
    kinds = {"gpu1": "8x NVIDIA H200", "gpu2": "8x NVIDIA B200"}
    apart = compare(cells, kinds, 0.02, across_gpus=False)
    assert [(c.gpus, c.hosts) for c in apart] == [("8x NVIDIA H200", ["gpu1"]), ("8x NVIDIA B200", ["gpu2"])]
    assert {b.best for b in apart[0].best} <= {f"{ZLAB_4}@gpu1", "bench_baseline@gpu1"}
    [together] = compare(cells, kinds, 0.02, across_gpus=True)
    assert together.hosts == ["gpu1", "gpu2"] and all(b.host == "gpu2" for b in together.best)  # twice as fast


# ---- the step, through a StepContext test double ---------------------------------------------------------


class StepsBeforeDouble(StepContext):
    """A StepContext test double: the records of earlier steps (`steps_before`) and a run folder, nothing else."""

    def __init__(self, views: list[StepView], run_dir: Path) -> None:
        self.views, self.run_dir, self.output_dir, self.base_dir = views, run_dir, run_dir / "gpu1", run_dir
        self.host_name, self.host_address, self.vars, self.said = "gpu1", "gpu1", {}, []
        self.redactor = NO_SECRETS

    def fact(self, step_id: str, path: str) -> Any:
        raise KeyError(step_id)

    def peer(self, host: str) -> StepContext:
        raise AssertionError("the campaign report runs on its own host only")

    async def run(self, script: str | bytes, *, timeout: float | None = None, on_output: Any = None) -> CommandResult:
        raise AssertionError("the campaign report runs no command on the host")

    def progress(self, message: str, /, **fields: Any) -> None:
        self.said.append(message)

    def facts_of_kind(self, kind: str) -> dict[str, Any]:
        raise AssertionError("the campaign report reads steps_before, every host's")

    def steps_before(self, kinds: Iterable[str] | None = None) -> list[StepView]:
        return [v for v in self.views if kinds is None or v.kind in kinds]

    async def put(self, local: Path, remote: str) -> Transfer:
        raise AssertionError("no transfer")

    async def get(self, remote: str, local: Path) -> Transfer:
        raise AssertionError("no transfer")


def write_campaign(run_dir: Path, views: list[StepView], **params: Any) -> Any:
    step = CampaignReportStep.model_validate(
        {"id": "report", "kind": "campaign_report", "baseline": "bench_baseline"} | params
    )
    outcome = asyncio.run(step.execute(StepsBeforeDouble(views, run_dir)))
    assert outcome.result.exit_code == 0
    return outcome.facts


def test_the_step_writes_the_report_and_its_figures_and_says_it_in_short(tmp_path: Path) -> None:
    facts = write_campaign(tmp_path, host_views())
    assert facts.best == {"1": ZLAB_4, "4": ZLAB_4, "16": ZLAB_4, "32": "bench_baseline"} and facts.crossover == 32
    assert (facts.counts.cells, facts.counts.passed, facts.counts.failed, facts.counts.skipped) == (4, 2, 1, 1)
    assert facts.counts.benchmarked == 2 and set(facts.failed) == {
        "dflash[drafter=zlab,tokens=ddtree-64]",
        "dflash[drafter=zlab,tokens=ddtree-16]",
    }
    report = json.loads((tmp_path / "report.json").read_text())
    assert set(report["provenance"]) == {"gpu1"} and report["provenance"]["gpu1"]["gpus"]["model"] == "NVIDIA H200"
    assert report["campaign"]["comparisons"][0]["crossover"]["concurrency"] == 32
    for name in ("campaign_throughput.png", "campaign_pareto.png", "campaign_acceptance.png"):
        assert (tmp_path / name).read_bytes().startswith(b"\x89PNG")
    assert "## Best configuration per concurrency" in (tmp_path / "report.md").read_text()


def test_no_cell_passed_is_a_report_that_says_so_and_fails_the_gate(tmp_path: Path) -> None:
    views = [v for v in host_views() if v.kind != "benchmark" or v.group is None or v.status != "passed"]
    facts = write_campaign(tmp_path, views)
    assert facts.counts.benchmarked == 0 and facts.best is None
    assert any("no cell passed" in note for note in json.loads((tmp_path / "report.json").read_text())["notes"])
    step = CampaignReportStep(id="report", kind="campaign_report", baseline="bench_baseline")
    results = [evaluate(g.that, {"facts": facts.model_dump(mode="json")}) for g in step.default_gates()]
    assert [r.passed for r in results] == [True, False]


def test_runbook_report_prints_the_choices_first_and_refuses_a_host_without_provenance(tmp_path: Path) -> None:
    views = host_views("gpu1", "NVIDIA H200") + host_views("gpu2", "NVIDIA B200", scale=2.0)
    write_campaign(tmp_path, views)
    shown = runbook_cli("report", str(tmp_path))
    assert shown.returncode == 0, shown.stderr
    out = shown.stdout
    order = ["Best configuration per concurrency", "Crossover", "Recommended launch command", "Failed and skipped"]
    assert [out.index(title) for title in order] == sorted(out.index(title) for title in order)
    assert out.index("Failed and skipped") < out.index("Output throughput and latency per cell")
    assert "cells of different GPUs are not compared" in " ".join(out.split())
    report = json.loads((tmp_path / "report.json").read_text())
    del report["provenance"]["gpu2"]["repos"]
    (tmp_path / "report.json").write_text(json.dumps(report))
    refused = runbook_cli("report", str(tmp_path))
    assert refused.returncode == 2 and "host gpu2: a provenance without repos" in refused.stderr
    del report["provenance"]
    (tmp_path / "report.json").write_text(json.dumps(report))
    refused = runbook_cli("report", str(tmp_path), "--json")
    assert refused.returncode == 2 and "refused: no provenance (needs generated_at, " in refused.stderr


# ---- the choice, as a property ---------------------------------------------------------------------------


def cell(name: str, gpus: int, tokens: int | None, throughput: float) -> CellReport:
    launch = Launch(
        deploy="d", algorithm="DFLASH" if tokens else None, draft_tokens=tokens, budget=None, gpus=gpus,
        draft_model=None, argv=None, server_version=None,
    )  # fmt: skip
    point = CellPoint(
        concurrency=1, repeats=1, output_throughput=(throughput,) * 3, tpot_ms=None, ttft_ms=None, noisy=False,
        speedup=None,
    )  # fmt: skip
    return CellReport(
        name=name, group=None if tokens is None else "g", host="h", values={}, status="passed", reason=None,
        benchmark=name, input_len=1, output_len=1, launch=launch, acceptance=[], points=[point], speedup=None,
        speedup_unknown=None,
    )  # fmt: skip


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from([1, 2, 4, 8]), st.one_of(st.none(), st.integers(1, 64)), st.floats(1.0, 1e4)),
        min_size=1,
        max_size=8,
    ),
    st.floats(0.0, 0.5),
)
def test_the_best_is_never_slower_than_the_tolerance_allows_and_is_the_cheapest_within(
    configs: list[tuple[int, int | None, float]], tolerance: float
) -> None:
    cells = [cell(f"c{i}", gpus, tokens, t) for i, (gpus, tokens, t) in enumerate(configs)]
    best = choose(cells, 1, tolerance)
    assert best is not None
    fastest = max(t for _, _, t in configs)
    assert best.output_throughput >= (1 - tolerance) * fastest
    within = [c for c in cells if (c.throughput_at(1) or 0) >= (1 - tolerance) * fastest]
    chosen = next(c for c in cells if c.name == best.best)
    assert all(chosen.cost <= other.cost for other in within)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from([1, 2, 8]), st.sampled_from([0.0, 5e-324, 1.0, 1e4])), min_size=1, max_size=6),
    st.floats(0.0, 0.99),
)
def test_a_cell_that_measured_no_throughput_never_wins(configs: list[tuple[int, float]], tolerance: float) -> None:
    """A median output throughput of 0 (a server that produced nothing) is no configuration: however cheap, it
    is never chosen, nor within the tolerance of a fastest one; where no cell measured more, nothing is chosen."""
    cells = [cell(f"c{i}", gpus, None, t) for i, (gpus, t) in enumerate(configs)]
    best = choose(cells, 1, tolerance)
    if all(t == 0 for _, t in configs):
        assert best is None
        return
    assert best is not None and best.output_throughput > 0 and best.fastest_throughput > 0
    zero = {c.name for c, (_, t) in zip(cells, configs, strict=True) if t == 0}
    assert not zero & {best.best, best.fastest, *best.tied}


@pytest.mark.parametrize("tolerance", [-0.1, 1.0])
def test_a_tolerance_outside_0_to_1_is_refused(tolerance: float) -> None:
    with pytest.raises(ValueError, match="tolerance"):
        CampaignReportStep.model_validate(
            {"id": "r", "kind": "campaign_report", "baseline": "b", "tolerance": tolerance}
        )


def test_through_the_engine_a_campaign_in_which_no_cell_passed_writes_its_report_and_fails(tmp_path: Path) -> None:
    runbook = tmp_path / "campaign.yaml"
    runbook.write_text(
        "name: campaign\nhosts: {here: {address: local}}\nsteps:\n"
        "  - {id: bench_baseline, kind: shell, script: 'true'}\n"
        "  - {id: report, kind: campaign_report, baseline: bench_baseline}\n"
    )
    planned = runbook_cli("plan", str(runbook))
    assert planned.returncode == 0 and "runs nothing on the host" in planned.stdout
    ran = runbook_cli("run", str(runbook), "--log-dir", str(tmp_path / "logs"))
    assert ran.returncode == 1 and "no cell passed with a benchmark" in ran.stdout + ran.stderr
    [run_dir] = (tmp_path / "logs").iterdir()
    notes = json.loads((run_dir / "report.json").read_text())["notes"]
    assert any("no cell passed" in note for note in notes)
    # a failed run that wrote a report says where it is, as a passed one does
    assert f"report: {run_dir / 'report.md'}\n" in ran.stderr
    assert f"see it again: runbook report {run_dir.name} --log-dir {tmp_path / 'logs'}\n" in ran.stderr


def test_facts_that_do_not_fit_or_hold_a_non_finite_number_are_left_out_not_a_crash(tmp_path: Path) -> None:
    """A passed benchmark whose facts are of another shape (a state.db of an older release), or that hold
    NaN or infinity (a tampered state.db, a zero-length run), is as one without facts: the report is
    written in valid JSON, the cell counted as not benchmarked, instead of a ValidationError or matplotlib's
    ValueError failing the step."""
    views = host_views()
    zlab_4, zlab_8 = instance("bench", drafter="zlab", tokens=4), instance("bench", drafter="zlab", tokens=8)
    infinite = bench_facts(instance("deploy_dflash", drafter="zlab", tokens=8), {1: 1.0, 4: 1.0})
    for run, number in zip(infinite["runs"], [float("inf"), 1e308, -1.0, 10**400], strict=True):
        run["output_throughput"] = number
    replaced = {zlab_4: {"label": "bench", "runs": "older shape"}, zlab_8: infinite}
    hostile = [view(v.step, v.kind, replaced[v.step], v.host, cell=v.cell) if v.step in replaced else v for v in views]
    nan_eval = eval_facts(4.0)  # as a tampered state.db holds it: the models refuse to make one
    nan_eval["sets"]["math"] |= {"mean": float("nan"), "weighted_mean": float("nan")}
    hostile = [
        view(v.step, v.kind, nan_eval, v.host, cell=v.cell) if v.kind == "eval_acceptance" else v for v in hostile
    ]
    facts = write_campaign(tmp_path, hostile)
    assert facts.counts.benchmarked == 0 and facts.best is None
    json.loads((tmp_path / "report.json").read_text(), parse_constant=lambda name: pytest.fail(name))


@pytest.mark.parametrize("tpot", [5e-324, 0.0])
def test_a_tpot_whose_tokens_per_user_is_not_finite_is_no_pareto_point(tpot: float) -> None:
    """1000 / 5e-324 ms is infinite, 1000 / 0 undefined: such a concurrency has no Pareto point (in the benchmark
    report's data, nor in the campaign's figure), the others keep theirs."""
    from steps import campaign_report_figures as figures
    from steps.benchmark_report import pareto_points
    from tests.steps.test_benchmark_report import side_of

    runs = [bench_run(1, 100.0, median_tpot_ms=tpot), bench_run(4, 300.0, median_tpot_ms=20.0)]
    assert [(p.concurrency, p.tokens_per_s_per_user) for p in pareto_points(side_of("s", runs), gpus=2)] == [(4, 50.0)]
    tokens_4 = cell("c", 2, 4, 100.0)
    point = tokens_4.points[0].model_copy(update={"tpot_ms": (tpot, tpot, tpot)})
    assert figures.points(tokens_4.model_copy(update={"points": [point]})) == []


def test_a_benchmark_of_two_workloads_is_one_cell_as_a_skipped_one_is() -> None:
    """The counts are of benchmark instances per host: a passed benchmark reports each workload apart (two
    CellReports), a skipped one has none; counted per report, a searched campaign said `17 cell(s): 10 passed, 7
    skipped` for 12 configurations."""
    from steps.campaign_report_document import counts

    fast = cell("b[x=1]", 8, 4, 500.0)
    two = [fast, fast.model_copy(update={"workload": "speed-bench/mixed"})]
    skipped = cell("b[x=2]", 8, 8, 500.0).model_copy(update={"status": "skipped", "points": []})
    found = counts([cell("base", 8, None, 100.0).model_copy(update={"group": None}), *two, skipped])
    assert (found.cells, found.passed, found.skipped, found.benchmarked) == (2, 1, 1, 1)
