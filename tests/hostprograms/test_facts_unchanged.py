"""Each kind's facts on the test host are what they were before its host program moved to `hostprograms/`.

One runbook runs every kind whose program ships through `executor.hostprogram` (download of both Hub repos
with the HTTP method and then again, skipped; verify; inspect_config; probe) over the real sshd against the
local Hub. The expectation (`facts_before.json`) was recorded once from main before the move: facts with
numbers replaced by their type and this run's folders, Hub address and home replaced by names, so what
varies from run to run (free disk, timings, ports) drops out and every field, text and list stays compared.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from executor.cli import main
from sandbox.hub import HubServer
from sandbox.repos import DRAFTER_ID, TARGET_ID

EXPECTED = Path(__file__).with_name("facts_before.json")
HF_VARS = {
    "HF_HUB_DISABLE_XET": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "HF_HUB_DISABLE_UPDATE_CHECK": "1",
    "HF_HUB_DOWNLOAD_TIMEOUT": "5",
}


#: Numbers that differ from run to run (timings, free disk, the hashing pool's size); every other number of
#: download, verify and inspect_config is compared as it is. The probe's numbers (memory, disks, load) all vary.
VOLATILE = {"duration_s", "rate_bytes_per_s", "free_bytes", "hash_seconds", "throughput_bytes_per_s", "workers",
            "workers_used", "hashed", "cached", "bytes_hashed"}  # fmt: skip


def normalized(value: Any, names: dict[str, str], exact: bool = True) -> Any:
    """`value` with each text of `names` (longest first) replaced by its name, and its numbers as their type
    unless `exact` (then only those at a VOLATILE key)."""
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int | float):
        return value if exact else f"<{type(value).__name__}>"
    if isinstance(value, str):
        for text in sorted(names, key=len, reverse=True):
            value = value.replace(text, names[text])
        return value
    if isinstance(value, list):
        return [normalized(item, names, exact) for item in value]
    return {normalized(k, names): normalized(v, names, exact and k not in VOLATILE) for k, v in value.items()}


def run_every_kind(tmp_path: Path, host_yaml: str, home: Path, python: Path, hub: HubServer) -> dict[str, Any]:
    """Facts of each step of one run, normalized."""
    models = tmp_path / "models"
    repos = {"drafter": DRAFTER_ID, "target": TARGET_ID}
    steps: list[dict[str, Any]] = []
    for name, repo in repos.items():
        local = f"$models_dir/{name}"
        steps += [
            {"id": f"download_{name}", "kind": "download", "repo": repo, "local_dir": local, "methods": ["http"]},
            {"id": f"again_{name}", "kind": "download", "repo": repo, "local_dir": local, "methods": ["http"]},
            {"id": f"verify_{name}", "kind": "verify", "repo": repo, "local_dir": local, "python": str(python)},
        ]
    steps += [
        {"id": "inspect", "kind": "inspect_config", "target_dir": "$models_dir/target", "drafter_dir": "~/nowhere"},
        {"id": "inspect_both", "kind": "inspect_config", "target_dir": "$models_dir/target", "gates": [],
         "drafter_dir": "${models_dir}/drafter"},
        {"id": "probe", "kind": "probe", "models_dir": "$models_dir", "python": str(python),
         "hub_repos": [DRAFTER_ID, f"{TARGET_ID}@main"]},
    ]  # fmt: skip
    steps[-3]["gates"] = []  # `~/nowhere` has no config: its problems are facts, not a failure here
    doc = {"vars": {"HF_ENDPOINT": hub.endpoint, "models_dir": str(models), **HF_VARS}, "steps": steps}
    path = tmp_path / "kinds.yaml"
    path.write_text("name: kinds\n" + host_yaml + yaml.safe_dump(doc, sort_keys=False))
    logs = tmp_path / "logs"
    assert main(["run", str(path), "--log-dir", str(logs)]) == 0
    out = tmp_path / "status.json"
    with out.open("w") as handle, contextlib.redirect_stdout(handle):
        assert main(["status", "--log-dir", str(logs), "--json"]) == 0
    records = json.loads(out.read_text())["steps"]
    names = {str(tmp_path): "<tmp>", str(home): "<home>", hub.endpoint: "<hub>", str(python): "<python>"}
    return {r["step"]: normalized(r["facts"], names, exact=r["step"] != "probe") for r in records}


@pytest.mark.timeout(240)
def test_every_kinds_facts_are_as_before_the_move(
    tmp_path: Path, testhost: Any, hub: HubServer, capsys: pytest.CaptureFixture[str]
) -> None:
    host = testhost("h200")
    facts = run_every_kind(tmp_path, host.host_yaml(), host.home, host.python, hub)
    assert facts == json.loads(EXPECTED.read_text())
