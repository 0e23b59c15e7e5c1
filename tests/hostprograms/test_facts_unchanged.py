"""Each kind's facts on the test host are what they were before its host program moved to `hostprograms/`.

One runbook runs the kinds that talk to the Hub (download of both repos with the HTTP method and then again,
skipped; verify; inspect_config; probe) over the real sshd against the local Hub; another the kinds that talk
to a server (deploy, again (reused), eval_acceptance, deploy's stop) against the SGLang stand-in. The
expectations (`facts_before.json`, `facts_before_server.json`) were recorded once from main before the move:
facts with this run's folders, Hub address, port and home replaced by names and the numbers that vary from
run to run (free disk, timings, pids) by their type, so every field, text and list stays compared.
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from executor.faces.cli import main
from sandbox.hub import HubServer
from sandbox.model_configs import drafter_config, target_config
from sandbox.repos import DRAFTER_ID, TARGET_ID
from sandbox.sshd import free_port

EXPECTED = Path(__file__).with_name("facts_before.json")
EXPECTED_SERVER = Path(__file__).with_name("facts_before_server.json")
#: The checkout the test host's tools live in (its `.cache`): a path under it is compared as `<repo>/...`.
REPO = Path(__file__).resolve().parents[2]
STANDIN = {"decode_tokens_per_s": 4000.0, "startup_s": 0.3}  # the stand-in's switches: a short test
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


#: The probe's `os` texts that name the machine the tests run on (CI's kernel differs from a session's).
MACHINE_TEXT = ("hostname", "kernel")


#: Texts that differ from run to run: a log file's time stamp, a request id in the server's answer.
VOLATILE_TEXT = ((re.compile(r"\b\d{8}T\d{6}Z\b"), "<stamp>"), (re.compile(r"\b[0-9a-f]{32}\b"), "<id>"))


def normalized(value: Any, names: dict[str, str], exact: bool = True) -> Any:
    """`value` with each text of `names` (longest first) replaced by its name, VOLATILE_TEXT by its mark, and
    its numbers as their type unless `exact` (then only those at a VOLATILE key)."""
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int | float):
        return value if exact else f"<{type(value).__name__}>"
    if isinstance(value, str):
        for text in sorted(names, key=len, reverse=True):
            value = value.replace(text, names[text])
        for pattern, mark in VOLATILE_TEXT:
            value = pattern.sub(mark, value)
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
    names = {
        str(tmp_path): "<tmp>",
        str(home): "<home>",
        hub.endpoint: "<hub>",
        str(python): "<python>",
        str(REPO): "<repo>",
    }
    records = run_facts(tmp_path, host_yaml, doc)
    facts = {r["step"]: normalized(r["facts"], names, exact=r["step"] != "probe") for r in records}
    for key in MACHINE_TEXT:  # the machine's, not the probe's: compared by type
        os_facts = facts["probe"]["os"]
        os_facts[key] = f"<{type(os_facts[key]).__name__}>"
    return facts


def run_facts(tmp_path: Path, host_yaml: str, doc: dict[str, Any]) -> list[dict[str, Any]]:
    """Run the runbook `doc` (it must pass); each step's record as `runbook status --json` gives it."""
    path = tmp_path / "kinds.yaml"
    path.write_text("name: kinds\n" + host_yaml + yaml.safe_dump(doc, sort_keys=False))
    logs = tmp_path / "logs"
    assert main(["run", str(path), "--log-dir", str(logs)]) == 0
    out = tmp_path / "status.json"
    with out.open("w") as handle, contextlib.redirect_stdout(handle):
        assert main(["status", "--log-dir", str(logs), "--json"]) == 0
    return json.loads(out.read_text())["steps"]  # type: ignore[no-any-return]


def run_server_kinds(tmp_path: Path, host_yaml: str, home: Path, python: Path) -> dict[str, Any]:
    """Facts of deploy (started, then reused), eval_acceptance against it and deploy's stop, normalized."""
    models = tmp_path / "models"
    for name, config in (("target", target_config()), ("drafter", drafter_config())):
        (models / name).mkdir(parents=True)
        (models / name / "config.json").write_text(json.dumps(config))
    port = free_port()
    deploy = {"kind": "deploy", "python": str(python), "model_path": "$models_dir/target", "port": "$port",
              "draft_model_path": "${models_dir}/drafter", "tp_size": 1, "attention_backend": "fa3",
              "draft_attention_backend": "fa3", "speculative_num_draft_tokens": 8, "trust_remote_code": False,
              "ready_timeout": 60, "state_dir": "~/.runbook-facts-test",
              "extra_args": ["--served-model-name", "$port"]}  # fmt: skip
    steps = [
        {"id": "deploy", **deploy},
        {"id": "again", **deploy},
        {"id": "eval", "kind": "eval_acceptance", "server": "deploy", "prompt_sets": ["math"], "limit": 2,
         "python": str(python)},
        {"id": "stop", "kind": "stop_server", "port": "$port", "python": str(python),
         "state_dir": "~/.runbook-facts-test"},
    ]  # fmt: skip
    doc = {"vars": {"models_dir": str(models), "port": str(port)}, "steps": steps}
    (home / "sglang-standin.json").write_text(json.dumps(STANDIN))
    try:
        records = run_facts(tmp_path, host_yaml, doc)
    finally:
        (home / "sglang-standin.json").unlink()
        shutil.rmtree(home / ".runbook-facts-test", ignore_errors=True)  # the servers' records and logs
    names = {str(tmp_path): "<tmp>", str(home): "<home>", str(python): "<python>", str(port): "<port>"}
    return {r["step"]: normalized(r["facts"], names, exact=False) for r in records}


@pytest.mark.timeout(240)
def test_every_kinds_facts_are_as_before_the_move(
    tmp_path: Path, testhost: Any, hub: HubServer, capsys: pytest.CaptureFixture[str]
) -> None:
    host = testhost("h200")
    facts = run_every_kind(tmp_path, host.host_yaml(), host.home, host.python, hub)
    expected = json.loads(EXPECTED.read_text())
    facts["probe"] = projected(facts["probe"], expected["probe"])  # issue 27 added sglang.launch_options
    for step in ("download_drafter", "download_target", "again_drafter", "again_target"):  # issue 30: repo_type, xet
        facts[step] = projected(facts[step], expected[step])
    assert facts == expected


@pytest.mark.timeout(240)
def test_the_server_kinds_facts_are_as_before_the_move(
    tmp_path: Path, testhost: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    host = testhost("h200")
    facts = run_server_kinds(tmp_path, host.host_yaml(), host.home, host.python)
    expected = json.loads(EXPECTED_SERVER.read_text())
    facts["eval"] = projected(facts["eval"], expected["eval"])  # issue 15 added facts to eval_acceptance's
    for step in ("deploy", "again"):  # issue 27 added the choice of extra_args (as the host's SGLang reads them)
        facts[step] = projected(facts[step], expected[step])
    for step in ("deploy", "again", "stop"):  # issue 30 launches with --enable-metrics (deploy's `metrics`)
        argv = facts[step]["argv"]
        assert argv.count("--enable-metrics") == 1
        argv.remove("--enable-metrics")
    # issue 15 gave the stand-in a prefix cache: the reused server's readiness generation finds the first
    # one's prompt cached, which is the stand-in's doing, not the kind's
    again = facts["again"]["generate"]
    again["body"] = re.sub(r'"cached_tokens": \d+', '"cached_tokens": 0', again["body"])
    assert facts == expected


#: eval_acceptance's facts renamed since the snapshot (its Summary's `prompts` is `requests` since issue 15)
RENAMED = {"prompts": "requests"}


def projected(value: Any, shape: Any) -> Any:
    """`value` reduced to the keys that `shape` (the snapshot) has, recursively, under their names of now:
    every fact of before is still compared; those added since are not."""
    if isinstance(shape, dict) and isinstance(value, dict):
        return {key: projected(value.get(RENAMED.get(key, key)), inner) for key, inner in shape.items()}
    if isinstance(shape, list) and isinstance(value, list) and len(shape) == len(value):
        return [projected(item, inner) for item, inner in zip(value, shape, strict=True)]
    return value
