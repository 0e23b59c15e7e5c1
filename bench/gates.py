"""Benchmark 6: what bounding a gate costs, against evaluating it on the event loop as before.

A gate now runs in a worker process (executor.runbook.gates.GateWorkers) limited in memory and killed at
its time bound; before, `evaluate` ran it in the controller with no bound. Both are measured in one
run, interleaved: the flagship probe's six gates against facts and output of the probe's size, per
attempt (the attempt's names go to the worker once, then one pipe round trip per gate), and the one-off
start of a worker (a Python with Jinja2, once per concurrent attempt of a run). The target is the
issue's: the bound costs at most ~1 ms per gate.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from bench.harness import Section, Table, Target, fmt_ratio, fmt_seconds, interleave, ratio
from executor.runbook.gates import GateWorker, GateWorkers, evaluate

#: The flagship probe's gates (runbooks/k26_dflash.yaml), as written there.
GATES = [
    "exit_code == 0",
    "facts.hf_token.available",
    "facts.sglang.installed and facts.sglang.dflash",
    "facts.gpu_count > 0",
    "facts.mla_backends_usable_on_gpu | length > 0",
    "facts.models.disk.avail_bytes + (facts.models.entries | selectattr('name', 'in', ['Kimi-K2.6', "
    "'Kimi-K2.6-DFlash']) | map(attribute='bytes') | sum) >= (facts.hub.values() | map(attribute='bytes') | sum)"
    " * 1.10",
]
ATTEMPTS = 200
TARGET_PER_GATE_S = 1e-3


def names(output_bytes: int) -> dict[str, Any]:
    """What a probe attempt's gates see: its facts' shape, and `output_bytes` of stdout."""
    facts = {
        "hf_token": {"available": True, "source": "env"},
        "sglang": {"installed": True, "dflash": True, "version": "0.5.23"},
        "gpu_count": 8,
        "gpus": [{"name": "NVIDIA H200", "memory_total_mib": 143771, "index": i} for i in range(8)],
        "mla_backends_usable_on_gpu": ["flashinfer", "fa3", "triton"],
        "models": {"disk": {"avail_bytes": 2 * 10**12}, "entries": [{"name": "Kimi-K2.6", "bytes": 10**9}]},
        "hub": {"moonshotai/Kimi-K2.6": {"bytes": 595 * 10**9}, "z-lab/Kimi-K2.6-DFlash": {"bytes": 6 * 10**9}},
    }
    return {"stdout": "x" * output_bytes, "stderr": "", "exit_code": 0, "facts": facts, "steps": {}, "vars": {}}


def _in_process(attempts: int, seen: dict[str, Any], expressions: list[str]) -> Callable[[], float]:
    def case() -> float:
        started = time.perf_counter()
        for _ in range(attempts):
            assert all(evaluate(gate, seen).passed for gate in expressions)
        return time.perf_counter() - started

    return case


def _bounded(attempts: int, seen: dict[str, Any], expressions: list[str]) -> Callable[[], float]:
    async def go() -> float:
        pool = GateWorkers()
        async with pool.session(seen):  # the worker's start is measured on its own, below
            pass
        started = time.perf_counter()
        for _ in range(attempts):
            async with pool.session(seen, expressions) as worker:
                for gate in expressions:
                    assert (await worker.evaluate(gate, None)).passed
        elapsed = time.perf_counter() - started
        await pool.close()
        return elapsed

    return lambda: asyncio.run(go())


def _worker_start() -> float:
    async def go() -> float:
        started = time.perf_counter()
        worker = await GateWorker.start()
        await worker.load({})
        elapsed = time.perf_counter() - started
        await worker.close()
        return elapsed

    return asyncio.run(go())


def section(reps: int, log: Callable[[str], None], attempts: int = ATTEMPTS) -> Section:
    rows, targets = [], []
    reads_stdout = [*GATES, "'Traceback' not in stdout"]
    for label, size, expressions in (
        ("1 KiB", 1024, GATES),
        ("1 MiB", 1 << 20, GATES),
        ("1 MiB, one gate reads it", 1 << 20, reads_stdout),
    ):
        seen = names(size)
        results = interleave(
            reps,
            {
                f"in-process {label}": _in_process(attempts, seen, expressions),
                f"bounded {label}": _bounded(attempts, seen, expressions),
            },
            log,
        )
        per_gate = {k: (s.median / (attempts * len(expressions)) if s.median else None) for k, s in results.items()}
        before, after = per_gate[f"in-process {label}"], per_gate[f"bounded {label}"]
        added = None if before is None or after is None else after - before
        rows.append(
            [label, fmt_seconds(before), fmt_seconds(after), fmt_seconds(added), fmt_ratio(ratio(after, before))]
        )
        targets.append(
            Target(
                f"the gate bound costs at most ~1 ms per gate ({label}: stdout of {label.split(',')[0]})",
                None if added is None else added <= TARGET_PER_GATE_S,
                f"{fmt_seconds(added)} added per gate ({fmt_seconds(before)} -> {fmt_seconds(after)})",
            )
        )
    start = interleave(reps, {"worker start": _worker_start}, log)["worker start"]
    return Section(
        title="6. Gate bounds",
        method=(
            f"{attempts} attempts of the flagship probe's {len(GATES)} gates (and a 7th that reads stdout), "
            "evaluated in the controller as "
            "before (`executor.runbook.gates.evaluate`, no bound) and in a bounded worker "
            "(`GateWorkers`, as the engine does: the names the attempt's gates read sent once, then a pipe round trip "
            "per gate), "
            f"interleaved, medians of {reps} repetitions; with 1 KiB and 1 MiB of stdout. A worker's start "
            f"(once per concurrent attempt and run) is measured alone: {fmt_seconds(start.median)}."
        ),
        tables=[Table(["stdout", "per gate before", "per gate bounded", "added per gate", "bounded / before"], rows)],
        targets=targets,
    )
