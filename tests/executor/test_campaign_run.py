"""A matrix as the engine runs it, through the real CLI against the test sshd, where a process boundary or the
host is under test: per-cell resume after kill -9, a server instance that adopts the server still running, an
out-of-memory cell on the SGLang stand-in. The engine's own cell semantics (`on_failure`, `when`, the
`matrix_*` environment and the gates' `matrix` and mate aliases, cells_progress, failed cells in `runbook
status`, resume after a new axis value, a placed group's lanes) run on scripted hosts:
tests/executor/test_engine_offline.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from sandbox.repos import oversized_copy
from sandbox.sshd import SSHServer
from tests.clirun import runbook_cli
from tests.steps.test_benchmark import standin as standin  # the stand-in test fixture, shared
from tests.steps.test_benchmark import yaml_steps

#: up uses `srv` only (one instance per server value), bench and note every axis; bench fails in (y, 1)
#: where FAIL_CELL says so, and sleeps there once (until the marker exists) where SLEEP_CELL says so
SWEEP = """\
    name: sweep
    __HOSTS__
    vars: {marker: MARKER}
    steps:
      - {id: pre, kind: shell, script: echo pre}
      - group: grid
        matrix:
          srv: [x, y]
          conc: CONCS
        ON_FAILURE
        steps:
          - id: up
            kind: shell
            WHEN
            script: echo "up $matrix_srv"
          - id: bench
            kind: shell
            script: |
              echo "bench $matrix_srv $matrix_conc"
              if [ "$matrix_srv-$matrix_conc" = SLEEP_CELL ] && [ ! -e "$marker" ]; then touch "$marker"; sleep 60; fi
              test "$matrix_srv-$matrix_conc" != FAIL_CELL
            gates:
              - exit_code == 0
              - "steps.up.status == 'passed' and matrix.conc in [1, 2, 3]"
              - "stdout is search('bench ' ~ matrix.srv ~ ' ' ~ matrix.conc)"
          - id: note
            kind: shell
            script: echo "note $matrix_srv $matrix_conc"
      - {id: post, kind: shell, script: echo post}
    """


def sweep(
    tmp_path: Path,
    sshd: SSHServer,
    *,
    on_failure: str = "continue",
    fail: str = "none",
    sleep: str = "none",
    when: str = "",
    concs: str = "[1, 2]",
) -> Path:
    path = tmp_path / "sweep.yaml"
    text = (
        SWEEP.replace("__HOSTS__\n", sshd.host_yaml("box").replace("\n", "\n    ").rstrip() + "\n")
        .replace("ON_FAILURE", f"on_failure: {on_failure}")
        .replace("FAIL_CELL", fail)
        .replace("SLEEP_CELL", sleep)
        .replace("WHEN", f"when: {json.dumps(when)}" if when else "")
        .replace("CONCS", concs)
        .replace("MARKER", str(tmp_path / "slept"))
    )
    path.write_text("\n".join(line[4:] if line.startswith("    ") else line for line in text.splitlines()) + "\n")
    return path


def run(path: Path, log_dir: Path, *more: str) -> subprocess.CompletedProcess[str]:
    return runbook_cli("run", str(path), "--log-dir", str(log_dir), *more)


def events(out: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.splitlines()]


def status(log_dir: Path) -> dict[str, Any]:
    done = runbook_cli("status", "--log-dir", str(log_dir), "--json")
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def commanded(log_dir: Path, run_id: str) -> list[str]:
    """The steps that ran a command in the run, in audit-log order."""
    lines = (log_dir / run_id / "audit.jsonl").read_text().splitlines()
    return [r["step"] for r in map(json.loads, lines) if r.get("event") == "command"]


def test_kill_9_in_a_cell_then_resume_reruns_only_the_cell_in_flight_and_what_follows_it(
    tmp_path: Path, sshd: SSHServer
) -> None:
    path = sweep(tmp_path, sshd, sleep="x-2")
    logs = tmp_path / "logs"
    proc = subprocess.Popen(
        [sys.executable, "-m", "executor.faces.cli", "run", str(path), "--log-dir", str(logs)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=os.environ.copy(),
    )
    deadline = time.monotonic() + 60
    while not (tmp_path / "slept").exists():
        assert time.monotonic() < deadline and proc.poll() is None, f"the sleeping step never started ({proc.poll()=})"
        time.sleep(0.1)
    time.sleep(0.3)  # the command is running on the host
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    killed = status(logs)["run"]["run_id"]
    done = run(path, logs, "--resume")
    assert done.returncode == 0, done.stderr
    resumed = status(logs)["run"]["run_id"]
    assert resumed != killed
    ran = set(commanded(logs, resumed))
    assert "bench[srv=x,conc=2]" in ran  # the one in flight runs again
    finished = {"pre", "up[srv=x]", "bench[srv=x,conc=1]", "note[srv=x,conc=1]"}
    assert not ran & finished, ran & finished
    assert ran == {"bench[srv=x,conc=2]", "note[srv=x,conc=2]", "up[srv=y]", *_cells("y"), "post"}


def _cells(srv: str, concs: tuple[int, ...] = (1, 2)) -> set[str]:
    return {f"{step}[srv={srv},conc={c}]" for step in ("bench", "note") for c in concs}


def test_a_cell_that_runs_again_runs_its_server_instance_again_which_adopts_the_running_server(
    standin: dict[str, Any], write_runbook: Any, tmp_path: Path
) -> None:
    """`up` (a deploy using no axis) serves both cells; `check[n=2]` fails until the marker exists. The resume
    runs `check[n=2]` and, before it, `up` again, which adopts the server still running (`reused`); the
    finished instances (`note` of both cells, `check[n=1]`) do not run again."""
    marker = tmp_path / "fixed"
    group = {
        "group": "acc",
        "matrix": {"n": [1, 2]},
        "on_failure": "continue",
        "steps": [
            {"id": "up", **standin["deploy"]},
            {"id": "note", "kind": "shell", "script": 'echo "cell $matrix_n"'},
            {"id": "check", "kind": "shell", "script": f'test "$matrix_n" = 1 || test -e {marker}'},
        ],
    }
    path = write_runbook("name: adopt\n__HOSTS__\n" + yaml_steps(group), hosts=standin["host"].host_yaml())
    logs = tmp_path / "logs"
    first = run(path, logs)
    assert first.returncode == 5, first.stderr
    marker.touch()
    done = run(path, logs, "--resume")
    assert done.returncode == 0, done.stderr
    report = status(logs)
    assert set(commanded(logs, report["run"]["run_id"])) == {"up", "check[n=2]"}
    up = next(r for r in report["steps"] if r["step"] == "up")
    assert up["facts"]["reused"] is True


def test_an_out_of_memory_cell_is_recorded_and_the_campaign_goes_on_with_one_launch_per_configuration(
    standin: dict[str, Any], write_runbook: Any, tmp_path: Path
) -> None:
    """A server axis (the model: the small test checkpoint, or one as big as Kimi-K2.6's 595 GB on the test
    host's one H200) times a client axis (how many prompts the eval sends): four cells, two server
    configurations. The big one dies at start-up with SGLang's out-of-memory line; its two cells are
    recorded failed with that line, the small one's two cells pass against ONE launch, and the run exits 5."""
    small = Path(standin["deploy"]["model_path"])
    oversized_copy(small, small.parent / "Kimi-K2.6-full", 595 * 10**9)
    group = {
        "group": "fit",
        "matrix": {"model": ["Kimi-K2.6", "Kimi-K2.6-full"], "prompts": [1, 2]},
        "on_failure": "continue",
        "steps": [
            {"id": "up", **standin["deploy"], "model_path": f"{small.parent}/${{{{ matrix.model }}}}"},
            {"id": "eval", "kind": "eval_acceptance", "server": "up", "speculative": False, "prompt_sets": ["math"]}
            | {"limit": "${{ matrix.prompts }}", "max_new_tokens": 8},
        ],
    }
    path = write_runbook("name: fit\n__HOSTS__\n" + yaml_steps(group), hosts=standin["host"].host_yaml())
    logs = tmp_path / "logs"
    done = run(path, logs, "--json")
    assert done.returncode == 5, done.stderr
    report = status(logs)
    by_step = {r["step"]: r for r in report["steps"]}
    assert sorted(s for s in by_step if s.startswith("up")) == ["up[model=Kimi-K2.6-full]", "up[model=Kimi-K2.6]"]
    assert by_step["up[model=Kimi-K2.6-full]"]["facts"]["error_line"].startswith("torch.OutOfMemoryError: CUDA out")
    assert [by_step[f"eval[model=Kimi-K2.6,prompts={n}]"]["status"] for n in (1, 2)] == ["passed", "passed"]
    assert [by_step[f"eval[model=Kimi-K2.6-full,prompts={n}]"]["status"] for n in (1, 2)] == ["skipped"] * 2
    failed = report["failed_cells"]
    assert sorted(f["cell"] for f in failed) == ["model=Kimi-K2.6-full,prompts=1", "model=Kimi-K2.6-full,prompts=2"]
    assert all(f["reason"].startswith("up[model=Kimi-K2.6-full]: ") for f in failed)
    progress = [e for e in events(done.stdout) if e["event"] == "cells_progress"][-1]
    assert progress["launches"] == {"done": 2, "planned": 2}
    assert progress["cells"]["passed"] == 2 and progress["cells"]["failed"] == 2
