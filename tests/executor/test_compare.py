"""`runbook compare RUN_A RUN_B` (issue 31, item 4) through the CLI, in-process, on report documents the steps'
own models write (tests/steps' builders): a planted regression found (exit 1, naming the cell and the metric), a
change within noise not flagged, a run compared with itself exits 0, the threshold respected, one repeat per
side never flagged, cells of one run only listed, tampered inputs exit 2, the MCP `compare` answers the same;
and, over random repeats, compare(A, A) never flags and B's throughput scaled down beyond the threshold with
tight repeats always does."""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import TypeAdapter, ValidationError

from executor.faces import compare
from executor.run.state import RunMeta, RunState, StepRecord
from steps.benchmark_report import build_report
from steps.benchmark_results import Measured
from tests.clirun import runbook_cli
from tests.documents import schema_problems
from tests.executor.test_cli_report_formats import provenance, with_commands, write_json
from tests.steps.test_benchmark_report import ACCEPTANCE, bench_run, side_of
from tests.steps.test_campaign_report import host_views, write_campaign

Repeats = Mapping[int, Sequence[float]]
STEADY = {1: [100.0, 101.0, 99.0], 4: [350.0, 352.0, 348.0]}


def write_benchmark(run_dir: Path, candidate: Repeats, baseline: Repeats = STEADY, **metrics: float) -> Path:
    """A benchmark's report.json (baseline and `dflash` sides) with these output throughputs per repeat; the
    candidate's runs with `metrics` (median_ttft_ms, ...) too."""

    def side(label: str, step: str, values: Repeats, **more: float) -> Any:
        runs = [bench_run(c, t, repeat=r, **more) for c, ts in values.items() for r, t in enumerate(ts, 1)]
        return with_commands(side_of(label, runs, step))

    base = side("baseline", "benchmark_baseline", baseline)
    cand = side("dflash", "benchmark_dflash", candidate, **metrics)
    write_json(run_dir, build_report(base, cand, provenance(base, cand), ACCEPTANCE))
    return run_dir


def run(*args: str | Path) -> Any:
    return runbook_cli("compare", *map(str, args), "--no-figure")


def as_json(*args: str | Path) -> tuple[int, dict[str, Any]]:
    done = run(*args, "--json")
    assert "Traceback" not in done.stderr, done.stderr
    return done.returncode, json.loads(done.stdout)


def test_a_planted_regression_is_found_naming_the_cell_and_the_metric(tmp_path: Path) -> None:
    a = write_benchmark(tmp_path / "a", {1: [300.0, 302.0, 298.0], 4: [900.0, 905.0, 895.0]})
    b = write_benchmark(tmp_path / "b", {1: [300.0, 301.0, 299.0], 4: [720.0, 724.0, 716.0]})  # -20% at 4
    done = run(a, b)
    assert done.returncode == 1, done.stderr
    assert "REGRESSION: dflash (random-ids, concurrency 4): output_throughput -20.0%" in done.stdout
    code, document = as_json(a, b)
    assert code == 1 and document["regressed"] is True and len(document["regressions"]) == 1
    [cell] = [c for c in document["cells"] if c["cell"] == "dflash" and c["concurrency"] == 4]
    [throughput] = [m for m in cell["metrics"] if m["metric"] == "output_throughput"]
    assert throughput["change_pct"] == pytest.approx(-20.0, abs=0.1)
    assert throughput["ci_low_pct"] < -20.0 < throughput["ci_high_pct"] < 0
    assert not any(m["regression"] for c in document["cells"] for m in c["metrics"] if c is not cell)
    assert schema_problems("compare", document) == []


def test_latency_up_is_a_regression_and_down_an_improvement(tmp_path: Path) -> None:
    values = {1: [300.0, 301.0, 299.0], 4: [900.0, 901.0, 899.0]}
    a = write_benchmark(tmp_path / "a", values, median_ttft_ms=50.0, median_tpot_ms=10.0)
    b = write_benchmark(tmp_path / "b", values, median_ttft_ms=80.0, median_tpot_ms=8.0)
    code, document = as_json(a, b)
    changes = {(c["cell"], c["concurrency"], m["metric"]): m for c in document["cells"] for m in c["metrics"]}
    assert code == 1 and changes[("dflash", 4, "ttft_ms")]["regression"]
    assert changes[("dflash", 4, "tpot_ms")]["beyond_noise"] and not changes[("dflash", 4, "tpot_ms")]["worse"]


def test_a_change_within_noise_is_not_flagged(tmp_path: Path) -> None:
    a = write_benchmark(tmp_path / "a", {1: [300.0, 330.0, 270.0], 4: [900.0, 990.0, 810.0]})
    b = write_benchmark(tmp_path / "b", {1: [285.0, 310.0, 260.0], 4: [860.0, 950.0, 790.0]})  # -4%, scattered 10%
    code, document = as_json(a, b, "--threshold", "1")
    assert code == 0 and document["regressions"] == []
    verdicts = {compare.verdict(compare.MetricChange(**m)) for c in document["cells"] for m in c["metrics"]}
    assert "within noise" in verdicts


def test_a_run_compared_with_itself_flags_nothing(tmp_path: Path) -> None:
    a = write_benchmark(tmp_path / "a", {1: [300.0, 302.0, 298.0], 4: [900.0, 905.0, 895.0]})
    done = run(a, a)
    assert done.returncode == 0 and "0 regression(s) beyond 5% and beyond noise" in done.stdout


def test_the_threshold_is_respected(tmp_path: Path) -> None:
    a = write_benchmark(tmp_path / "a", {1: [300.0, 301.0, 299.0], 4: [900.0, 901.0, 899.0]})
    b = write_benchmark(tmp_path / "b", {1: [300.0, 301.0, 299.0], 4: [837.0, 838.0, 836.0]})  # -7%
    assert run(a, b).returncode == 1  # beyond the default 5%
    assert run(a, b, "--threshold", "10").returncode == 0
    assert run(a, b, "--threshold", "6.5%").returncode == 1
    for bad in ("-1", "nan", "lots", "1e9"):
        done = run(a, b, "--threshold", bad)
        assert done.returncode == 2 and "a percentage from 0 to 1000" in done.stderr


def test_one_repeat_per_side_has_no_noise_estimate_and_never_flags(tmp_path: Path) -> None:
    a = write_benchmark(tmp_path / "a", {1: [300.0], 4: [900.0]}, {1: [100.0], 4: [350.0]})
    b = write_benchmark(tmp_path / "b", {1: [150.0], 4: [450.0]}, {1: [100.0], 4: [350.0]})  # -50%, one repeat
    code, document = as_json(a, b)
    [throughput] = [m for m in document["cells"][2]["metrics"] if m["metric"] == "output_throughput"]
    assert code == 0 and throughput["change_pct"] == pytest.approx(-50.0)
    assert throughput["ci_low_pct"] is None and throughput["note"].startswith("no noise estimate (1 repeat in A")
    assert "no noise estimate" in run(a, b).stdout


def test_cells_of_one_run_only_are_listed_and_nothing_in_common_is_exit_2(tmp_path: Path) -> None:
    a = write_benchmark(tmp_path / "a", {1: [300.0, 301.0], 4: [900.0, 901.0]})
    b = write_benchmark(tmp_path / "b", {1: [300.0, 301.0], 16: [1500.0, 1501.0]}, {1: [100.0, 101.0]})
    code, document = as_json(a, b)
    only = {side: [(u["cell"], u["concurrency"]) for u in document[side]["only_here"]] for side in ("a", "b")}
    assert code == 0 and only == {"a": [("baseline", 4), ("dflash", 4)], "b": [("dflash", 16)]}
    assert "only in A (a): dflash random-ids c=4" in run(a, b).stdout
    c = write_benchmark(tmp_path / "c", {8: [300.0, 301.0]}, {8: [100.0, 101.0]})
    done = run(a, c)
    assert done.returncode == 2 and "measured no cell in common" in done.stderr and done.stdout == ""


def tampered(document: dict[str, Any], how: str) -> str:
    """report.json text with one of its numbers (the candidate's first repeat of throughput) made hostile."""
    spread = document["data"]["candidate"]["points"][0]["output_throughput"]
    if how == "missing":
        del document["data"]["candidate"]["points"][0]["max_concurrency"]
        return json.dumps(document)
    if how in ("no repeats", "repeats copied"):
        spread["values"] = [] if how == "no repeats" else spread["values"] * 50  # the median as it was
        return json.dumps(document)
    spread["values"][0] = {"nan": float("nan"), "negative": -5.0, "huge": 1e300, "text": "fast"}[how]
    return json.dumps(document)


@pytest.mark.parametrize("how", ["nan", "negative", "huge", "text", "missing"])
def test_a_tampered_report_is_exit_2_saying_what(tmp_path: Path, how: str) -> None:
    a = write_benchmark(tmp_path / "a", {1: [300.0, 301.0]})
    b = write_benchmark(tmp_path / "b", {1: [300.0, 301.0]})
    (b / "report.json").write_text(tampered(json.loads((b / "report.json").read_text()), how))
    done = run(a, b)
    assert done.returncode == 2 and "Traceback" not in done.stderr and done.stdout == ""
    assert f"{b / 'report.json'}" in done.stderr and "data.candidate.points.0" in done.stderr


@pytest.mark.parametrize("how", ["no repeats", "repeats copied"])
def test_a_report_whose_repeats_are_not_its_repeats_compares_its_median_saying_why(tmp_path: Path, how: str) -> None:
    """Empty repeats (no median: a StatisticsError), or 2 repeats copied to 100 (a narrower interval on nothing)."""
    a = write_benchmark(tmp_path / "a", {1: [300.0, 301.0]})
    b = write_benchmark(tmp_path / "b", {1: [300.0, 301.0]})
    (b / "report.json").write_text(tampered(json.loads((b / "report.json").read_text()), how))
    code, document = as_json(a, b)
    cells = [c for c in document["cells"] if c["cell"] == "dflash"]
    [throughput] = [m for m in cells[0]["metrics"] if m["metric"] == "output_throughput"]
    assert code == 0 and throughput["repeats_b"] == 1 and "do not give the report's median" in throughput["note"]


def test_no_run_no_report_another_report_a_fifo_and_a_huge_file_are_exit_2(tmp_path: Path) -> None:
    a = write_benchmark(tmp_path / "a", {1: [300.0, 301.0]})
    cases = {"no-run": None, "empty": "", "other": {"title": "t", "notes": [], "tables": [], "figures": []}}
    for name, content in cases.items():
        folder = tmp_path / name
        if content is not None:
            folder.mkdir()
            (folder / "report.json").write_text(content if isinstance(content, str) else json.dumps(content))
        done = runbook_cli("compare", str(a), str(folder), "--log-dir", str(tmp_path), "--no-figure")
        assert done.returncode == 2 and "Traceback" not in done.stderr and done.stdout == "", (name, done.stderr)
    fifo = tmp_path / "fifo"
    fifo.mkdir()
    os.mkfifo(fifo / "report.json")  # never opened for reading: it would wait for a writer
    done = run(a, fifo)
    assert done.returncode == 2 and "report.json" in done.stderr
    huge = tmp_path / "huge"
    huge.mkdir()
    with (huge / "report.json").open("wb") as handle:
        handle.truncate(1 << 30)  # 1 GiB, sparse: refused by its size, unread
    done = run(a, huge)
    assert done.returncode == 2 and "larger than 16 MiB" in done.stderr


def test_a_report_whose_two_sides_share_a_label_is_exit_2(tmp_path: Path) -> None:
    a = write_benchmark(tmp_path / "a", {1: [300.0, 301.0]})
    document = json.loads((a / "report.json").read_text())
    document["data"]["baseline"]["label"] = document["data"]["candidate"]["label"]
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "report.json").write_text(json.dumps(document))
    done = run(a, tmp_path / "b")
    assert done.returncode == 2 and "two rows of 'dflash' at concurrency 1" in done.stderr


hostile = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(10**400), max_value=10**400),
    st.text(max_size=5),
    st.none(),
    st.booleans(),
    st.lists(st.integers(), max_size=2),
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=hostile)
def test_any_value_in_place_of_a_repeat_is_compared_or_refused_never_a_traceback(tmp_path: Path, value: Any) -> None:
    """A repeat's value replaced by anything JSON holds: what the report's model takes as a measurement (0 to below
    1e12; pydantic's lax float reads `true` and `"1"` as numbers too) is compared (exit 0 or 1), anything else
    is exit 2 naming the report's field."""
    a = write_benchmark(tmp_path / "a", {1: [300.0, 301.0]}) if not (tmp_path / "a").exists() else tmp_path / "a"
    document = json.loads((a / "report.json").read_text())
    document["data"]["candidate"]["points"][0]["output_throughput"]["values"][0] = value
    b = tmp_path / "b"
    b.mkdir(exist_ok=True)
    (b / "report.json").write_text(json.dumps(document))
    done = run(a, b)
    try:
        TypeAdapter(Measured).validate_python(value)
        usable = True
    except ValidationError:
        usable = False
    assert "Traceback" not in done.stderr
    assert done.returncode in ((0, 1) if usable else (2,)), (value, done.stderr)
    if not usable:
        assert "data.candidate.points.0.output_throughput" in done.stderr


# ---- a campaign: its repeats are in state.db -----------------------------------------------------------------


def write_run(run_dir: Path, views: Sequence[Any], stored: Sequence[Any] | None = None) -> Path:
    """A campaign's run folder: state.db holding its steps' records (facts; `stored`'s: a state.db tampered with
    after the report), then the report its step writes."""
    meta = RunMeta(run_id=run_dir.name, runbook="sweep", path="/sweep.yaml", started_at="2026-12-03T20:00:00+00:00")
    records = [StepRecord(v.step, v.host, n, v.status, "", facts=v.facts) for n, v in enumerate(stored or views)]
    RunState.create(run_dir, meta, records).close()
    write_campaign(run_dir, list(views))
    return run_dir


def slower(views: Sequence[Any], step: str, factor: float) -> list[Any]:
    """The views with `step`'s benchmark facts rescaled: every run's output throughput times `factor`."""
    from steps.benchmark_report import BenchmarkFacts
    from steps.benchmark_results import points

    changed = []
    for view in views:
        if view.step == step:
            facts = BenchmarkFacts.model_validate(view.facts)
            runs = [r.model_copy(update={"output_throughput": r.output_throughput * factor}) for r in facts.runs]
            facts = facts.model_copy(update={"runs": runs, "points": points(runs, facts.spread_threshold)})
            view = dataclasses.replace(view, facts=facts.model_dump(mode="json"))
        changed.append(view)
    return changed


@pytest.fixture(scope="module")
def campaigns(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three campaign runs under one log folder: two alike, one whose 4-token DFLASH cell is 20% slower."""
    logs = tmp_path_factory.mktemp("logs")
    views = host_views()
    write_run(logs / "20261201-010000-aaaaaa", views)
    write_run(logs / "20261202-010000-bbbbbb", views)
    write_run(logs / "20261203-010000-cccccc", slower(views, "bench[drafter=zlab,tokens=4]", 0.8))
    return logs


def test_campaign_runs_are_matched_by_cell_and_a_slower_cell_is_found_by_run_id(campaigns: Path) -> None:
    same = runbook_cli("compare", "20261201", "20261202", "--log-dir", str(campaigns), "--no-figure", "--json")
    assert same.returncode == 0, same.stderr
    document = json.loads(same.stdout)
    assert document["a"]["kind"] == "campaign" and document["regressions"] == []
    assert {c["cell"] for c in document["cells"]} == {
        "bench_baseline",
        "dflash[drafter=zlab,tokens=4]",
        "dflash[drafter=zlab,tokens=8]",
    }
    assert all(m["repeats_a"] == 2 and m["ci_low_pct"] == 0 for c in document["cells"] for m in c["metrics"])
    worse = runbook_cli("compare", "20261201", "20261203", "--log-dir", str(campaigns), "--no-figure", "--json")
    lines = json.loads(worse.stdout)["regressions"]
    assert worse.returncode == 1 and len(lines) == 4  # each of its four concurrencies
    assert all(line.startswith("dflash[drafter=zlab,tokens=4] (random-ids, concurrency") for line in lines)


def test_a_campaign_without_its_state_db_is_exit_2(campaigns: Path, tmp_path: Path) -> None:
    copy = tmp_path / "copy"
    copy.mkdir()
    (copy / "report.json").write_bytes((campaigns / "20261201-010000-aaaaaa" / "report.json").read_bytes())
    done = run(campaigns / "20261201-010000-aaaaaa", copy)
    assert done.returncode == 2 and "per-repeat values are in its state.db" in done.stderr


def test_a_cell_whose_facts_in_state_db_are_unusable_is_compared_on_its_medians_saying_why(
    campaigns: Path, tmp_path: Path
) -> None:
    cell = "bench[drafter=zlab,tokens=8]"
    views = [
        dataclasses.replace(v, facts={**v.facts, "runs": "tampered"}) if v.step == cell else v for v in host_views()
    ]
    write_run(tmp_path / "20261204-010000-dddddd", host_views(), stored=views)
    code, document = as_json(campaigns / "20261201-010000-aaaaaa", tmp_path / "20261204-010000-dddddd")
    notes = {c["cell"]: {m["note"] for m in c["metrics"]} for c in document["cells"]}
    assert code == 0 and notes["bench_baseline"] == {None}
    [note] = notes["dflash[drafter=zlab,tokens=8]"]
    assert note.startswith("no noise estimate (1 repeat in B): its benchmark's facts in state.db are unusable")


def test_repeats_rewritten_in_state_db_after_the_report_are_not_used(campaigns: Path, tmp_path: Path) -> None:
    """A state.db whose repeats no longer give the report's medians: the report's medians are compared (no noise
    estimate, never flagged), saying why, rather than numbers the report does not show."""
    stored = slower(host_views(), "bench[drafter=zlab,tokens=4]", 0.5)
    write_run(tmp_path / "20261204-010000-eeeeee", host_views(), stored=stored)
    code, document = as_json(campaigns / "20261201-010000-aaaaaa", tmp_path / "20261204-010000-eeeeee")
    [cell] = [c for c in document["cells"] if c["cell"] == "dflash[drafter=zlab,tokens=4]" and c["concurrency"] == 4]
    [throughput] = [m for m in cell["metrics"] if m["metric"] == "output_throughput"]
    assert code == 0 and throughput["change_pct"] == 0 and throughput["ci_low_pct"] is None
    assert "the repeats of its output_throughput do not give the report's median" in throughput["note"]


def test_the_figure_is_written_where_told_and_by_default_into_the_log_dir(campaigns: Path, tmp_path: Path) -> None:
    figure = tmp_path / "out.png"
    args = ["compare", "20261201", "20261203", "--log-dir", str(campaigns)]
    done = runbook_cli(*args, "--figure", str(figure))
    assert done.returncode == 1 and figure.read_bytes().startswith(b"\x89PNG") and f"figure: {figure}" in done.stdout
    done = runbook_cli(*args, "--json")
    default = campaigns / "compare-20261201-010000-aaaaaa-vs-20261203-010000-cccccc.png"
    assert json.loads(done.stdout)["figure"] == str(default) and default.is_file()
    assert not [p for p in campaigns.glob("*/compare*")]  # no run folder written into
    inside = campaigns / "20261203-010000-cccccc" / ".." / "20261201-010000-aaaaaa" / "report.json"
    done = runbook_cli(*args, "--figure", str(inside))  # nor when told to: the run's report would be a PNG
    assert done.returncode == 2 and "inside a compared run's folder" in done.stderr
    assert json.loads(inside.read_text())  # the report as it was


# ---- the statistics, over random repeats ----------------------------------------------------------------------

repeats = st.lists(st.floats(min_value=1.0, max_value=1e6), min_size=1, max_size=5)


@settings(max_examples=30, deadline=None)
@given(values=repeats, baseline=repeats)
def test_a_run_compared_with_itself_never_flags(values: list[float], baseline: list[float]) -> None:
    """Through the whole reading (report.json written by the step's model, read back, matched): every change 0."""
    with tempfile.TemporaryDirectory() as folder:
        a = write_benchmark(Path(folder) / "a", {1: values, 8: values[::-1]}, {1: baseline})
        comparison = compare.compare(a, a, 0.0)
    assert not comparison.regressed and not comparison.a.only_here
    assert all(m.change_pct == 0 and not m.beyond_noise for c in comparison.cells for m in c.metrics)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    base=st.floats(min_value=1.0, max_value=1e6),
    a=st.lists(st.floats(min_value=-1e-3, max_value=1e-3), min_size=2, max_size=5),
    b=st.lists(st.floats(min_value=-1e-3, max_value=1e-3), min_size=2, max_size=5),
    threshold=st.floats(min_value=0.0, max_value=50.0),
    margin=st.floats(min_value=0.02, max_value=0.5),
)
def test_throughput_scaled_down_beyond_the_threshold_with_tight_repeats_always_flags(
    base: float, a: list[float], b: list[float], threshold: float, margin: float
) -> None:
    scale = (1 - threshold / 100) * (1 - margin)
    first, second = [base * (1 + e) for e in a], [base * scale * (1 + e) for e in b]
    change = compare.metric_change(compare.METRICS[0], first, second, threshold)
    assert change.regression and change.change_pct < -threshold


# ---- the MCP `compare` --------------------------------------------------------------------------------------


def ask_mcp(root: Path, **arguments: Any) -> dict[str, Any]:
    """The `compare` tool's structured answer through the SDK's in-memory client, its server's root `root`."""
    pytest.importorskip("mcp.server.mcpserver", reason="the optional extra runbook[mcp]")
    import asyncio

    from mcp.client.client import Client

    from executor.faces.mcp_server import Launches, Roots, build_server

    async def ask() -> Any:
        async with Client(build_server(Launches(), Roots([root]))) as client:
            return await client.call_tool("compare", arguments)

    result = asyncio.run(ask())
    assert isinstance(result.structured_content, dict), result
    return result.structured_content


def test_the_mcp_tool_answers_as_the_cli_and_only_under_its_roots(campaigns: Path, tmp_path: Path) -> None:
    args = {"run_a": "20261201", "run_b": "20261203", "log_dir": str(campaigns)}
    answer = ask_mcp(campaigns, **args)
    done = runbook_cli("compare", "20261201", "20261203", "--log-dir", str(campaigns), "--no-figure", "--json")
    assert answer.pop("ok") is True and answer.pop("exit_code") == done.returncode == 1
    assert answer == json.loads(done.stdout)
    folders = {"run_a": str(campaigns / "20261201-010000-aaaaaa"), "run_b": str(campaigns / "20261202-010000-bbbbbb")}
    assert ask_mcp(campaigns, **folders)["exit_code"] == 0
    figure = campaigns / "mcp.png"
    assert ask_mcp(campaigns, **args, figure=str(figure))["figure"] == str(figure) and figure.is_file()
    for refused in ({**args, "figure": str(tmp_path / "x.png")}, {**folders, "run_b": str(tmp_path)}):
        answer = ask_mcp(campaigns, **refused)
        assert answer["ok"] is False and answer["exit_code"] == 2 and "outside the server's roots" in answer["error"]
    answer = ask_mcp(campaigns, **args, figure=str(campaigns / "20261201-010000-aaaaaa" / "report.json"))
    assert answer["exit_code"] == 2 and "inside a compared run's folder" in answer["error"]
    answer = ask_mcp(campaigns, **args, threshold=-1)
    assert answer == {"ok": False, "exit_code": 2, "error": "compare: invalid arguments: threshold"}


def test_a_figure_of_cells_with_no_metric_compared_is_drawn_saying_so(tmp_path: Path) -> None:
    from executor.faces.compare_figure import draw

    side = compare.RunSide(run="a", run_dir="a", kind="benchmark", only_here=[])
    unknown = {m.name: "a repeat measured 0: no ratio" for m in compare.METRICS}
    cell = compare.CellChange(
        cell="dflash", workload="random-ids", category=None, concurrency=1, metrics=[], unknown=unknown
    )
    comparison = compare.Comparison(
        a=side,
        b=side,
        threshold_pct=5.0,
        confidence=0.95,
        method="",
        cells=[cell],
        regressions=[],
        regressed=False,
        figure=None,
    )
    draw(comparison, tmp_path / "f.png")  # every metric of every cell not compared: one empty panel, no ValueError
    assert (tmp_path / "f.png").read_bytes().startswith(b"\x89PNG")


def test_two_run_folders_by_path_draw_no_figure_into_an_unrelated_logs_folder(
    campaigns: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """README: the figure goes `beside the run folders`, and none `where --log-dir is no folder, as for two run
    folders given by path`. From a checkout's root (its logs/ is tracked), `runbook compare RUN_A_DIR RUN_B_DIR` puts
    it into that logs/, beside neither run."""
    (tmp_path / "logs").mkdir()
    monkeypatch.chdir(tmp_path)
    done = runbook_cli("compare", *(str(campaigns / r) for r in ("20261201-010000-aaaaaa", "20261203-010000-cccccc")))
    assert done.returncode == 1, done.stderr
    assert not list((tmp_path / "logs").iterdir()), done.stdout.splitlines()[-1]
    assert (campaigns / "compare-20261201-010000-aaaaaa-vs-20261203-010000-cccccc.png").is_file()  # beside them


def test_an_unwritable_folder_beside_the_runs_costs_the_default_figure_not_the_verdict(
    campaigns: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two run folders by path in a folder this user may not write (as root no mode forbids it: the figure's
    writer refuses as the file system would)."""
    from executor.faces import compare_figure

    def refused(_comparison: Any, figure: Path) -> None:
        raise PermissionError(13, "Permission denied", str(figure))

    monkeypatch.setattr(compare_figure, "draw", refused)
    done = runbook_cli("compare", *(str(campaigns / r) for r in ("20261201-010000-aaaaaa", "20261203-010000-cccccc")))
    assert done.returncode == 1, done.stderr  # 20261203 regressed (test_the_figure_is_written_where_told_...)
    assert "regression(s) beyond" in done.stdout, done.stdout


def test_a_run_kept_inside_the_other_compares_with_its_default_figure_outside_both(tmp_path: Path) -> None:
    a = write_benchmark(tmp_path / "a", {1: [300.0, 302.0, 298.0]})
    b = write_benchmark(a / "rerun", {1: [300.0, 302.0, 298.0]})
    done = runbook_cli("compare", str(a), str(b))
    assert done.returncode == 0, done.stderr
    assert not list(a.glob("compare-*.png")) and not list(b.glob("compare-*.png"))
