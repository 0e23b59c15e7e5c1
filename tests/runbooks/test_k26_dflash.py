"""The flagship runbook, unedited, against the test host, the Hub test double and the SGLang stand-in
(--inventory lays the site over it), through each failure mode of part 2. Its run end to end, report and
provenance included, is `runbook demo`'s (tests/sandbox/test_demo.py): one run of the whole flagship in CI.
The failure modes after the downloads resume copies of one run that got that far (`prefix`)."""

from __future__ import annotations

import contextlib
import copy
import io
import json
import os
import shutil
import signal
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from executor.faces.cli import main
from executor.run import audit
from sandbox.hub import HubServer
from sandbox.repos import SPEED_BENCH_PARQUET_ID
from sandbox.sglang_standin import faults as standin_switches
from sandbox.sshd import free_port

#: the runbook tier, on the worker of the tests that load the CPU or read a clock (pyproject's markers)
pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("timing")]
RUNBOOK = Path("runbooks/k26_dflash.yaml")
#: The stand-in decodes fast and starts at once, so the runbook's full benchmark takes seconds.
# streamed every 16 tokens, as the demo's stand-in: the tests here are of the runbook, not of streaming, and a
# chunk per token made each of the flagship's 96 benchmark runs CPU-bound on the client and the server
FAST = {"decode_tokens_per_s": 5000.0, "startup_s": 0.5, "stream_interval": 16}


def site(tmp_path: Path, host: Any, hub: Any) -> Path:
    """An inventory that points the runbook's host and vars at the test host and the local Hub."""
    inventory = tmp_path / "testhost.yaml"
    inventory.write_text(
        yaml.safe_dump(
            {
                "hosts": {"gpu": host.host_dict()},
                "vars": {
                    "models_dir": str(tmp_path / "models"),
                    "sglang_python": str(host.python),
                    "hf_cli": str(host.python.parent / "hf"),
                    "HF_ENDPOINT": hub.endpoint,
                    "sglang_port": free_port(),
                    "bench_repeats": 1,  # a run per concurrency and workload: the tests here are of the runbook
                },
            }
        )
    )
    return inventory


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, list[dict[str, Any]]]:
    code = main(["run", str(RUNBOOK), "--json", *args])
    return code, [json.loads(line) for line in capsys.readouterr().out.splitlines()]


def facts(log_dir: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    assert main(["status", "--log-dir", str(log_dir), "--json"]) == 0
    return {s["step"]: s for s in json.loads(capsys.readouterr().out)["steps"]}


def failed_step(events: list[dict[str, Any]]) -> dict[str, Any]:
    (failed,) = [e for e in events if e["event"] == "step_finished" and e["status"] == "failed"]
    return failed


def run_dir(events: list[dict[str, Any]]) -> Path:
    return Path(next(e["run_dir"] for e in events if e["event"] == "run_started"))


def commands_of(events: list[dict[str, Any]]) -> set[str]:
    """The steps that ran a command on the host in that run, from its audit log."""
    return {record["step"] for _, record, _ in audit.read_records(run_dir(events)) if record}


class Flagship:
    """The runbook's site on the h200 test host, with the token in the environment."""

    def __init__(self, tmp_path: Path, host: Any, hub: Any) -> None:
        self.host, self.hub = host, hub
        self.inventory, self.logs, self.models = site(tmp_path, host, hub), tmp_path / "logs", tmp_path / "models"
        self.port = yaml.safe_load(self.inventory.read_text())["vars"]["sglang_port"]
        self.state_file = host.home / ".runbook" / "sglang" / f"{self.port}.json"

    def args(self, *more: str) -> list[str]:
        return ["--inventory", str(self.inventory), "--log-dir", str(self.logs), *more]

    def switch(self, **switches: Any) -> None:
        """Set the SGLang stand-in's switches (read when a server starts), on top of FAST."""
        standin_switches.path(self.host.home).write_text(json.dumps(FAST | switches))

    def kill_server(self) -> None:
        """What an operator's `kill` would do: the server recorded on the port dies (its record stays)."""
        if self.state_file.exists():
            pgid = json.loads(self.state_file.read_text())["pgid"]
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)


@pytest.fixture
def flagship(tmp_path: Path, testhost: Any, hub: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[Flagship]:
    monkeypatch.setenv("HF_TOKEN", hub.token)
    made = Flagship(tmp_path, testhost("h200"), hub)
    made.switch()
    yield made
    made.kill_server()
    standin_switches.path(made.host.home).unlink(missing_ok=True)


@dataclass(frozen=True)
class Prefix:
    """The flagship run to its first failure (module fixture `prefix`): its site, exit code and events."""

    site: Flagship
    code: int
    events: list[dict[str, Any]]


@pytest.fixture(scope="module")
def prefix(testhost: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prefix]:
    """The flagship once, to the crash of deploy_baseline's server at start-up: probe, both downloads and
    verifications and inspect passed. The tests below resume a copy of it (`resumed`) instead of downloading
    again; they share its site (inventory, models folder, Hub, port), since a resume reuses a step only with the
    vars it had."""
    with HubServer() as hub, pytest.MonkeyPatch.context() as env:
        env.setenv("HF_TOKEN", hub.token)
        site = Flagship(tmp_path_factory.mktemp("prefix"), testhost("h200"), hub)
        site.switch(fault="crash_at_startup")
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            code = main(["run", str(RUNBOOK), "--json", *site.args()])
        standin_switches.path(site.host.home).unlink(missing_ok=True)
        yield Prefix(site, code, [json.loads(line) for line in out.getvalue().splitlines()])


@pytest.fixture
def resumed(prefix: Prefix, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Flagship]:
    """The prefix's site with a copy of its run folder of its own, the token in the environment again."""
    monkeypatch.setenv("HF_TOKEN", prefix.site.hub.token)
    made = copy.copy(prefix.site)
    made.logs = tmp_path / "logs"
    shutil.copytree(prefix.site.logs, made.logs, ignore=shutil.ignore_patterns("lock"))
    made.switch()
    yield made
    made.kill_server()
    standin_switches.path(made.host.home).unlink(missing_ok=True)


def test_a_crash_at_start_up_fails_deploy_with_the_log_line_and_resume_skips_the_downloads(
    prefix: Prefix, resumed: Flagship, capsys: pytest.CaptureFixture[str]
) -> None:
    assert prefix.code == 1
    failed = failed_step(prefix.events)
    assert failed["step"] == "deploy_baseline"
    message = failed["failures"][0]
    assert "during start-up" in message and "torch.OutOfMemoryError: CUDA out of memory" in message

    # the cause is fixed (`resumed` switched the fault off)
    code, events = run(capsys, *resumed.args("--resume"))
    assert code == 0, [e for e in events if e["event"] in ("attempt_failed", "step_finished")]
    ran = commands_of(events)
    assert not ran & {"probe", "download_drafter", "verify_drafter", "download_target", "verify_target", "inspect"}
    assert {"deploy_baseline", "benchmark_baseline", "eval", "benchmark_dflash", "stop"} <= ran
    assert (run_dir(events) / "report.json").exists()
    token_bytes = resumed.hub.token.encode()
    assert not [p for p in resumed.logs.rglob("*") if p.is_file() and token_bytes in p.read_bytes()]


def test_a_shard_gone_bad_on_disk_is_found_fetched_again_and_passes_verify(
    resumed: Flagship, capsys: pytest.CaptureFixture[str]
) -> None:
    """verify (repair: true) of the runbook as it is, on weights it verified before: one byte of a shard
    flipped is found, that file alone fetched again, and the step passes."""
    shard = next(p for p in (resumed.models / "Kimi-K2.6").glob("*.safetensors"))
    good = shard.read_bytes()
    shard.write_bytes(good[:-1] + bytes([good[-1] ^ 0xFF]))
    try:
        code, _ = run(capsys, *resumed.args("--only", "verify_target"))
        assert code == 0
        assert facts(resumed.logs, capsys)["verify_target"]["facts"]["repaired"] == [shard.name]
        assert shard.read_bytes() == good
    finally:
        shard.write_bytes(good)  # the prefix's other tests share its models folder


def test_a_server_never_healthy_fails_deploy_after_its_ready_timeout(
    flagship: Flagship, capsys: pytest.CaptureFixture[str]
) -> None:
    flagship.switch(fault="never_healthy")
    code, events = run(capsys, *flagship.args("--var", "sglang_ready_timeout=3s"))
    assert code == 1
    failed = failed_step(events)
    assert failed["step"] == "deploy_baseline"
    assert "the server was not ready after 3s: /health answered 503" in failed["failures"][0]
    assert not flagship.state_file.exists()  # it was stopped, and its record with it


def test_a_port_taken_by_another_program_fails_deploy_naming_it(
    flagship: Flagship, capsys: pytest.CaptureFixture[str]
) -> None:
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", flagship.port))
        squatter.listen()
        code, events = run(capsys, *flagship.args())
    assert code == 1
    failed = failed_step(events)
    assert failed["step"] == "deploy_baseline"
    assert f"port {flagship.port} is taken by pid {os.getpid()}" in failed["failures"][0]


def test_acceptance_below_the_gate_fails_eval_and_a_fixed_drafter_continues_from_deploy(
    resumed: Flagship, capsys: pytest.CaptureFixture[str]
) -> None:
    resumed.switch(accept_length=2.0)
    code, events = run(capsys, *resumed.args("--resume"))
    assert code == 1
    failed = failed_step(events)
    assert failed["step"] == "eval"
    assert "DFlash accepts fewer than 3 tokens per verify step on the math set" in failed["failures"][0]

    resumed.switch()  # the operator swaps the drafter for a better one, so the server must start again
    resumed.kill_server()
    code, events = run(capsys, *resumed.args("--from", "deploy_dflash"))
    assert code == 0, [e for e in events if e["event"] in ("attempt_failed", "step_finished")]
    assert commands_of(events) == {"deploy_dflash", "eval", "benchmark_dflash", "stop"}
    assert facts(resumed.logs, capsys)["eval"]["facts"]["sets"]["math"]["mean"] >= 3.0


def test_no_token_is_a_clear_gate_failure(tmp_path, testhost, hub, capsys, monkeypatch) -> None:
    monkeypatch.delenv("HF_TOKEN", raising=False)
    inventory, logs = site(tmp_path, testhost("h200"), hub), tmp_path / "logs"
    code, events = run(capsys, "--inventory", str(inventory), "--log-dir", str(logs))
    assert code == 1
    (failed,) = [e for e in events if e["event"] == "step_finished" and e["status"] == "failed"]
    assert failed["step"] == "probe"
    assert "no Hugging Face token reaches the host" in failed["failures"][0]


def test_a_host_without_gpu_stops_at_the_probe(tmp_path, testhost, hub, capsys, monkeypatch) -> None:
    monkeypatch.setenv("HF_TOKEN", hub.token)
    inventory, logs = site(tmp_path, testhost("none"), hub), tmp_path / "logs"
    code, events = run(capsys, "--inventory", str(inventory), "--log-dir", str(logs))
    assert code == 1
    (failed,) = [e for e in events if e["event"] == "step_finished" and e["status"] == "failed"]
    assert "no GPU found by nvidia-smi" in failed["failures"][0]
    assert not (tmp_path / "models" / "Kimi-K2.6").exists()  # nothing was downloaded


def test_a_var_a_step_cannot_use_stops_the_run_before_anything_runs(
    tmp_path: Path, testhost: Any, hub: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    inventory, logs = site(tmp_path, testhost("h200"), hub), tmp_path / "logs"
    args = ["--inventory", str(inventory), "--log-dir", str(logs), "--var", "sglang_ready_timeout=forever"]
    assert main(["run", str(RUNBOOK), *args]) == 2
    problems = capsys.readouterr().err.splitlines()
    assert problems[0].startswith(f"{RUNBOOK}:")
    assert problems[0].endswith(
        "step 'deploy_baseline': ready_timeout: runbook var sglang_ready_timeout = 'forever' does not fit: "
        "expected a duration such as 500ms, 30s, 10m or 2h, got 'forever'"
    )
    assert not logs.exists()  # no run folder, no state, no audit log: nothing ran
    # a number in the runbook takes only a number from --var (the text itself, typed like the runbook's)
    assert main(["plan", str(RUNBOOK), "--inventory", str(inventory), "--var", "sglang_port=abc"]) == 2
    assert "sglang_port=abc: sglang_port is a number in the runbook (" in capsys.readouterr().err


def test_plan_shows_every_download_method(tmp_path, testhost, hub, capsys) -> None:
    assert main(["plan", str(RUNBOOK), "--inventory", str(site(tmp_path, testhost("h200"), hub))]) == 0
    out = capsys.readouterr().out
    for step in ("download_drafter", "download_target"):
        section = out.split(f"'{step}'")[1].split("## step")[0]
        assert all(method in section for method in ("hf_cli", "snapshot_download", "http")), step
    deploy = out.split("'deploy_dflash'")[1].split("## step")[0]
    for shown in ("-m sglang.launch_server", "--speculative-algorithm DFLASH", "--tp-size '<known at run time"):
        assert shown in deploy


def test_a_dataset_repository_without_the_jsonl_fails_at_the_probe_naming_it(
    tmp_path: Path, testhost: Any, hub: HubServer, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Hub's nvidia/SPEED-Bench holds Parquet, not the JSONL SGLang's `speed-bench` client reads: the flagship
    pointed (by its var) at such a repository stops at its probe, naming the repository, the file and the var to
    set, before any download request reaches the Hub (no drafter download first, no 12-hour target download)."""
    monkeypatch.setenv("HF_TOKEN", hub.token)
    inventory, logs = site(tmp_path, testhost("h200"), hub), tmp_path / "logs"
    args = [
        "--inventory",
        str(inventory),
        "--log-dir",
        str(logs),
        "--var",
        f"speed_bench_repo={SPEED_BENCH_PARQUET_ID}",
    ]
    code, events = run(capsys, *args)
    assert code == 1
    failed = failed_step(events)
    assert failed["step"] == "probe"
    (failure,) = [f for f in failed["failures"] if "lacks a file it includes" in f]
    assert "name it in var speed_bench_repo, or benchmark a `custom` workload" in failure
    assert f"{SPEED_BENCH_PARQUET_ID}@main holds no file matching throughput_1k.jsonl" in failure
    assert "throughput_1k/test-00000-of-00001.parquet" in failure  # what it holds instead
    assert len(failed["failures"]) == 1  # the repository is readable: only the missing file fails
    assert commands_of(events) == {"probe"}
    for repo in hub.repos:
        assert hub.requests.count(repo, method="GET", kind="resolve") + hub.requests.count(repo, kind="cdn") == 0
