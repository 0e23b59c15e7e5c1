"""The flagship campaign with `strategy: search` (`runbook demo --sweep --search`'s copy of it) on the test host, killed
with SIGKILL mid-search and resumed: the resumed run launches nothing the killed one had decided (measured or pruned),
the search stays within its budget (5: with the baseline's, half the grid's 13 launches), each launch's evaluation is
screened (its first prompts, checked against the baseline's answers to them), every configuration not launched is
recorded with why, the report's account gives launches and GPU time against the grid's, and its best configuration
per concurrency is one the grid measured once on the same stand-in (tests/executor/runbook/search_landscapes/
standin_flagship.json) ranks near its best.

The stand-in's numbers move with the machine's load (its batches form in real time): two runs on a loaded 2-core
machine differed by up to 17% at a point, so this run's answers are checked against the recorded grid within NEAR,
not its tolerance, and it takes its turn with the e2e tier (xdist group "timing"): run beside another campaign's
e2e (CI of stop 34), its answer at speed-bench/mixed c=32 was one the recorded grid has 28% below its best.
The bar itself (the grid's best or a tie in every band, at most 5 of 12 launched) is proven on the recorded
landscapes (tests/executor/runbook/test_search.py), where the numbers hold still.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from executor.runbook.search import UNPROVEN
from sandbox.demo import SWEEP_RUNBOOK, demo_site, searching_copy
from tests.conftest import runbook_cli

LANDSCAPES = Path(__file__).resolve().parents[1] / "executor" / "runbook" / "search_landscapes"
GRID = LANDSCAPES / "standin_flagship.json"
NEAR = 0.2  # of the recorded grid's best: the stand-in's load-dependent variation (module docstring), with room
#: the same for `headroom` at concurrency 32, whose points a live grid measured from 14% below their recording (z-lab's
#: DFLASH 8: 261k tok/s against 304k) to 6% above (tmp-long's: 241k against 228k), reordering the four DFLASH 4-8
NEAR_HEADROOM = 0.3


def _grid_answers(recorded: Path = GRID, near: float = NEAR) -> dict[tuple[str, int], set[str]]:
    """(workload, concurrency) -> the configurations the recorded grid measured within `near` of its best."""
    grid = json.loads(recorded.read_text())
    answers: dict[tuple[str, int], set[str]] = {}
    for band in grid["baseline"]:
        workload, _, level = band.rpartition(" c=")
        medians = {"baseline": grid["baseline"][band][0]}
        medians |= {name.removeprefix("deploy_dflash"): m[band][0] for name, m in grid["configs"].items()}
        top = max(medians.values())
        answers[(workload, int(level))] = {n for n, v in medians.items() if v >= (1 - near) * top}
    return answers


def _events(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


@pytest.mark.timeout(900)
@pytest.mark.e2e
@pytest.mark.xdist_group("timing")  # its numbers move with load: never beside another e2e (README)
def test_a_search_killed_mid_way_resumes_without_relaunching_and_names_the_grids_best(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    with demo_site(logs, sweep=True, search=True, say=lambda _: None) as site:
        assert site.runbook == searching_copy(SWEEP_RUNBOOK, site.host_root)
        env = {**os.environ, "HF_TOKEN": site.hf_token}
        args = [str(site.runbook), "--inventory", str(site.inventory), "--log-dir", str(logs), "--json"]
        first = subprocess.Popen(
            [sys.executable, "-m", "executor.faces.cli", "run", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            stdin=subprocess.DEVNULL,
            text=True,
            env=env,
        )
        assert first.stdout is not None
        seen: list[dict[str, Any]] = []
        for line in first.stdout:  # killed outright once its fourth launch is decided (its server starting)
            seen += _events(line)
            if sum(1 for e in seen if e["event"] == "search_decided" and e["action"] == "launch") == 4:
                first.send_signal(signal.SIGKILL)
                break
        first.wait(timeout=60)
        assert first.returncode == -signal.SIGKILL
        run_id = seen[0]["run_id"]
        killed = {
            r["step"]: r
            for r in json.loads(runbook_cli("status", run_id, "--log-dir", str(logs), "--json").stdout)["steps"]
        }
        decided = [e for e in seen if e["event"] == "search_decided"]
        measured = [
            d["config"]
            for d in decided
            if d["action"] == "launch"
            and killed[d["config"].replace("deploy_dflash", "benchmark")]["status"] == "passed"
        ]
        pruned = [d["config"] for d in decided if d["action"] == "prune"]
        assert len(measured) == 3 and pruned, decided  # three measured and some pruned before the kill

        resumed = runbook_cli("run", *args, "--resume", run_id, env={"HF_TOKEN": site.hf_token}, timeout=800)
        assert resumed.returncode == 0, resumed.stderr[-3000:]
    events = _events(resumed.stdout)
    ran = {e["step"] for e in events if e["event"] == "step_finished" and e["status"] != "skipped"}
    assert not ran & set(measured)  # measured before the kill: never launched again
    assert not ran & set(pruned)  # pruned before the kill: stays pruned (left out, no command)
    new_run = events[0]["run_id"]
    steps = {
        r["step"]: r
        for r in json.loads(runbook_cli("status", new_run, "--log-dir", str(logs), "--json").stdout)["steps"]
    }
    deploys = [s for s in steps if s.startswith("deploy_dflash[")]
    launched = [s for s in deploys if steps[s]["status"] == "passed"]
    assert len(launched) + 1 <= (len(deploys) + 1) / 2  # the bar: half the grid's launches, the baseline's included
    for step in launched:  # screened: the evaluation's first 4 prompts of each set, checked against the baseline's
        evaluated = steps[step.replace("deploy_dflash", "eval")]["facts"]
        assert evaluated["screened_from"] == {"math": 16, "code": 16, "chat": 16}, step
        assert [s["requests"] for s in evaluated["sets"].values()] == [4, 4, 4], step
        assert [s["compared"] for s in evaluated["lossless"].values()] == [4, 4, 4], step
    for step in set(deploys) - set(launched):  # why each was never launched: the bound that excluded it, or the budget
        message = steps[step]["message"]
        assert steps[step]["status"] == "skipped", (step, steps[step])
        assert (message.startswith("search: pruned ") and " at most " in message) or "budget" in message, message
    [account] = steps["report"]["facts"]["search"]  # the report's own account, from the run's records
    assert (account["launched"], account["configurations"], account["grid_launches"]) == (len(launched), 12, 13)
    assert account["screened_evals"] == len(launched)
    cells_table = (logs / new_run / "report.md").read_text()  # the Cells table says which evaluations were screened
    screened = cells_table.count("math: 4/4 identical (a search's screen: 4 of its 16 prompts)")
    assert screened == 2 * len(launched)  # a row per workload (two) of each launched configuration
    assert 0 < account["gpu_hours"] < account["grid_gpu_hours"]
    assert sorted(account["never_launched"]) == sorted(set(deploys) - set(launched))
    answers = _grid_answers()
    decisions = [(e["config"], e["action"], e["reason"]) for e in seen + events if e["event"] == "search_decided"]
    for comparison in steps["report"]["facts"]["comparisons"]:
        for level, name in comparison["best"].items():
            where = (comparison["workload"], level, name, decisions)
            assert _chosen(name) in answers[(comparison["workload"], int(level))], where


def _chosen(name: str) -> str:
    """A comparison's best as the recorded grid names it: `[drafter=zlab,spec=dflash-8]` or `baseline`."""
    return name.partition(" (")[0].removeprefix("sweep").replace("benchmark_baseline", "baseline")


@pytest.mark.timeout(900)
@pytest.mark.e2e
@pytest.mark.xdist_group("timing")  # its numbers move with load: never beside another e2e (README)
def test_the_demo_on_the_second_landscape_names_its_answers_within_half_the_launches(tmp_path: Path) -> None:
    """`runbook demo --sweep --search --landscape headroom`: where z-lab's drafter and a DDTREE budget win at low
    concurrency and DFLASH 8 at high, the search launches at most half of the grid's launches, its best per band is
    one the recorded grid of that landscape ranks near its best, and its report says which answers the budget left
    unproven (tests/executor/runbook/test_search.py proves on the recorded grid that no 5 launches prove them all)."""
    logs = tmp_path / "logs"
    args = ["demo", "--sweep", "--search", "--landscape", "headroom", "--log-dir", str(logs)]
    done = runbook_cli(*args, timeout=800)
    assert done.returncode == 0, done.stderr[-3000:]
    run_id = next(p.name for p in logs.iterdir() if (p / "run.json").exists())
    steps = {
        r["step"]: r
        for r in json.loads(runbook_cli("status", run_id, "--log-dir", str(logs), "--json").stdout)["steps"]
    }
    deploys = [s for s in steps if s.startswith("deploy_dflash[")]
    launched = [s for s in deploys if steps[s]["status"] == "passed"]
    assert len(launched) + 1 <= (len(deploys) + 1) / 2, launched  # the bar: half the grid's launches
    report = steps["report"]["facts"]
    [account] = report["search"]
    unproven = [s for s in deploys if UNPROVEN in (steps[s]["message"] or "")]
    assert account["unproven"] == len(unproven) > 0, (account, unproven)
    said = " ".join((logs / run_id / "report.md").read_text().split())
    assert f"The budget ended the search with {len(unproven)} of them able to change an answer" in said
    recorded = LANDSCAPES / "standin_headroom.json"
    answers = _grid_answers(recorded) | {k: v for k, v in _grid_answers(recorded, NEAR_HEADROOM).items() if k[1] == 32}
    campaign = json.loads((logs / run_id / "report.json").read_text())["campaign"]
    assert any(b["unproven"] for c in campaign["comparisons"] for b in c["best"])  # marked where the answer is read
    for comparison in campaign["comparisons"]:
        for band in comparison["best"]:  # its fastest, or one it finds tied with it, is near the recorded grid's best
            named = {_chosen(name) for name in [band["fastest"], *band["tied"]]}
            assert named & answers[(comparison["workload"], band["concurrency"])], (comparison["workload"], band)
