"""A matrix as the engine runs it, through the real CLI against the test sshd: `on_failure`, `when`, the
`matrix_*` environment and the gates' `matrix` and mate aliases, the cells_progress events, `runbook status`
listing failed cells, per-cell resume after kill -9 and after a new axis value, and a placed group's lanes
running in parallel. Each test fails on main, whose loader knows no `group:`/`matrix:` (exit 2).
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


def test_on_failure_continue_records_the_cell_runs_the_others_and_exits_5(tmp_path: Path, sshd: SSHServer) -> None:
    path = sweep(tmp_path, sshd, fail="y-1")
    done = run(path, tmp_path / "logs", "--json")
    assert done.returncode == 5, done.stderr
    stream = events(done.stdout)
    assert stream[-1]["status"] == "cells-failed" and stream[-1]["exit_code"] == 5
    steps = {r["step"]: r for r in status(tmp_path / "logs")["steps"]}
    assert steps["bench[srv=y,conc=1]"]["status"] == "failed"
    assert steps["note[srv=y,conc=1]"]["status"] == "skipped"
    assert steps["note[srv=y,conc=1]"]["message"].startswith("cell failed: bench[srv=y,conc=1]: ")
    others = [s for s in steps if s not in ("bench[srv=y,conc=1]", "note[srv=y,conc=1]")]
    assert all(steps[s]["status"] == "passed" for s in others), others
    [failed] = status(tmp_path / "logs")["failed_cells"]
    assert (failed["group"], failed["cell"]) == ("grid", "srv=y,conc=1")
    shown = runbook_cli("status", "--log-dir", str(tmp_path / "logs")).stdout
    assert "failed cells (1):" in shown and "grid[srv=y,conc=1]: bench[srv=y,conc=1]:" in shown
    progress = [e for e in stream if e["event"] == "cells_progress"]
    assert progress and {e["group"] for e in progress} == {"grid"}
    assert progress[-1]["cells"] == {"total": 4, "passed": 3, "failed": 1, "skipped": 0, "running": 0}
    started = next(e for e in stream if e["event"] == "step_started" and e["step"] == "bench[srv=x,conc=2]")
    assert (started["group"], started["cell"]) == ("grid", {"srv": "x", "conc": "2"})


def test_on_failure_stop_fails_the_run_at_the_failed_cell(tmp_path: Path, sshd: SSHServer) -> None:
    path = sweep(tmp_path, sshd, on_failure="stop", fail="x-2")
    done = run(path, tmp_path / "logs")
    assert done.returncode == 1, done.stderr
    steps = {r["step"]: r["status"] for r in status(tmp_path / "logs")["steps"]}
    assert steps["bench[srv=x,conc=2]"] == "failed"
    assert steps["up[srv=y]"] == "pending" and steps["post"] == "pending"


def test_a_false_when_skips_the_instance_with_its_message_and_its_cells_dependents(
    tmp_path: Path, sshd: SSHServer
) -> None:
    path = sweep(tmp_path, sshd, when="matrix.srv != 'y'")
    done = run(path, tmp_path / "logs", "--json")
    assert done.returncode == 0, done.stderr
    steps = {r["step"]: r for r in status(tmp_path / "logs")["steps"]}
    assert steps["up[srv=y]"]["status"] == "skipped"
    assert steps["up[srv=y]"]["message"] == "when: matrix.srv != 'y' is false"
    assert steps["bench[srv=y,conc=1]"]["status"] == "skipped"
    assert "up[srv=y]" in steps["bench[srv=y,conc=1]"]["message"]
    assert steps["up[srv=x]"]["status"] == "passed" and steps["post"]["status"] == "passed"
    assert "up[srv=y]" not in commanded(tmp_path / "logs", events(done.stdout)[0]["run_id"])
    progress = [e for e in events(done.stdout) if e["event"] == "cells_progress"]
    assert progress[-1]["cells"]["skipped"] == 2 and progress[-1]["cells"]["passed"] == 2
    again = run(path, tmp_path / "logs", "--resume")  # unchanged, the `when:` would be false again
    assert again.returncode == 0, again.stderr
    assert commanded(tmp_path / "logs", status(tmp_path / "logs")["run"]["run_id"]) == []
    assert status(tmp_path / "logs")["steps"][0]["status"] == "passed"


def test_a_when_that_cannot_be_evaluated_fails_the_instance_instead_of_skipping_it(
    tmp_path: Path, sshd: SSHServer
) -> None:
    """A typo in a fact's path is an error, not a `false`: skipping would hide it as a quiet `skipped` cell."""
    path = sweep(tmp_path, sshd, when="steps.pre.facts.no_such_fact")
    done = run(path, tmp_path / "logs")
    assert done.returncode == 5, done.stderr  # on_failure: continue; the run said its cells failed
    steps = {r["step"]: r for r in status(tmp_path / "logs")["steps"]}
    assert steps["up[srv=x]"]["status"] == "failed"
    assert "when: steps.pre.facts.no_such_fact could not be evaluated" in steps["up[srv=x]"]["message"]
    assert "names something missing" in steps["up[srv=x]"]["message"]


def test_kill_9_in_a_cell_then_resume_reruns_only_the_cell_in_flight_and_what_follows_it(
    tmp_path: Path, sshd: SSHServer
) -> None:
    path = sweep(tmp_path, sshd, sleep="x-2")
    logs = tmp_path / "logs"
    proc = subprocess.Popen(
        [sys.executable, "-m", "executor.cli", "run", str(path), "--log-dir", str(logs)],
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


def test_a_new_axis_value_then_resume_runs_only_the_new_cells(tmp_path: Path, sshd: SSHServer) -> None:
    logs = tmp_path / "logs"
    first = run(sweep(tmp_path, sshd), logs)
    assert first.returncode == 0, first.stderr
    done = run(sweep(tmp_path, sshd, concs="[1, 2, 3]"), logs, "--resume")
    assert done.returncode == 0, done.stderr
    ran = set(commanded(logs, status(logs)["run"]["run_id"]))
    assert ran == {*_cells("x", (3,)), *_cells("y", (3,)), "post"}  # the new cells, and the step after them


LANES = """\
    name: pool
    hosts:
    HOSTS
    steps:
      - group: spread_out
        matrix: {srv: [x, y, z]}
        hosts: [a, b, c]
        placement: spread
        steps:
          - {id: work, kind: shell, script: 'echo "$matrix_srv"; sleep 2'}
    """


def test_a_placed_group_runs_one_lane_per_host_in_parallel(tmp_path: Path, sshd: SSHServer) -> None:
    hosts = "".join(sshd.host_yaml(name).removeprefix("hosts:\n") for name in "abc")
    body = LANES.replace("    HOSTS\n", "".join("    " + line + "\n" for line in hosts.splitlines()))
    path = tmp_path / "pool.yaml"
    path.write_text("\n".join(line[4:] for line in body.splitlines()) + "\n")
    done = run(path, tmp_path / "logs", "--json")
    assert done.returncode == 0, done.stderr
    stream = events(done.stdout)
    finished = [e for e in stream if e["event"] == "step_finished"]
    assert sorted(host for e in finished for host in e["hosts"]) == ["a", "b", "c"]
    # three lanes of one `sleep 2` each, at once: some moment lies inside all three [started, finished] intervals
    # (run one after the other, each would start after the previous one finished), whatever the machine's load
    spans = intervals(stream)
    assert len(spans) == 3 and common_moment(spans), spans


def intervals(stream: list[dict[str, Any]]) -> dict[str, tuple[float, float]]:
    """Each step's [step_started, step_finished] interval (event times), by step id."""
    started = {e["step"]: e["time"] for e in stream if e["event"] == "step_started"}
    return {e["step"]: (started[e["step"]], e["time"]) for e in stream if e["event"] == "step_finished"}


def common_moment(spans: dict[str, tuple[float, float]]) -> bool:
    """Whether one moment lies inside every interval: the latest start comes before the earliest finish."""
    return max(start for start, _ in spans.values()) < min(end for _, end in spans.values())


def test_in_a_placed_group_without_a_server_an_instance_runs_after_and_beside_the_mate_it_needs(
    tmp_path: Path, sshd: SSHServer
) -> None:
    """`check[srv=x,n=1]` reads `steps.work`: placed alone it ran on another host while `work[srv=x]` slept
    there, and its gate saw `steps.work.status = "running"`."""
    hosts = "".join(sshd.host_yaml(name).removeprefix("hosts:\n") for name in "ab")
    body = LANES.replace("    HOSTS\n", "".join("    " + line + "\n" for line in hosts.splitlines()))
    body = body.replace("{srv: [x, y, z]}", "{srv: [x, y], n: [1, 2]}").replace("[a, b, c]", "[a, b]")
    check = "{id: check, kind: shell, script: 'echo $matrix_n', gates: [\"steps.work.status == 'passed'\"]}"
    body = body.replace("sleep 2'}\n", f"sleep 1'}}\n          - {check}\n")
    path = tmp_path / "pool.yaml"
    path.write_text("\n".join(line[4:] for line in body.splitlines()) + "\n")
    done = run(path, tmp_path / "logs")
    assert done.returncode == 0, done.stdout + done.stderr
    hosts_of = {r["step"]: r["host"] for r in status(tmp_path / "logs")["steps"]}
    assert all(hosts_of[f"check[srv={srv},n={n}]"] == hosts_of[f"work[srv={srv}]"] for srv in "xy" for n in (1, 2))


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


def test_a_failure_in_a_placed_group_that_stops_lets_running_lanes_finish_and_starts_nothing_new(
    tmp_path: Path, sshd: SSHServer
) -> None:
    """Four units on three hosts: x and w on a, y on b, z on c. x fails at once while y and z sleep: they
    finish, w (next on a's lane) never starts."""
    hosts = "".join(sshd.host_yaml(name).removeprefix("hosts:\n") for name in "abc")
    body = LANES.replace("    HOSTS\n", "".join("    " + line + "\n" for line in hosts.splitlines()))
    body = body.replace("[x, y, z]", "[x, y, z, w]").replace(
        """'echo "$matrix_srv"; sleep 2'""", """'test "$matrix_srv" != x && sleep 1'"""
    )
    path = tmp_path / "pool.yaml"
    path.write_text("\n".join(line[4:] for line in body.splitlines()) + "\n")
    done = run(path, tmp_path / "logs")
    assert done.returncode == 1, done.stderr
    steps = {(r["step"], r["host"]): r["status"] for r in status(tmp_path / "logs")["steps"]}
    assert steps == {
        ("work[srv=x]", "a"): "failed",
        ("work[srv=y]", "b"): "passed",
        ("work[srv=z]", "c"): "passed",
        ("work[srv=w]", "a"): "pending",
    }


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


def test_a_resumed_placed_group_keeps_each_instance_on_the_host_it_ran_on(tmp_path: Path, sshd: SSHServer) -> None:
    """No server step: each instance is its own unit. A new first value would place x on a and y on b afresh
    (w, x on a; y on b); the resume keeps x on b and y on c where they passed, so neither runs again."""
    hosts = "".join(sshd.host_yaml(name).removeprefix("hosts:\n") for name in "abc")
    body = LANES.replace("    HOSTS\n", "".join("    " + line + "\n" for line in hosts.splitlines()))
    body = body.replace("; sleep 2", "").replace("{srv: [x, y, z]}", "{srv: [v, x, y]}")
    path = tmp_path / "pool.yaml"
    path.write_text("\n".join(line[4:] for line in body.splitlines()) + "\n")
    logs = tmp_path / "logs"
    assert run(path, logs).returncode == 0
    path.write_text(path.read_text().replace("[v, x, y]", "[w, v, x, y]"))
    done = run(path, logs, "--resume", "--json")
    assert done.returncode == 0, done.stderr
    assert commanded(logs, status(logs)["run"]["run_id"]) == ["work[srv=w]"]
    placed = {r["step"]: r["host"] for r in status(logs)["steps"]}
    assert placed == {"work[srv=v]": "a", "work[srv=x]": "b", "work[srv=y]": "c", "work[srv=w]": "a"}
