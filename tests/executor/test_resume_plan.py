"""executor.run.resume without a host: the plan of each step (what, why, where), the carry-over of --var and
--inventory, and that the CLI and the Engine API resume alike, reading the runbook and the run once.

The plans are of runbooks loaded from small YAML files and of constructed source records; the last tests
run the real CLI in-process on the controller (`address: local`), no sshd needed.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from executor.errors import ResumeError
from executor.faces.cli import main
from executor.run.engine import Engine, RunOptions
from executor.run.events import Reporter
from executor.run.resume import Fingerprints, Plan, carry_over, plan_steps
from executor.run.state import RunMeta, StepRecord
from executor.runbook.loader import Runbook, load_runbook
from executor.runbook.model import var_text
from tests.clirun import runbook_cli

SOURCE = "20260101-000000-abcdef"

#: s1 and s2 run on both hosts, s2's gate reads s1's facts, s3 and s4 run on `a` only
BOOK = """\
    name: plans
    hosts: {a: {address: local}, b: {address: gpu-box.example}}
    vars: {color: red, size: 1}
    steps:
      - {id: s1, kind: shell, script: 'echo $color', hosts: all}
      - {id: s2, kind: shell, script: 'echo two', hosts: all, gates: ['steps.s1.exit_code == 0']}
      - {id: s3, kind: shell, script: 'echo $size', hosts: [a]}
      - {id: s4, kind: shell, script: 'echo four', hosts: [a]}
    """


@pytest.fixture(scope="module")
def book(tmp_path_factory: pytest.TempPathFactory) -> Runbook:
    path = tmp_path_factory.mktemp("plans") / "book.yaml"
    path.write_text(textwrap.dedent(BOOK))
    return load_runbook(path)


def fingerprints(book: Runbook, **variables: Any) -> Fingerprints:
    values = {**book.header.vars, **variables}
    return Fingerprints(book, {name: var_text(value) for name, value in values.items()}, [])


class Source:
    """The records of a source run, each of the step as `made` (the run's fingerprints) sees it."""

    def __init__(self, book: Runbook, made: Fingerprints) -> None:
        self.book, self.made = book, made
        self.records: dict[tuple[str, str], StepRecord] = {}

    def add(self, step: str, host: str, status: str = "passed") -> Source:
        spec = next(s for s in self.book.steps if s.id == step)
        started = status not in ("pending", "skipped")
        self.records[step, host] = StepRecord(
            step=step,
            host=host,
            position=[s.id for s in self.book.steps].index(step),
            status=status,
            fingerprint=self.made.fingerprint(spec, host) if started else "",
            parts=self.made.parts(spec, host) if started else None,
        )
        return self

    def all(self, status: str = "passed", *steps: str) -> Source:
        for step in steps or [s.id for s in self.book.steps]:
            for host in self.book.step_hosts[step]:
                self.add(step, host, status)
        return self


def planned(plan: Plan) -> dict[str, tuple[str, str, tuple[str, ...], tuple[str, ...]]]:
    return {p.step: (p.action, p.why, p.runs_on, p.reused_on) for p in plan.steps}


# ---- each branch of the plan, with the console's words ---------------------------------------------


def test_a_fresh_run_runs_every_step_on_all_its_hosts(book: Runbook) -> None:
    plan = plan_steps(book, fingerprints(book), {}, None)
    assert planned(plan) == {
        "s1": ("run", "runs", ("a", "b"), ()),
        "s2": ("run", "runs", ("a", "b"), ()),
        "s3": ("run", "runs", ("a",), ()),
        "s4": ("run", "runs", ("a",), ()),
    }
    assert plan.hosts_to_run == {"s1": ["a", "b"], "s2": ["a", "b"], "s3": ["a"], "s4": ["a"]}


def test_a_run_that_passed_is_reused_whole(book: Runbook) -> None:
    now = fingerprints(book)
    plan = plan_steps(book, now, Source(book, now).all().records, SOURCE)
    assert plan.to_run == [] and plan.reused == ["s1", "s2", "s3", "s4"]
    assert plan.why == dict.fromkeys(plan.reused, f"reused (passed in {SOURCE})")
    assert plan.step("s1").reused_on == ("a", "b") and plan.hosts_to_run == {}


def test_the_step_that_failed_runs_again_and_the_ones_not_reached_run(book: Runbook) -> None:
    now = fingerprints(book)
    source = Source(book, now).all("passed", "s1", "s2").add("s3", "a", "failed").add("s4", "a", "pending")
    plan = plan_steps(book, now, source.records, SOURCE)
    assert plan.why == {
        "s1": f"reused (passed in {SOURCE})",
        "s2": f"reused (passed in {SOURCE})",
        "s3": f"runs again (did not pass in {SOURCE})",
        "s4": f"runs (not reached in {SOURCE})",
    }
    source.add("s4", "a", "skipped")  # left out by an --only run
    assert plan_steps(book, now, source.records, SOURCE).why["s4"] == f"runs (skipped in {SOURCE})"


def test_a_changed_part_names_itself_and_every_later_step_runs_again(book: Runbook, tmp_path: Path) -> None:
    source = Source(book, fingerprints(book)).all()
    plan = plan_steps(book, fingerprints(book, color="blue"), source.records, SOURCE)  # a shell step gets every var
    assert plan.why == {
        "s1": f"runs again (changed since {SOURCE}: var color)",
        "s2": "runs again (after 's1')",
        "s3": "runs again (after 's1')",
        "s4": "runs again (after 's1')",
    }
    edited = tmp_path / "book.yaml"
    edited.write_text(textwrap.dedent(BOOK).replace("echo $size", "echo size=$size"))
    now = load_runbook(edited)
    plan = plan_steps(now, fingerprints(now), source.records, SOURCE)
    assert (plan.reused, plan.why["s3"], plan.why["s4"]) == (
        ["s1", "s2"],
        f"runs again (changed since {SOURCE}: step)",
        "runs again (after 's3')",
    )
    # a record from before the parts were kept can only say that the definition changed
    source.records["s3", "a"].parts = None
    assert plan_steps(now, fingerprints(now), source.records, SOURCE).why["s3"] == (
        f"runs again (changed since {SOURCE}: its definition)"
    )


def test_a_step_that_passed_on_some_hosts_runs_again_only_on_the_others(book: Runbook) -> None:
    now = fingerprints(book)
    source = Source(book, now).add("s1", "a").add("s1", "b", "failed").all("pending", "s2", "s3", "s4")
    plan = plan_steps(book, now, source.records, SOURCE)
    assert planned(plan)["s1"] == (
        "run",
        f"runs again on b (did not pass there in {SOURCE}); reused on a",
        ("b",),
        ("a",),
    )
    assert plan.why["s2"] == f"runs (not reached in {SOURCE})" and plan.step("s2").runs_on == ("a", "b")


def test_a_step_changed_on_one_host_only_runs_again_there(book: Runbook, tmp_path: Path) -> None:
    """Host b moved: s1 passed on both hosts, and runs again on b alone, saying what changed there."""
    source = Source(book, fingerprints(book)).all()
    moved = tmp_path / "book.yaml"
    moved.write_text(textwrap.dedent(BOOK).replace("gpu-box.example", "other-box.example"))
    now = load_runbook(moved)
    plan = plan_steps(now, fingerprints(now), source.records, SOURCE)
    assert planned(plan)["s1"] == (
        "run",
        f"runs again on b (changed there since {SOURCE}: host); reused on a",
        ("b",),
        ("a",),
    )
    assert plan.why["s2"] == "runs again (after 's1')" and plan.step("s2").reused_on == ()


def test_from_and_only_reuse_earlier_facts_and_warn_when_they_may_be_stale(book: Runbook) -> None:
    source = Source(book, fingerprints(book)).all()
    plan = plan_steps(book, fingerprints(book), source.records, SOURCE, from_step="s3")
    assert plan.why == {
        "s1": f"facts reused from {SOURCE}",
        "s2": f"facts reused from {SOURCE}",
        "s3": "runs (--from)",
        "s4": "runs (--from)",
    }
    only = plan_steps(book, fingerprints(book, color="blue"), source.records, SOURCE, only_step="s2")
    assert only.why == {
        "s1": f"facts reused from {SOURCE} although the step changed since (var color; --from s1 runs it again)",
        "s2": "runs (--only)",
        "s3": "skipped (--only)",
        "s4": "skipped (--only)",
    }
    assert (only.reused, only.to_run, only.step("s1").reused_on) == (["s1"], ["s2"], ("a", "b"))


def test_from_refuses_an_unknown_step_and_a_step_whose_facts_never_passed(book: Runbook) -> None:
    now = fingerprints(book)
    with pytest.raises(ResumeError, match=r"no step 'nosuch' in the runbook \(steps: s1, s2, s3, s4\)"):
        plan_steps(book, now, {}, None, from_step="nosuch")
    with pytest.raises(ResumeError) as refused:
        plan_steps(book, now, {}, None, from_step="s2")  # s2's gate reads s1's facts: there are none
    assert str(refused.value) == (
        "step 's2' needs facts from step 's1', which has never passed; run it first (e.g. --from s1)"
    )
    source = Source(book, now).add("s1", "a").add("s1", "b", "failed")
    plan = plan_steps(book, now, source.records, SOURCE, from_step="s3")  # s3 and s4 need nothing
    assert (plan.step("s1").action, plan.step("s1").reused_on) == ("skip", ("a", "b"))  # kept as it ended
    assert plan.why["s1"] == f"facts reused from {SOURCE} on a; kept failed on b (as in {SOURCE})"
    partly = Source(book, now).add("s1", "a").add("s1", "b", "interrupted").records
    plan = plan_steps(book, now, partly, SOURCE, from_step="s3")
    assert (plan.step("s1").reused_on, plan.why["s1"]) == (
        ("a",),
        f"skipped on b (never passed there); facts reused from {SOURCE} on a",
    )
    never = plan_steps(book, now, Source(book, now).add("s1", "b", "interrupted").records, SOURCE, from_step="s3")
    assert (never.step("s1").reused_on, never.why["s1"]) == ((), "skipped (never passed)")


# ---- properties over random outcomes of a source run -----------------------------------------------

OUTCOMES = st.sampled_from(["passed", "passed", "passed", "failed", "running", "interrupted", "pending", "skipped"])
#: for each step and host: what the source run recorded (None: no row) and whether the step changed since
CELL = st.tuples(st.none() | OUTCOMES, st.booleans())


def _source_of(book: Runbook, cells: list[tuple[str | None, bool]]) -> dict[tuple[str, str], StepRecord]:
    now, before = fingerprints(book), fingerprints(book, color="old", size=0)
    pairs = [(spec, host) for spec in book.steps for host in book.step_hosts[spec.id]]
    records: dict[tuple[str, str], StepRecord] = {}
    for (spec, host), (status, changed) in zip(pairs, cells, strict=False):
        if status is not None:
            made = before if changed else now  # a shell step gets every var: each of them changed
            records.update(Source(book, made).add(spec.id, host, status).records)
    return records


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cells=st.lists(CELL, min_size=6, max_size=6))
def test_a_resume_reuses_exactly_the_unchanged_passed_prefix(book: Runbook, cells: list[Any]) -> None:
    now = fingerprints(book)
    source = _source_of(book, cells)
    plan = plan_steps(book, now, source, SOURCE)
    actions = [p.action for p in plan.steps]
    assert "skip" not in actions
    first_run = actions.index("run") if "run" in actions else len(actions)
    assert actions[first_run:] == ["run"] * (len(actions) - first_run), "once a step runs, every later step runs"
    for spec, step in zip(book.steps, plan.steps, strict=True):
        hosts = book.step_hosts[spec.id]
        assert set(step.runs_on) | set(step.reused_on) == set(hosts) and not set(step.runs_on) & set(step.reused_on)
        for host in step.reused_on:  # a reused record passed, with the fingerprint the step has now
            record = source[spec.id, host]
            assert record.status == "passed" and record.fingerprint == now.fingerprint(spec, host)
        if step.action == "run":
            assert step.runs_on, step
            unchanged_pass = all(now.same(spec, source.get((spec.id, h))) for h in hosts) and all(
                source[spec.id, h].status == "passed" for h in hosts
            )
            assert not unchanged_pass or spec.id != plan.to_run[0], "the first step to run is not one to reuse"
            assert step.reused_on == () or spec.id == plan.to_run[0], "only the first step to run reuses hosts"


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    cells=st.lists(CELL, min_size=6, max_size=6), start=st.sampled_from(["s1", "s2", "s3", "s4"]), only=st.booleans()
)
def test_from_and_only_run_from_their_step_and_reuse_what_passed_before(
    book: Runbook, cells: list[Any], start: str, only: bool
) -> None:
    source = _source_of(book, cells)
    s1_passed = all((r := source.get(("s1", h))) is not None and r.status == "passed" for h in "ab")
    scope = {"only_step": start} if only else {"from_step": start}
    if start == "s2" and not s1_passed:  # s2's gate reads s1's facts, which never passed
        with pytest.raises(ResumeError, match="needs facts from step 's1', which has never passed"):
            plan_steps(book, fingerprints(book), source, SOURCE, **scope)
        return
    plan = plan_steps(book, fingerprints(book), source, SOURCE, **scope)
    ids = [s.id for s in book.steps]
    for index, step in enumerate(plan.steps):
        hosts = tuple(book.step_hosts[step.step])
        passed = all((r := source.get((step.step, h))) is not None and r.status == "passed" for h in hosts)
        if index < ids.index(start):
            assert step.action == ("reuse" if passed else "skip")
            ended = ("passed", "failed")  # the newest outcome: a failure is kept as such, never as "never passed"
            kept = tuple(h for h in hosts if (r := source.get((step.step, h))) is not None and r.status in ended)
            assert step.reused_on == kept, "every host's record that passed or failed is kept"
        elif index == ids.index(start) or not only:
            assert (step.action, step.runs_on) == ("run", hosts)
        else:
            assert (step.action, step.why) == ("skip", "skipped (--only)")


# ---- the carry-over of --var and --inventory -------------------------------------------------------


def _meta(book: Runbook, **fields: Any) -> RunMeta:
    return RunMeta(
        **{"run_id": SOURCE, "runbook": book.name, "path": str(book.path.resolve()), "started_at": ""} | fields
    )


def test_a_resume_carries_the_source_s_vars_and_inventory_under_those_given_now(book: Runbook) -> None:
    said: list[str] = []
    source = _meta(book, var_args=["color=blue", "size=3"], inventory="/site/inv.yaml")
    carry = carry_over(source, book.path, [], None, say=said.append)
    assert (carry.inventory, carry.carried_inventory, carry.var_args) == (
        Path("/site/inv.yaml"),
        True,
        ["color=blue", "size=3"],
    )
    assert said == [f"resuming {SOURCE} as it was started: --inventory /site/inv.yaml --var color=blue --var size=3"]

    said.clear()
    carry = carry_over(source, book.path, ["size=9"], Path("/other.yaml"), say=said.append)
    assert (carry.inventory, carry.carried_inventory, carry.var_args) == (
        Path("/other.yaml"),
        False,
        ["color=blue", "size=9"],
    )
    assert said == [f"resuming {SOURCE} as it was started: --var color=blue"]
    # an API caller's value given now wins over the source's pair, which the run then neither says nor keeps
    said.clear()
    assert carry_over(source, book.path, [], Path("/x"), values_given={"color"}, say=said.append).var_args == ["size=3"]
    assert said == [f"resuming {SOURCE} as it was started: --var size=3"]


def test_nothing_carried_is_nothing_said_but_another_runbook_file_is(book: Runbook) -> None:
    said: list[str] = []
    assert carry_over(_meta(book), book.path, [], None, say=said.append).var_args == []
    assert said == []
    elsewhere = _meta(book, path="/old/book.yaml")
    carry_over(elsewhere, book.path, [], None, say=said.append)
    assert said == [f"note: run {SOURCE} ran /old/book.yaml; this is {book.path.resolve()}"]


def test_a_var_that_held_a_secret_is_asked_for_again(book: Runbook) -> None:
    source = _meta(book, var_args=["size=3"], var_args_withheld=["color"])
    with pytest.raises(ResumeError) as refused:
        carry_over(source, book.path, [], None)
    assert str(refused.value) == (
        f"run {SOURCE} was started with --var color=... holding a secret's value, which is never stored; "
        "give it again: --var color=..."
    )
    assert carry_over(source, book.path, ["color=tok"], None).var_args == ["size=3", "color=tok"]
    assert carry_over(source, book.path, [], None, values_given={"color"}).var_args == ["size=3"]


def test_the_carried_line_is_masked_by_this_run_s_secrets(book: Runbook) -> None:
    from executor.redact import Redactor

    said: list[str] = []
    token = "hf_" + "k" * 30
    carry_over(
        _meta(book, var_args=[f"color={token}"]), book.path, [], None, redactor=Redactor([token]), say=said.append
    )
    assert said == [f"resuming {SOURCE} as it was started: --var color=***"] and token not in said[0]


# ---- the CLI and the Engine API, in-process on the controller ---------------------------------------

LOCAL_BOOK = """\
    name: local-carry
    hosts: {here: {address: local}}
    vars: {color: red, size: small}
    steps:
      - {id: c1, kind: shell, script: 'echo "$color-$size"'}
      - {id: c2, kind: shell, script: 'test -f "{marker}"'}
    """


@pytest.fixture
def failed_local_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Iterator[tuple[Path, Path, Path]]:
    """A run of LOCAL_BOOK started with --var and --inventory that failed at c2: (book, logs, marker)."""
    book, logs, marker, site = tmp_path / "book.yaml", tmp_path / "logs", tmp_path / "marker", tmp_path / "site.yaml"
    book.write_text(textwrap.dedent(LOCAL_BOOK).replace("{marker}", str(marker)))
    site.write_text("vars: {size: large}\n")
    args = ["run", str(book), "--var", "color=blue", "--inventory", str(site), "--log-dir", str(logs)]
    assert main(args) == 1, capsys.readouterr().err
    capsys.readouterr()
    marker.touch()
    yield book, logs, marker


def _newest(logs: Path) -> dict[str, Any]:
    metas = [json.loads(p.read_text()) for p in logs.glob("*/run.json")]
    return max(metas, key=lambda m: m["started_at"])  # type: ignore[no-any-return]


def test_an_engine_started_through_the_api_resumes_as_the_cli_does(failed_local_run: tuple[Path, Path, Path]) -> None:
    """The API caller gives neither the --var nor the --inventory: the source run's carry over, so the
    step that passed is reused (not run again as changed), and the resumed run records them."""
    book, logs, _marker = failed_local_run
    first = _newest(logs)
    engine = Engine(load_runbook(book), RunOptions(log_dir=logs, resume="latest"), Reporter())
    assert asyncio.run(engine.run()) == 0
    assert engine.records["c1", "here"].reused_from == first["run_id"]
    assert engine.variables["color"] == "blue" and engine.variables["size"] == "large"
    site = Path(first["inventory"])
    assert engine.start.notes == [f"resuming {first['run_id']} as it was started: --inventory {site} --var color=blue"]
    resumed = _newest(logs)
    assert (resumed["resumed_from"], resumed["var_args"], resumed["inventory"]) == (
        first["run_id"],
        ["color=blue"],
        str(site),
    )


def _counting(monkeypatch: pytest.MonkeyPatch, function: Callable[..., Any]) -> list[int]:
    """Wrap `function` wherever a module of this project imported it; the list counts its calls."""
    calls: list[int] = []

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return function(*args, **kwargs)

    for name, module in list(sys.modules.items()):
        if name.split(".")[0] in ("executor", "steps") and getattr(module, function.__name__, None) is function:
            monkeypatch.setattr(module, function.__name__, counted)
    return calls


def test_a_resume_reads_the_runbook_and_finds_the_run_once(
    failed_local_run: tuple[Path, Path, Path], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from executor.run import state
    from executor.runbook import loader

    book, logs, _marker = failed_local_run
    loads, finds = _counting(monkeypatch, loader.load_runbook), _counting(monkeypatch, state.find_run)
    assert main(["run", str(book), "--resume", "--log-dir", str(logs)]) == 0
    err = capsys.readouterr().err
    assert "as it was started: --inventory" in err and "--var color=blue" in err
    assert (len(loads), len(finds)) == (1, 1)


def test_from_and_only_with_a_matrix_step_as_written_name_its_instances_not_every_step(tmp_path: Path) -> None:
    """`--only bench` (a matrix step's id as written) was `no step 'bench'` followed by every instance
    id of the runbook: up to 10 000 of them, none said to be what `bench` expands to."""
    path = tmp_path / "grid.yaml"
    values = ", ".join(map(str, range(500)))
    path.write_text(
        "name: grid\nhosts: {box: {address: local}}\nsteps:\n  - {id: pre, kind: shell, script: echo}\n"
        f"  - id: bench\n    kind: shell\n    matrix: {{n: [{values}]}}\n    script: echo $matrix_n\n"
    )
    book = load_runbook(path)
    now = fingerprints(book)
    with pytest.raises(ResumeError) as refused:
        plan_steps(book, now, {}, None, only_step="bench")
    assert str(refused.value) == (
        "no step 'bench' in the runbook: 'bench' is a matrix step (group 'bench') of 500 instances; "
        "name one, such as 'bench[n=0]' (`runbook validate` lists the cells)"
    )
    with pytest.raises(ResumeError, match=r"^no step 'nosuch' in the runbook \(steps: pre, bench\[\.\.\.\]\)$"):
        plan_steps(book, now, {}, None, from_step="nosuch")


GRID = """\
    name: grid
    hosts: {a: {address: local}}
    steps:
      - {id: pre, kind: shell, script: echo pre}
      - group: grid
        matrix: {srv: [x, y], conc: [1, 2]}
        steps:
          - {id: up, kind: shell, script: echo $matrix_srv}
          - {id: bench, kind: shell, script: echo $matrix_srv $matrix_conc, gates: ['steps.up.exit_code == 0']}
      - {id: post, kind: shell, script: echo post}
    """


def test_only_a_matrix_instance_keeps_the_group_s_cells_that_do_not_depend_on_it(tmp_path: Path) -> None:
    """What `--only` leaves out that a `--resume` would reuse is kept (reused): the group's other cells, so that
    a later report of the run still has them; an instance of the same cell, one that needs it, and every step
    after the group are left out (`skipped (--only)`), as they may depend on what ran."""
    path = tmp_path / "grid.yaml"
    path.write_text(textwrap.dedent(GRID))
    grid = load_runbook(path)
    now = fingerprints(grid)
    source = Source(grid, now).all().records
    plan = plan_steps(grid, now, source, SOURCE, only_step="bench[srv=x,conc=1]")
    kept = f"reused (passed in {SOURCE})"
    assert {p.step: p.why for p in plan.steps if p.action != "reuse" or p.why == kept} == {
        "bench[srv=x,conc=1]": "runs (--only)",
        "bench[srv=x,conc=2]": kept,
        "up[srv=y]": kept,
        "bench[srv=y,conc=1]": kept,
        "bench[srv=y,conc=2]": kept,
        "post": "skipped (--only)",
    }
    server = plan_steps(grid, now, source, SOURCE, only_step="up[srv=x]")  # both x cells run against it
    assert [p.step for p in server.steps if p.action == "skip"] == [
        "bench[srv=x,conc=1]",
        "bench[srv=x,conc=2]",
        "post",
    ]
    assert [p.step for p in server.steps if p.why == kept] == [
        "up[srv=y]",
        "bench[srv=y,conc=1]",
        "bench[srv=y,conc=2]",
    ]


@pytest.mark.parametrize(
    "order",
    [
        "FILE --resume",
        "--resume FILE",
        "--resume=FILE",
        "--var color=green --resume FILE",
        "FILE --resume RUN",
        "--resume RUN FILE",
        "--resume FILE RUN",
    ],
)
def test_resume_and_its_file_in_any_order(failed_local_run: tuple[Path, Path, Path], order: str) -> None:
    """`--resume` takes an optional RUN_ID: argparse gave it the FILE after it (`runbook run --resume FILE` asked
    for a file; `--resume FILE RUN` took the run id for the runbook). Every order resumes the run it names (the
    latest without RUN), FILE the runbook."""
    book, logs, marker = failed_local_run
    marker.unlink()  # c2 fails again: each resume ends as its source did, 1
    first, latest = _newest(logs)["run_id"], _newest(logs)["run_id"]
    if "RUN" in order:  # a newer run than the one named, so that the latest is not what RUN resumes
        assert runbook_cli("run", str(book), "--log-dir", str(logs)).returncode == 1
        latest = _newest(logs)["run_id"]
    words = order.replace("RUN", first).replace("FILE", str(book)).split()
    done = runbook_cli("run", *words, "--log-dir", str(logs))
    assert done.returncode == 1, done.stderr
    assert _newest(logs)["resumed_from"] == (first if "RUN" in order else latest)


@pytest.mark.parametrize("order", ["FILE --resume RUN", "--resume RUN FILE"])
def test_a_file_named_as_the_run_id_beside_it_leaves_the_run_id_a_run_id(
    failed_local_run: tuple[Path, Path, Path], tmp_path: Path, order: str
) -> None:
    """A file in the working folder named as the run (`runbook status RUN > RUN`) made the run id pass for a
    runbook: `runbook run FILE --resume RUN`, the documented order, said there were two runbooks (exit 2).
    A FILE written as one (`.yaml`, a folder in it) is the runbook; the other word is the run id."""
    book, logs, marker = failed_local_run
    marker.unlink()  # c2 fails again: the resume ends as its source did, 1
    run_id = _newest(logs)["run_id"]
    (tmp_path / run_id).write_text("the output of runbook status\n")
    words = order.replace("RUN", run_id).replace("FILE", str(book)).split()
    done = runbook_cli("run", *words, "--log-dir", str(logs), cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    assert _newest(logs)["resumed_from"] == run_id


@pytest.mark.parametrize(
    ("words", "said"),
    [
        (["--resume"], "which runbook? give its FILE: runbook run FILE --resume"),
        (["--resume", "2026"], "which runbook? give its FILE: runbook run FILE --resume 2026"),
        ([], "which runbook? give its FILE: runbook run FILE"),
        (["--resume", "a.yaml", "b.yaml"], "two runbooks, a.yaml and b.yaml: give one FILE, then --resume [RUN_ID]"),
    ],
)
def test_a_run_without_one_runbook_says_what_to_type(tmp_path: Path, words: list[str], said: str) -> None:
    done = runbook_cli("run", *words, "--log-dir", str(tmp_path))
    assert done.returncode == 2
    assert done.stderr.splitlines()[-1] == f"runbook run: error: {said}"
    assert "Traceback" not in done.stderr and not list(tmp_path.iterdir())


def _run_started(done: Any) -> dict[str, Any]:
    started: dict[str, Any] = json.loads(done.stdout.partition("\n")[0])
    assert started["event"] == "run_started", done.stdout
    return started


def test_a_resume_shows_what_it_carries_and_unset_var_drops_a_carried_value(
    failed_local_run: tuple[Path, Path, Path],
) -> None:
    """The failed run was started with --var color=blue and an inventory setting size: a resume carries both and
    says so (console, `run_started.carried`); `--unset-var color` drops the carried value, so the runbook's
    default (red) applies again and c1, which reads it, runs again; `--var color=` is still the empty string."""
    book, logs, _marker = failed_local_run
    first = _newest(logs)
    site = first["inventory"]
    kept = runbook_cli("run", str(book), "--resume", "--json", "--log-dir", str(logs))
    assert kept.returncode == 0, kept.stderr
    assert _run_started(kept)["carried"] == {"inventory": site, "vars": {"color": "blue"}, "unset": []}
    assert f"as it was started: --inventory {site} --var color=blue" in kept.stderr

    dropped = runbook_cli("run", str(book), "--resume", "--unset-var", "color", "--json", "--log-dir", str(logs))
    assert dropped.returncode == 0, dropped.stderr
    started = _run_started(dropped)
    assert started["carried"] == {"inventory": site, "vars": {}, "unset": ["color"]}
    assert "not carried (--unset-var color): --var color=blue" in dropped.stderr
    assert started["steps"][0]["plan"].endswith("var color)")  # c1 reads it: it runs again
    assert (_newest(logs)["vars"]["color"], _newest(logs)["vars"]["size"]) == ("red", "large")

    empty = runbook_cli("run", str(book), "--resume", "--var", "color=", "--log-dir", str(logs))
    assert empty.returncode == 0, empty.stderr
    assert _newest(logs)["vars"]["color"] == ""


@pytest.mark.parametrize(
    ("words", "said"),
    [
        (["--resume", "--unset-var", "colr"], "carries no --var colr (did you mean 'color'?); it was started with"),
        (["--resume", "--unset-var", "size"], "a value from the runbook or the inventory is no --var to drop"),
        (["--resume", "--unset-var", "color", "--var", "color=x"], "--unset-var color and --var color=... together"),
        (["--unset-var", "color"], "--unset-var drops a --var that --resume would carry over: it needs --resume"),
    ],
)
def test_unset_var_of_a_value_not_carried_is_refused(
    failed_local_run: tuple[Path, Path, Path], words: list[str], said: str
) -> None:
    book, logs, _marker = failed_local_run
    before = sorted(logs.iterdir())
    done = runbook_cli("run", str(book), *words, "--log-dir", str(logs))
    assert done.returncode == 2 and said in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and sorted(logs.iterdir()) == before


def test_unset_var_on_a_run_started_without_any_var_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A run started with no --var at all: the refusal says so, not "it was started with --var none"."""
    book, logs = tmp_path / "book.yaml", tmp_path / "logs"
    book.write_text(textwrap.dedent(LOCAL_BOOK).replace("{marker}", str(tmp_path / "marker")))
    assert main(["run", str(book), "--log-dir", str(logs)]) == 1
    capsys.readouterr()
    done = runbook_cli("run", str(book), "--resume", "--unset-var", "color", "--log-dir", str(logs))
    assert done.returncode == 2, done.stderr
    assert "it was started with no --var;" in done.stderr and "--var none" not in done.stderr


HELD = """\
    name: held
    hosts: {here: {address: local}}
    vars: {port: 30000}
    steps:
      - {id: first, kind: shell, script: 'echo first', pass_env: []}
      - id: serve
        kind: shell
        parse: json
        gates: ['facts.failure is none']
        script: |
          if [ "$port" = 30000 ]; then
            echo '{"failure": "port 30000 is held by another process (pid 4242)", "failure_class": "PortInUse",'
            echo ' "failure_var": "port"}'
          else
            echo '{"failure": null}'
          fi
    """


def test_a_failure_a_var_caused_names_it_and_the_resume_that_changes_it(tmp_path: Path) -> None:
    """A step's facts name the var whose value caused its failure (`failure_var`, as deploy's PortInUse names its
    `port`): the failure's headline leads with `port=30000`, the console ends with the command that resumes
    with another value, `status` (and its --json, which the MCP tool returns) says the same; that command,
    run, passes, reusing the step before (which the var does not reach)."""
    book, logs = tmp_path / "held.yaml", tmp_path / "logs"
    book.write_text(textwrap.dedent(HELD))
    failed = runbook_cli("run", str(book), "--log-dir", str(logs))
    assert failed.returncode == 1, failed.stderr
    run_id = _newest(logs)["run_id"]
    command = f"runbook run {book} --resume {run_id} --log-dir {logs} --var port=NEW_VALUE"
    assert "serve@here: [primary] port=30000: port 30000 is held by another process (pid 4242)\n" in failed.stderr
    assert "serve@here failed because of port=30000; resume with another value:" in failed.stderr
    assert failed.stderr.splitlines()[-1] == command
    assert "after fixing the cause" not in failed.stderr  # the cause is named: no guessing line

    shown = runbook_cli("status", run_id, "--log-dir", str(logs))
    assert "serve@here: caused by port=30000; resume with another value:" in shown.stdout
    assert command in shown.stdout.splitlines()
    step = json.loads(runbook_cli("status", "--json", "--log-dir", str(logs)).stdout)["steps"][1]
    assert step["cause"] == {"var": "port", "value": "30000", "param": "", "resume": command}

    again = runbook_cli(*command.replace("NEW_VALUE", "30001").split()[1:])
    assert again.returncode == 0, again.stderr
    resumed = runbook_cli("status", "--json", "--log-dir", str(logs))
    steps = json.loads(resumed.stdout)["steps"]
    assert [(s["status"], s["reused_from"], s["cause"]) for s in steps] == [
        ("passed", run_id, None),
        ("passed", None, None),
    ]


def test_a_cause_whose_value_is_a_document_is_quoted_in_short(tmp_path: Path) -> None:
    """A var of 100 000 characters that caused a failure was quoted whole three times on the console (300 KB,
    one line of 100 KB), and whole in status and its --json: its head is quoted, with its length."""
    book, logs = tmp_path / "held.yaml", tmp_path / "logs"
    book.write_text(
        textwrap.dedent(HELD).replace("port: 30000", "port: '" + "3" * 100_000 + "'").replace(" = 30000", "")
    )
    failed = runbook_cli("run", str(book), "--log-dir", str(logs))
    assert failed.returncode == 1, failed.stderr
    quoted = "port=" + "3" * 200 + "... (100000 characters)"
    assert f"serve@here failed because of {quoted}; resume with another value:" in failed.stderr
    shown = runbook_cli("status", "--log-dir", str(logs))
    step = json.loads(runbook_cli("status", "--json", "--log-dir", str(logs)).stdout)["steps"][1]
    assert step["cause"]["value"] == quoted.removeprefix("port=")
    assert max(len(line) for line in (failed.stderr + shown.stdout).splitlines()) < 1000


@pytest.mark.parametrize("cause", ["{}", '{"var": "port"}', '{"value": "30000", "param": ""}'])
def test_a_damaged_cause_in_state_db_is_named_never_a_traceback(tmp_path: Path, cause: str) -> None:
    """A cause without its var or value (a state.db edited by hand) is a damaged store, named as any other
    misshapen column is: status, its --json and a resume said a KeyError's traceback."""
    book, logs = tmp_path / "held.yaml", tmp_path / "logs"
    book.write_text(textwrap.dedent(HELD))
    assert runbook_cli("run", str(book), "--log-dir", str(logs)).returncode == 1
    run_id = _newest(logs)["run_id"]
    with sqlite3.connect(logs / run_id / "state.db") as db:
        db.execute("UPDATE steps SET cause = ? WHERE step = 'serve'", (cause,))
    db.close()
    for argv in (["status"], ["status", "--json"], ["run", str(book), "--resume"]):
        shown = runbook_cli(*argv, "--log-dir", str(logs))
        assert shown.returncode == 2 and "Traceback" not in shown.stderr, shown.stderr
        assert "state.db is unreadable (step 'serve': field 'cause' must be" in shown.stderr, shown.stderr
