"""A campaign spread over a pool of three test hosts, through the CLI, run once (module fixture): the flagship
cut to four server configurations on gpu1, gpu2 (8x H200 each) and gpu3 (8x H100), whose SGLang is the 0.5.23
release (no DDTREE). `placement: spread` gives each configuration one host, in order, to the one with the
fewest so far: tmp-long/dflash-4 to gpu1, zlab/dflash-4 to gpu2, zlab/dflash-8 to gpu3, zlab/ddtree-32 to gpu1.

- the hosts work at once: every host's lane of cells is under way at one moment (events.jsonl);
- each drafter is downloaded and verified once on each host whose cells need it, and nowhere else (audit log);
- the report says which host measured which cell, gives the best configuration per GPU kind without comparing
  the H100 host's cells with the H200 hosts', until `compare_across_gpus: true` (a resume that reruns only
  the report) compares them all;
- the DDTREE cell (the same as tests/runbooks/test_campaign_answers.py runs on a DDTree build) is skipped with
  the reason: this SGLang has no DDTREE.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from sandbox.demo import SWEEP_STANDIN
from sandbox.testhost import PoolHost
from tests.conftest import runbook_cli
from tests.runbooks.small_campaign import CampaignSite, cut, events

EXCLUDE = [{"drafter": "tmp-long", "spec": "dflash-8"}, {"drafter": "tmp-long", "spec": "ddtree-32"}]
PLACED = {
    "deploy_dflash[drafter=tmp-long,spec=dflash-4]": "gpu1",
    "deploy_dflash[drafter=zlab,spec=dflash-4]": "gpu2",
    "deploy_dflash[drafter=zlab,spec=dflash-8]": "gpu3",
    "deploy_dflash[drafter=zlab,spec=ddtree-32]": "gpu1",
}
DDTREE = "deploy_dflash[drafter=zlab,spec=ddtree-32]"
SERVER_STEPS = ("deploy_dflash[", "eval[", "benchmark[")

#: the first test sets the module's campaign up (about a minute on a loaded 2-core machine)
pytestmark = [pytest.mark.timeout(900), pytest.mark.e2e, pytest.mark.xdist_group("timing")]


@pytest.fixture(scope="module")
def pool(testhosts: Callable[..., list[PoolHost]], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The first run, then a resume with the report told to compare across GPU kinds: (site, first, resumed)."""
    hosts = testhosts(3, variants=("h200x8", "h200x8", "h100"))
    runbook = cut(
        ["tmp-long", "zlab"],
        ["dflash-4", "dflash-8", "ddtree-32"],
        exclude=EXCLUDE,
        concurrencies=[1, 4],
        repeats=1,
        output_len=16,
    )
    with CampaignSite(hosts, tmp_path_factory.mktemp("pool"), SWEEP_STANDIN) as site:
        done = site.run(runbook)
        assert done.returncode == 0, done.stderr[-3000:]
        first = events(done.stdout)[0]["run_id"]
        report = next(step for step in runbook["steps"] if step.get("id") == "report")
        report["compare_across_gpus"] = True
        again = site.run(runbook, "--resume", first)
        assert again.returncode == 0, again.stderr[-3000:]
        yield site, first, events(again.stdout)[0]["run_id"]


def records(site: CampaignSite, run_id: str) -> dict[str, dict[str, Any]]:
    return {r["step"]: r for r in site.status(run_id)["steps"]}


def jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_each_host_runs_its_own_cells_and_the_hosts_work_at_once(pool: Any) -> None:
    site, first, _ = pool
    steps = records(site, first)
    assert {step: steps[step]["host"] for step in PLACED} == PLACED
    for deploy, host in PLACED.items():  # a cell's eval and benchmark run against its server, on its host
        cell = deploy.removeprefix("deploy_dflash")
        assert steps[f"eval{cell}"]["host"] == steps[f"benchmark{cell}"]["host"] == host
    # Each host's lane: from its first cell step's start to its last cell step's finish (events.jsonl). Every
    # lane is under way at one moment: the last lane to start starts before the first lane to end ends. Lanes
    # run one after another would fail this; it does not ask the hosts' short server steps themselves to
    # overlap, which a few seconds' difference in the downloads before them may undo on a loaded machine.
    stream = jsonl(site.logs / first / "events.jsonl")
    lanes: dict[str, list[float]] = {}
    for e in stream:
        if e["event"] in ("step_started", "step_finished") and "[" in e["step"]:
            (host,) = e["hosts"]
            lanes.setdefault(host, []).append(e["time"])
    assert sorted(lanes) == ["gpu1", "gpu2", "gpu3"]
    assert max(min(times) for times in lanes.values()) < min(max(times) for times in lanes.values()), lanes
    served = {
        h for e in stream if e["event"] == "step_finished" and e["step"].startswith(SERVER_STEPS) for h in e["hosts"]
    }
    assert served == {"gpu1", "gpu2", "gpu3"}


def test_each_drafter_is_downloaded_and_verified_once_on_each_host_whose_cells_need_it(pool: Any) -> None:
    site, first, _ = pool
    audit = jsonl(site.logs / first / "audit.jsonl")
    ran: dict[tuple[str, str], set[int]] = {}
    for r in audit:
        if r.get("event") == "command" and r["step"].startswith(("download_", "verify_")):
            ran.setdefault((r["step"], r["host"]), set()).add(r["attempt"])
    needs = {"tmp-long": ["gpu1"], "zlab": ["gpu1", "gpu2", "gpu3"]}  # gpu1 for the DDTREE cell too
    expected = {
        (f"{kind}_drafter[drafter={d}]", h)
        for d, hosts in needs.items()
        for h in hosts
        for kind in ("download", "verify")
    }
    # the target and the benchmark's dataset (SPEED-Bench) on every host of the pool
    shared = ("target", "speed_bench")
    expected |= {
        (f"{kind}_{what}", h) for h in ("gpu1", "gpu2", "gpu3") for kind in ("download", "verify") for what in shared
    }
    assert set(ran) == expected
    assert all(attempts == {1} for attempts in ran.values()), ran


def test_the_report_says_which_host_measured_each_cell_and_compares_only_hosts_with_the_same_gpus(pool: Any) -> None:
    site, first, _ = pool
    run_dir = site.logs / first
    campaign = json.loads((run_dir / "report.json").read_text())["campaign"]
    hosts = {c["name"]: c["host"] for c in campaign["cells"] if c["status"] == "passed"}
    assert hosts == {
        "benchmark_baseline@gpu1": "gpu1",
        "benchmark_baseline@gpu2": "gpu2",
        "benchmark_baseline@gpu3": "gpu3",
        "sweep[drafter=tmp-long,spec=dflash-4]@gpu1": "gpu1",
        "sweep[drafter=zlab,spec=dflash-4]@gpu2": "gpu2",
        "sweep[drafter=zlab,spec=dflash-8]@gpu3": "gpu3",
    }
    assert campaign["gpu_kinds"] == {
        "gpu1": "8x NVIDIA H200",
        "gpu2": "8x NVIDIA H200",
        "gpu3": "8x NVIDIA H100 80GB HBM3",
    }
    compared = {c["gpus"]: (c["hosts"], sorted(c["cells"])) for c in campaign["comparisons"]}
    assert compared == {
        "8x NVIDIA H200": (
            ["gpu1", "gpu2"],
            sorted(name for name, host in hosts.items() if host != "gpu3"),
        ),
        "8x NVIDIA H100 80GB HBM3": (["gpu3"], ["benchmark_baseline@gpu3", "sweep[drafter=zlab,spec=dflash-8]@gpu3"]),
    }
    facts = records(site, first)["report"]["facts"]
    assert facts["best"] is None and len(facts["comparisons"]) == 2  # no single answer across the two kinds
    printed = runbook_cli("report", str(run_dir))
    assert printed.returncode == 0, printed.stderr
    assert "cells of different GPUs are not compared" in printed.stdout
    for name, host in hosts.items():
        assert any(name in line and host in line.replace(f"@{host}", "") for line in printed.stdout.splitlines()), name


def test_compare_across_gpus_lifts_the_refusal_without_measuring_again(pool: Any) -> None:
    site, _, resumed = pool
    commanded = {r["step"] for r in jsonl(site.logs / resumed / "audit.jsonl") if r.get("event") == "command"}
    assert not {s for s in commanded if s.startswith(("deploy", "eval", "benchmark"))}, commanded
    campaign = json.loads((site.logs / resumed / "report.json").read_text())["campaign"]
    (comparison,) = campaign["comparisons"]
    assert comparison["gpus"] == "any" and comparison["hosts"] == ["gpu1", "gpu2", "gpu3"]
    assert len(comparison["cells"]) == 6
    facts = records(site, resumed)["report"]["facts"]
    assert facts["best"] is not None and set(facts["best"]) == {"1", "4"}
    printed = runbook_cli("report", str(site.logs / resumed)).stdout
    assert "compared across them as told (compare_across_gpus)" in printed


def test_on_a_release_sglang_the_ddtree_cell_is_skipped_with_the_reason(pool: Any) -> None:
    site, first, _ = pool
    steps = records(site, first)
    assert steps[DDTREE]["status"] == "skipped"
    assert "is false: the probed SGLang has no DDTREE" in steps[DDTREE]["message"]
    for mate in ("eval", "benchmark"):
        assert steps[f"{mate}[drafter=zlab,spec=ddtree-32]"]["status"] == "skipped"
    commanded = {r["step"] for r in jsonl(site.logs / first / "audit.jsonl") if r.get("event") == "command"}
    assert not {s for s in commanded if "ddtree" in s}
    campaign = json.loads((site.logs / first / "report.json").read_text())["campaign"]
    (skipped,) = [f for f in campaign["failed"] if "ddtree" in f["name"]]
    assert (skipped["name"], skipped["host"], skipped["status"]) == (
        "sweep[drafter=zlab,spec=ddtree-32]@gpu1",
        "gpu1",
        "skipped",
    )
    assert "the probed SGLang has no DDTREE" in skipped["reason"]
    assert "the probed SGLang has no DDTREE" in runbook_cli("report", str(site.logs / first)).stdout
