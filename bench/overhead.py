"""Benchmark 1 (per-command overhead) and benchmark 5 (the audit log's price).

Benchmark 1 runs 200 trivial steps (`true`) on one host, a real sshd on 127.0.0.1, with every tool:
runbook (its CLI, and its Engine in-process), the raw asyncssh floor (one connection, one exec
channel per command, nothing else), ansible-playbook and pyinfra (bench.tools says how each is
configured). A whole run's time mixes a one-time start (interpreter, imports, connecting) with
the per-step cost, so every tool also runs a single step in the same repetition: the marginal
cost of a step is (T(200) - T(1)) / 199, the median of that over repetitions. That marginal cost
is what "per-step overhead" means in the targets; the whole-run figure is shown beside it.

Benchmark 5 prices the audit log: the same run by the Engine in-process with the audit log on,
and with it off. runbook has no switch to turn it off, so the "build with it off" is the Engine
with `executor.run.run_folder.AuditLog` replaced, for that run only, by `bench.tools.NoAudit`, which
records nothing. Both cases run in the same interleaved repetitions as benchmark 1 when both are
asked for.

`step_times` and `step_table` are shared with benchmark 2 (bench/transfer.py), which measures
the same way with other scripts.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.fleet import SHELLS, Shell, sshd_fleet
from bench.harness import (
    Section,
    Series,
    Table,
    Target,
    ToolFailed,
    first_line,
    fmt_ratio,
    fmt_seconds,
    interleave,
    paired_median,
    ratio,
)
from bench.tools import (
    Ansible,
    AsyncsshFloor,
    LongLivedBash,
    Pyinfra,
    RunbookCLI,
    RunbookEngine,
    RunbookTransport,
    Runner,
)

STEPS = 200
SCRIPT = "true"
TARGET_VS_FLOOR = 1.5
TARGET_VS_ANSIBLE = 10.0
#: Issue 7 (the persistent runner): against one long-lived bash on one channel, and against Ansible.
TARGET_VS_RUNNER_FLOOR = 2.0
TARGET_RUNNER_VS_ANSIBLE = 100.0
SHELL_LABELS = {"clean": "clean shell", "login": "login shell with ~/.bashrc"}


@dataclass
class StepTimes:
    """Each tool's runs of one step and of all `steps` steps, interleaved on the same host."""

    steps: int
    series: dict[str, Series]  # by case name: "<tool>, 1 step" and "<tool>, N steps"

    def short(self, runner: Runner) -> Series:
        return self.series[f"{runner.name}, 1 step"]

    def long(self, runner: Runner) -> Series:
        return self.series[f"{runner.name}, {self.steps} steps"]

    def whole(self, runner: Runner) -> float | None:
        """Seconds per step over the whole run: the long run's median time / steps."""
        median = self.long(runner).median
        return None if median is None else median / self.steps

    def marginal(self, runner: Runner) -> float | None:
        """Seconds one more step costs: median over repetitions of (T(N) - T(1)) / (N - 1)."""
        return paired_median(self.long(runner), self.short(runner), lambda a, b: (a - b) / (self.steps - 1))

    def failures(self, tools: Sequence[Runner]) -> list[str]:
        """A note per tool of `tools` that failed, in its own words (once when both runs said the same)."""
        notes = []
        for runner in tools:
            said = dict.fromkeys(s.failure for s in (self.short(runner), self.long(runner)) if s.failure)
            notes += [f"{runner.name}: failed: {first_line(message, 600)}" for message in said]
        return notes


def step_times(
    tools: Sequence[Runner], scripts: Sequence[str], reps: int, shell: Shell, log: Callable[[str], None] | None
) -> StepTimes:
    """Run every tool on one fresh sshd with the first script alone and with all of them,
    `reps` interleaved repetitions, after one untimed run of each in-process tool."""
    steps = len(scripts)

    def case(runner: Runner, chosen: Sequence[str]) -> Callable[[], float]:
        return lambda: runner.run(servers, chosen)

    with tempfile.TemporaryDirectory(prefix="bench-steps-") as tmp, sshd_fleet(Path(tmp), 1, shell) as servers:
        for runner in tools:
            if runner.in_process:
                with contextlib.suppress(ToolFailed):  # a tool that fails here fails its cases below
                    runner.run(servers, scripts[:1])
        cases: dict[str, Callable[[], float]] = {}
        for runner in tools:
            cases[f"{runner.name}, 1 step"] = case(runner, scripts[:1])
            cases[f"{runner.name}, {steps} steps"] = case(runner, scripts)
        return StepTimes(steps, interleave(reps, cases, log))


def step_table(times: StepTimes, tools: Sequence[Runner], floor: Runner) -> Table:
    """Per tool: both run times, seconds per step (whole run and marginal), and ratios to `floor`."""
    n = times.steps
    table = Table(
        [
            "tool",
            "run of 1 step",
            f"run of {n} steps",
            "per step (whole run)",
            "per step (marginal)",
            "marginal vs floor",
            "whole run vs floor",
        ]
    )
    for runner in tools:
        failure = times.short(runner).failure or times.long(runner).failure
        if failure:
            table.rows.append([runner.name, "failed (see below)", *["—"] * 5])
            continue
        table.rows.append(
            [
                runner.name,
                fmt_seconds(times.short(runner).median),
                fmt_seconds(times.long(runner).median),
                fmt_seconds(times.whole(runner)),
                fmt_seconds(times.marginal(runner)),
                fmt_ratio(ratio(times.marginal(runner), times.marginal(floor))),
                fmt_ratio(ratio(times.whole(runner), times.whole(floor))),
            ]
        )
    return table


def usable(tools: Sequence[Runner]) -> tuple[list[Runner], list[str]]:
    """The runners that can run here, and a note for each that cannot."""
    notes = [f"{r.name}: not run: {why}" for r in tools if (why := r.missing())]
    return [r for r in tools if r.missing() is None], notes


def sections(
    parts: Collection[str] = ("overhead", "audit"),
    steps: int = STEPS,
    reps: int = 5,
    shell: Shell = "clean",
    log: Callable[[str], None] | None = None,
    before: Path | None = None,
) -> list[Section]:
    """Run benchmark 1 ("overhead") and/or 5 ("audit") in one set of repetitions; their sections.
    `before`: another checkout whose CLI runs in the same repetitions too (a change before and after)."""
    cli, engine, no_audit, floor = RunbookCLI(), RunbookEngine(), RunbookEngine(audit=False), AsyncsshFloor()
    wanted: list[Runner] = [cli, engine, *([RunbookCLI(tree=before)] if before else [])]
    if "audit" in parts:
        wanted.append(no_audit)
    if "overhead" in parts:
        wanted += [
            RunbookCLI("exec"),
            RunbookEngine(runner="exec"),
            RunbookTransport("persistent"),
            RunbookTransport("exec"),
            Ansible(),
            Pyinfra(),
            LongLivedBash(),
            LongLivedBash(fork=False),
        ]
    tools, notes = usable([*wanted, floor])
    times = step_times(tools, [SCRIPT] * steps, reps, shell, log)
    result = []
    if "overhead" in parts:
        result.append(overhead_section(times, [t for t in tools if t is not no_audit], floor, reps, shell, notes))
    if "audit" in parts:
        result.append(audit_section(times, engine, no_audit, floor, reps, shell))
    return result


def host_words(shell: Shell) -> str:
    """The host, for a section's prose: the sshd, and what its login shell runs."""
    return f"one real sshd on 127.0.0.1 (host login shell: {SHELLS[shell]})"


def overhead_section(
    times: StepTimes, tools: Sequence[Runner], floor: Runner, reps: int, shell: Shell, notes: list[str]
) -> Section:
    """Benchmark 1's section: the table, the two targets judged on runbook's CLI (as users run it),
    and issue 7's targets for the persistent runner (its transport alone, and the CLI)."""
    n = times.steps
    runbook = next(t for t in tools if isinstance(t, RunbookCLI) and t.runner == "persistent" and t.tree is None)
    before = next((t for t in tools if isinstance(t, RunbookCLI) and t.tree is not None), None)
    ansible = next((t for t in tools if isinstance(t, Ansible)), None)
    ours, base = times.marginal(runbook), times.marginal(floor)
    vs_floor = ratio(ours, base)
    targets = [
        Target(
            f"{runbook.name}: per-step overhead within {TARGET_VS_FLOOR:g}x of the raw asyncssh floor",
            None if vs_floor is None else vs_floor <= TARGET_VS_FLOOR,
            f"marginal {fmt_seconds(ours)} vs {fmt_seconds(base)} per step = {fmt_ratio(vs_floor)} "
            f"(whole run, start-up included: {fmt_ratio(ratio(times.whole(runbook), times.whole(floor)))})",
        )
    ]
    theirs = times.marginal(ansible) if ansible else None
    vs_ansible = ratio(theirs, ours)
    if ansible is None:
        detail = "ansible-playbook not run (not installed)"
    elif vs_ansible is None:
        detail = "a case failed (see below)"
    else:
        detail = (
            f"ansible-playbook {fmt_seconds(theirs)} vs {fmt_seconds(ours)} per step = {fmt_ratio(vs_ansible)} lower "
            f"(whole run: {fmt_ratio(ratio(times.whole(ansible), times.whole(runbook)))})"
        )
    targets.append(
        Target(
            f"{runbook.name}: per-step overhead at least {TARGET_VS_ANSIBLE:g}x lower than Ansible's",
            None if vs_ansible is None else vs_ansible >= TARGET_VS_ANSIBLE,
            detail,
        )
    )
    bash_floor = next((t for t in tools if isinstance(t, LongLivedBash) and t.fork), None)
    transport = next((t for t in tools if isinstance(t, RunbookTransport) and t.runner == "persistent"), None)
    for ours_runner in (before, transport, runbook):
        if ours_runner is not None and bash_floor is not None:
            targets += runner_targets(times, ours_runner, bash_floor, ansible)
    return Section(
        title=f"1. Per-command overhead — {SHELL_LABELS[shell]}",
        method=(
            f"{n} steps `{SCRIPT}` on {host_words(shell)}, run by each tool; each tool also runs 1 step in the "
            f"same repetition. Times are from the tool's start to its exit; medians of {reps} interleaved "
            f"repetitions. *Per step (marginal)* = median over repetitions of (T({n}) - T(1)) / {n - 1}: the "
            f"cost of one more step, start-up excluded; *per step (whole run)* = T({n}) / {n}, start-up "
            "included. The floor is raw asyncssh: one open connection, one exec channel per command. "
            "The floor for a persistent runner is one long-lived bash on one channel, each command written "
            "to its stdin and run as a child `bash -c` (one round trip plus one fork/exec; no separate "
            "streams, no isolation); the row below it runs each command inside that bash; the runbook "
            "transport rows are `SSHTransport.run` alone, without the engine. Rows marked `runner: exec` "
            "run with that host setting (one exec channel per command, as before the runner); the others "
            "use the default persistent runner."
            + (
                f" The row `{before.name}` is that checkout's CLI (`--before`), run in the same repetitions."
                if before is not None
                else ""
            )
        ),
        tables=[step_table(times, tools, floor)],
        notes=notes + times.failures(tools),
        targets=targets,
    )


def runner_targets(times: StepTimes, ours: Runner, floor: Runner, ansible: Runner | None) -> list[Target]:
    """Issue 7's two targets for `ours`: within TARGET_VS_RUNNER_FLOOR of one long-lived bash, and
    TARGET_RUNNER_VS_ANSIBLE below Ansible, both on marginal per-step cost."""
    mine, base = times.marginal(ours), times.marginal(floor)
    vs_floor = ratio(mine, base)
    targets = [
        Target(
            f"{ours.name}: per-step overhead within {TARGET_VS_RUNNER_FLOOR:g}x of {floor.name}",
            None if vs_floor is None else vs_floor <= TARGET_VS_RUNNER_FLOOR,
            f"marginal {fmt_seconds(mine)} vs {fmt_seconds(base)} per step = {fmt_ratio(vs_floor)}",
        )
    ]
    theirs = times.marginal(ansible) if ansible else None
    vs_ansible = ratio(theirs, mine)
    detail = f"ansible-playbook {fmt_seconds(theirs)} vs {fmt_seconds(mine)} per step = {fmt_ratio(vs_ansible)} lower"
    targets.append(
        Target(
            f"{ours.name}: per-step overhead at least {TARGET_RUNNER_VS_ANSIBLE:g}x lower than Ansible's",
            None if vs_ansible is None else vs_ansible >= TARGET_RUNNER_VS_ANSIBLE,
            "ansible-playbook not run or failed" if vs_ansible is None else detail,
        )
    )
    return targets


def audit_section(
    times: StepTimes, engine: Runner, no_audit: Runner, floor: Runner, reps: int, shell: Shell
) -> Section:
    """Benchmark 5's section: the Engine with the audit log on and off, and the difference per step."""
    n = times.steps
    cost = paired_median(times.long(engine), times.long(no_audit), lambda on, off: (on - off) / n)
    table = Table(["case", f"run of {n} steps", "per step (marginal)", "vs audit log off"])
    for runner in (engine, no_audit, floor):
        table.rows.append(
            [
                runner.name,
                fmt_seconds(times.long(runner).median),
                fmt_seconds(times.marginal(runner)),
                fmt_ratio(ratio(times.marginal(runner), times.marginal(no_audit))),
            ]
        )
    share = ratio(cost, times.marginal(engine))
    summary = (
        f"The audit log costs {fmt_seconds(cost)} per step (median over repetitions of the difference of the "
        f"two {n}-step runs / {n})" + ("" if share is None else f", {share:.0%} of a step's marginal cost") + "."
    )
    return Section(
        title=f"5. Audit cost — {SHELL_LABELS[shell]}",
        method=(
            f"The run of benchmark 1 ({n} steps `{SCRIPT}` on {host_words(shell)}) by runbook's Engine "
            "in-process, with the audit log on (as always) and off. runbook cannot turn its audit log "
            "off; the run with it off replaces `executor.run.run_folder.AuditLog` for that run with "
            "`bench.tools.NoAudit`, which records nothing (the state store is still written). "
            f"Medians of {reps} interleaved repetitions."
        ),
        tables=[table],
        notes=[summary, *times.failures([engine, no_audit, floor])],
    )
