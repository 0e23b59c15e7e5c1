"""The flagship runbook, unedited, against the test host, the Hub test double and the SGLang stand-in
(--inventory lays the site over it), end to end and through each failure mode of part 2."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from executor import audit
from executor.cli import main
from sandbox.repos import DRAFTER_ID, TARGET_ID
from sandbox.sglang_standin import faults as standin_switches
from sandbox.sshd import free_port

RUNBOOK = Path("runbooks/k26_dflash.yaml")
#: The stand-in decodes fast and starts at once, so the runbook's full benchmark takes seconds.
FAST = {"decode_tokens_per_s": 1500.0, "startup_s": 0.5}


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
        self.inventory, self.logs = site(tmp_path, host, hub), tmp_path / "logs"
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


def test_the_runbook_runs_end_to_end_unedited(flagship: Flagship, capsys: pytest.CaptureFixture[str]) -> None:
    code, events = run(capsys, *flagship.args())
    assert code == 0, [e for e in events if e["event"] in ("attempt_failed", "step_finished")]
    steps = facts(flagship.logs, capsys)
    probe = steps["probe"]["facts"]
    assert probe["gpu_arch"] == "sm90" and probe["gpu_count"] == 1
    assert probe["sglang"]["dflash"] is True and probe["hf_token"]["source"] == "env HF_TOKEN"
    assert steps["download_drafter"]["facts"]["method"] == "hf_cli"
    assert steps["verify_target"]["facts"]["files_expected"] == len(flagship.hub.repos[TARGET_ID].files)
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
    assert [p["max_concurrency"] for p in bench["points"]] == [1, 4, 16, 32]
    assert [r["max_concurrency"] for r in bench["runs"]] == [c for c in (1, 4, 16, 32) for _ in range(3)]  # repeats
    assert bench["speedup"]["by_concurrency"]["1"] > 1.0
    assert steps["stop"]["facts"]["stopped"] is True
    with socket.socket() as sock:
        assert sock.connect_ex(("127.0.0.1", flagship.port)) != 0  # the GPUs are free again

    folder = run_dir(events)
    report = json.loads((folder / "report.json").read_text())
    titles = [t["title"] for t in report["tables"]]
    assert titles[0] == "Acceptance length per prompt set" and "Output throughput per concurrency" in titles
    assert (folder / "report.md").read_text().startswith("# Benchmark")
    assert (folder / "speedup.png").read_bytes().startswith(b"\x89PNG")
    assert [f["path"] for f in report["figures"]][:2] == ["speedup.png", "pareto.png"]
    assert all((folder / f["path"]).read_bytes().startswith(b"\x89PNG") for f in report["figures"])
    # provenance: what the numbers are of, complete on the test host
    provenance = report["provenance"]
    assert [(r["repo"], r["commit"], r["verified"]) for r in provenance["repos"]] == [
        (repo, flagship.hub.repos[repo].sha, True) for repo in (DRAFTER_ID, TARGET_ID)
    ]
    assert [r["step"] for r in provenance["repos"]] == ["verify_drafter", "verify_target"]
    assert [(d["side"], d["step"], d["server_version"]) for d in provenance["deployments"]] == [
        ("baseline", "deploy_baseline", "0.5.23"), ("dflash", "deploy_dflash", "0.5.23")
    ]  # fmt: skip
    assert provenance["deployments"][1]["argv"] == argv and provenance["deployments"][1]["gpus"] == 1
    assert provenance["gpus"]["model"] == probe["gpu"]["gpus"][0]["name"] and provenance["gpus"]["count"] == 1
    assert provenance["gpus"]["driver_version"] == probe["gpu"]["driver_version"] is not None
    assert provenance["gpus"]["cuda_version"] == probe["gpu"]["cuda_version"] is not None
    assert [{r["concurrency"] for r in b["runs"]} for b in provenance["benchmarks"]] == [{1, 4, 16, 32}] * 2
    assert [len({r["seed"] for r in b["runs"]}) for b in provenance["benchmarks"]] == [12, 12]  # a seed per run
    acceptance = provenance["acceptance"]
    assert (acceptance["step"], acceptance["api"], acceptance["thinking"]) == ("eval", "chat", True)
    assert provenance["unknown"] == {}  # on the test host every fact of the numbers is known
    assert main(["report", str(folder)]) == 0
    assert "Acceptance length per prompt set" in capsys.readouterr().out
    assert main(["audit", "verify", str(folder)]) == 0
    assert capsys.readouterr().out.startswith("intact")
    token_bytes = flagship.hub.token.encode()
    assert not [p for p in flagship.logs.rglob("*") if p.is_file() and token_bytes in p.read_bytes()]

    # a shard goes bad on disk: verify (repair: true) finds it, fetches it again and passes
    shard = next(p for p in (flagship.logs.parent / "models" / "Kimi-K2.6").glob("*.safetensors"))
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0xFF
    shard.write_bytes(bytes(data))
    code, events = run(capsys, *flagship.args("--only", "verify_target"))
    assert code == 0
    assert facts(flagship.logs, capsys)["verify_target"]["facts"]["repaired"] == [shard.name]


def test_a_crash_at_start_up_fails_deploy_with_the_log_line_and_resume_skips_the_downloads(
    flagship: Flagship, capsys: pytest.CaptureFixture[str]
) -> None:
    flagship.switch(fault="crash_at_startup")
    code, events = run(capsys, *flagship.args())
    assert code == 1
    failed = failed_step(events)
    assert failed["step"] == "deploy_baseline"
    message = failed["failures"][0]
    assert "during start-up" in message and "torch.OutOfMemoryError: CUDA out of memory" in message

    flagship.switch()  # the cause is fixed
    code, events = run(capsys, *flagship.args("--resume"))
    assert code == 0, [e for e in events if e["event"] in ("attempt_failed", "step_finished")]
    ran = commands_of(events)
    assert not ran & {"probe", "download_drafter", "verify_drafter", "download_target", "verify_target", "inspect"}
    assert {"deploy_baseline", "benchmark_baseline", "eval", "benchmark_dflash", "stop"} <= ran
    assert (run_dir(events) / "report.json").exists()


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
    flagship: Flagship, capsys: pytest.CaptureFixture[str]
) -> None:
    flagship.switch(accept_length=2.0)
    code, events = run(capsys, *flagship.args())
    assert code == 1
    failed = failed_step(events)
    assert failed["step"] == "eval"
    assert "DFlash accepts fewer than 3 tokens per verify step on the math set" in failed["failures"][0]

    flagship.switch()  # the operator swaps the drafter for a better one, so the server must start again
    flagship.kill_server()
    code, events = run(capsys, *flagship.args("--from", "deploy_dflash"))
    assert code == 0, [e for e in events if e["event"] in ("attempt_failed", "step_finished")]
    assert commands_of(events) == {"deploy_dflash", "eval", "benchmark_dflash", "stop"}
    assert facts(flagship.logs, capsys)["eval"]["facts"]["sets"]["math"]["mean"] >= 3.0


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
