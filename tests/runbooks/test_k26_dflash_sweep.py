"""The flagship campaign, unedited, end to end as a user runs it: `runbook demo --sweep` on the test host
whose SGLang is the 0.5.23 release (no DDTREE), so the DDTREE cells are skipped with the reason and the
DFLASH ones run (one launch each), the report names the best configuration per concurrency and the launch
command to paste, and a `--resume` of the finished run runs nothing. (About 5 minutes with its two workloads,
SPEED-Bench's mixed prompts and random ids: the campaign's runs of bench_serving are the suite's longest test;
the full grid with DDTREE is `runbook demo --sweep`.)
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import runbook_cli
from tests.documents import schema_problems

SWEEP = Path(__file__).resolve().parents[2] / "runbooks" / "k26_dflash_sweep.yaml"


@pytest.mark.timeout(1500)
@pytest.mark.e2e
@pytest.mark.xdist_group("timing")
def test_the_campaign_on_a_release_sglang_runs_the_dflash_cells_skips_ddtree_and_recommends_a_launch(
    tmp_path: Path,
) -> None:
    logs = tmp_path / "logs"
    done = runbook_cli("demo", "--sweep", "--sglang", "release", "--log-dir", str(logs), "--json", timeout=1500)
    assert done.returncode == 0, done.stderr[-3000:]
    events = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    run_id = events[0]["run_id"]
    status = runbook_cli("status", run_id, "--log-dir", str(logs), "--json")
    steps = {r["step"]: r for r in json.loads(status.stdout)["steps"]}
    ddtree = [s for s in steps if s.startswith("deploy_dflash[") and "ddtree" in s]
    assert len(ddtree) == 6
    for step in ddtree:
        assert steps[step]["status"] == "skipped"
        assert "is false: the probed SGLang has no DDTREE" in steps[step]["message"]
    dflash = [s for s in steps if s.startswith("deploy_dflash[") and "spec=dflash" in s]
    assert len(dflash) == 6 and all(steps[s]["status"] == "passed" and not steps[s]["facts"]["reused"] for s in dflash)
    # downloads and verification once per drafter on the host, reused across its cells
    assert sorted(s for s in steps if s.startswith("verify_drafter")) == [
        "verify_drafter[drafter=tmp-long]",
        "verify_drafter[drafter=zlab]",
    ]
    progress = [e for e in events if e["event"] == "cells_progress"][-1]
    assert progress["launches"]["done"] == 6 and progress["cells"]["skipped"] == 6
    assert progress["cells"]["passed"] == 6 and progress["cells"]["failed"] == 0

    run_dir = logs / run_id
    report: dict[str, Any] = json.loads((run_dir / "report.json").read_text())
    assert schema_problems("report", report) == []  # the campaign's document, as `runbook schema` says
    assert {p.name for p in run_dir.glob("campaign_*.png")} >= {"campaign_throughput.png", "campaign_pareto.png"}
    campaign = report["campaign"]
    facts = steps["report"]["facts"]
    # each workload compared on its own: SPEED-Bench's mixed prompts, then random ids, labelled
    assert [c["workload"] for c in facts["comparisons"]] == ["speed-bench/mixed", "random-ids"]
    assert facts["best"] is None  # no single answer across the two workloads
    best = facts["comparisons"][0]["best"]
    assert set(best) == {"1", "4", "16", "32"}
    suffix = " (speed-bench/mixed)"
    assert all(name.endswith(suffix) for name in best.values())
    assert all(name.startswith(("sweep[", "benchmark_baseline ")) for name in best.values())
    # the best at each concurrency is a cell that ran, and the command recommended for it is its own launch
    comparison = campaign["comparisons"][0]
    assert comparison["workload"] == "speed-bench/mixed"
    covered = [c for entry in comparison["recommended"] for c in entry["concurrencies"]]
    assert sorted(covered) == [1, 4, 16, 32]
    for entry in comparison["recommended"]:
        assert entry["best"] == best[str(entry["concurrencies"][0])]
        name = entry["best"].removesuffix(suffix)
        deploy = "deploy_baseline" if name == "benchmark_baseline" else "deploy_dflash" + name[5:]
        assert "spec=ddtree" not in deploy
        assert shlex.split(entry["command"]) == steps[deploy]["facts"]["argv"]
    printed = runbook_cli("report", str(run_dir))
    assert printed.returncode == 0, printed.stderr
    assert "Best configuration per concurrency" in printed.stdout and "Recommended launch command" in printed.stdout
    assert "the probed SGLang has no DDTREE" in printed.stdout  # the skipped cells, with the reason

    # the demo ran with a token (the local Hub's); a resume without one would run the Hub steps again
    token = {"HF_TOKEN": "hf_the_secret_counts_by_name_not_by_value"}
    again = runbook_cli("run", str(SWEEP), "--resume", run_id, "--log-dir", str(logs), "--json", env=token, timeout=600)
    assert again.returncode == 0, again.stderr[-2000:]
    resumed = [json.loads(line) for line in again.stdout.splitlines() if line.startswith("{")]
    assert not [e for e in resumed if e["event"] == "command_finished"]
