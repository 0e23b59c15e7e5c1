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

Each process's CPU time (user + system, the kernel's account of a waited-for child) is reported beside its wall
time: on a machine that other work loads, a process also waits for a core, so wall medians swing by half from
one run to the next, where the CPU a start costs moves little. The targets are judged on wall time, as the
issues state them.
"""

from __future__ import annotations

import resource
import statistics
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


def _case(argv: Sequence[str], tree: Path, cache: Path, cpu: list[float]) -> Callable[[], float]:
    """The process's wall time; its CPU time (user + system) appended to `cpu`."""
    env = {"PYTHONPATH": str(tree), "PYTHONPYCACHEPREFIX": str(cache), "PYTHONDONTWRITEBYTECODE": ""}

    def run() -> float:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        seconds = timed_subprocess(argv, cwd=tree, env=env)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
        return seconds

    return run


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
        argvs = {BASELINE: [sys.executable, "-c", "import yaml, pydantic"], FLOOR: [sys.executable, "-c", FLOOR_CODE]}
        tree_of = dict.fromkeys(argvs, REPO)
        for label, tree in trees.items():
            for name, args in commands(log_dir).items():
                argvs[f"runbook {name}{label}"] = [sys.executable, "-m", "executor.faces.cli", *args]
                tree_of[f"runbook {name}{label}"] = tree
        cpu: dict[str, list[float]] = {case: [] for case in argvs}
        cases = {case: _case(argv, tree_of[case], cache, cpu[case]) for case, argv in argvs.items()}
        interleave(1, cases)  # untimed: fills the bytecode cache
        for times in cpu.values():
            times.clear()
        results = interleave(reps, cases, log)
    baseline = results[BASELINE].median
    cpu_of = {case: statistics.median(times) if times else None for case, times in cpu.items()}
    table = Table(["command", "median start to exit", "vs baseline", "median CPU", "CPU vs baseline", "target"])
    for case, series in results.items():
        limit = TARGETS.get(case.removeprefix("runbook ").split(",")[0]) if case.startswith("runbook ") else None
        wall = "1x" if case == BASELINE else fmt_ratio(ratio(series.median, baseline))
        used = [fmt_seconds(cpu_of[case]), fmt_ratio(ratio(cpu_of[case], cpu_of[BASELINE]))]
        table.rows.append([case, _time(series), wall, *used, _within(limit)])
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
            f"repetitions, one process of each case per repetition, its wall time and its CPU time (user + system). "
            "`status` and `runs` read the run folder of one "
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
