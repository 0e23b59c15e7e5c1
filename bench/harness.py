"""Measuring and reporting: interleaved repetitions, medians, ratios, and the RESULTS.md writer.

Speed is only ever shown as ratios measured side by side in one run: a machine that is busier in
one minute than in the next would otherwise decide the comparison. So `interleave` runs every case
once per repetition, in an order rotated from one repetition to the next, and the benchmarks report
medians of those repetitions and ratios between them.

A benchmark module builds a `Section` (its tables, notes and targets); `render_report` lays
sections out as markdown with the machine they ran on and the exact command that reproduces them.
"""

from __future__ import annotations

import os
import platform
import re
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


class ToolFailed(Exception):
    """A tool could not do what a case asked (an error exit, a check that failed on the host).

    Raised by a case; `interleave` records the message as the case's failure and does not run the
    case again, and the report shows the failure in place of a time.
    """


@dataclass
class Series:
    """The wall times (seconds) of one case, one per repetition, or why it failed."""

    times: list[float] = field(default_factory=list)
    failure: str | None = None

    @property
    def median(self) -> float | None:
        """The median time; None when the case failed or never ran."""
        return statistics.median(self.times) if self.times and self.failure is None else None


def interleave(
    reps: int, cases: Mapping[str, Callable[[], float]], log: Callable[[str], None] | None = None
) -> dict[str, Series]:
    """Run every case once per repetition, `reps` times, in an order rotated each repetition.

    A case is a callable that does the work and returns the seconds it measured (it times only
    what it means to compare, keeping its set-up out). A case that raises `ToolFailed` is marked
    failed and skipped from then on; any other exception propagates. `log` gets one line per run.
    """
    names = list(cases)
    results = {name: Series() for name in names}
    for rep in range(reps):
        shift = rep % len(names) if names else 0
        for name in names[shift:] + names[:shift]:
            series = results[name]
            if series.failure is not None:
                continue
            try:
                seconds = cases[name]()
            except ToolFailed as exc:
                series.failure = str(exc)
                if log:
                    log(f"rep {rep + 1}/{reps} {name}: FAILED {first_line(series.failure)}")
                continue
            series.times.append(seconds)
            if log:
                log(f"rep {rep + 1}/{reps} {name}: {seconds:.3f} s")
    return results


def paired_median(a: Series, b: Series, combine: Callable[[float, float], float]) -> float | None:
    """Median over repetitions of `combine(a_i, b_i)`: for quantities that need two cases of the
    same repetition (a per-step slope from a long and a short run), so that both saw the same load."""
    if a.failure is not None or b.failure is not None or not a.times or len(a.times) != len(b.times):
        return None
    return statistics.median(combine(x, y) for x, y in zip(a.times, b.times, strict=True))


def first_line(text: str, width: int = 160) -> str:
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line[:width] + (" ..." if len(line) > width else "")


def fmt_seconds(seconds: float | None) -> str:
    """A duration with a unit that keeps three significant digits ("4.21 ms", "88.3 s")."""
    if seconds is None:
        return "—"
    if abs(seconds) < 0.9995e-3:  # below what rounds to 1.00 ms at three digits (999.6 µs is "1 ms")
        return f"{seconds * 1e6:.3g} µs"
    if abs(seconds) < 0.9995:
        return f"{seconds * 1e3:.3g} ms"
    return f"{seconds:.3g} s"


def ratio(value: float | None, reference: float | None) -> float | None:
    if value is None or reference is None or reference <= 0:
        return None
    return value / reference


def fmt_ratio(value: float | None) -> str:
    return "—" if value is None else f"{value:.3g}x"


@dataclass
class Table:
    """One markdown table: `rows` are already-formatted cells, one list per row."""

    columns: list[str]
    rows: list[list[str]] = field(default_factory=list)
    title: str | None = None

    def markdown(self) -> str:
        def cells(values: Sequence[str]) -> str:
            return "| " + " | ".join(v.replace("|", "\\|").replace("\n", " ") for v in values) + " |"

        lines = [f"**{self.title}**", ""] if self.title else []
        lines += [cells(self.columns), cells(["---"] * len(self.columns)), *(cells(row) for row in self.rows)]
        return "\n".join(lines)


@dataclass
class Target:
    """A target of the issue: `reached` is True/False when measured, None when it could not be
    (a tool missing, a case failed); `detail` gives the numbers it was decided on."""

    text: str
    reached: bool | None
    detail: str

    def markdown(self) -> str:
        verdict = {True: "**reached**", False: "**missed**", None: "**not measured**"}[self.reached]
        return f"- {self.text}: {verdict} — {self.detail}"


@dataclass
class Section:
    """One benchmark's part of the report."""

    title: str
    method: str  # what was measured and how, in prose
    tables: list[Table] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # failures, caveats
    targets: list[Target] = field(default_factory=list)

    def markdown(self) -> str:
        parts = [f"## {self.title}", "", self.method.strip()]
        parts += [part for table in self.tables for part in ("", table.markdown())]
        if self.notes:
            parts += ["", *(f"- {note}" for note in self.notes)]
        if self.targets:
            parts += ["", "Targets:", "", *(t.markdown() for t in self.targets)]
        return "\n".join(parts)


def _command_output(argv: Sequence[str]) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unavailable ({exc})"
    return first_line(done.stdout or done.stderr)


def _version(distribution: str) -> str:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return "not installed"


def _cpu_model() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or "unknown"
    match = re.search(r"^model name\s*:\s*(.+)$", text, re.MULTILINE)
    return match.group(1).strip() if match else platform.processor() or "unknown"


def machine_info() -> dict[str, str]:
    """What the numbers depend on: the machine, the kernel, and every tool's version."""
    load = os.getloadavg()
    commit = _command_output(["git", "-C", str(REPO), "describe", "--always", "--dirty"])
    return {
        "CPU": _cpu_model(),
        "cores": str(os.cpu_count()),
        "load average at start (1/5/15 min)": " / ".join(f"{x:.2f}" for x in load),
        "kernel": f"{platform.system()} {platform.release()}",
        "OpenSSH": _command_output(["ssh", "-V"]),
        "bash": _command_output(["bash", "--version"]),
        "Python": sys.version.split()[0],
        "asyncssh": _version("asyncssh"),
        "ansible-core": _version("ansible-core"),
        "pyinfra": _version("pyinfra"),
        "runbook": f"{_version('runbook')} at git {commit}",
    }


def render_report(
    sections: Sequence[Section], machine: Mapping[str, str], command: Sequence[str], warning: str | None = None
) -> str:
    """The whole RESULTS.md: how to reproduce, the machine, the targets, then one part per benchmark.

    `warning` is shown first, in bold (a smoke run's numbers are not results)."""
    started = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        "# Benchmarks: runbook against the tools users would pick instead",
        "",
        *([f"**{warning}**", ""] if warning else []),
        f"Written by `{shlex.join(command)}` on {started}; rerun that command from the repository root",
        "(`python3 -m pip install -e '.[bench]'` first) to reproduce every number below on your machine.",
        "Every case of a benchmark ran once per repetition, interleaved; the tables give medians over",
        "the repetitions and ratios between cases of the same run, never timings from another run.",
        "",
        "## Machine",
        "",
        Table(["what", "value"], [[k, v] for k, v in machine.items()]).markdown(),
    ]
    targets = [(section.title, target) for section in sections for target in section.targets]
    if targets:
        lines += ["", "## Targets of the issue", ""]
        lines += [f"{target.markdown()} ({title})" for title, target in targets]
    for section in sections:
        lines += ["", section.markdown()]
    return "\n".join(lines) + "\n"


class Stopwatch:
    """`with Stopwatch() as watch: ...` then `watch.seconds`: wall time on the monotonic clock."""

    def __enter__(self) -> Stopwatch:
        self._t0 = time.perf_counter()
        self.seconds = 0.0
        return self

    def __exit__(self, *_exc: object) -> None:
        self.seconds = time.perf_counter() - self._t0
