"""`runbook demo`, as a new user runs it: the whole flagship runbook on this machine, one command."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import runbook_cli
from tests.executor.test_transport import live_pids


@pytest.mark.parametrize("ssh_server", ["embedded"])
def test_the_demo_runs_the_flagship_runbook_end_to_end(tmp_path: Path, ssh_server: str) -> None:
    logs = tmp_path / "logs"
    done = runbook_cli("demo", "--log-dir", str(logs), "--ssh-server", ssh_server, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"SSH served by {ssh_server}" in done.stderr
    (run,) = [p for p in logs.iterdir() if (p / "run.json").exists()]
    report = json.loads((run / "report.json").read_text())
    assert report["tables"][0]["title"] == "Acceptance length per prompt set"
    assert "Output throughput per concurrency" in done.stdout  # the report's tables, printed at the end
    assert f"audit log: {run / 'audit.jsonl'}" in done.stderr and "a test double" in done.stderr
    assert (run / "speedup.png").exists()
    status = json.loads(runbook_cli("status", "--log-dir", str(logs), "--json").stdout)
    assert [s["status"] for s in status["steps"]] == ["passed"] * 12
    assert runbook_cli("audit", "verify", str(run)).returncode == 0
    assert not live_pids(cmdline=str(logs))  # the SGLang stand-in was stopped by the runbook, the servers by the demo
