"""The MCP `report` through the SDK's in-memory client: for a benchmark's report and a campaign's, a summary
within the cap (headline, speedup or best configuration per concurrency, verdicts, sections, figures, the whole
report's paths), each section's rows on request, page by page within the cap, and a real error an `ok: false`
answer. The reports are the ones the steps write (tests/steps' documents), in run folders made here."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import csv
import io
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("mcp.server.mcpserver", reason="the optional extra runbook[mcp]")

from mcp.client.client import Client

from executor.faces.cli import main
from executor.faces.mcp_server import RESULT_CAP, Launches, Roots, build_server
from steps.benchmark_figures import write_report
from tests.clirun import runbook_cli
from tests.steps.test_benchmark_report import ACCEPTANCE, BASELINE, DFLASH, PROVENANCE
from tests.steps.test_campaign_report import ZLAB_4, host_views, write_campaign

BOOK = "name: one\nhosts:\n  box: {address: local}\nsteps:\n  - {id: a, kind: shell, script: echo a}\n"


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding `benchmark/` and `campaign/` (the reports the steps write, with their figures), and
    logs/ with one finished run (`address: local`) that wrote no report."""
    folder = tmp_path_factory.mktemp("site")
    write_report(folder / "benchmark", BASELINE, DFLASH, PROVENANCE, ACCEPTANCE)
    write_campaign(folder / "campaign", host_views("gpu1", "NVIDIA H200") + host_views("gpu2", "NVIDIA B200", 2.0))
    (folder / "one.yaml").write_text(BOOK)
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        assert main(["run", str(folder / "one.yaml"), "--log-dir", str(folder / "logs")]) == 0
    return folder


def report(root: Path, **arguments: Any) -> dict[str, Any]:
    """The `report` tool's structured result through the SDK's client, checked to be within the cap (its text
    block the same JSON)."""

    async def ask() -> Any:
        async with Client(build_server(Launches(), Roots([root]))) as client:
            return await client.call_tool("report", arguments)

    result = asyncio.run(ask())
    assert not result.is_error and isinstance(result.structured_content, dict), result
    (block,) = result.content
    assert len(block.text.encode()) <= RESULT_CAP and json.loads(block.text) == result.structured_content
    return result.structured_content


def document(run_dir: Path) -> dict[str, Any]:
    return dict(json.loads((run_dir / "report.json").read_text()))


def test_a_benchmark_report_answers_its_speedup_and_verdicts_in_short(site: Path) -> None:
    run_dir = site / "benchmark"
    summary = report(site, run_dir=str(run_dir))
    assert (summary["ok"], summary["kind"], summary["cap"]) == (True, "benchmark", RESULT_CAP)
    assert summary["headline"] == (
        "dflash vs baseline: 1.50x to 3.10x the output throughput (mean 2.40x) at concurrency 1, 4, 16"
    )
    assert summary["speedup"]["by_concurrency"] == {"1": 3.1, "4": 2.6, "16": 1.5}
    verdicts = summary["verdicts"]
    assert verdicts["speculation_on"] is True and verdicts["noisy"] == {"baseline": [], "candidate": []}
    assert (verdicts["lossless"]["math"]["identical"], verdicts["lossless"]["math"]["compared"]) == (19, 20)
    assert summary["acceptance"]["math"] == {"mean": 5.3, "weighted_mean": 5.6}
    whole = document(run_dir)
    assert summary["sections"] == [{"name": t["title"], "rows": len(t["rows"])} for t in whole["tables"]]
    assert [figure["path"] for figure in summary["figures"]] == [str(run_dir / f["path"]) for f in whole["figures"]]
    assert all(Path(figure["path"]).is_file() for figure in summary["figures"])
    assert (summary["report_json"], summary["report_md"]) == (str(run_dir / "report.json"), str(run_dir / "report.md"))
    assert summary["notes"] == whole["notes"] and "provenance" not in summary  # the provenance is in its sections


def test_a_campaign_report_answers_its_best_configurations_and_counts_in_short(site: Path) -> None:
    run_dir = site / "campaign"
    summary = report(site, run_dir=str(run_dir))
    assert summary["kind"] == "campaign" and summary["headline"].startswith("8 cells: 4 passed, 2 failed, 2 skipped")
    crossover = "8x NVIDIA H200, random-ids, 256 in / 64 out: speculation stops paying at concurrency 32"
    assert crossover in summary["headline"]
    h200 = summary["best"][0]
    assert h200["gpus"] == "8x NVIDIA H200" and h200["crossover"]["concurrency"] == 32
    assert (h200["best"][0]["concurrency"], h200["best"][0]["best"]) == (1, f"{ZLAB_4}@gpu1")
    assert h200["recommended"][0]["command"].startswith("/venv/bin/python -m sglang.launch_server")
    assert summary["verdicts"]["counts"]["cells"] == 8 and len(summary["verdicts"]["failed"]) == 4
    assert [s["name"] for s in summary["sections"]] == [t["title"] for t in document(run_dir)["tables"]]
    assert [Path(f["path"]).name for f in summary["figures"]] == [
        "campaign_throughput.png",
        "campaign_pareto.png",
        "campaign_acceptance.png",
    ]


def test_a_section_comes_page_by_page_within_the_cap_and_a_huge_campaign_s_summary_fits(
    site: Path, tmp_path: Path
) -> None:
    """A campaign of many comparisons and cells: its report.json is far over the cap, its summary is not (the
    best configurations cut, saying how many), and a table of thousands of rows comes whole over its pages."""
    whole = document(site / "campaign")
    campaign_table = next(t for t in whole["tables"] if t["title"].startswith("Output throughput and latency"))
    campaign_table["rows"] *= 50
    whole["campaign"]["comparisons"] *= 100
    run_dir = tmp_path / "huge"
    run_dir.mkdir()
    (run_dir / "report.json").write_text(json.dumps(whole))
    assert len(json.dumps(whole)) > 5 * RESULT_CAP
    summary = report(tmp_path, run_dir=str(run_dir))
    assert summary["ok"] and summary["truncated"] and summary["best_left_out"] > 0
    assert len(summary["best"]) + summary["best_left_out"] == 200 and summary["sections_left_out"] == 0
    rows: list[list[str]] = []
    page: dict[str, Any] = {"next_offset": 0}
    while page["next_offset"] is not None:
        page = report(tmp_path, run_dir=str(run_dir), section="output throughput and", offset=page["next_offset"])
        assert page["section"] == campaign_table["title"] and page["rows_total"] == len(campaign_table["rows"])
        rows += page["rows"]
    assert rows == campaign_table["rows"] and len(rows) == 1200


def test_a_run_id_under_log_dir_or_the_latest_run_names_the_run_as_for_the_other_tools(
    site: Path, tmp_path: Path
) -> None:
    logs = tmp_path / "logs"
    shutil.copytree(site / "logs", logs)
    [run_dir] = logs.iterdir()
    shutil.copy(site / "benchmark" / "report.json", run_dir)
    by_folder = report(tmp_path, run_dir=str(run_dir))
    assert by_folder["kind"] == "benchmark" and by_folder["report_json"] == str(run_dir / "report.json")
    assert report(tmp_path, run_id=run_dir.name[:12], log_dir=str(logs)) == by_folder
    assert report(tmp_path, log_dir=str(logs)) == by_folder


def test_a_real_error_is_an_ok_false_answer(site: Path, tmp_path: Path) -> None:
    """No such run, a run without a report, a section the report has not, a tampered report.json: `ok: false`
    with the CLI's exit code and one line saying why; a row over the cap alone comes with its cells cut."""
    logs = site / "logs"
    [run_dir] = logs.iterdir()
    no_run = report(site, run_id="20991231-nope", log_dir=str(logs))
    assert no_run == {"ok": False, "exit_code": 2, "error": f"no run 20991231-nope in {logs}"}
    no_report = report(site, run_dir=str(run_dir))
    assert not no_report["ok"] and "no report.json (a run folder without a report" in no_report["error"]
    no_section = report(site, run_dir=str(site / "campaign"), section="Provenance")
    assert no_section["exit_code"] == 2 and "several sections start with 'Provenance'" in no_section["error"]
    assert "Provenance: GPUs (host gpu2)" in no_section["error"]  # the sections it has
    tampered = copy.deepcopy(document(site / "campaign"))
    tampered["campaign"]["counts"]["cells"] = "many"
    (tmp_path / "report.json").write_text(json.dumps(tampered))
    refused = report(tmp_path, run_dir=str(tmp_path))
    assert (
        refused["exit_code"] == 2
        and "not a campaign report as its step writes one: campaign.counts.cells" in (refused["error"])
    )
    huge_cell = copy.deepcopy(document(site / "benchmark"))
    huge_cell["tables"][0]["rows"][0][0] = "x" * (2 * RESULT_CAP)
    (tmp_path / "report.json").write_text(json.dumps(huge_cell))
    first = report(tmp_path, run_dir=str(tmp_path), section="Acceptance length per prompt set")
    assert first["cells_cut"] and len(first["rows"]) == 1 and first["next_offset"] == 1
    assert first["rows"][0][1:] == huge_cell["tables"][0]["rows"][0][1:]


def test_a_campaign_whose_failed_cells_say_much_still_answers_its_summary(site: Path, tmp_path: Path) -> None:
    """Twenty failed cells whose reasons carry a server's long error text, and long notes: the summary comes within
    the cap with each of those texts cut (`texts_cut`), not refused as over it."""
    whole = document(site / "campaign")
    reason = "deploy: the server exited during start-up:\n" + "Traceback line\n" * 300
    failed = whole["campaign"]["failed"][0]
    whole["campaign"]["failed"] = [failed | {"name": f"cell{n}", "reason": reason} for n in range(40)]
    whole["notes"] = ["n" * 30_000] * 3
    (tmp_path / "report.json").write_text(json.dumps(whole))
    summary = report(tmp_path, run_dir=str(tmp_path))
    assert summary["ok"] and summary["texts_cut"] and summary["verdicts"]["failed_left_out"] == 20
    assert [each["name"] for each in summary["verdicts"]["failed"]] == [f"cell{n}" for n in range(20)]
    assert all(reason.startswith(each["reason"]) and each["reason"] for each in summary["verdicts"]["failed"])
    assert all(note and note != "n" * 30_000 for note in summary["notes"])


def test_a_report_whose_markdown_and_figures_were_not_written_says_so(site: Path, tmp_path: Path) -> None:
    """A run a full disk stopped after report.json: the summary no longer hands over report.md's and the figures'
    paths as if they were there (`report_md_missing`, each figure's `missing`)."""
    shutil.copy(site / "benchmark" / "report.json", tmp_path)
    shutil.copy(site / "benchmark" / "pareto.png", tmp_path)
    summary = report(tmp_path, run_dir=str(tmp_path))
    assert summary["ok"] and summary["report_md_missing"] is True
    assert {Path(f["path"]).name: f.get("missing", False) for f in summary["figures"]} == {
        "speedup.png": True,
        "pareto.png": False,
        "acceptance.png": True,
    }
    assert "report_md_missing" not in report(site, run_dir=str(site / "benchmark"))


def test_format_csv_pages_the_cli_s_tidy_rows_within_the_cap(site: Path, tmp_path: Path) -> None:
    """`format: csv`: the rows `runbook report --format csv` prints (a campaign of many cells, far over the cap),
    page by page; with a section too it is refused, the two being different tables."""
    whole = document(site / "campaign")
    whole["campaign"]["cells"] *= 16
    run_dir = tmp_path / "many"
    run_dir.mkdir()
    (run_dir / "report.json").write_text(json.dumps(whole))
    done = runbook_cli("report", str(run_dir), "--format", "csv")
    header, *printed = list(csv.reader(io.StringIO(done.stdout)))
    assert done.returncode == 0 and len(done.stdout) > RESULT_CAP
    rows: list[list[str]] = []
    page: dict[str, Any] = {"next_offset": 0}
    while page["next_offset"] is not None:
        page = report(tmp_path, run_dir=str(run_dir), format="csv", offset=page["next_offset"])
        assert page["columns"] == header and page["rows_total"] == len(printed) and "cells_cut" not in page
        rows += page["rows"]
    assert rows == printed
    both = report(tmp_path, run_dir=str(run_dir), format="csv", section="Provenance")
    assert both["exit_code"] == 2 and "section 'Provenance' or format csv, not both" in both["error"]
