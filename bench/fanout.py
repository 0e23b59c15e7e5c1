"""Benchmark 3: one step on 1, 8 and 32 hosts; how each tool's wall time grows with the fleet.

A fleet of real sshd servers on loopback ports (`bench.fleet`, one shared key and known_hosts, so
every tool sees identical hosts) is started once, for the largest count; each case runs one step
(`true`) on the first N of them with one tool, told to reach all N at once: runbook with
`hosts: all` and `max_parallel` = N, ansible-playbook with forks = N (pipelining, ControlPersist),
pyinfra with `--parallel` N, and the raw asyncssh floor, which shows what opening N SSH
connections costs this machine with no tool at all. Every (tool, N) case runs once per repetition,
interleaved, and a tool's ratio N hosts / 1 host is the median over repetitions of that ratio
within one repetition, so that both times saw the same load. The last column sets each tool's
time on the most hosts against the floor's: the part of the growth that is the tool's own.

The target, "fan-out to 32 hosts within 3x of one host", is judged for runbook, both as a user
runs it (the CLI, whose interpreter start is part of every time) and in-process (the engine alone,
where a fixed start-up cannot hide the growth).
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from bench.fleet import SHELLS, Shell, sshd_fleet
from bench.harness import (
    Section,
    Series,
    Table,
    Target,
    first_line,
    fmt_ratio,
    fmt_seconds,
    interleave,
    paired_median,
)
from bench.overhead import SHELL_LABELS, usable
from bench.tools import Ansible, AsyncsshFloor, Pyinfra, RunbookCLI, RunbookEngine, Runner
from sandbox.sshd import SSHServer

COUNTS = (1, 8, 32)
SCRIPT = "true"
TARGET_RATIO = 3.0


def runners() -> list[Runner]:
    """Every tool of the comparison, the floor last."""
    return [RunbookCLI(), RunbookEngine(), Ansible(), Pyinfra(), AsyncsshFloor()]


def hosts_text(count: int) -> str:
    return f"{count} host{'s' if count != 1 else ''}"


def case_name(runner: Runner, count: int) -> str:
    return f"{runner.name}, {hosts_text(count)}"


def cases(
    tools: Sequence[Runner], servers: Sequence[SSHServer], counts: Sequence[int]
) -> dict[str, Callable[[], float]]:
    """One case per (tool, host count): the tool runs the one step on the first `count` servers."""

    def case(runner: Runner, count: int) -> Callable[[], float]:
        return lambda: runner.run(servers[:count], [SCRIPT])

    return {case_name(r, n): case(r, n) for r in tools for n in counts}


def growth(series: dict[str, Series], runner: Runner, count: int, base: int) -> float | None:
    """Median over repetitions of (time on `count` hosts) / (time on `base` hosts)."""
    return paired_median(series[case_name(runner, count)], series[case_name(runner, base)], lambda a, b: a / b)


def section(
    counts: Sequence[int] = COUNTS,
    reps: int = 5,
    shell: Shell = "clean",
    log: Callable[[str], None] | None = None,
) -> Section:
    """Run benchmark 3 and describe it: a table of times and ratios, the 32-host target."""
    counts = sorted(counts)
    base, top = counts[0], counts[-1]
    tools, notes = usable(runners())
    with tempfile.TemporaryDirectory(prefix="bench-fanout-") as tmp, sshd_fleet(Path(tmp), top, shell) as servers:
        series = interleave(reps, cases(tools, servers, counts), log)
    floor = next(r for r in tools if isinstance(r, AsyncsshFloor))
    table = Table(
        [
            "tool",
            *map(hosts_text, counts),
            *(f"{n} / {base}" for n in counts[1:]),
            f"{top} hosts vs floor",
        ]
    )
    for runner in tools:
        times = [fmt_seconds(series[case_name(runner, n)].median) for n in counts]
        ratios = [fmt_ratio(growth(series, runner, n, base)) for n in counts[1:]]
        vs_floor = paired_median(series[case_name(runner, top)], series[case_name(floor, top)], lambda a, b: a / b)
        table.rows.append([runner.name, *times, *ratios, fmt_ratio(vs_floor)])
    notes += [f"{name}: failed: {first_line(s.failure)}" for name, s in series.items() if s.failure]
    targets = [
        _target(runner, growth(series, runner, top, base), top, base)
        for runner in tools
        if isinstance(runner, RunbookCLI | RunbookEngine)
    ]
    return Section(
        title=f"3. Fan-out — {SHELL_LABELS[shell]}",
        method=(
            f"One step (`{SCRIPT}`) on {', '.join(map(str, counts))} hosts: that many real sshd servers on "
            f"127.0.0.1 ports ({SHELLS[shell]}), every tool told to reach all hosts at once. Wall time from "
            f"the tool's start to its exit, medians of {reps} interleaved repetitions; `N / {base}` is the "
            f"median of that ratio within each repetition; `vs floor` sets each tool's time on {top} hosts "
            "against raw asyncssh's (the cost of the SSH connections themselves) in the same repetition."
        ),
        tables=[table],
        notes=notes,
        targets=targets,
    )


def _target(runner: Runner, value: float | None, top: int, base: int) -> Target:
    text = f"{runner.name}: fan-out to {hosts_text(top)} within {TARGET_RATIO:g}x of {hosts_text(base)}"
    if value is None:
        return Target(text, None, "a case failed")
    return Target(text, value <= TARGET_RATIO, f"{top} / {base} = {fmt_ratio(value)}")
