"""A campaign's search as the engine runs it (executor/run/searching.py's SearchDriver under the scheduler's
`_run_search`), in-process through `runbook run`/`plan`/`status`/`validate` on this machine (`address: local`, real
bash): no SSH, no SGLang stand-in. Two kinds of this module stand in for deploy and benchmark: a server whose launch
says where it sits (drafter, DFLASH, tokens verified) and its GPUs (`--tp-size 2`), and a measure that prints what
LANDSCAPE says its configuration measures, so each test knows the grid's answer. What the search decides from
measures is tests/executor/runbook/test_search.py's; the kill -9 of a whole campaign, tests/runbooks/
test_k26_dflash_search.py's (a subprocess, the demo's stand-in: minutes). Here: fewer launches than the grid and the
grid's answer, a record of every decision (status, events, the run's state), both budgets, a resume after a failed
measure, a tampered record, and the runbook's mistakes at their line."""

from __future__ import annotations

import json
import shlex
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar, Literal

import pytest

from executor.command_result import CommandResult
from executor.run.events import EVENTS_FILE
from executor.run.state import SEARCH_KEY, open_state
from executor.runbook.matrix import SEARCH_MAX_LAUNCHES
from executor.runbook.search import Band, Measure, Position
from executor.stepkind import RenderContext, StepSpec
from steps.provenance import gpus_of
from tests.clirun import runbook_cli

#: What each launch measures (the physical model of tests/executor/runbook/test_search.py: acceptance concave in the
#: tokens verified, a verify step's cost convex, drafter a ahead of b): (drafter, tokens) -> acceptance length and
#: output throughput's median (tok/s) per band; the baseline is (None, 1). The grid's best: a at 8 tokens at c=1,
#: a at 4 at c=8.
LANDSCAPE: dict[tuple[str | None, int], tuple[float | None, dict[Band, float]]] = {
    (None, 1): (None, {"random c=1": 100.0, "random c=8": 600.0}),
    ("a", 2): (1.6, {"random c=1": 156.9, "random c=8": 834.8}),
    ("a", 4): (2.314, {"random c=1": 218.3, "random c=8": 957.5}),
    ("a", 8): (2.835, {"random c=1": 248.7, "random c=8": 829.8}),
    ("a", 16): (2.991, {"random c=1": 230.0, "random c=8": 552.1}),
    ("b", 2): (1.45, {"random c=1": 142.2, "random c=8": 756.5}),
    ("b", 4): (1.986, {"random c=1": 187.3, "random c=8": 821.6}),
    ("b", 8): (2.376, {"random c=1": 208.5, "random c=8": 695.6}),
    ("b", 16): (2.493, {"random c=1": 191.8, "random c=8": 460.2}),
}
SPREAD = 0.02  # the repeats' range around the median
GRID_BEST = {"random c=1": "up[drafter=a,tokens=8]", "random c=8": "up[drafter=a,tokens=4]"}
CONFIGS = [f"up[drafter={d},tokens={n}]" for d in ("a", "b") for n in (2, 4, 8, 16)]
GROUP = "sweep"
WIDE = {"COLUMNS": "500"}  # `plan`'s lines whole (a pipe's are broken at its default width)


def _printed(document: object) -> str:
    return f"printf '%s\\n' {shlex.quote(json.dumps(document))}"


def _json_facts(result: CommandResult) -> Any:
    """What the script printed (None where it failed before printing: the exit code's gate says so)."""
    return json.loads(result.stdout_text) if result.exit_code == 0 else None


class SearchedServer(StepSpec):
    """A server launch as a search sees it: where it sits on its family's axis, and the GPUs its argv holds."""

    kind: Literal["search_test_server"] = "search_test_server"
    starts_server: ClassVar[bool] = True
    drafter: str | None = None
    algorithm: str | None = None
    tokens: int = 1

    def render(self, ctx: RenderContext) -> str:
        argv = ["python3", "-m", "sglang.launch_server", "--tp-size", "2"]
        return _printed({"drafter": self.drafter, "tokens": self.tokens, "argv": argv})

    def parse_facts(self, result: CommandResult) -> Any:
        return _json_facts(result)

    def search_position(self) -> Position:
        return Position(
            self.drafter,
            self.algorithm,
            verified=self.tokens,
            cost=(1.0, float(self.tokens), 0.0),
            setting=f"{self.algorithm} {self.tokens}",
        )

    def search_gpus(self, facts: Any) -> int | None:
        return gpus_of(facts["argv"])


class SearchedBench(StepSpec):
    """A benchmark of a launch: prints what LANDSCAPE says its configuration measures. With `count_in`, a file
    counting the measures run, the `fail_at`th one fails (a measure that fails once)."""

    kind: Literal["search_test_bench"] = "search_test_bench"
    drafter: str | None = None
    tokens: int = 1
    count_in: str | None = None
    fail_at: int = 0

    def render(self, ctx: RenderContext) -> str:
        accept, medians = LANDSCAPE[(self.drafter, self.tokens)]
        bands = {b: [m, m * (1 - SPREAD), m * (1 + SPREAD), accept] for b, m in medians.items()}
        script = _printed({"bands": bands})
        if self.count_in is None:
            return script
        counter = shlex.quote(self.count_in)
        counted = f"n=$(( $(cat {counter} 2>/dev/null || echo 0) + 1 )); echo $n > {counter}\n"
        return f'{counted}[ "$n" != {self.fail_at} ] || exit 1\n{script}'

    def parse_facts(self, result: CommandResult) -> Any:
        return _json_facts(result)

    def search_measures(self, facts: Any) -> dict[Band, Measure]:
        return {band: Measure(*row) for band, row in facts["bands"].items()}


RUNBOOK = """\
name: searched
hosts:
  box: {address: local}
steps:
  - {id: base_up, kind: search_test_server}
  - {id: base_bench, kind: search_test_bench COUNTED}
  - group: sweep
    matrix:
      drafter: [a, b]
      tokens: [2, 4, 8, 16]
    strategy: search
    search:
      budget: BUDGET
      measure: bench
      baseline: base_bench
    steps:
      - id: up
        kind: search_test_server
        drafter: ${{ matrix.drafter }}
        algorithm: DFLASH
        tokens: ${{ matrix.tokens }}
      - {id: bench, kind: search_test_bench, drafter: "${{ matrix.drafter }}", tokens: "${{ matrix.tokens }}" COUNTED}
"""


def runbook(
    tmp_path: Path, budget: str = "{launches: 8}", fail_at: int | None = None, edits: Mapping[str, str] = {}
) -> Path:
    """RUNBOOK edited (`edits`: old text to new), with its budget and its measures counted (the `fail_at`th
    failing)."""
    text = RUNBOOK
    for old, new in edits.items():
        assert old in text, old
        text = text.replace(old, new)
    counted = "" if fail_at is None else f", count_in: {tmp_path / 'measures'}, fail_at: {fail_at}"
    text = text.replace("BUDGET", budget).replace(" COUNTED", counted)
    path = tmp_path / "searched.yaml"
    path.write_text(text)
    return path


def run(path: Path, *more: str) -> subprocess.CompletedProcess[str]:
    return runbook_cli("run", str(path), "--log-dir", str(path.parent / "logs"), *more)


def status(path: Path) -> tuple[Path, dict[str, dict[str, Any]]]:
    """The last run's folder and its steps by id (`runbook status --json`)."""
    logs = path.parent / "logs"
    done = runbook_cli("status", "--log-dir", str(logs), "--json")
    assert done.returncode == 0, done.stderr
    shown = json.loads(done.stdout)
    return logs / shown["run"]["run_id"], {row["step"]: row for row in shown["steps"]}


def events(run_dir: Path, *names: str) -> list[dict[str, Any]]:
    """The run's events named `names`, in order."""
    lines = (run_dir / EVENTS_FILE).read_text().splitlines()
    return [e for e in map(json.loads, lines) if e["event"] in names]


def recorded(run_dir: Path) -> list[dict[str, Any]]:
    """The group's decisions as the run's state keeps them."""
    with open_state(run_dir) as state:
        raw = state.get(SEARCH_KEY)
    assert raw is not None
    decisions: list[dict[str, Any]] = json.loads(raw)[GROUP]
    return decisions


def launched(steps: dict[str, dict[str, Any]]) -> list[str]:
    return [c for c in CONFIGS if steps[c]["status"] != "skipped"]


def test_a_search_launches_fewer_than_the_grid_finds_its_answer_and_records_every_decision(tmp_path: Path) -> None:
    path = runbook(tmp_path)
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
    path = runbook(tmp_path, "{launches: 2}")
    plan = runbook_cli("plan", str(path), env=WIDE)
    assert plan.returncode == 0, plan.stderr
    assert f"worst case 2 of the grid's {len(CONFIGS)} launches" in plan.stdout, plan.stdout
    done = run(path)
    assert done.returncode == 0, done.stderr
    run_dir, steps = status(path)
    assert len(launched(steps)) == 2
    for config in set(CONFIGS) - set(launched(steps)):
        why = f"search: not launched {config}: never launched: the search's budget of 2 launches was spent"
        assert (steps[config]["status"], steps[config]["message"]) == ("skipped", why)
    assert [d["action"] for d in recorded(run_dir)] == ["launch"] * 2 + ["unexplored"] * (len(CONFIGS) - 2)


def test_a_gpu_hours_budget_is_checked_before_each_launch_so_the_first_one_happens(tmp_path: Path) -> None:
    path = runbook(tmp_path, "{gpu_hours: 1.0e-9}")
    plan = runbook_cli("plan", str(path), env=WIDE)
    assert "budget 1e-09 GPU-hours" in plan.stdout and "(no launch cap: the GPU-hours stop it)" in plan.stdout
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
    path = runbook(tmp_path, fail_at=4, edits=edits)
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
    path = runbook(tmp_path, fail_at=2)  # the first launch's measure fails: the run has one decision
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
    path = runbook(tmp_path, edits=edits)
    done = runbook_cli("validate", str(path))
    assert done.returncode == 2, done.stdout
    (problem,) = [line for line in done.stderr.splitlines() if line.startswith(f"{path}:")]
    assert problem.startswith(f"{path}:{where[0]}:{where[1]}: ") and said in problem, problem


def test_a_budget_in_gpu_hours_may_be_written_as_yaml_writes_small_numbers(tmp_path: Path) -> None:
    done = runbook_cli("validate", str(runbook(tmp_path, "{gpu_hours: 1e-9}")))
    assert done.returncode == 0, done.stderr


def test_a_search_over_more_configurations_than_it_judges_is_refused_before_anything_runs(tmp_path: Path) -> None:
    """SEARCH_MAX_LAUNCHES (500) server configurations at most: 2 drafters x 251 token counts are 502."""
    tokens = ", ".join(str(n) for n in range(1, 252))
    path = runbook(tmp_path, edits={"tokens: [2, 4, 8, 16]": f"tokens: [{tokens}]"})
    done = runbook_cli("validate", str(path))
    assert done.returncode == 2, done.stdout
    assert f"502 server configurations; a search judges at most {SEARCH_MAX_LAUNCHES}" in done.stderr
