"""`python -m bench [--quick] [--only NAME ...] [--reps N] [--shell clean|login ...] [--out FILE]`

Runs the benchmarks on this machine and writes the report (bench/RESULTS.md by default). The full
run takes about 40 minutes on two cores (ansible-playbook alone spends a quarter to half a second
per task); `--quick` runs every benchmark at a tiny size, one repetition, in about a minute,
to show that everything works, and its numbers mean little. Progress goes to stderr.

Benchmarks: overhead (1), transfer (2), fanout (3), verify (4), audit (5), gates (6), redaction (7), launches (8),
startup (9). Those that depend on how a host's login shell starts (1, 2, 3, 5) run once per `--shell`:
`clean` (no ~/.bashrc) and `login` (this machine's own ~/.bashrc, as a real host has one).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from bench import fanout, gates, launches, overhead, redaction, startup, transfer, verify_throughput
from bench.fleet import SHELLS, Shell
from bench.harness import REPO, Section, machine_info, render_report

NAMES = ("overhead", "transfer", "fanout", "verify", "audit", "gates", "redaction", "launches", "startup")
MIB = 1 << 20


@dataclass(frozen=True)
class Sizes:
    """How big each benchmark is: the issue's sizes, or tiny ones for --quick."""

    overhead_steps: int
    transfer_steps: int
    transfer_bytes: int
    fanout_counts: tuple[int, ...]
    verify_bytes: int
    verify_shards: int
    gate_attempts: int
    redaction_bytes: int
    startup_processes: int
    reps: int


FULL = Sizes(
    overhead_steps=overhead.STEPS,
    transfer_steps=transfer.STEPS,
    transfer_bytes=transfer.SIZE,
    fanout_counts=fanout.COUNTS,
    verify_bytes=2 * verify_throughput.GIB,
    verify_shards=8,
    gate_attempts=gates.ATTEMPTS,
    redaction_bytes=redaction.OUTPUT_BYTES,
    startup_processes=startup.PROCESSES,
    reps=3,
)
QUICK = Sizes(
    overhead_steps=5,
    transfer_steps=3,
    transfer_bytes=transfer.SIZE,
    fanout_counts=(1, 4),
    verify_bytes=64 * MIB,
    verify_shards=4,
    gate_attempts=10,
    redaction_bytes=MIB,
    startup_processes=1,
    reps=1,
)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n\n")[1])
    parser.add_argument("--quick", action="store_true", help="tiny sizes, one repetition: a smoke run")
    parser.add_argument("--only", nargs="+", choices=NAMES, metavar="NAME", help=f"run only these: {', '.join(NAMES)}")
    parser.add_argument("--reps", type=int, help=f"repetitions (default {FULL.reps}; {QUICK.reps} with --quick)")
    parser.add_argument(
        "--shell",
        nargs="+",
        choices=list(SHELLS),
        help="host login shells to measure on (default: clean login; clean with --quick)",
    )
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "RESULTS.md", help="report file")
    parser.add_argument(
        "--before",
        type=Path,
        metavar="TREE",
        help="another checkout of runbook (e.g. `git archive main | tar -x -C TREE`): benchmarks 1 and 9 run its "
        "CLI too, in the same repetitions, as `runbook (CLI), before: TREE` and `runbook COMMAND, before: TREE`",
    )
    return parser


def _log(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def run(
    names: Sequence[str],
    sizes: Sizes,
    shells: Sequence[Shell],
    log: Callable[[str], None],
    before: Path | None = None,
) -> list[Section]:
    """The sections of the chosen benchmarks, in their order (1 to 9); `before`: see --before."""
    sections: list[Section] = []
    reps = sizes.reps
    step_parts = [name for name in ("overhead", "audit") if name in names]
    by_shell: dict[str, list[Section]] = {}
    for shell in shells:
        if step_parts:
            log(f"benchmark {' and '.join(step_parts)}, {shell} shell")
            by_shell[shell] = overhead.sections(step_parts, sizes.overhead_steps, reps, shell, log, before)
    if "overhead" in names:
        sections += [by_shell[shell][0] for shell in shells]
    for shell in shells:
        if "transfer" in names:
            log(f"benchmark transfer, {shell} shell")
            sections.append(transfer.section(sizes.transfer_steps, sizes.transfer_bytes, reps, shell, log))
    for shell in shells:
        if "fanout" in names:
            log(f"benchmark fanout, {shell} shell")
            sections.append(fanout.section(sizes.fanout_counts, reps, shell, log))
    if "verify" in names:
        log("benchmark verify")
        sections.append(
            verify_throughput.section(total_bytes=sizes.verify_bytes, shards=sizes.verify_shards, reps=reps, log=log)
        )
    if "audit" in names:
        sections += [by_shell[shell][-1] for shell in shells]
    if "gates" in names:
        log("benchmark gates")
        sections.append(gates.section(reps, log, attempts=sizes.gate_attempts))
    if "redaction" in names:
        log("benchmark redaction")
        sections.append(redaction.section(reps, log, size=sizes.redaction_bytes))
    if "launches" in names:
        log("benchmark launches")
        sections.append(launches.section(reps, log))
    if "startup" in names:
        log("benchmark startup")
        sections.append(startup.section(sizes.startup_processes, log, before))
    return sections


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    sizes = QUICK if args.quick else FULL
    if args.reps is not None:
        if args.reps < 1:
            _parser().error("--reps must be at least 1")
        sizes = dataclasses.replace(sizes, reps=args.reps)
    shells = cast(list[Shell], args.shell or (["clean"] if args.quick else list(SHELLS)))
    names = args.only or list(NAMES)
    machine = machine_info()
    sections = run(names, sizes, shells, _log, args.before.resolve() if args.before else None)
    command = ["python", "-m", "bench", *(sys.argv[1:] if argv is None else argv)]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    warning = (
        "A smoke run (--quick): tiny sizes, one repetition; its numbers and verdicts mean nothing."
        if args.quick
        else None
    )
    args.out.write_text(render_report(sections, machine, command, warning))
    _log(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
