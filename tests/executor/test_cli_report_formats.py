"""`runbook report RUN --format text|json|csv` through the CLI (issue 30, item 6): the csv is a row per cell x
workload x concurrency with the provenance columns, for a benchmark's report and a campaign's as their steps write
them (tests/steps' documents); json is report.json; `--json` is `--format json`; hostile labels reach a
spreadsheet as data."""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import shlex
from pathlib import Path
from typing import Any

import pytest

from executor.faces.cli import EXIT_BROKEN_PIPE, main
from executor.faces.report_csv import CELL_MAX_CHARS, COLUMNS
from steps.benchmark_report import build_report
from steps.provenance import Measured, Sources, build
from tests.clirun import runbook_cli
from tests.executor.test_cli_report import write
from tests.steps.test_benchmark_report import ACCEPTANCE, BASELINE, DFLASH, bench_run, deployed, side, side_of
from tests.steps.test_benchmark_workloads import RANDOM, SPEED, exact, runs_of
from tests.steps.test_benchmark_workloads import step as workload_step
from tests.steps.test_campaign_report import host_views, write_campaign

#: The model the benchmark's servers serve, downloaded by a step that names its repo, revision and commit.
DOWNLOAD = {"repo": "org/model", "revision": "v1", "commit": "c0ffee" * 6 + "c0ff", "local_dir": "/models/m"}
COMMAND = "python3 -m sglang.bench_serving --dataset-name random-ids --max-concurrency {c} --seed {s}"


def provenance(baseline: Any, candidate: Any, files: tuple[str | None, str | None] = (None, None)) -> Any:
    """The benchmark's provenance, its model downloaded (so its revision and commit are known), with the
    per-request records files of each side."""
    sources = Sources("gpu", {}, {"download": DOWNLOAD}, {}, {"deploy_b": deployed(2), "deploy_c": deployed(2)})
    sides = [Measured(baseline.label, baseline.step, "deploy_b", baseline.runs, files[0])]
    sides.append(Measured(candidate.label, candidate.step, "deploy_c", candidate.runs, files[1]))
    return build(sources, sides, "2026-12-01T18:00:00+00:00", "eval", ACCEPTANCE.model_dump())


def with_commands(each: Any) -> Any:
    """A side whose runs' commands name their dataset, concurrency and seed, as the step's do."""
    runs = [r.model_copy(update={"command": COMMAND.format(c=r.max_concurrency, s=r.seed)}) for r in each.runs]
    return each.model_copy(update={"runs": runs})


def write_json(run_dir: Path, report: Any) -> None:
    """The report's report.json alone, as the step writes it (its figures are no part of the rows: drawing them
    takes seconds)."""
    run_dir.mkdir()
    (run_dir / "report.json").write_text(report.model_dump_json())


def recorded(view: Any) -> Any:
    """A campaign's benchmark or eval step as it ran with its per-request records."""
    if view.kind not in ("benchmark", "eval_acceptance") or view.facts is None:
        return view
    return dataclasses.replace(
        view, facts=view.facts | {"requests_file": f"hosts/{view.host}/requests/{view.step}.jsonl"}
    )


#: A campaign on two hosts (tests/steps/test_campaign_report.py's), its steps with their per-request records.
CAMPAIGN = [recorded(view) for view in host_views("gpu1", "NVIDIA H200") + host_views("gpu2", "NVIDIA B200", 2.0)]


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`benchmark/` and `campaign/`: the reports the steps write (the campaign's with its figures)."""
    folder = tmp_path_factory.mktemp("site")
    baseline, candidate = with_commands(BASELINE), with_commands(DFLASH)
    origin = provenance(baseline, candidate, ("hosts/gpu/requests/b.jsonl", "hosts/gpu/requests/c.jsonl"))
    write_json(folder / "benchmark", build_report(baseline, candidate, origin, ACCEPTANCE))
    write_campaign(folder / "campaign", CAMPAIGN)
    return folder


def csv_rows(run_dir: Path, *options: str) -> list[dict[str, str]]:
    """`runbook report RUN_DIR --format csv` read back with the csv module: its header is COLUMNS."""
    done = runbook_cli("report", str(run_dir), "--format", "csv", *options)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    reader = csv.DictReader(io.StringIO(done.stdout))
    assert reader.fieldnames == COLUMNS
    return list(reader)


def report_json(run_dir: Path) -> dict[str, Any]:
    return dict(json.loads((run_dir / "report.json").read_text()))


def test_a_benchmark_report_is_a_row_per_side_and_concurrency_with_what_its_numbers_are_of(site: Path) -> None:
    document = report_json(site / "benchmark")
    rows = csv_rows(site / "benchmark")
    data = document["data"]
    expected = [
        (role, data[role]["label"], str(p["max_concurrency"]), str(p["output_throughput"]["median"]))
        for role in ("baseline", "candidate")
        for p in data[role]["points"]
    ]
    assert [(r["role"], r["cell"], r["concurrency"], r["output_throughput"]) for r in rows] == expected
    assert len(rows) == 6 and {r["workload"] for r in rows} == {"random-ids"}
    assert [r["speedup"] for r in rows] == [""] * 3 + [str(v) for v in data["speedup"]["by_concurrency"].values()]
    deployed = {d["side"]: d for d in document["provenance"]["deployments"]}
    runs = {(b["side"], r["concurrency"]): r for b in document["provenance"]["benchmarks"] for r in b["runs"]}
    for row in rows:
        server = deployed[row["cell"]]
        run = runs[(row["cell"], int(row["concurrency"]))]
        assert (row["sglang_version"], row["server_argv"]) == (server["server_version"], shlex.join(server["argv"]))
        assert (row["model"], row["model_revision"], row["model_commit"]) == ("org/model", "v1", DOWNLOAD["commit"])
        assert (row["client"], row["dataset"], row["client_command"]) == (
            "sglang.bench_serving",
            "random-ids",
            run["command"],
        )
        assert row["seed_first"] == row["seed_last"] == str(run["seed"]) and row["host"] == "gpu"
        assert row["generated_at"] == document["provenance"]["generated_at"]
    assert {r["requests_file"] for r in rows} == {"hosts/gpu/requests/b.jsonl", "hosts/gpu/requests/c.jsonl"}


def test_a_campaign_report_is_a_row_per_cell_and_concurrency_and_one_for_a_cell_that_measured_none(
    site: Path,
) -> None:
    campaign = report_json(site / "campaign")["campaign"]
    rows = csv_rows(site / "campaign")
    expected = [
        (each["name"], each["host"], each["status"], str(p["concurrency"]) if p else "")
        for each in campaign["cells"]
        for p in each["points"] or [None]
    ]
    assert [(r["cell"], r["host"], r["status"], r["concurrency"]) for r in rows] == expected
    failed = [r for r in rows if r["status"] != "passed"]
    assert failed and all(r["reason"] and r["output_throughput"] == "" for r in failed)
    assert {r["host"]: r["gpu_model"] for r in rows} == {"gpu1": "NVIDIA H200", "gpu2": "NVIDIA B200"}
    for row, each in zip(rows, [c for c in campaign["cells"] for _ in c["points"] or [None]], strict=True):
        point = next((p for p in each["points"] if str(p["concurrency"]) == row["concurrency"]), None)
        if point is not None:
            assert row["output_throughput"] == str(point["output_throughput"][0])
            assert row["speedup"] == ("" if point["speedup"] is None else str(point["speedup"]))
        assert row["role"] == ("baseline" if each["group"] is None else "candidate")
        assert row["sglang_version"] == (each["launch"]["server_version"] or "")


def test_json_is_report_json_and_the_json_switch_is_its_short_form(site: Path) -> None:
    for kind in ("benchmark", "campaign"):
        long = runbook_cli("report", str(site / kind), "--format", "json")
        short = runbook_cli("report", str(site / kind), "--json")
        both = runbook_cli("report", str(site / kind), "--json", "--format", "json")
        assert long.returncode == short.returncode == both.returncode == 0
        assert json.loads(long.stdout) == report_json(site / kind)
        assert long.stdout == short.stdout == both.stdout
    text, default = (
        runbook_cli("report", str(site / "benchmark"), "--format", "text"),
        runbook_cli("report", str(site / "benchmark")),
    )
    assert text.stdout == default.stdout and "Provenance" in text.stdout


@pytest.mark.parametrize(
    ("options", "said"),
    [
        (["--format", "xml"], "argument --format: invalid choice: 'xml'"),
        (["--json", "--format", "csv"], "--json is short for --format json; it contradicts --format csv"),
        (["--format", "text", "--json"], "it contradicts --format text"),
    ],
)
def test_a_bad_or_contradicting_format_is_exit_2_saying_why(site: Path, options: list[str], said: str) -> None:
    done = runbook_cli("report", str(site / "benchmark"), *options)
    assert done.returncode == 2 and said in done.stderr and done.stdout == ""
    assert "Traceback" not in done.stderr


def test_the_text_names_each_per_request_records_file(site: Path) -> None:
    done = runbook_cli("report", str(site / "benchmark"))
    folder = site / "benchmark" / "hosts" / "gpu" / "requests"
    for step, file in (("benchmark_baseline", "b.jsonl"), ("benchmark_dflash", "c.jsonl")):
        assert f"per-request records of {step}: {folder / file}" in done.stdout


HOSTILE = {
    '=HYPERLINK("http://x.example","a")': '\'=HYPERLINK("http://x.example","a")',
    "+1+1": "'+1+1",
    "-2": "'-2",
    "@SUM(A1)": "'@SUM(A1)",
}


def test_hostile_labels_reach_a_spreadsheet_as_data_on_one_line_and_cut(tmp_path: Path) -> None:
    """A label a spreadsheet would evaluate is prefixed with `'`, a line break is written as an escape (one line
    per row), and a label of 10 000 characters is cut to CELL_MAX_CHARS saying how much was left."""
    labels = [*HOSTILE, "two\nlines\r", "x" * 10_000]
    rows: list[dict[str, str]] = []
    for first, second in zip(labels[::2], labels[1::2], strict=True):
        baseline = with_commands(side(first, {1: 100.0}, "benchmark_baseline"))
        candidate = with_commands(side(second, {1: 150.0}, "benchmark_dflash"))
        run_dir = tmp_path / f"run{len(rows)}"
        write_json(run_dir, build_report(baseline, candidate, provenance(baseline, candidate)))
        done = runbook_cli("report", str(run_dir), "--format", "csv")
        assert done.stdout.count("\n") == 3  # the header and two rows: no line break inside a cell
        rows += csv_rows(run_dir)
    cells = [row["cell"] for row in rows]
    assert cells[:4] == list(HOSTILE.values())
    assert cells[4] == "two\\x0alines\\x0d"
    assert cells[5] == "x" * CELL_MAX_CHARS + "... (5,904 more characters)"
    assert not any(value.startswith(("=", "+", "-", "@")) for row in rows for value in row.values())


def test_a_reader_that_goes_away_ends_the_csv_quietly(site: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    class Closed(io.StringIO):
        def write(self, text: str) -> int:
            raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr("sys.stdout", Closed())
    assert main(["report", str(site / "campaign"), "--format", "csv"]) == EXIT_BROKEN_PIPE


def test_a_benchmark_of_several_workloads_is_a_row_per_workload_category_and_concurrency(tmp_path: Path) -> None:
    """SPEED-Bench's categories and random ids (tests/steps/test_benchmark_workloads.py's runs): each row its own
    workload and category, its speedup there (not the worst one's), and the seed of its own run."""
    slices = ["speed/low_entropy", "speed/mixed", "random-ids"]
    workloads = workload_step(SPEED, RANDOM).resolved_workloads(True)
    sides = []
    for label, step, throughputs in (
        ("baseline", "benchmark_baseline", (100.0, 100.0, 100.0)),
        ("dflash", "d", (250.0, 80.0, 110.0)),
    ):
        runs = runs_of(dict(zip(slices, throughputs, strict=True)))
        runs = [
            run.model_copy(update={"seed": 10 + n, "command": COMMAND.format(c=4, s=10 + n)})
            for n, run in enumerate(runs)
        ]
        sides.append(side_of(label, runs, step).model_copy(update={"workloads": workloads}))
    baseline, candidate = sides
    write_json(tmp_path / "run", build_report(baseline, candidate, provenance(baseline, candidate)))
    rows = csv_rows(tmp_path / "run")
    assert [(r["cell"], r["workload"], r["workload_category"], r["concurrency"]) for r in rows] == [
        (label, *key.partition("/")[::2], "4") for label in ("baseline", "dflash") for key in slices
    ]
    assert [r["speedup"] for r in rows[3:]] == ["2.5", "0.8", "1.1"]
    assert [r["seed_first"] for r in rows] == [r["seed_last"] for r in rows] == ["10", "11", "12"] * 2


def test_a_report_of_another_writer_has_no_rows_exit_2_saying_so(tmp_path: Path) -> None:
    """Its tables are shown (`--format text`), but nothing says which of its cells are measurements."""
    write(tmp_path / "run", {"title": "mine", "notes": [], "tables": [], "figures": []})
    done = runbook_cli("report", str(tmp_path / "run"), "--format", "csv")
    assert done.returncode == 2 and done.stdout == "" and "Traceback" not in done.stderr
    said = f"{tmp_path / 'run' / 'report.json'}: neither a benchmark's report nor a campaign's: it has no rows to tidy"
    assert said in done.stderr
    assert runbook_cli("report", str(tmp_path / "run")).returncode == 0


def test_a_campaign_names_each_cell_s_per_request_records(site: Path) -> None:
    """The benchmarks' records through each host's provenance (and the csv's `requests_file`), the evals' through
    the cells' acceptance: `runbook report` names every one, each once."""
    shown = runbook_cli("report", str(site / "campaign")).stdout
    named = [(v.host, v.step) for v in CAMPAIGN if v.kind in ("benchmark", "eval_acceptance") and v.facts is not None]
    assert len(named) == 10  # per host: the baseline's benchmark, and two cells' eval and benchmark
    for host, step in named:
        path = site / "campaign" / "hosts" / host / "requests" / f"{step}.jsonl"
        assert shown.count(f"per-request records of {step}: {path}") == 1
    rows = [row for row in csv_rows(site / "campaign") if row["status"] == "passed"]
    benchmarks = {f"hosts/{host}/requests/{step}.jsonl" for host, step in named if not step.startswith("eval")}
    assert {row["requests_file"] for row in rows} == benchmarks


def test_a_row_gives_the_exact_acceptance_length_beside_the_running_average(tmp_path: Path) -> None:
    """`accept_length` is the client's running average (an estimate); `accept_length_exact` the median over the
    repeats of the server's counters, empty where no run has one (the baseline)."""
    lengths = {1: (3.0, 5.0, 4.0), 4: (2.0, 2.5, 3.0)}
    runs = [
        run.model_copy(update={"acceptance": exact(lengths[run.max_concurrency][run.repeat - 1], 1.5)})
        for run in (bench_run(c, 300.0 * c, r, accept_length=1.5) for c in lengths for r in (1, 2, 3))
    ]
    baseline = side_of("baseline", [bench_run(c, 100.0 * c, r) for c in lengths for r in (1, 2, 3)], "b")
    candidate = side_of("dflash", runs, "c")
    write_json(tmp_path / "run", build_report(baseline, candidate, provenance(baseline, candidate), ACCEPTANCE))
    rows = csv_rows(tmp_path / "run")
    assert [(r["cell"], r["concurrency"], r["accept_length"], r["accept_length_exact"]) for r in rows] == [
        ("baseline", "1", "1.0", ""),
        ("baseline", "4", "1.0", ""),
        ("dflash", "1", "1.5", "4.0"),
        ("dflash", "4", "1.5", "2.5"),
    ]
