"""Benchmark 8: how many servers a campaign launches, in runbook's order and in a naive one.

Loading Kimi-K2.6 takes 10-40 minutes per launch, so a campaign's cost is its launches. The same grid
(draft tokens 4, 8, 16: server-side; benchmark output length 16, 32: client-side) runs twice on one test
host (a real sshd, the SGLang stand-in starting in `STARTUP_S` seconds as a stand-in for the loading):

- **runbook's order**: the grid as a `matrix:` group, which runs every cell of one server configuration
  against one launch;
- **a naive order**: the same cells as a flat runbook in the order a shell loop over the grid visits
  them (`for out in 16 32; for tokens in 4 8 16: deploy; benchmark`), each deploy adopting a server
  still running with its arguments as runbook's deploy does, so it relaunches only when the
  configuration changes, which in this order is every cell.

Launches are counted from the runs' own records (each deploy's `reused: false`), the distinct server
configurations from the grid; both orders run once per repetition, interleaved, and their wall times
are set side by side as a ratio. The target: runbook's launches equal the distinct configurations.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from bench.harness import REPO, Section, Table, Target, fmt_ratio, fmt_seconds, interleave, paired_median
from bench.tools import timed_subprocess
from sandbox import testhost
from sandbox.model_configs import drafter_config, target_config
from sandbox.sglang_standin import faults as standin_switches

TOKENS = (4, 8, 16)
OUTPUT_LENS = (16, 32)
STARTUP_S = 3.0  # the stand-in's start-up: what a launch costs here (Kimi-K2.6: 10-40 minutes)


def _deploy(models: Path, port: int, tokens: int | str) -> dict[str, Any]:
    return {
        "kind": "deploy",
        "model_path": str(models / "Kimi-K2.6"),
        "draft_model_path": str(models / "Kimi-K2.6-DFlash"),
        "speculative_num_draft_tokens": tokens,
        "tp_size": 1,
        "attention_backend": "fa3",
        "draft_attention_backend": "fa3",
        "trust_remote_code": True,
        "port": port,
        "ready_timeout": 120,
    }


def _benchmark(server: str, output_len: int | str) -> dict[str, Any]:
    return {
        "kind": "benchmark",
        "server": server,
        "label": "dflash",
        "concurrencies": [1],
        "repeats": 1,
        "num_prompts": 2,
        "input_len": 16,
        "output_len": output_len,
    }


def runbooks(host: dict[str, Any], models: Path, port: int) -> dict[str, dict[str, Any]]:
    """The grid as a matrix (runbook's order) and as the flat runbook of a naive loop over it."""
    stop = {"id": "stop", "kind": "stop_server", "port": port}
    matrix = {
        "name": "launches-matrix",
        "hosts": {"gpu": host},
        "steps": [
            {
                "group": "grid",
                "matrix": {"tokens": list(TOKENS), "output_len": list(OUTPUT_LENS)},
                "steps": [
                    {"id": "deploy", **_deploy(models, port, "${{ matrix.tokens }}")},
                    {"id": "bench", **_benchmark("deploy", "${{ matrix.output_len }}")},
                ],
            },
            stop,
        ],
    }
    naive_steps: list[dict[str, Any]] = []
    for output_len in OUTPUT_LENS:
        for tokens in TOKENS:
            cell = f"t{tokens}_o{output_len}"
            naive_steps.append({"id": f"deploy_{cell}", **_deploy(models, port, tokens)})
            naive_steps.append({"id": f"bench_{cell}", **_benchmark(f"deploy_{cell}", output_len)})
    naive = {"name": "launches-naive", "hosts": {"gpu": host}, "steps": [*naive_steps, stop]}
    return {"runbook's order (matrix)": matrix, "naive order (loop over the grid)": naive}


def launches(log_dir: Path) -> int:
    """Servers the latest run in `log_dir` started: its deploy records that did not adopt a running one."""
    run_dir = max(log_dir.iterdir(), key=lambda p: p.stat().st_mtime)
    with sqlite3.connect(run_dir / "state.db") as db:
        rows = db.execute("SELECT facts FROM steps WHERE step LIKE 'deploy%' AND status = 'passed'").fetchall()
    return sum(1 for (facts,) in rows if not json.loads(facts)["reused"])


def section(reps: int, log: Callable[[str], None]) -> Section:
    counted: dict[str, list[int]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-launches-") as tmp:
        root = Path(tmp)
        proc, host = testhost.start(root / "host", "gpu", gpu="h200")
        try:
            standin_switches.path(host.home).write_text(
                json.dumps({"startup_s": STARTUP_S, "decode_tokens_per_s": 4000.0})
            )
            models = root / "models"
            for name, config in (("Kimi-K2.6", target_config()), ("Kimi-K2.6-DFlash", drafter_config())):
                (models / name).mkdir(parents=True)
                (models / name / "config.json").write_text(json.dumps(config))
            files = {}
            for label, data in runbooks(host.server.host_dict(), models, host.sglang_port).items():
                path = root / f"{data['name']}.yaml"
                path.write_text(yaml.safe_dump(data, sort_keys=False))
                files[label] = path

            def case(label: str) -> Callable[[], float]:
                def run() -> float:
                    logs = root / "logs" / ("matrix" if label.startswith("runbook") else "naive")
                    argv = [
                        sys.executable,
                        "-m",
                        "executor.faces.cli",
                        "run",
                        str(files[label]),
                        "--log-dir",
                        str(logs),
                    ]
                    seconds = timed_subprocess(argv, cwd=REPO)
                    counted.setdefault(label, []).append(launches(logs))
                    return seconds

                return run

            series = interleave(reps, {label: case(label) for label in files}, log)
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
    ours, naive = list(series)
    configs = len(TOKENS)
    table = Table(["order", "cells", "server configurations", "launches", "wall time (median)", "vs runbook's order"])
    for label, result in series.items():
        table.rows.append(
            [
                label,
                str(len(TOKENS) * len(OUTPUT_LENS)),
                str(configs),
                ", ".join(map(str, sorted(set(counted.get(label, []))))) or "failed",
                fmt_seconds(result.median) if result.failure is None else f"failed: {result.failure}",
                fmt_ratio(paired_median(result, series[ours], lambda x, y: x / y)) if label != ours else "1.00x",
            ]
        )
    our_launches = set(counted.get(ours, []))
    reached = None if not our_launches else our_launches == {configs}
    target = Target(
        "a campaign launches one server per distinct server configuration",
        reached,
        f"runbook's order: {sorted(our_launches)} launches for {configs} configurations; "
        f"the naive order: {sorted(set(counted.get(naive, [])))}",
    )
    return Section(
        title="8. Launches of a campaign",
        method=__doc__.split("\n\n", 1)[1] if __doc__ else "",
        tables=[table],
        notes=[f"each launch here costs the stand-in's {STARTUP_S:g} s start-up; on Kimi-K2.6 it is 10-40 minutes"],
        targets=[target],
    )
