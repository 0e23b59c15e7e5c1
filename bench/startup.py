"""Benchmark 9: how long a `runbook` command takes to start, against importing what it cannot do without.

An agent runs `runbook status` or `runbook runs` after every step it starts; each of those is a fresh
process whose time is nearly all interpreter start and imports. The baseline is the same interpreter
importing the two libraries every command needs (`python -c 'import yaml, pydantic'`), so the ratio says
what runbook itself adds. Every case is a fresh process: `python -m executor.faces.cli ...` from the checkout
measured (the console script `runbook` runs the same `main` after the same imports), its wall time from
start to exit. The cases run interleaved, one process each per repetition, and the table gives medians.
Every case reads its modules' bytecode from a cache, as an installed runbook does (pip writes it), after one
untimed run of each case filled it: a checkout run with PYTHONDONTWRITEBYTECODE would otherwise compile
runbook's modules at every start but not yaml's or pydantic's.
`status` and `runs` read a run folder of one real run (runbooks/demo_local.yaml on this machine, made
once before timing); `validate` and `plan` read the flagship runbooks/k26_dflash.yaml.

With `--before TREE` every command also runs from that checkout in the same repetitions (its folder first
on PYTHONPATH), so one run measures a change before and after.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from bench.harness import REPO, Section, Series, Table, Target, fmt_ratio, fmt_seconds, interleave, ratio
from bench.tools import timed_subprocess

#: Fresh processes per case: each is short, and a median of many is steady on a busy machine.
PROCESSES = 21
BASELINE = "python -c 'import yaml, pydantic'"
#: What `validate` cannot do without, for scale: `import pydantic` loads almost nothing (its names load on
#: first use), while validating loads pydantic's model machinery, its plugin scan at the first validator built,
#: and Jinja2 (a gate's syntax is checked).
FLOOR = "floor: yaml, Jinja2, one pydantic model validated"
FLOOR_CODE = (
    "import yaml, jinja2\nfrom pydantic import BaseModel\nclass M(BaseModel):\n    x: int\n"
    "M(x=1)\njinja2.Environment().parse('{{ x }}')"
)
FLAGSHIP = "runbooks/k26_dflash.yaml"
#: The issues' targets: a command's median over the baseline's (issue 17: status, runs, validate; 29: plan).
TARGETS = {"status": 1.5, "runs": 1.5, "validate": 2.0, "plan": 2.0}


def commands(log_dir: Path) -> dict[str, list[str]]:
    """Each measured command's arguments (after `python -m executor.faces.cli`), by its name in the report."""
    return {
        "status": ["status", "--log-dir", str(log_dir)],
        "runs": ["runs", "--log-dir", str(log_dir)],
        "validate": ["validate", FLAGSHIP],
        "plan": ["plan", FLAGSHIP],
        "--help": ["--help"],
    }


def _case(argv: Sequence[str], tree: Path, cache: Path) -> Callable[[], float]:
    env = {"PYTHONPATH": str(tree), "PYTHONPYCACHEPREFIX": str(cache), "PYTHONDONTWRITEBYTECODE": ""}
    return lambda: timed_subprocess(argv, cwd=tree, env=env)


def _one_run(log_dir: Path) -> None:
    """A run folder for `status` and `runs` to read: the local demo runbook, run once, untimed."""
    subprocess.run(
        [sys.executable, "-m", "executor.faces.cli", "run", "runbooks/demo_local.yaml", "--log-dir", str(log_dir)],
        cwd=REPO,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=120,
        check=True,
    )


def section(reps: int, log: Callable[[str], None], before: Path | None = None) -> Section:
    """Benchmark 9's section: every command's median start, its ratio to the baseline, and the targets."""
    trees = {"": REPO, **({f", before: {before}": before} if before else {})}
    with tempfile.TemporaryDirectory(prefix="bench-startup-") as tmp:
        log_dir, cache = Path(tmp) / "logs", Path(tmp) / "pycache"
        _one_run(log_dir)
        imports = [sys.executable, "-c", "import yaml, pydantic"]
        cases: dict[str, Callable[[], float]] = {BASELINE: _case(imports, REPO, cache)}
        cases[FLOOR] = _case([sys.executable, "-c", FLOOR_CODE], REPO, cache)
        for label, tree in trees.items():
            for name, args in commands(log_dir).items():
                cases[f"runbook {name}{label}"] = _case(
                    [sys.executable, "-m", "executor.faces.cli", *args], tree, cache
                )
        interleave(1, cases)  # untimed: fills the bytecode cache
        results = interleave(reps, cases, log)
    baseline = results[BASELINE].median
    table = Table(["command", "median start to exit", "vs baseline", "target"])
    table.rows.append([BASELINE, fmt_seconds(baseline), "1x", ""])
    table.rows.append([FLOOR, _time(results[FLOOR]), fmt_ratio(ratio(results[FLOOR].median, baseline)), ""])
    for case, series in results.items():
        if case in (BASELINE, FLOOR):
            continue
        name = case.removeprefix("runbook ").split(",")[0]
        limit = TARGETS.get(name)
        table.rows.append([case, _time(series), fmt_ratio(ratio(series.median, baseline)), _within(limit)])
    targets = []
    for name, limit in TARGETS.items():
        measured = ratio(results[f"runbook {name}"].median, baseline)
        targets.append(
            Target(
                f"`runbook {name}` starts within {limit:g}x of `{BASELINE}`",
                None if measured is None else measured <= limit,
                f"{_time(results[f'runbook {name}'])} vs {fmt_seconds(baseline)} = {fmt_ratio(measured)}",
            )
        )
    return Section(
        title="9. Start-up",
        method=(
            f"Each command a fresh process, `python -m executor.faces.cli COMMAND` with this checkout first on "
            f"PYTHONPATH, against `{BASELINE}` with the same interpreter, every module's bytecode cached "
            f"(PYTHONPYCACHEPREFIX, filled by one untimed run of each case): medians of {reps} interleaved "
            f"repetitions, one process of each case per repetition. `status` and `runs` read the run folder of one "
            f"run of runbooks/demo_local.yaml; `validate` and `plan` read the flagship {FLAGSHIP}. "
            "The `floor` row is a process doing only what `validate` cannot do without (FLOOR_CODE), for scale."
            + (f" Rows marked `before: {before}` run that checkout's CLI in the same repetitions." if before else "")
        ),
        tables=[table],
        notes=[f"{case}: failed: {series.failure}" for case, series in results.items() if series.failure],
        targets=targets,
    )


def _time(series: Series) -> str:
    return "failed (see below)" if series.failure else fmt_seconds(series.median)


def _within(limit: float | None) -> str:
    return "" if limit is None else f"within {limit:g}x"
