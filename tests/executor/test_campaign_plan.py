"""Per-cell resume and the cell rules without a host: `plan_steps` over a matrix group whose instances are
built by hand (`Runbook.instances`, `Runbook.groups`), and `executor.runbook.cells.CellBook`.

The group: server axis `srv` (x, y), client axis `conc` (1, 2); `dep_S` stands for the server instance of
each server configuration (one launch each), `b_SC` for a benchmark of one cell, `pre` and `post` are plain
steps around it. Fails on main: there a resume reruns every step after the first one that runs.
"""

from __future__ import annotations

import dataclasses
import textwrap
from pathlib import Path

import pytest

from executor.run.resume import plan_steps
from executor.runbook.campaign import Cell, Instance, MatrixGroup, matrix_environment
from executor.runbook.cells import CellBook, Index, matrix_context
from executor.runbook.loader import Runbook, load_runbook
from tests.executor.test_resume_plan import SOURCE, Source, fingerprints

AXES = {"srv": ("x", "y"), "conc": (1, 2)}


def instances(extra: bool = False) -> dict[str, Instance]:
    """The group's instances; `extra`: `conc: 3` added to the axis (a new cell per server)."""
    concs = [1, 2, 3] if extra else [1, 2]
    found: dict[str, Instance] = {}
    for srv in ("x", "y"):
        cells = tuple(f"srv={srv},conc={c}" for c in concs)
        found[f"dep_{srv}"] = Instance(f"dep_{srv}", "dep", "g", {"srv": srv}, cells, f"dep_{srv}")
        for c in concs:
            values = {"srv": srv, "conc": c}
            found[f"b_{srv}{c}"] = Instance(f"b_{srv}{c}", "b", "g", values, (f"srv={srv},conc={c}",), f"dep_{srv}")
    return found


def book_of(tmp_path: Path, extra: bool = False, dep_x: str = "echo x") -> Runbook:
    found = instances(extra)
    steps = "\n".join(
        f"  - {{id: {i}, kind: shell, script: '{dep_x if i == 'dep_x' else 'echo ' + i}', host: a}}" for i in found
    )
    path = tmp_path / "book.yaml"
    path.write_text(
        textwrap.dedent("""\
        name: cells
        hosts: {a: {address: local}}
        steps:
          - {id: pre, kind: shell, script: echo pre, host: a}
        """)
        + steps
        + "\n  - {id: post, kind: shell, script: echo post, host: a}\n"
    )
    book = load_runbook(path)
    concs = (1, 2, 3) if extra else (1, 2)
    group = MatrixGroup(
        name="g",
        axes={"srv": ("x", "y"), "conc": concs},
        cells=tuple(Cell({"srv": s, "conc": c}) for s in ("x", "y") for c in concs),
        bases=("dep", "b"),
        instances=tuple(found),
        on_failure="continue",
        server_axes=("srv",),
        servers=("dep_x", "dep_y"),
    )
    return dataclasses.replace(book, groups=[group], instances=found)


def test_a_killed_cell_runs_again_with_its_server_and_nothing_else_of_the_group(tmp_path: Path) -> None:
    book = book_of(tmp_path)
    now = fingerprints(book)
    source = Source(book, now).all().add("b_x2", "a", "running")
    plan = plan_steps(book, now, source.records, SOURCE)
    assert plan.to_run == ["dep_x", "b_x2", "post"]
    assert plan.reused == ["pre", "b_x1", "dep_y", "b_y1", "b_y2"]
    assert "'b_x2' runs against it" in plan.step("dep_x").why
    assert plan.step("post").why == "runs again (after 'b_x2')"


def test_a_new_axis_value_runs_only_the_new_cells_and_their_servers(tmp_path: Path) -> None:
    before = book_of(tmp_path)
    made = fingerprints(before)
    source = Source(before, made).all()
    after = book_of(tmp_path, extra=True)
    plan = plan_steps(after, fingerprints(after), source.records, SOURCE)
    assert plan.to_run == ["dep_x", "b_x3", "dep_y", "b_y3", "post"]
    assert plan.step("b_x3").why == f"runs (not reached in {SOURCE})"


def test_a_changed_server_runs_its_cells_again_and_not_the_other_servers(tmp_path: Path) -> None:
    before = book_of(tmp_path)
    source = Source(before, fingerprints(before)).all()
    after = book_of(tmp_path, dep_x="echo x changed")
    plan = plan_steps(after, fingerprints(after), source.records, SOURCE)
    assert plan.to_run == ["dep_x", "b_x1", "b_x2", "post"]
    assert plan.step("b_x1").why == "runs again (after 'dep_x')"


def test_a_failed_instance_fails_its_cells_and_takes_down_what_needs_it(tmp_path: Path) -> None:
    book = book_of(tmp_path)
    specs = {s.id: s for s in book.steps}
    cells = CellBook(Index(book))
    cells.fail("dep_x", "server crashed at start-up\nlog tail")
    assert cells.why_not(specs["b_x1"]) == "cell failed: dep_x: server crashed at start-up"
    assert cells.why_not(specs["b_y1"]) is None and cells.why_not(specs["dep_y"]) is None
    assert cells.failed_cells() == [
        {"group": "g", "cell": "srv=x,conc=1", "reason": "dep_x: server crashed at start-up"},
        {"group": "g", "cell": "srv=x,conc=2", "reason": "dep_x: server crashed at start-up"},
    ]
    cells.status.update({"dep_y": "passed", "b_y1": "passed", "b_y2": "running"})
    assert cells.counts(book.groups[0]) == {"total": 4, "passed": 1, "failed": 2, "skipped": 0, "running": 1}
    assert cells.launches(book.groups[0]) == {"done": 1, "planned": 2}


@pytest.mark.parametrize(
    ("values", "env"),
    [
        ({"thinking": True, "tokens": 4}, {"matrix_thinking": "true", "matrix_tokens": "4"}),
        (
            {"spec": {"name": "ddtree-16", "algorithm": "DDTREE", "tokens": None, "budget": 16, "xs": [1]}},
            {
                "matrix_spec": "ddtree-16",
                "matrix_spec_name": "ddtree-16",
                "matrix_spec_algorithm": "DDTREE",
                "matrix_spec_tokens": "",
                "matrix_spec_budget": "16",
            },
        ),
    ],
)
def test_the_matrix_environment_and_context_of_an_instance(values: dict, env: dict) -> None:
    assert matrix_environment(values) == env
    assert matrix_context(values) == {k: dict(v) if isinstance(v, dict) else v for k, v in values.items()}
