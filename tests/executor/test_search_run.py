"""A campaign's search as the engine runs it (executor/run/searching.py's SearchDriver under the scheduler's
`_run_search`), in-process through `runbook run`/`plan`/`status`/`validate` on this machine (`address: local`, real
bash): no SSH, no SGLang stand-in, with the kinds and the runbook of tests/executor/searched.py, whose table says what
each configuration measures, so each test knows the grid's answer. What the search decides from
measures is tests/executor/runbook/test_search.py's; the kill -9 of a whole campaign, tests/runbooks/
test_k26_dflash_search.py's (a subprocess, the demo's stand-in: minutes). Here: fewer launches than the grid and the
grid's answer, a record of every decision (status, events, the run's state), both budgets, a resume after a failed
measure, a tampered record, and the runbook's mistakes at their line."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from executor.run.searching import SearchDriver
from executor.run.state import SEARCH_KEY, open_state
from executor.runbook.cells import Index
from executor.runbook.loader import load_runbook
from executor.runbook.matrix import SEARCH_MAX_LAUNCHES
from executor.runbook.search import UNPROVEN
from tests.clirun import runbook_cli
from tests.executor.searched import CONFIGS, GRID_BEST, GROUP, book, events, launched, recorded, run, status
from tests.executor.test_search_attacks import TWO_HOSTS

TOLERANCE = 0.02  # SearchSpec's default
WIDE = {"COLUMNS": "500"}  # `plan`'s lines whole (a pipe's are broken at its default width)


def test_a_search_launches_fewer_than_the_grid_finds_its_answer_and_records_every_decision(tmp_path: Path) -> None:
    path = book(tmp_path)
    done = run(path)
    assert done.returncode == 0, done.stderr
    run_dir, steps = status(path)
    ran = launched(steps)
    assert set(GRID_BEST.values()) <= set(ran) and len(ran) < len(CONFIGS), ran
    assert all(steps[c.replace("up[", "bench[")]["status"] == "passed" for c in ran)
    for config in set(CONFIGS) - set(ran):
        for step in (config, config.replace("up[", "bench[")):
            message = steps[step]["message"]
            assert steps[step]["status"] == "skipped" and message.startswith(f"search: pruned {config}: "), message
            assert all(f"{band}: at most " in message for band in GRID_BEST), message
            assert "beaten by" in message or "tied" in message, message
    decided = events(run_dir, "search_decided")
    assert [e["decision"] for e in decided] == list(range(1, len(CONFIGS) + 1))
    assert {e["config"] for e in decided} == set(CONFIGS)
    order = [e["config"] for e in decided if e["action"] == "launch"]
    assert sorted(order) == sorted(ran)
    timeline = [  # each launch decided before its server starts, and that server next
        (e["event"], e.get("config", e["step"]))
        for e in events(run_dir, "search_decided", "step_started")
        if e.get("action") == "launch" or (e["event"] == "step_started" and e["step"] in ran)
    ]
    assert timeline == [(event, c) for c in order for event in ("search_decided", "step_started")]
    keep = ("decision", "action", "config", "reason")
    assert [{k: e[k] for k in keep} for e in decided] == [
        {"decision": d["seq"], "action": d["action"], "config": d["config"], "reason": d["reason"]}
        for d in recorded(run_dir)
    ]


def test_a_launch_budget_launches_that_many_and_records_the_rest_never_launched(tmp_path: Path) -> None:
    path = book(tmp_path, budget="{launches: 2}")
    plan = runbook_cli("plan", str(path), env=WIDE)
    assert plan.returncode == 0, plan.stderr
    worst = f"budget 2 launches; worst case 2 of the grid's {len(CONFIGS)} launches (3 of {len(CONFIGS) + 1} with"
    assert worst in plan.stdout, plan.stdout  # the baseline's launch counted in both, as the report does
    done = run(path)
    assert done.returncode == 0, done.stderr
    run_dir, steps = status(path)
    assert len(launched(steps)) == 2
    decisions = recorded(run_dir)
    assert [d["action"] for d in decisions] == ["launch"] * 2 + ["unexplored"] * (len(CONFIGS) - 2)
    progress = [e["launches"] for e in events(run_dir, "cells_progress")]  # planned: the budget's worst case
    assert progress[-1] == {"done": 2, "planned": 2} and {p["planned"] for p in progress} == {2}, progress
    for decision in decisions[2:]:  # where each might still change the answer, its bound against the incumbent's
        config = decision["config"]
        why = f"search: not launched {config}: never launched: the search's budget of 2 launches was spent, {UNPROVEN} "
        assert steps[config]["status"] == "skipped" and steps[config]["message"].startswith(why), steps[config]
        assert decision["evidence"], decision
        # the bands, for the report to mark: on the server instance's record, as in the decision
        assert decision["unproven"] and steps[config]["facts"] == {"unproven": decision["unproven"]}, steps[config]
        for band, (bound, incumbent) in decision["evidence"].items():
            said = f"{band}: up to {bound:.0f} tok/s ("
            assert said in decision["reason"] and f"'s {incumbent:.0f}" in decision["reason"], decision
            assert bound >= (1 - TOLERANCE) * incumbent  # not excluded: it might beat or tie the answer


def test_a_gpu_hours_budget_is_checked_before_each_launch_so_the_first_one_happens(tmp_path: Path) -> None:
    path = book(tmp_path, budget="{gpu_hours: 1.0e-9}")
    plan = runbook_cli("plan", str(path), env=WIDE)
    cap = "(no launch cap: the GPU-hours, checked before each launch, stop it)"
    assert "budget 1e-09 GPU-hours; worst case" in plan.stdout and cap in plan.stdout, plan.stdout
    done = run(path)
    assert done.returncode == 0, done.stderr
    run_dir, steps = status(path)
    (first,) = launched(steps)
    assert steps[first.replace("up[", "bench[")]["status"] == "passed"
    assert [d["action"] for d in recorded(run_dir)] == ["launch"] + ["unexplored"] * (len(CONFIGS) - 1)
    for config in set(CONFIGS) - {first}:
        why = f"search: not launched {config}: never launched: the search's budget of 1e-09 GPU-hours was spent ("
        assert steps[config]["status"] == "skipped" and steps[config]["message"].startswith(why)


@pytest.mark.parametrize(
    ("on_failure", "exit_code"),
    [("stop", 1), ("continue", 5)],
)
def test_a_resume_after_a_failed_measure_launches_nothing_measured_or_pruned_and_keeps_the_decisions(
    tmp_path: Path, on_failure: str, exit_code: int
) -> None:
    """The third launch's measure fails once (the baseline's is the first measure): the run stops there, or, with
    `on_failure: continue`, goes on without it and exits 5 (cells failed). The resume measures it first."""
    edits = {"    strategy: search": f"    on_failure: {on_failure}\n    strategy: search"}
    path = book(tmp_path, edits, fail_at=4)
    first = run(path)
    assert first.returncode == exit_code, first.stderr
    first_dir, steps = status(path)
    before = recorded(first_dir)
    launches = [d["config"] for d in before if d["action"] == "launch"]
    assert steps[launches[2].replace("up[", "bench[")]["status"] == "failed"
    measured = {c for c in launches if steps[c.replace("up[", "bench[")]["status"] == "passed"}
    pruned = {d["config"] for d in before if d["action"] == "prune"}
    for config in set(CONFIGS) - {d["config"] for d in before}:  # the run stopped before deciding them
        assert steps[config]["message"] == f"search: {config} was not reached (the run stopped first)"
    resumed = run(path, "--resume")
    assert resumed.returncode == 0, resumed.stderr
    run_dir, steps = status(path)
    ran = [e["step"] for e in events(run_dir, "step_finished") if e["status"] != "skipped"]
    again = {c for c in measured | pruned if {c, c.replace("up[", "bench[")} & set(ran)}
    assert not again, again
    assert ran[:2] == [launches[2], launches[2].replace("up[", "bench[")]  # the launch not measured: first
    kept = [(d["action"], d["config"], d["reason"]) for d in before if d["action"] != "unexplored"]
    assert [(d["action"], d["config"], d["reason"]) for d in recorded(run_dir)][: len(kept)] == kept
    assert set(GRID_BEST.values()) <= set(launched(steps))


def test_a_tampered_search_record_refuses_the_resume_naming_the_run_folder(tmp_path: Path) -> None:
    path = book(tmp_path, fail_at=2)  # the first launch's measure fails: the run has one decision
    assert run(path).returncode == 1
    run_dir, _ = status(path)
    for garbage in ("{not json", '{"sweep": 7}', '{"sweep": [{"seq": 1}]}', '["sweep"]', '{"sweep": [{"seq": "x"}]}'):
        with open_state(run_dir) as state:
            state.set(SEARCH_KEY, garbage)
        resumed = run(path, "--resume", run_dir.name)
        assert resumed.returncode == 2, (garbage, resumed.stderr)
        said = f"{run_dir}: the search's record (`{SEARCH_KEY}`) is not as a run writes it: "
        assert said in resumed.stderr and "Traceback" not in resumed.stderr, (garbage, resumed.stderr)


SEARCH_BLOCK = "    search:\n      budget: BUDGET\n      measure: bench\n      baseline: base_bench\n"


@pytest.mark.parametrize(
    ("edits", "where", "said"),
    [
        pytest.param({SEARCH_BLOCK: ""}, (11, 15), "strategy: search needs its `search:`", id="no-search"),
        pytest.param(
            {"measure: bench": "measure: benchmark"},
            (14, 16),
            "search.measure: 'benchmark' is no step of group",
            id="measure",
        ),
        pytest.param(
            {"BUDGET": "{}"},
            (13, 15),
            "budget",
            id="empty-budget",
        ),
        pytest.param(
            {"BUDGET": "{launches: 0}"},
            (13, 26),
            "launches",
            id="no-launch",
        ),
        pytest.param(
            {"base_bench\n    steps": "base_bench\n      tolerance: .nan\n    steps"},
            (16, 18),
            "tolerance",
            id="nan",
        ),
        pytest.param(
            {"strategy: search": "strategy: random"},
            (11, 15),
            "strategy: 'grid' (every configuration, the default) or 'search', not 'random'",
            id="random",
        ),
        pytest.param(
            {"baseline: base_bench": "baseline: nosuch"},
            (15, 17),
            "search.baseline",
            id="no-baseline",
        ),
    ],
)
def test_a_search_written_wrong_is_refused_at_its_line(
    tmp_path: Path, edits: dict[str, str], where: tuple[int, int], said: str
) -> None:
    path = book(tmp_path, edits)
    done = runbook_cli("validate", str(path))
    assert done.returncode == 2, done.stdout
    (problem,) = [line for line in done.stderr.splitlines() if line.startswith(f"{path}:")]
    assert problem.startswith(f"{path}:{where[0]}:{where[1]}: ") and said in problem, problem


def test_a_budget_in_gpu_hours_may_be_written_as_yaml_writes_small_numbers(tmp_path: Path) -> None:
    done = runbook_cli("validate", str(book(tmp_path, budget="{gpu_hours: 1e-9}")))
    assert done.returncode == 0, done.stderr


def test_a_search_over_more_configurations_than_it_judges_is_refused_before_anything_runs(tmp_path: Path) -> None:
    """SEARCH_MAX_LAUNCHES (500) server configurations at most: 2 drafters x 251 token counts are 502."""
    tokens = ", ".join(str(n) for n in range(1, 252))
    path = book(tmp_path, {"tokens: [2, 4, 8, 16]": f"tokens: [{tokens}]"})
    done = runbook_cli("validate", str(path))
    assert done.returncode == 2, done.stdout
    assert f"502 server configurations; a search judges at most {SEARCH_MAX_LAUNCHES}" in done.stderr


def test_only_the_searchs_measure_among_a_launchs_measuring_steps_is_screened(tmp_path: Path) -> None:
    """A benchmark the search does not read (`bench_long`: other lengths, the same band names) ranks nothing: its
    repeats are the runbook's, never cut by how the measure's bands compare with their incumbents."""
    other = (
        '      - {id: bench_long, kind: searched_bench, table: TABLE, drafter: "${{ matrix.drafter }}", '
        'tokens: "${{ matrix.tokens }}"}\n'
    )
    runbook = load_runbook(book(tmp_path, {"      - {id: bench,": other + "      - {id: bench,"}))
    index = Index(runbook)
    driver = SearchDriver(index.groups[GROUP], {s.id: s for s in runbook.steps}, index, [], runbook.step_hosts)
    screened = set(driver.screens())
    assert {f"bench[{c.removeprefix('up[')}" for c in CONFIGS} <= screened
    assert not {i for i in screened if i.startswith("bench_long[")}


def test_plan_full_shows_a_searched_launchs_evaluation_as_the_run_sends_it(tmp_path: Path) -> None:
    """README: `--full` shows every command exactly as it would run; in a launch of a search the evaluation sends the
    first `screen_prompts` of each set (README "Search")."""
    evaluation = '      - {id: eval, kind: eval_acceptance, base_url: "http://127.0.0.1:1", prompt_sets: [math]}\n'
    plan = runbook_cli(
        "plan", str(book(tmp_path, {"      - {id: bench,": evaluation + "      - {id: bench,"})), "--full"
    )
    assert plan.returncode == 0, plan.stderr
    assert "of the prompt sets math (4)" in plan.stdout, plan.stdout


def test_plans_worst_case_with_the_baseline_counts_the_launches_an_unplaced_two_host_search_makes(
    tmp_path: Path,
) -> None:
    two_hosts = TWO_HOSTS | {"    strategy: search\n": "    hosts: [box, box2]\n    strategy: search\n"}  # unplaced
    path = book(tmp_path, two_hosts, budget="{launches: 2}")
    plan = runbook_cli("plan", str(path), env=WIDE)
    said = re.search(r"\((\d+) of \d+ with the baseline's\)", plan.stdout)
    assert said, plan.stdout
    assert run(path).returncode == 0
    run_dir, _ = status(path)
    with open_state(run_dir) as state:
        servers = {"base_up", *CONFIGS}
        started = [r for r in state.records() if r.step in servers and r.status in ("passed", "failed")]
    assert int(said[1]) == len(started), (said[0], [(r.step, r.host) for r in started])
