"""`runbook demo`, as a new user runs it: the whole flagship runbook on this machine, one command."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from hostprograms import deploy as deploy_host
from sandbox.demo import DEMO_REPEATS, demo_site, stop_servers
from sandbox.repos import DRAFTER_ID, SPEED_BENCH_ID, TARGET_ID, drafter_repo, speed_bench_repo, target_repo
from tests.conftest import runbook_cli
from tests.documents import schema_problems
from tests.executor.test_transport import live_pids


@pytest.mark.e2e
@pytest.mark.xdist_group("timing")
@pytest.mark.parametrize("ssh_server", ["embedded"])
def test_the_demo_runs_the_flagship_runbook_end_to_end(tmp_path: Path, ssh_server: str) -> None:
    """The suite's one run of the whole flagship (runbooks/k26_dflash.yaml, unedited), as a new user starts it;
    its failure modes are tests/runbooks/test_k26_dflash.py's, on copies of one run to the first deploy."""
    logs = tmp_path / "logs"
    done = runbook_cli("demo", "--log-dir", str(logs), "--ssh-server", ssh_server, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"SSH served by {ssh_server}" in done.stderr
    (run,) = [p for p in logs.iterdir() if (p / "run.json").exists()]
    report = json.loads((run / "report.json").read_text())
    assert schema_problems("report", report) == []  # the document agents read, as `runbook schema` says
    assert report["tables"][0]["title"] == "Acceptance length per prompt set"
    assert "Speedup and acceptance per workload" in done.stdout  # the report's tables, printed at the end
    for section in ("Lossless check: greedy outputs of dflash against baseline", "Speculative decoding was on"):
        assert section in done.stdout  # issue 15's sections: the eval as served, checked against the baseline
    assert "Provenance: repos" in done.stdout and "Provenance: benchmark runs" in done.stdout
    assert all((run / name).read_bytes().startswith(b"\x89PNG") for name in ("pareto.png", "acceptance.png"))
    assert f"audit log: {run / 'audit.jsonl'}" in done.stderr and "a test double" in done.stderr
    # where the report is, as `runbook run` says it (one function), after the tables
    assert f"demo: report: {run / 'report.md'}\ndemo: figure: {run / 'speedup.png'}\n" in done.stderr
    assert f"demo: see it again: runbook report {run.name} --log-dir {logs}\n" in done.stderr
    assert (run / "speedup.png").exists()
    status = json.loads(runbook_cli("status", "--log-dir", str(logs), "--json").stdout)
    assert [s["status"] for s in status["steps"]] == ["passed"] * 15  # eval_baseline included
    assert runbook_cli("audit", "verify", str(run)).returncode == 0
    assert not live_pids(cmdline=str(logs))  # the SGLang stand-in was stopped by the runbook, the servers by the demo
    steps = {s["step"]: s for s in status["steps"]}
    port = yaml.safe_load((logs / "demo-host" / "inventory.yaml").read_text())["hosts"]["gpu"]["vars"]["sglang_port"]
    assert_the_flagship_ran_end_to_end(steps, run, report, port)


def assert_the_flagship_ran_end_to_end(steps: dict[str, Any], run: Path, report: dict[str, Any], port: int) -> None:
    """What a whole flagship run on the h200 test host found, chose, measured and reported."""
    probe = steps["probe"]["facts"]
    assert probe["gpu_arch"] == "sm90" and probe["gpu_count"] == 1
    assert probe["sglang"]["dflash"] is True and probe["hf_token"]["source"] == "env HF_TOKEN"
    assert steps["download_drafter"]["facts"]["method"] == "hf_cli"
    assert steps["verify_target"]["facts"]["files_expected"] == len(target_repo().files)
    assert steps["inspect"]["facts"]["drafter"]["block_size"]["value"] == 8

    baseline, dflash = steps["deploy_baseline"]["facts"], steps["deploy_dflash"]["facts"]
    assert baseline["speculative_algorithm"] is None and "--speculative-algorithm" not in baseline["argv"]
    argv = dflash["argv"]
    assert argv[argv.index("--speculative-algorithm") + 1] == "DFLASH"
    assert argv[argv.index("--speculative-num-draft-tokens") + 1] == "8"  # the drafter's block size
    assert argv[argv.index("--tp-size") + 1] == "1"  # the GPU count
    assert argv[argv.index("--attention-backend") + 1] == "fa3"  # Hopper, sm90
    assert dflash["previous"]["action"] == "stopped"  # the baseline made room for it on the port
    assert steps["eval"]["facts"]["sets"]["math"]["mean"] >= 3.0
    evaluated = steps["eval"]["facts"]  # as served: chat template, thinking on; outputs as the baseline's
    assert (evaluated["api"], evaluated["thinking"], evaluated["speculation_on"]) == ("chat", True, True)
    assert {name: s["identical"] for name, s in evaluated["lossless"].items()} == {"math": 16, "code": 16, "chat": 16}
    bench = steps["benchmark_dflash"]["facts"]
    slices = ["speed-bench/low_entropy", "speed-bench/mixed", "speed-bench/high_entropy", "random-ids"]
    assert [p["max_concurrency"] for p in bench["points"]] == [1, 4, 16, 32] * len(slices)
    repeats = [c for c in (1, 4, 16, 32) for _ in range(DEMO_REPEATS)]  # the demo site's bench_repeats
    assert [r["max_concurrency"] for r in bench["runs"]] == repeats * len(slices)  # per workload and category
    assert list(bench["speedup"]["by_workload"]) == slices
    assert bench["speedup"]["by_workload"]["speed-bench/mixed"]["by_concurrency"]["1"] > 1.0  # the runbook's gate
    # the stand-in's acceptance follows content: SPEED-Bench's predictable prompts are accepted longest
    accept = {p["category"]: p["accept_length"]["median"] for p in bench["points"] if p["max_concurrency"] == 1}
    assert accept["low_entropy"] > accept["high_entropy"] and accept[None] < accept["mixed"]  # None: random ids
    assert steps["stop"]["facts"]["stopped"] is True
    with socket.socket() as sock:
        assert sock.connect_ex(("127.0.0.1", port)) != 0  # the GPUs are free again

    titles = [t["title"] for t in report["tables"]]
    assert titles[0] == "Acceptance length per prompt set" and "Speedup and acceptance per workload" in titles
    assert [f"Output throughput per concurrency: {key}" in titles for key in slices] == [True] * len(slices)
    per_workload = next(t for t in report["tables"] if t["title"] == "Speedup and acceptance per workload")
    assert [row[:2] for row in per_workload["rows"][::4]] == [
        ["speed-bench", "low_entropy"], ["speed-bench", "mixed"], ["speed-bench", "high_entropy"], ["random-ids", "all"]
    ]  # fmt: skip
    assert (run / "report.md").read_text().startswith("# Benchmark")
    assert [f["path"] for f in report["figures"]][:2] == ["speedup.png", "pareto.png"]
    assert all((run / f["path"]).read_bytes().startswith(b"\x89PNG") for f in report["figures"])
    # provenance: what the numbers are of, complete on the test host
    provenance = report["provenance"]
    assert [(r["repo"], r["commit"], r["verified"]) for r in provenance["repos"]] == [
        (DRAFTER_ID, drafter_repo().sha, True), (SPEED_BENCH_ID, speed_bench_repo().sha, True),
        (TARGET_ID, target_repo().sha, True),
    ]  # fmt: skip
    assert [r["step"] for r in provenance["repos"]] == ["verify_drafter", "verify_speed_bench", "verify_target"]
    assert [(d["side"], d["step"], d["server_version"]) for d in provenance["deployments"]] == [
        ("baseline", "deploy_baseline", "0.5.23"), ("dflash", "deploy_dflash", "0.5.23")
    ]  # fmt: skip
    assert provenance["deployments"][1]["argv"] == argv and provenance["deployments"][1]["gpus"] == 1
    assert provenance["gpus"]["model"] == probe["gpu"]["gpus"][0]["name"] and provenance["gpus"]["count"] == 1
    assert provenance["gpus"]["driver_version"] == probe["gpu"]["driver_version"] is not None
    assert provenance["gpus"]["cuda_version"] == probe["gpu"]["cuda_version"] is not None
    assert [{r["concurrency"] for r in b["runs"]} for b in provenance["benchmarks"]] == [{1, 4, 16, 32}] * 2
    assert [len({r["seed"] for r in b["runs"]}) for b in provenance["benchmarks"]] == [
        16 * DEMO_REPEATS
    ] * 2  # a seed per run
    acceptance = provenance["acceptance"]
    assert (acceptance["step"], acceptance["api"], acceptance["thinking"]) == ("eval", "chat", True)
    assert provenance["unknown"] == {}  # on the test host every fact of the numbers is known
    printed = runbook_cli("report", str(run))
    assert printed.returncode == 0 and "Acceptance length per prompt set" in printed.stdout
    assert not re.search(rb"hf_[A-Za-z]{34}", b"".join(p.read_bytes() for p in run.rglob("*") if p.is_file()))


@pytest.mark.e2e
@pytest.mark.xdist_group("timing")
def test_the_demo_serves_the_flagship_across_two_nodes(tmp_path: Path) -> None:
    """`runbook demo --nodes 2`: the flagship unchanged, its pool `nodes` two 8x H100 test nodes on their own
    loopback addresses: both probed and given verified weights, one SGLang server of tp 16 across them (rank 1
    launched on gpu2 with --node-rank 1), the evals and benchmarks against rank 0, every rank stopped."""
    logs = tmp_path / "logs"
    done = runbook_cli("demo", "--nodes", "2", "--log-dir", str(logs), "--ssh-server", "openssh", timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    (run,) = [p for p in logs.iterdir() if (p / "run.json").exists()]
    status = json.loads(runbook_cli("status", "--log-dir", str(logs), "--json").stdout)
    hosts: dict[str, set[str]] = {}
    for step in status["steps"]:
        assert step["status"] == "passed", step
        hosts.setdefault(step["step"], set()).add(step["host"])
    assert all(hosts[step] == {"gpu", "gpu2"} for step in ("probe", "verify_target", "verify_drafter"))
    assert hosts["deploy_dflash"] == hosts["benchmark_dflash"] == hosts["stop"] == {"gpu"}  # rank 0's
    records = [json.loads(line) for line in (run / "audit.jsonl").read_text().splitlines()]
    launched = {r["host"]: json.loads(r["stdout"]) for r in records if r.get("step") == "deploy_dflash" and
                r.get("stdout", "").startswith('{"action": "launch"')}  # fmt: skip
    assert sorted(launched) == ["gpu", "gpu2"]
    for rank, host in enumerate(("gpu", "gpu2")):
        argv = " ".join(launched[host]["argv"])
        assert "--tp-size 16 " in argv and f"--nnodes 2 --node-rank {rank} --dist-init-addr 127.0.0.2:" in argv
    stopped = [json.loads(r["stdout"]) for r in records if r.get("step") == "stop" and r.get("event") == "command"]
    assert sorted(s["state_file"].split("/demo-host/")[1].split("/")[0] for s in stopped) == ["gpu", "gpu2"]
    assert all(s["stopped"] and s["gpu_freed"] for s in stopped)
    deployments = json.loads((run / "report.json").read_text())["provenance"]["deployments"]
    assert [d["gpus"] for d in deployments] == [16, 16] and all(d["server_version"] == "0.5.23" for d in deployments)
    assert all([node["host"] for node in d["group"]["nodes"]] == ["gpu", "gpu2"] for d in deployments)
    assert not live_pids(cmdline=str(logs))


def _server_record(home: Path, server: subprocess.Popen[bytes], starttime: int) -> None:
    """What the deploy step records for a server it started, as sandbox.demo.stop_servers reads it."""
    records = home / ".runbook" / "sglang"
    records.mkdir(parents=True)
    record = {"pid": server.pid, "pgid": server.pid, "starttime": starttime, "argv": ["sleep"]}
    (records / "30000.json").write_text(json.dumps(record))


@pytest.fixture
def leftover() -> Iterator[subprocess.Popen[bytes]]:
    """A process in its own group, as a server a killed demo left running."""
    server = subprocess.Popen(["sleep", "60"], start_new_session=True)
    yield server
    with contextlib.suppress(ProcessLookupError):
        os.killpg(server.pid, signal.SIGKILL)
    server.wait()


def test_a_server_left_by_a_killed_demo_is_stopped_before_its_record_is_wiped(
    tmp_path: Path, leftover: subprocess.Popen[bytes]
) -> None:
    stat = deploy_host.proc_stat(leftover.pid)
    assert stat is not None
    _server_record(tmp_path / "demo-host" / "home", leftover, stat["starttime"])
    with demo_site(tmp_path, "embedded", say=lambda _: None):
        assert leftover.wait(timeout=10) == -signal.SIGKILL


def test_a_stale_record_never_kills_a_process_that_reused_the_pid(
    tmp_path: Path, leftover: subprocess.Popen[bytes]
) -> None:
    stat = deploy_host.proc_stat(leftover.pid)
    assert stat is not None
    _server_record(tmp_path, leftover, stat["starttime"] - 1)  # the recorded server started at another time
    stop_servers(tmp_path)
    time.sleep(0.2)
    assert leftover.poll() is None


def test_a_demo_that_stops_says_to_run_the_demo_again_not_a_resume(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The demo's test host ends with the demo: the `runbook run ... --resume` a run ends with would retry a port
    nothing listens on, then blame sshd. Its probe made to fail (a wrong sglang_python), in seconds."""
    from executor.faces import cli
    from tests.clirun import runbook_cli as in_process

    run = cli.cmd_run

    def probe_only(args: Any) -> int:
        return run(argparse.Namespace(**{**vars(args), "only_step": "probe", "var": ["sglang_python=/nonexistent"]}))

    monkeypatch.setattr(cli, "cmd_run", probe_only)
    done = in_process("demo", "--log-dir", str(tmp_path / "logs"), "--ssh-server", "embedded", env={"COLUMNS": "100"})
    assert done.returncode == 1, done.stderr[-3000:]
    # the commands to paste, whole on lines of their own where a hint and its command fit no line of 100
    lines = done.stderr.splitlines()
    assert "HF_TOKEN=hf_... runbook run runbooks/k26_dflash.yaml --inventory my-site.yaml" in lines, lines
    # a command too long for a line is `$ `-prefixed and `\`-continued, as a console's commands are
    pasted = [line.strip().removeprefix("$ ") for line in re.sub(r" \\\n *", " ", done.stderr).splitlines()]
    assert f"runbook audit verify {next((tmp_path / 'logs').glob('2*'))}" in pasted, lines
    said = " ".join(done.stderr.split())
    assert "python '/nonexistent' (from '$sglang_python') does not exist" in said
    assert "k26_dflash.yaml --resume" not in said and "continue where it stopped" not in said
    assert "run the same `runbook demo` again, from the start" in said
    assert "demo: no report" in said and "the numbers come from the SGLang stand-in" not in said


def test_a_var_given_to_the_demo_reaches_its_run_and_one_that_does_not_fit_stops_it_before_anything_runs(
    tmp_path: Path,
) -> None:
    """`runbook demo --var` as `runbook run --var`, over the demo's inventory (its `bench_repeats: 1`)."""
    from tests.clirun import runbook_cli as in_process

    logs = tmp_path / "logs"
    done = in_process("demo", "--var", "bench_repeats=0", "--log-dir", str(logs), "--ssh-server", "embedded")
    assert done.returncode == 2, done.stderr[-3000:]
    said = re.findall(r"k26_dflash\.yaml:\d+:\d+: step '(\w+)': repeats: runbook var bench_repeats = '0' does not fit: "
                      r"expected a whole number above 0", done.stderr)  # fmt: skip
    assert said == ["benchmark_baseline", "benchmark_dflash"]
    assert not [p for p in logs.iterdir() if (p / "run.json").exists()]  # nothing ran


def test_the_demos_landscapes_are_the_sandboxs_and_one_is_the_sweeps_alone(tmp_path: Path) -> None:
    """`runbook demo --landscape` offers sandbox.demo.LANDSCAPES (the CLI names them without importing the sandbox),
    and without --sweep it is refused before anything starts."""
    from executor.faces.cli import DEMO_LANDSCAPES
    from sandbox.demo import LANDSCAPES
    from tests.clirun import runbook_cli as in_process

    assert tuple(LANDSCAPES) == DEMO_LANDSCAPES
    logs = tmp_path / "logs"
    done = in_process("demo", "--landscape", "headroom", "--log-dir", str(logs))
    assert done.returncode == 2 and "--landscape headroom is the sweep's test hosts': add --sweep" in done.stderr
    assert not logs.exists()
