"""The flagship runbook, unedited, against the test host and the Hub test double (--inventory)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from executor.cli import main
from sandbox.repos import TARGET_ID

RUNBOOK = Path("runbooks/k26_dflash.yaml")


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


def test_the_runbook_runs_unedited_on_the_test_host(tmp_path, testhost, hub, capsys, monkeypatch) -> None:
    monkeypatch.setenv("HF_TOKEN", hub.token)
    inventory, logs = site(tmp_path, testhost("h200"), hub), tmp_path / "logs"
    code, events = run(capsys, "--inventory", str(inventory), "--log-dir", str(logs))
    assert code == 0, [e for e in events if e["event"] in ("attempt_failed", "step_finished")]
    steps = facts(logs, capsys)
    probe = steps["probe"]["facts"]
    assert probe["gpu_arch"] == "sm90" and probe["gpu_count"] == 1
    assert probe["sglang"]["dflash"] is True and probe["hf_token"]["source"] == "env HF_TOKEN"
    assert steps["download_drafter"]["facts"]["method"] == "hf_cli"
    assert steps["verify_target"]["facts"]["files_expected"] == len(hub.repos[TARGET_ID].files)
    assert steps["inspect"]["facts"]["drafter"]["block_size"]["value"] == 8
    token_bytes = hub.token.encode()
    assert not [p for p in logs.rglob("*") if p.is_file() and token_bytes in p.read_bytes()]

    # a shard goes bad on disk: verify (repair: true) finds it, fetches it again and passes
    shard = next(p for p in (tmp_path / "models" / "Kimi-K2.6").glob("*.safetensors"))
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0xFF
    shard.write_bytes(bytes(data))
    code, events = run(capsys, "--inventory", str(inventory), "--log-dir", str(logs), "--from", "verify_target")
    assert code == 0
    assert facts(logs, capsys)["verify_target"]["facts"]["repaired"] == [shard.name]


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


def test_plan_shows_every_download_method(tmp_path, testhost, hub, capsys) -> None:
    assert main(["plan", str(RUNBOOK), "--inventory", str(site(tmp_path, testhost("h200"), hub))]) == 0
    out = capsys.readouterr().out
    for step in ("download_drafter", "download_target"):
        section = out.split(f"'{step}'")[1].split("## step")[0]
        assert all(method in section for method in ("hf_cli", "snapshot_download", "http")), step
