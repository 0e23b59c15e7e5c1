"""A campaign's search (`strategy: search`) attacked: what a careless user writes, a tampered run folder, a bad day
(every launch failing, a kill), and inputs the bounds were not made for. Each test here is a defect found so, a
strict xfail until it is fixed: its reason says what happens and what should.

The engine's tests run in-process on this machine (`address: local`, real bash) with the kinds, runbook and table of
tests/executor/searched.py (a test may change the table between runs, or fail a launch as out of memory)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from executor.run.searching import SearchDriver
from executor.run.state import SEARCH_KEY, StepRecord, open_state
from executor.runbook.cells import Index
from executor.runbook.loader import load_runbook
from executor.runbook.search import NOT_REACHED, Band, Decision, Measure, Position, Search
from executor.stepkind import StepView
from steps.campaign_report_search import account, notes
from tests.clirun import runbook_cli
from tests.executor.searched import (
    CONFIGS,
    GROUP,
    RUNBOOK,
    SPREAD,
    TABLE,
    book,
    launched,
    ran,
    recorded,
    run,
    status,
)


def rows(run_dir: Path) -> dict[str, list[str]]:
    """Each server of the group -> the hosts its launch started on (its rows passed or failed)."""
    with open_state(run_dir) as state:
        records = state.records()
    started: dict[str, list[str]] = {}
    for record in records:
        if record.step in CONFIGS and record.status in ("passed", "failed"):
            started.setdefault(record.step, []).append(record.host)
    return started


# ---- a placed group over two hosts ------------------------------------------------------------------------------

TWO_HOSTS = {
    "  box: {address: local}\n": "  box: {address: local}\n  box2: {address: local}\n",
    "kind: searched_server, table: TABLE}": "kind: searched_server, table: TABLE, hosts: [box, box2]}",
    "kind: searched_bench, table: TABLE COUNTED}": "kind: searched_bench, table: TABLE, hosts: [box, box2] COUNTED}",
    "    strategy: search\n": "    hosts: [box, box2]\n    placement: spread\n    strategy: search\n",
}


def test_a_placed_search_launches_each_configuration_on_one_host(tmp_path: Path) -> None:
    path = book(tmp_path, TWO_HOSTS)
    assert run(path).returncode == 0
    run_dir, _ = status(path)
    started = rows(run_dir)
    assert all(len(hosts) == 1 for hosts in started.values()), started
    spent = [d for d in recorded(run_dir) if d["action"] == "unexplored"]
    assert not spent or len(started) == 8, (len(started), spent[0]["reason"])


# ---- resuming ----------------------------------------------------------------------------------------------------


def test_a_resume_after_a_stop_launches_what_its_search_decides_to_launch(tmp_path: Path) -> None:
    """The launch of a-8 fails (out of memory; `on_failure: stop`): the run stops with the rest not reached. With
    the launch fixed, the resume goes on searching: each configuration it decides to launch is launched."""
    failing = json.loads(json.dumps(TABLE)) | {"fail": ["a-8"]}
    assert run(book(tmp_path, table=failing)).returncode == 1
    stopped, _ = status(tmp_path / "searched.yaml")
    assert "bench[drafter=a,tokens=8]" not in ran(stopped)  # nothing starts once a failure stops the run
    path = book(tmp_path)
    assert run(path, "--resume").returncode == 0
    run_dir, steps = status(path)
    decided = [d["config"] for d in recorded(run_dir) if d["action"] == "launch"]
    unlaunched = [c for c in decided if steps[c]["status"] not in ("passed", "failed")]
    assert not unlaunched, [(c, steps[c]["message"]) for c in unlaunched]
    assert not [c for c in CONFIGS if "was not reached" in (steps[c]["message"] or "")]


def test_a_resume_with_a_raised_budget_launches_more(tmp_path: Path) -> None:
    """A budget of 2 launches spent, then raised to 8 and resumed (the driver: `a spent budget is judged again (a
    resume may raise it)`): the resume launches beyond the first 2. It launches nothing: '0 to run, 16 reused'."""
    assert run(book(tmp_path, budget="{launches: 2}")).returncode == 0
    path = book(tmp_path)
    assert run(path, "--resume").returncode == 0
    _, steps = status(path)
    assert len(launched(steps)) > 2, launched(steps)
    assert not [c for c in CONFIGS if "budget of 2 launches" in (steps[c]["message"] or "")]


@pytest.mark.parametrize(
    ("flag", "step"),
    [("--only", "up[drafter=a,tokens=8]"), ("--only", "up[drafter=b,tokens=8]"), ("--from", "up[drafter=b,tokens=8]")],
    ids=["only-measured", "only-pruned", "from-pruned"],
)
def test_only_or_from_a_step_of_a_searched_group_runs_it(tmp_path: Path, flag: str, step: str) -> None:
    path = book(tmp_path)
    assert run(path).returncode == 0
    _, before = status(path)
    assert (before["up[drafter=a,tokens=8]"]["status"], before["up[drafter=b,tokens=8]"]["status"]) == (
        "passed",
        "skipped",
    )
    done = run(path, flag, step)
    if done.returncode == 2:  # refused, saying why: as good as running it
        assert "search" in done.stderr, done.stderr
        return
    assert done.returncode == 0, done.stderr
    run_dir, steps = status(path)
    assert step in ran(run_dir), (steps[step]["status"], steps[step]["message"])
    assert steps["up[drafter=a,tokens=8]"]["status"] == "passed", steps["up[drafter=a,tokens=8]"]["message"]


# ---- a runbook written wrong -------------------------------------------------------------------------------------

BENCH_LINE = RUNBOOK.splitlines(keepends=True)[-1]  # the measure, the group's last step
AFTER_THE_GROUP = {
    "  - {id: base_bench, kind: searched_bench, table: TABLE COUNTED}\n": "",
    "baseline: base_bench": "baseline: late_bench",
    BENCH_LINE: BENCH_LINE + "  - {id: late_bench, kind: searched_bench, table: TABLE}\n",
}


@pytest.mark.parametrize(
    "edits",
    [{"measure: bench": "measure: up"}, {"baseline: base_bench": "baseline: base_up"}, AFTER_THE_GROUP],
    ids=["measure-is-the-server", "baseline-is-a-server", "baseline-after-the-group"],
)
def test_a_search_measured_by_a_step_that_measures_nothing_is_refused(tmp_path: Path, edits: dict[str, str]) -> None:
    done = runbook_cli("validate", str(book(tmp_path, edits)))
    assert done.returncode == 2, done.stdout
    assert "search." in done.stderr, done.stderr


# ---- a tampered run folder ---------------------------------------------------------------------------------------


def stopped_run(tmp_path: Path) -> tuple[Path, Path]:
    """A search stopped by a failed launch (a-8, out of memory), and the runbook with the launch fixed: its folder."""
    failing = json.loads(json.dumps(TABLE)) | {"fail": ["a-8"]}
    assert run(book(tmp_path, table=failing)).returncode == 1
    path = book(tmp_path)
    return path, status(path)[0]


def tamper(run_dir: Path, record: str) -> None:
    with open_state(run_dir) as state:
        state.set(SEARCH_KEY, record)


def test_a_deeply_nested_search_record_refuses_the_resume_with_its_reason(tmp_path: Path) -> None:
    path, run_dir = stopped_run(tmp_path)
    tamper(run_dir, "[" * 200_000 + "]" * 200_000)
    resumed = run(path, "--resume", run_dir.name)
    assert resumed.returncode == 2, resumed.stderr[-500:]
    assert "is not as a run writes it" in resumed.stderr and "Traceback" not in resumed.stderr


def test_a_restored_prune_of_a_measured_configuration_is_not_kept(tmp_path: Path) -> None:
    path, run_dir = stopped_run(tmp_path)
    with open_state(run_dir) as state:
        record = json.loads(state.get(SEARCH_KEY) or "{}")
    for decision in record[GROUP]:
        if decision["config"] == "up[drafter=a,tokens=4]":
            decision["action"] = "prune"
    tamper(run_dir, json.dumps(record))
    resumed = run(path, "--resume", run_dir.name)
    if resumed.returncode == 2:
        return
    new_dir, _ = status(path)
    kept = {d["config"]: d["action"] for d in recorded(new_dir)}
    assert kept.get("up[drafter=a,tokens=4]") == "launch", kept


@pytest.mark.parametrize(
    "change",
    [{"evidence": {"r c=1": "12"}}, {"evidence": {"r c=1": [math.nan, 1.0]}}, {"config": ["up"]}, {"reason": {"a": 1}}],
    ids=["evidence-text", "evidence-nan", "config-list", "reason-mapping"],
)
def test_a_recorded_decision_not_as_a_run_writes_it_is_refused(change: dict[str, Any]) -> None:
    written = {"seq": 1, "action": "prune", "config": "up[drafter=a,tokens=2]", "reason": "r c=1: ...", "evidence": {}}
    with pytest.raises(ValueError):
        Decision.from_json(written | change)


# ---- bounds that prune the answer --------------------------------------------------------------------------------


def test_a_draft_forward_the_baseline_does_not_run_never_prunes_the_fastest() -> None:
    """throughput(n) = acceptance(n) / (c0 (1 + draft + verify (n - 1))): acceptance concave (1 + 3 (1 - 0.85^(n-1))),
    the cost convex (linear), the baseline 1 / c0 = 100 tok/s; draft 0.2, verify 0.01."""

    def measure(tokens: int) -> Measure:
        accept = 1 + 3 * (1 - 0.85 ** (tokens - 1))
        median = 100 * accept / (1 + 0.2 + 0.01 * (tokens - 1))
        return Measure(median, 0.99 * median, 1.01 * median, accept)

    positions = {f"z-{n}": Position("z", "DFLASH", n, (1.0, float(n), 0.0), f"DFLASH {n}") for n in (2, 4, 8, 16)}
    search = Search(positions, 0.02, baseline={"c=1": Measure(100.0, 99.0, 101.0, None)})
    while True:
        search.prune()
        chosen = search.next_launch(list(positions))
        if chosen is None:
            break
        search.decide("launch", *chosen)
        search.measured[chosen[0]] = {"c=1": measure(positions[chosen[0]].verified or 0)}
    assert max(positions, key=lambda c: measure(positions[c].verified or 0).median) == "z-16"
    pruned = {d.config: d.reason for d in search.decisions if d.action == "prune"}
    assert "z-16" not in pruned, pruned["z-16"]


def test_a_server_axis_the_search_does_not_place_never_carries_one_setting_bound_to_another() -> None:
    from steps.deploy import DeployStep

    def position(tp: int, tokens: int) -> Position | None:
        step = DeployStep(
            id="deploy", model_path="m", draft_model_path="z", tp_size=tp, speculative_num_draft_tokens=tokens, host="h"
        )
        return step.search_position()

    truth = {(4, 4): (228.6, 2.4), (4, 8): (260.9, 3.0), (8, 4): (420.0, 2.4), (8, 8): (400.0, 3.0)}
    positions = {f"deploy[tp={tp},tokens={n}]": position(tp, n) for tp, n in truth}
    search = Search(
        {c: p for c, p in positions.items() if p is not None}, 0.02, baseline={"c=1": Measure(100, 99, 101, None)}
    )
    for tp, tokens in [(4, 4), (4, 8)]:  # the tp=4 half measured first (the group's order, or a budget's)
        config = f"deploy[tp={tp},tokens={tokens}]"
        median, accept = truth[(tp, tokens)]
        search.decide("launch", config, "")
        search.measured[config] = {"c=1": Measure(median, 0.99 * median, 1.01 * median, accept)}
    pruned = {d.config: d.reason for d in search.prune()}
    assert "deploy[tp=8,tokens=4]" not in pruned, pruned["deploy[tp=8,tokens=4]"]


def test_a_placed_search_never_launches_beyond_its_budget(tmp_path: Path) -> None:
    path = book(tmp_path, TWO_HOSTS, budget="{launches: 1}")
    assert run(path).returncode == 0
    run_dir, _ = status(path)
    assert sum(len(hosts) for hosts in rows(run_dir).values()) == 1, rows(run_dir)


def test_a_configuration_the_report_would_tie_and_deploy_is_never_pruned_as_beaten() -> None:
    from executor.runbook.search import Bound

    class Bounded(Search):
        def bound(self, config: str, band: Band) -> Bound | None:  # the most x-4's median can be, as given
            return Bound(976.0, "given") if config == "x-4" else None

    positions = {f"x-{n}": Position("x", "DFLASH", n, (1.0, float(n), 0.0), f"DFLASH {n}") for n in (4, 16)}
    search = Bounded(positions, 0.02, baseline={"c=1": Measure(244.0, 240.0, 248.0, None)})
    search.decide("launch", "x-16", "")
    search.measured["x-16"] = {"c=1": Measure(1000.0, 990.0, 1010.0, 4.0)}
    x4 = Measure(970.0, 950.0, 992.0, 3.9)  # what x-4 would measure: under its bound, its repeats reaching 990
    assert x4.median <= 976.0 and x4.high >= search.measured["x-16"]["c=1"].low  # the report: tied, x-4 cheaper
    pruned = {d.config: d.reason for d in search.prune()}
    assert "x-4" not in pruned, pruned["x-4"]


def test_a_launchs_reason_says_the_most_room_only_where_its_bound_leaves_the_most() -> None:
    """The table's drafter a, its middle (8 tokens) and then 4 measured: a-2 lies between the baseline and a-4, a-16
    beyond a-8; the decision's reason (its event, the run's record, `status`) must say why it was chosen."""
    positions = {f"a-{n}": Position("a", "DFLASH", n, (1.0, float(n), 0.0), f"DFLASH {n}") for n in (2, 4, 8, 16)}

    def measures(key: str) -> dict[Band, Measure]:
        accept, medians = TABLE["bands"][key]
        return {band: Measure(m, m * 0.98, m * 1.02, accept) for band, m in medians.items()}

    search = Search(positions, 0.02, baseline=measures("base"))
    for config in ("a-8", "a-4"):
        search.decide("launch", config, "measured")
        search.measured[config] = measures(config)
    search.prune()

    def room(config: str) -> float:
        return max(
            b.value / t[1].median
            for band in search.bands()
            if (b := search.bound(config, band)) and (t := search.incumbent(band))
        )

    chosen = search.next_launch(search.open())
    assert chosen is not None and sorted(search.open()) == ["a-16", "a-2"]
    config, reason = chosen
    assert "the most room" not in reason or room(config) >= max(room(c) for c in search.open()), (reason, room("a-16"))


# ---- what the report says of its answers (proven, or left unproven by the budget) ----------------------------------

CONTINUE = {"    strategy: search\n": "    on_failure: continue\n    strategy: search\n"}


def cell_of(step: str) -> dict[str, str]:
    """A matrix instance's axis values (`up[drafter=a,tokens=8]`: drafter a, tokens 8), {} outside the matrix."""
    return dict(kv.split("=", 1) for kv in step.split("[", 1)[1][:-1].split(",")) if "[" in step else {}


def note(run_dir: Path) -> str:
    """The campaign report's note on the group (steps/campaign_report_search.py) from the run's records, its launches
    read as the report reads a `deploy`'s."""
    with open_state(run_dir) as state:
        records = state.records()
    views = [
        StepView(
            r.step,
            r.step.split("[")[0],
            "deploy" if r.step in CONFIGS else "searched",
            r.host,
            r.status,
            r.message,
            r.facts,
            GROUP if cell_of(r.step) else None,
            cell_of(r.step),
            r.duration_s,
        )
        for r in records
    ]
    [searched] = account(views, "base_bench")
    [line] = notes([searched])
    return line


def test_a_search_that_measured_nothing_never_says_its_answers_are_proven(tmp_path: Path) -> None:
    """No baseline, a budget of 1 launch, and that launch out of memory (`on_failure: continue`): nothing was
    measured, so no band exists and each configuration left open is recorded `never launched: the search's budget
    of 1 launches was spent` with no band unproven; the note then says each answer is proven."""
    failing = json.loads(json.dumps(TABLE)) | {"fail": ["a-4"]}
    edits = CONTINUE | {"      baseline: base_bench\n": ""}
    path = book(tmp_path, edits, budget="{launches: 1}", table=failing)
    assert run(path).returncode == 5
    run_dir, steps = status(path)
    assert not [c for c in CONFIGS if steps[c.replace("up[", "bench[")]["status"] == "passed"]  # nothing measured
    line = note(run_dir)
    assert "is proven" not in line, line


def test_a_launch_whose_measure_failed_leaves_its_bands_unproven(tmp_path: Path) -> None:
    """The 5th measure fails (a-8's, the grid's answer at `r c=1`; its server started), `on_failure: continue`: the
    search goes on without it and decides every other configuration. Nothing bounds a-8, which was never measured,
    yet the note says every answer is proven (it recommends a-16's 230 tok/s at r c=1, a-8 measures 249)."""
    path = book(tmp_path, CONTINUE, fail_at=5)
    assert run(path).returncode == 5
    run_dir, steps = status(path)
    assert steps["bench[drafter=a,tokens=8]"]["status"] == "failed", steps["bench[drafter=a,tokens=8]"]
    line = note(run_dir)
    assert "is proven" not in line, line


def test_a_placed_searchs_unexplored_configurations_are_judged_with_every_launch_measured(tmp_path: Path) -> None:
    """Two lanes, a budget of 2: each lane launches one, the first to finish finds the budget spent and records
    every open configuration `unexplored` while the other lane's launch is still measuring. Its measure comes next
    and is never judged against: a-16 is recorded unproven at `r c=8`, which that measure excludes, and the
    decisions naming `r c=1` give its incumbent as a-4's 218 where the answer is a-8's 249 (the note: 'its bound
    against the answer's measure'). The driver of the scheduler's two lanes, in their order, with the table's
    measures."""
    runbook = load_runbook(book(tmp_path, TWO_HOSTS, budget="{launches: 2}"))
    index = Index(runbook)
    driver = SearchDriver(index.groups[GROUP], {s.id: s for s in runbook.steps}, index, [], runbook.step_hosts)
    records: dict[tuple[str, str], StepRecord] = {}

    def measured(step: str, host: str) -> None:
        cell = cell_of(step)
        accept, medians = TABLE["bands"][f"{cell['drafter']}-{cell['tokens']}" if cell else "base"]
        facts = {"bands": {b: [m, m * (1 - SPREAD), m * (1 + SPREAD), accept] for b, m in medians.items()}}
        records[(step, host)] = StepRecord(step, host, 0, "passed", "", facts=facts)
        driver.observe(records)

    made: list[Decision] = []
    measured("base_bench", "box")
    first, second = driver.next_unit("box", records, made.append), driver.next_unit("box2", records, made.append)
    assert first and second
    measured(first.replace("up[", "bench["), "box")
    assert driver.next_unit("box", records, made.append) is None  # the budget spent: the rest left open
    measured(second.replace("up[", "bench["), "box2")
    assert driver.next_unit("box2", records, made.append) is None
    search = driver.search
    answer = {band: top[1].median for band in search.bands() if (top := search.incumbent(band)) is not None}
    stale = {
        d.config: band
        for d in made
        if d.action == "unexplored"
        for band in d.evidence
        if search.excluded(d.config, band) is not None or d.evidence[band][1] != answer[band]
    }
    assert not stale, stale


def test_an_unexplored_reason_says_the_evidence_has_each_band_only_where_it_does() -> None:
    """Ten bands where a configuration has no bound yet (no baseline in them; no point of its family's cost at or
    below it): its reason names 8 and says `and 2 more bands (the evidence has each)`, but its evidence is empty
    (a band with no bound has no numbers)."""
    positions = {f"x-{n}": Position("x", "DFLASH", n, (1.0, float(n), 0.0), f"DFLASH {n}") for n in (2, 4)}
    search = Search(positions, 0.02)
    search.decide("launch", "x-4", "")
    search.measured["x-4"] = {f"w{i} c=1": Measure(100.0, 99.0, 101.0, 2.0) for i in range(10)}
    decision = search.unexplored("x-2", "the search's budget of 1 launches was spent")
    assert "no bound yet" in decision.reason, decision.reason
    more = "(the evidence has each)" in decision.reason
    assert not more or len(decision.evidence) == 10, (decision.reason, decision.evidence)


def test_a_stopped_runs_note_gives_no_decision_to_what_it_never_reached(tmp_path: Path) -> None:
    """A search stopped by a failed launch (a-8, out of memory): the configurations it never reached have no
    decision, yet the note says each never launched is in the table `with the bounds of its decision`."""
    _, run_dir = stopped_run(tmp_path)
    with open_state(run_dir) as state:
        messages = [r.message or "" for r in state.records() if r.step in CONFIGS]
    assert [m for m in messages if m.endswith(NOT_REACHED)], messages
    line = note(run_dir)
    assert "each with the bounds of its decision" not in line, line


def test_a_spent_gpu_hours_budget_says_what_was_used(tmp_path: Path) -> None:
    """A budget of 1e-06 GPU-hours (3.6 ms), spent by the first launch: every configuration left open is recorded
    `the search's budget of 1e-06 GPU-hours was spent (0.00 used)`, a use below the budget as printed."""
    path = book(tmp_path, budget="{gpu_hours: 0.000001}")
    assert run(path).returncode == 0
    run_dir, _ = status(path)
    reasons = [d["reason"] for d in recorded(run_dir) if d["action"] == "unexplored"]
    assert reasons and not [r for r in reasons if "(0.00 used)" in r], reasons[0]
