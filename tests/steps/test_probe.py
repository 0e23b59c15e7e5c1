"""The `probe` kind: its facts from the host program's document, and whole probes through the test host
(the program's own parts: tests/hostprograms/test_probe.py)."""

from __future__ import annotations

import contextlib
import io
import json
import platform
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from executor.faces.cli import main
from executor.stepkind import FactsError
from executor.transport.base import Collector
from hostprograms import probe as probe_host
from sandbox.model_configs import TMP_LONG_ID
from sandbox.prepare import VENV
from sandbox.repos import DRAFTER_ID, SPEED_BENCH_ID, TARGET_ID
from sandbox.sshd import free_port
from steps.probe import ProbeStep
from steps.probe_facts import HostReport, ProbeFacts, sm_arch
from tests.conftest import SandboxHost


def test_sm_arch() -> None:
    assert [sm_arch(c) for c in ("9.0", "10.0", "10.3", "12.0", None, "[N/A]")] == [
        "sm90",
        "sm100",
        "sm103",
        "sm120",
        None,
        None,
    ]


def finished(stdout: bytes, stderr: bytes = b"", exit_code: int = 0):  # type: ignore[no-untyped-def]
    collect = Collector()
    collect.stdout.feed(stdout)
    collect.stderr.feed(stderr)
    return collect.result(exit_code)


def test_no_document_is_loud() -> None:
    step = ProbeStep(id="p")
    with pytest.raises(FactsError, match=r"no JSON document \(exit 127\).*python3: command not found"):
        step.parse_facts(finished(b"", b"bash: line 9: python3: command not found\n", 127))
    with pytest.raises(FactsError, match=r"printed a document of an unexpected shape"):
        step.parse_facts(finished(b'{"os": {}}'))


# ---------------------------------------------------------------- whole probes through the test host


def run_probe(
    host: SandboxHost,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    step: str = "",
    head: str = "",
) -> tuple[int, dict[str, Any] | None, str]:
    """Run a runbook whose one step is a probe on `host`: (exit code, facts, stderr of the CLI)."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "probe.yaml"
    body = "name: probe\n" + host.host_yaml() + head + "steps:\n  - id: probe\n    kind: probe\n"
    path.write_text(body + textwrap.indent(textwrap.dedent(step), "    "))
    logs = tmp_path / "logs"
    code = main(["run", str(path), "--log-dir", str(logs)])
    err = capsys.readouterr().err
    assert main(["status", "--log-dir", str(logs), "--json"]) == 0
    (record,) = json.loads(capsys.readouterr().out)["steps"]
    return code, record["facts"], err


@pytest.fixture(scope="module")
def h200(testhost: Callable[[str], SandboxHost], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One probe of the H200 host with the SGLang venv's python, shared by the tests that read it."""
    host = testhost("h200")
    tmp = tmp_path_factory.mktemp("probe-h200")
    model = host.home / "models" / "Kimi-K2.6-DFlash-probe-test"
    model.mkdir(parents=True)
    try:
        (model / "config.json").write_text("{}" * 50)
        (model / "model.safetensors.incomplete").write_bytes(b"\0" * 1000)
        path = tmp / "probe.yaml"
        path.write_text(
            f"name: probe\n{host.host_yaml()}steps:\n  - id: probe\n    kind: probe\n    python: {host.python}\n"
        )
        assert main(["run", str(path), "--log-dir", str(tmp / "logs")]) == 0
        with contextlib.redirect_stdout(io.StringIO()) as out:
            assert main(["status", "--log-dir", str(tmp / "logs"), "--json"]) == 0
    finally:
        shutil.rmtree(model)
        with contextlib.suppress(OSError):
            model.parent.rmdir()  # only if no other test keeps models there
    facts: dict[str, Any] = json.loads(out.getvalue())["steps"][0]["facts"]
    return facts


def test_h200_gpu_facts_are_the_real_hosts(h200: dict[str, Any]) -> None:
    (card,) = h200["gpu"]["gpus"]
    assert card["name"] == "NVIDIA H200" and card["compute_capability"] == "9.0" and card["arch"] == "sm90"
    assert (card["memory_total_mib"], card["memory_free_mib"]) == (143771, 143156)
    assert h200["gpu"]["driver_version"] == "580.159.04" and h200["gpu"]["cuda_version"] == "13.0"
    assert h200["gpu"]["reason"] is None and h200["gpu"]["nvidia_smi"].endswith(".cache/testhost/bin/nvidia-smi")
    assert (h200["gpu_count"], h200["gpu_arch"], h200["gpu_memory_min_mib"]) == (1, "sm90", 143771)


def test_sglang_capabilities_are_read_from_the_installed_release(h200: dict[str, Any]) -> None:
    sglang = h200["sglang"]
    assert sglang["installed"] is True and sglang["version"] == "0.5.23" and sglang["dflash"] is True
    assert "trtllm_mla" in sglang["attention_backends"] and len(sglang["attention_backends"]) == 25
    assert sglang["draft_attention_backends"][:4] == ["flashinfer", "fa3", "fa4", "triton"]
    assert sglang["kimi_k25_model"] is True and sglang["kimi_k25_classes"] == ["KimiK25ForConditionalGeneration"]
    assert sglang["sources"]["attention_backends"].endswith("site-packages/sglang/srt/arg_groups/choices.py")
    assert sglang["sources"]["dflash"].endswith("sglang/srt/speculative/spec_info.py")
    assert sglang["sources"]["kimi_k25_model"].endswith("sglang/srt/models/kimi_k25.py")
    assert set(sglang["mla_attention_backends"]) == {
        "flashmla",
        "trtllm_mla",
        "cutedsl_mla",
        "tokenspeed_mla",
        "fa3",
        "flashinfer",
        "triton",
    }
    assert sglang["unknown"] == {}
    assert h200["mla_backends_usable_on_gpu"] == ["triton", "fa3", "flashinfer", "flashmla"]
    assert h200["python"]["executable"] == str(VENV / "bin" / "python")
    assert h200["python"]["version"] == platform.python_version()  # the venv is made from the tests' Python
    assert h200["python"]["packages"]["sglang"] == "0.5.23" and h200["python"]["packages"]["torch"] is None


def test_sglang_0_5_23_has_no_ddtree_and_says_which_algorithms_it_has(h200: dict[str, Any]) -> None:
    sglang = h200["sglang"]
    assert sglang["ddtree"] is False
    assert sglang["speculative_algorithms"] == [
        "DFLASH", "UNO", "DSPARK", "EAGLE", "EAGLE3", "FROZEN_KV_MTP", "STANDALONE", "NGRAM",
    ]  # fmt: skip
    assert sglang["sources"]["ddtree"].endswith("site-packages/sglang/srt/speculative/spec_info.py")


def test_a_build_with_the_ddtree_pull_request_has_ddtree(
    testhost: Callable[..., SandboxHost], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    host = testhost("h200", sglang="ddtree-pr")
    code, facts, _ = run_probe(host, tmp_path, capsys, f"python: {host.python}\n")
    assert code == 0 and facts is not None
    sglang = facts["sglang"]
    assert sglang["ddtree"] is True and sglang["dflash"] is True and sglang["version"] == "0.5.23"
    assert sglang["speculative_algorithms"][:2] == ["DFLASH", "DDTREE"]
    assert "sglang-with-ddtree-pr" in sglang["sources"]["ddtree"]


def test_the_serving_benchmark_entry_points_are_read_from_the_files(
    h200: dict[str, Any], testhost: Callable[..., SandboxHost], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """0.5.23 has both (the old one deprecated); a release from before the move only sglang.bench_serving."""
    assert h200["sglang"]["bench_entry_points"] == ["sglang.benchmark.serving", "sglang.bench_serving"]
    assert h200["sglang"]["sources"]["bench_entry_points"].endswith("site-packages/sglang")
    host = testhost("h200", sglang="old-client")
    code, facts, _ = run_probe(host, tmp_path, capsys, f"python: {host.python}\n")
    assert code == 0 and facts is not None
    assert facts["sglang"]["bench_entry_points"] == ["sglang.bench_serving"]
    assert facts["sglang"]["sources"]["bench_entry_points"].endswith("sglang-old-client/sglang")


def test_host_disks_memory_os_and_models(h200: dict[str, Any]) -> None:
    shm = h200["disks"]["/dev/shm"]
    df = subprocess.run(["df", "-B1", "--output=size,avail", "/dev/shm"], capture_output=True, text=True, check=True)
    size, _avail = df.stdout.splitlines()[1].split()
    assert shm["size_bytes"] == int(size) and shm["mount_point"] == "/dev/shm" and shm["exists"] is True
    models = h200["models"]
    assert models["dir"] == "~/models" and models["resolved"].endswith("/home/models") and models["exists"] is True
    (entry,) = [e for e in models["entries"] if e["name"] == "Kimi-K2.6-DFlash-probe-test"]
    assert (entry["name"], entry["bytes"], entry["files"], entry["incomplete_files"], entry["has_config"]) == (
        "Kimi-K2.6-DFlash-probe-test",
        1100,
        2,
        1,
        True,
    )
    steady = ("path", "resolved", "exists", "measured_at", "mount_point", "size_bytes")  # others write meanwhile
    assert {k: h200["disks"]["~/models"][k] for k in steady} == {k: models["disk"][k] for k in steady}
    assert models["disk"]["avail_bytes"] > 0
    assert h200["memory"]["total_bytes"] == probe_host.parse_meminfo(Path("/proc/meminfo").read_text())["MemTotal"]
    assert h200["cpu"]["count"] >= 1 and h200["os"]["id"] and h200["os"]["pretty_name"]


@pytest.mark.parametrize(
    ("caps", "usable"),
    [
        (["9.0"], ["triton", "fa3", "flashinfer", "flashmla"]),
        (["10.0", "10.0"], ["triton", "flashinfer", "flashmla", "trtllm_mla", "cutedsl_mla", "tokenspeed_mla"]),
        (["12.0"], ["triton", "flashinfer"]),
        (["9.0", "12.0"], None),
    ],
)
def test_mla_backends_usable_follow_the_gpu_architecture(
    h200: dict[str, Any], caps: list[str], usable: list[str] | None
) -> None:
    report = {k: v for k, v in h200.items() if k in HostReport.model_fields}
    report["sglang"] = {k: v for k, v in report["sglang"].items() if k != "mla_attention_backends"}
    card = {k: v for k, v in report["gpu"]["gpus"][0].items() if k != "arch"}
    report["gpu"] = {
        **report["gpu"],
        "gpus": [{**card, "index": i, "compute_capability": c} for i, c in enumerate(caps)],
    }
    facts = ProbeFacts.from_report(HostReport.model_validate(report))
    assert facts.mla_backends_usable_on_gpu == usable
    if usable is None:
        assert facts.unknown["mla_backends_usable_on_gpu"] == (
            "GPU architecture unknown: the GPUs' compute capabilities differ or are unknown: 12.0, 9.0"
        )


def test_rtx6000_host_has_eight_sm120_gpus_where_trtllm_mla_is_unusable(testhost, tmp_path, capsys) -> None:
    host = testhost("rtx6000")
    code, facts, err = run_probe(host, tmp_path, capsys, step=f"python: {host.python}\n")
    assert code == 0, err
    assert facts is not None
    assert facts["gpu_count"] == 8 and facts["gpu_arch"] == "sm120"
    assert {g["name"] for g in facts["gpu"]["gpus"]} == {"NVIDIA RTX PRO 6000 Blackwell Server Edition"}
    assert [g["index"] for g in facts["gpu"]["gpus"]] == list(range(8))
    assert facts["gpu_memory_min_mib"] == 97887 and facts["gpu"]["driver_version"] == "580.95.05"
    assert "trtllm_mla" in facts["sglang"]["attention_backends"]
    assert facts["mla_backends_usable_on_gpu"] == ["triton", "flashinfer"]


def test_trtllm_mla_gate_fails_loudly_on_sm120(testhost, tmp_path, capsys) -> None:
    host = testhost("rtx6000")
    code, _facts, err = run_probe(
        host,
        tmp_path,
        capsys,
        step=f"""\
            python: {host.python}
            gates:
              - that: "'trtllm_mla' in facts.mla_backends_usable_on_gpu"
                message: trtllm_mla cannot run on this GPU
            """,
    )
    assert code == 1
    assert "trtllm_mla cannot run on this GPU" in err
    assert 'facts.mla_backends_usable_on_gpu = ["triton", "flashinfer"]' in err


@pytest.mark.parametrize(
    ("variant", "reason"),
    [
        ("none", "nvidia-smi --query-gpu failed (exit 9): NVIDIA-SMI has failed because it couldn't communicate"),
        ("absent", "nvidia-smi not found on PATH"),
    ],
)
def test_no_gpu_is_an_empty_list_with_a_reason(testhost, tmp_path, capsys, variant: str, reason: str) -> None:
    code, facts, err = run_probe(testhost(variant), tmp_path, capsys, step="python: /nonexistent/python\n")
    assert code == 0, err
    assert facts is not None
    assert facts["gpu"]["gpus"] == [] and facts["gpu"]["reason"].startswith(reason)
    assert facts["gpu_count"] == 0 and facts["gpu_arch"] is None
    assert facts["unknown"]["gpu_arch"].startswith("no GPUs: " + reason)
    assert (
        facts["mla_backends_usable_on_gpu"] is None
        and "GPU architecture unknown" in facts["unknown"]["mla_backends_usable_on_gpu"]
    )


def test_a_python_without_sglang_says_not_installed_and_gates_on_it_fail(testhost, tmp_path, capsys) -> None:
    code, facts, err = run_probe(
        testhost("h200"),
        tmp_path,
        capsys,
        step=f"""\
            python: {sys.executable}
            packages: [sglang, pydantic]
            gates:
              - that: "'trtllm_mla' in facts.sglang.attention_backends"
                message: this SGLang offers no trtllm_mla
            """,
    )
    assert code == 1
    assert "this SGLang offers no trtllm_mla" in err and "argument of type 'NoneType' is not iterable" in err
    code, facts, err = run_probe(testhost("h200"), tmp_path, capsys, step=f"python: {sys.executable}\n")
    assert code == 0, err
    assert facts is not None
    sglang = facts["sglang"]
    assert sglang["installed"] is False and sglang["attention_backends"] is None and sglang["dflash"] is None
    assert sglang["unknown"]["attention_backends"] == f"sglang is not installed for {sys.executable}"
    assert facts["python"]["packages"]["sglang"] is None
    assert facts["unknown"]["mla_backends_usable_on_gpu"].startswith("SGLang's attention backends unknown")


def test_a_missing_python_is_unknown_with_the_reason(testhost, tmp_path, capsys) -> None:
    code, facts, err = run_probe(testhost("h200"), tmp_path, capsys, step="python: /opt/nope/bin/python\n")
    assert code == 0, err
    assert facts is not None
    assert facts["python"]["unknown_reason"] == "python '/opt/nope/bin/python' does not exist or is not executable"
    assert facts["sglang"]["installed"] is None
    assert facts["sglang"]["unknown"]["dflash"] == facts["python"]["unknown_reason"]


TOKEN = "hf_probeTESTtokenValue0123456789"


def _nowhere_holds_the_token(logs: Path, *outputs: str) -> None:
    for path in logs.rglob("*"):
        if path.is_file():
            assert TOKEN.encode() not in path.read_bytes(), path
    for output in outputs:
        assert TOKEN not in output


def test_token_from_env_reports_its_source_never_its_value(testhost, tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.setenv("PROBE_TEST_TOKEN", TOKEN)
    code, facts, err = run_probe(
        testhost("h200"),
        tmp_path,
        capsys,
        head="secrets:\n  HF_TOKEN: {env: PROBE_TEST_TOKEN}\n",
        step="python: /nonexistent/python\ngates:\n  - facts.hf_token.available\n",
    )
    assert code == 0, err
    assert facts is not None
    assert facts["hf_token"] == {
        "available": True,
        "source": "env HF_TOKEN",
        "checked": ["env HF_TOKEN"],
        "reason": None,
    }
    _nowhere_holds_the_token(tmp_path / "logs", err, json.dumps(facts))


def test_token_from_file_reports_the_file(testhost, tmp_path, capsys) -> None:
    host = testhost("h200")
    token_file = host.home / ".cache" / "huggingface" / "token"
    code, facts, err = run_probe(host, tmp_path / "before", capsys, step="python: /nonexistent/python\n")
    assert code == 0 and facts is not None
    assert facts["hf_token"]["available"] is False
    assert facts["hf_token"]["reason"] == f"no HF_TOKEN in the environment and no token file at {token_file}"
    token_file.parent.mkdir(parents=True, exist_ok=True)
    try:
        token_file.write_text(TOKEN + "\n")
        code, facts, err = run_probe(host, tmp_path, capsys, step="python: /nonexistent/python\n")
    finally:
        token_file.unlink()
    assert code == 0, err
    assert facts is not None
    assert facts["hf_token"]["source"] == f"file {token_file}" and facts["hf_token"]["available"] is True
    _nowhere_holds_the_token(tmp_path / "logs", err, json.dumps(facts))


def test_missing_token_fails_a_token_gate_with_the_reason(testhost, tmp_path, capsys) -> None:
    code, _facts, err = run_probe(
        testhost("h200"),
        tmp_path,
        capsys,
        step="""\
            python: /nonexistent/python
            gates:
              - that: facts.hf_token.available
                message: no Hugging Face token on the host
            """,
    )
    assert code == 1 and "no Hugging Face token on the host" in err and "facts.hf_token.available = false" in err


def test_paths_and_models_dir_expand_on_the_host_and_unset_vars_are_reasons(testhost, tmp_path, capsys) -> None:
    host = testhost("h200")
    code, facts, err = run_probe(
        host,
        tmp_path,
        capsys,
        head="vars:\n  models_root: /nonexistent-probe-root\n",
        # a name of the host's environment (XDG_*): one that is no var of the runbook is refused at validate
        step="python: /nonexistent/python\nmodels_dir: $models_root/models\npaths: [/, $XDG_RUNBOOK_UNSET/x]\n",
    )
    assert code == 0, err
    assert facts is not None
    disk = facts["disks"]["$models_root/models"]
    assert (
        disk["resolved"] == "/nonexistent-probe-root/models" and disk["exists"] is False and disk["measured_at"] == "/"
    )
    assert disk["size_bytes"] == facts["disks"]["/"]["size_bytes"] > 0
    assert facts["models"]["exists"] is False and facts["models"]["entries"] == []
    unset = facts["disks"]["$XDG_RUNBOOK_UNSET/x"]
    assert unset["size_bytes"] is None
    assert unset["unknown_reason"] == "'$XDG_RUNBOOK_UNSET/x': variable $XDG_RUNBOOK_UNSET is not set on the host"


def test_hub_sizes_are_asked_from_the_host_and_a_failure_is_a_reason(testhost, tmp_path, capsys) -> None:
    host = testhost("h200")
    code, facts, err = run_probe(
        host,
        tmp_path,
        capsys,
        head=f"vars:\n  HF_ENDPOINT: http://127.0.0.1:{free_port()}\n",
        step=f"python: {host.python}\nhub_repos: [z-lab/Kimi-K2.6-DFlash@main]\n",
    )
    # the probe's default gates hold the repos readable (issue 30): a Hub it cannot ask fails it, saying why
    assert code == 1 and "why (facts.hub): ConnectError" in err, err
    assert facts is not None
    repo = facts["hub"]["z-lab/Kimi-K2.6-DFlash@main"]
    assert (repo["repo"], repo["revision"], repo["files"], repo["bytes"]) == (
        "z-lab/Kimi-K2.6-DFlash",
        "main",
        None,
        None,
    )
    assert "ConnectError" in repo["unknown_reason"] and "127.0.0.1" in repo["unknown_reason"]


def test_plan_shows_one_command_shipping_the_program_and_its_config(tmp_path, capsys) -> None:
    path = tmp_path / "rb.yaml"
    path.write_text("name: p\nsteps:\n  - {id: probe, kind: probe, python: /root/venv_sglang/bin/python}\n")
    assert main(["plan", "--full", str(path)]) == 0
    out = capsys.readouterr().out
    assert "# hostprograms/probe.py with the kit, zip sha256:" in out
    assert 'python3 "$prog/program.pyz" "$prog/config.json"' in out
    assert '"python": "/root/venv_sglang/bin/python"' in out


CAMPAIGN = """\
name: gated-drafter
{hosts}vars: {vars}
secrets:
  HF_TOKEN: {{env: PROBE_TEST_HF_TOKEN, required: false}}
steps:
  - id: probe
    kind: probe
    python: {python}
    hub_repos: [{target}]
  - group: sweep
    matrix:
      drafter:
        - {{name: zlab, repo: {drafter}, dir: zlab}}
        - {{name: tmp-long, repo: {tmp_long}, dir: tmp-long}}
    steps:
      - id: download_drafter
        kind: download
        repo: ${{{{ matrix.drafter.repo }}}}
        local_dir: {models}/${{{{ matrix.drafter.dir }}}}
  - id: download_dataset
    kind: download
    repo: {dataset}
    repo_type: dataset
    local_dir: {models}/speed-bench
"""


def test_a_gated_drafter_of_a_campaign_fails_the_probe_before_any_download(
    testhost: Callable[[str], SandboxHost], hub: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The probe asks the Hub about every repository the runbook downloads, derived from its download steps (a
    matrix's drafters and a dataset included, the hand-written hub_repos kept): the plan shows them, and a drafter
    whose terms the token's owner has not accepted fails the probe's gate, naming it, before any download ran."""
    host = testhost("h200")
    hub.faults.gate(TMP_LONG_ID)
    variables = json.dumps(hub.client_env(tmp_path / "hf-home") | {"HF_HUB_DOWNLOAD_TIMEOUT": "5"})
    body = CAMPAIGN.format(
        hosts=host.host_yaml(), vars=variables, python=host.python, target=TARGET_ID, drafter=DRAFTER_ID,
        tmp_long=TMP_LONG_ID, dataset=SPEED_BENCH_ID, models=tmp_path / "models",
    )  # fmt: skip
    path = tmp_path / "campaign.yaml"
    path.write_text(body)
    assert main(["plan", str(path)]) == 0
    derived = f"{TARGET_ID}, {DRAFTER_ID}, {TMP_LONG_ID}, datasets/{SPEED_BENCH_ID}"
    assert f"the Hub's files and access of {derived}" in " ".join(capsys.readouterr().out.split())  # unwrapped

    code = main(["run", str(path), "--log-dir", str(tmp_path / "logs")])
    err = capsys.readouterr().err
    assert code == 1
    assert "the token at hand may not read a repository the runbook downloads" in err
    assert "why (facts.hub): the token at hand may not read its files: GatedRepoError" in err
    assert f"tried: {TMP_LONG_ID}@main, asked with the huggingface_hub of {host.python}" in err  # named, alone
    assert f"tried: {DRAFTER_ID}@main" not in err
    assert hub.requests.count(TMP_LONG_ID, method="HEAD", kind="resolve") == 1  # the probe's one question
    for repo in (TARGET_ID, DRAFTER_ID, TMP_LONG_ID, SPEED_BENCH_ID):  # no download began
        assert hub.requests.count(repo, method="GET", kind="resolve") + hub.requests.count(repo, kind="cdn") == 0
    assert main(["status", "--log-dir", str(tmp_path / "logs"), "--json"]) == 0
    steps = {s["step"]: s for s in json.loads(capsys.readouterr().out)["steps"]}
    assert steps["probe"]["status"] == "failed"
    hub_facts = steps["probe"]["facts"]["hub"]
    assert hub_facts[f"datasets/{SPEED_BENCH_ID}"]["readable"] is True
    assert hub_facts[DRAFTER_ID]["readable"] is True and hub_facts[TMP_LONG_ID]["readable"] is False
    assert all(s["status"] == "pending" for name, s in steps.items() if name != "probe")
