"""`runbook plan`: readable by default (what each step does, the commands that matter, run-time values and
their source, host programs as name, size and digest), `--full` as every command is sent, `--json` the
structured plan (executor.runbook.planner.plan_document). Before: one output only, 8,800 lines for the flagship,
every host program inline, and a `plan_document` that missed a secret holding `"` or `\\`."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import sys
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from executor.faces.cli import main
from executor.runbook.loader import load_runbook
from executor.runbook.planner import host_env, plan_text, secrets_redactor
from executor.stepkind import RenderContext

FLAGSHIP = Path(__file__).resolve().parents[2] / "runbooks" / "k26_dflash.yaml"
SWEEP = FLAGSHIP.with_name("k26_dflash_sweep.yaml")


def plan(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    capsys.readouterr()
    assert main(["plan", *args]) == 0
    return capsys.readouterr().out


def section(text: str, step: str) -> str:
    """The readable plan's lines of one step, up to the next step."""
    return text.split(f" '{step}' (")[1].split("\n## step")[0]


def shipped(full: str) -> dict[str, bytes]:
    """Each host program's zip as the full plan sends it (its base64 heredoc), by name."""
    found = re.findall(
        r"# hostprograms/(\w+)\.py with the kit.*?<<'RUNBOOK_PROGRAM'\n(.*?)\nRUNBOOK_PROGRAM\n", full, re.S
    )
    return {name: base64.b64decode(body) for name, body in found}


def test_the_flagships_plan_fits_two_screens_and_says_what_each_step_does(capsys: pytest.CaptureFixture[str]) -> None:
    text = plan(capsys, str(FLAGSHIP))
    lines = text.splitlines()
    # 7: its host; 25: the SPEED-Bench dataset's download and verify steps; 1: the probe's gate on the files the
    # downloads include (issue 30); 1: the probe's gate on the GPUs of a campaign laid over it (issue 31)
    assert len(lines) <= 160 and max(map(len, lines)) <= 160, (len(lines), max(map(len, lines)))
    assert "RUNBOOK_PROGRAM" not in text and "base64 -d" not in text  # no program's body
    deploy = section(text, "deploy_dflash")
    launch = deploy.replace(" \\\n        ", " ")  # the command's lines, joined as a shell joins them
    assert "$ /root/venv_sglang/bin/python -m sglang.launch_server --model-path /root/models/Kimi-K2.6" in launch
    assert "--speculative-algorithm DFLASH --speculative-draft-model-path /root/models/Kimi-K2.6-DFlash" in launch
    assert "known at run time, from step 'probe': gpu_count" in deploy  # the tp size's source
    for step in ("download_drafter", "download_target"):
        methods = next(line for line in section(text, step).splitlines() if "methods: " in line)
        assert [methods.index(m) for m in ("1. hf_cli", "2. snapshot_download", "3. http")] == sorted(
            methods.index(m) for m in ("1. hf_cli", "2. snapshot_download", "3. http")
        )
    assert "$ /root/venv_sglang/bin/hf download z-lab/Kimi-K2.6-DFlash --revision" in section(text, "download_drafter")
    bench = section(text, "benchmark_dflash").replace(" \\\n        ", " ")
    assert "$ /root/venv_sglang/bin/python -m sglang.benchmark.serving --backend sglang --base-url" in bench
    assert "--max-concurrency 1" in bench and "known at run time, from step 'deploy_dflash': base_url" in bench
    # each host program as name, size and the sha256 of the very bytes the full plan ships
    sent = shipped(plan(capsys, "--full", str(FLAGSHIP)))
    listed = re.findall(r"host program (\w+): (\d+) bytes, sha256:([0-9a-f]{64})", text)
    assert (
        {name for name, _, _ in listed}
        == set(sent)
        == {"probe", "download", "verify", "inspect_config", "deploy"} | {"eval_acceptance", "scrape_metrics"}
    )
    for name, size, digest in listed:
        assert (int(size), digest) == (len(sent[name]), hashlib.sha256(sent[name]).hexdigest())


class Known(RenderContext):
    """Earlier steps' facts, all known (as in a run), noting each fact a step consults."""

    def __init__(self, variables: dict[str, str], **facts: dict[str, Any]) -> None:
        self.host_name, self.vars, self.facts = "gpu", variables, facts
        self.consulted: set[tuple[str, str]] = set()

    def fact(self, step_id: str, path: str) -> Any:
        self.consulted.add((step_id, f"steps.{step_id}.facts.{path}"))
        value: Any = self.facts[step_id]
        for part in path.split("."):
            value = value[part]
        return value

    def peer(self, host: str) -> Known:
        assert host == self.host_name, f"the flagship has one node; asked for {host}"
        return self


def known_facts(variables: dict[str, str], attention: str) -> Known:
    """What the flagship's probe and inspect steps report on an H200 host, for a target of `attention`."""
    backends = ["fa3", "flashinfer", "triton", "flashmla", "trtllm_mla"]
    probe = {"gpu_count": 8, "gpu_arch": "sm90", "mla_backends_usable_on_gpu": ["fa3", "flashmla", "flashinfer"]}
    probe["sglang"] = {"attention_backends": backends, "draft_attention_backends": ["fa3", "flashinfer", "triton"]}
    tokens = {"value": 16, "source": "drafter/config.json block_size", "unknown_reason": None}
    deploy = {"speculative_num_draft_tokens": tokens, "trust_remote_code": True}
    deploy["attention_arch"] = {"value": attention, "source": "target/config.json", "unknown_reason": None}
    return Known(variables, probe=probe, inspect={"deploy": deploy})


@pytest.mark.parametrize("step", ["deploy_baseline", "deploy_dflash"])
def test_the_plan_names_every_fact_a_deploy_command_depends_on(step: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Each deploy choice stops at its first fact not known yet; the plan listed only those (gpu_count, gpu_arch,
    deploy.trust_remote_code), not the MLA backends, SGLang's backend lists or the target's attention."""
    document = json.loads(plan(capsys, "--json", str(FLAGSHIP)))
    (variant,) = next(s for s in document["steps"] if s["id"] == step)["on"][0]["variants"]
    listed = {(value["step"], value["value"]) for value in variant["run_time"]}
    runbook = load_runbook(FLAGSHIP, None)
    spec = next(s for s in runbook.steps if s.id == step)
    for attention in ("MLA", "MHA"):  # every branch a run may take: each fact it consults is in the plan
        ctx = known_facts(host_env(runbook, "gpu", {}), attention)
        spec.render(ctx)
        assert ctx.consulted <= listed, ctx.consulted - listed
    probe = "gpu_count, gpu_arch, mla_backends_usable_on_gpu, sglang.attention_backends"
    inspect = "deploy.attention_arch, deploy.trust_remote_code"
    if step == "deploy_dflash":
        probe += ", sglang.draft_attention_backends"
        inspect = "deploy.attention_arch, deploy.speculative_num_draft_tokens, deploy.trust_remote_code"
    probe += ", sglang.launch_options"  # extra_args, resolved as the host's SGLang reads them
    shown = section(plan(capsys, str(FLAGSHIP)), step)
    # the attention backend's mark fits no line: it gets lines of its own, the command keeps its ` \\` breaks
    assert "--tp-size '<known at run time: steps.probe.facts.gpu_count>' \\\n" in shown
    assert f"known at run time, from step 'probe': {probe}\n" in shown.replace(",\n        ", ", ")  # a wrapped line
    assert f"known at run time, from step 'inspect': {inspect}\n" in shown


@pytest.mark.parametrize("book", [FLAGSHIP, SWEEP], ids=["flagship", "sweep"])
def test_plan_full_is_every_command_as_sent(book: Path, capsys: pytest.CaptureFixture[str]) -> None:
    runbook = load_runbook(book, None)
    assert plan(capsys, "--full", str(book)) == plan_text(runbook, {}, secrets_redactor(runbook, os.environ)) + "\n"


def test_plan_json_is_the_structured_plan(capsys: pytest.CaptureFixture[str]) -> None:
    document = json.loads(plan(capsys, "--json", str(SWEEP)))
    runbook = load_runbook(SWEEP, None)
    assert document["runbook"] == runbook.name
    assert [(s["id"], s["kind"]) for s in document["steps"]] == [(s.id, s.kind) for s in runbook.steps]
    by_id = {step["id"]: step for step in document["steps"]}
    [group] = document["groups"]
    assert len(group["cells"]) == 12 and group["launches"] == 12 and group["placement"] == "spread"
    instance = by_id[group["instances"][0]]
    assert instance["group"] == group["name"] and instance["cell"]
    [variant] = by_id["deploy_baseline"]["on"][0]["variants"]
    assert "-m sglang.launch_server" in variant["commands"][0]
    assert {"value": "steps.probe.facts.gpu_count", "step": "probe"} in variant["run_time"]
    assert variant["programs"][0]["name"] == "deploy" and len(variant["programs"][0]["sha256"]) == 64


def test_the_sweeps_plan_keeps_its_group_header_and_cells(capsys: pytest.CaptureFixture[str]) -> None:
    text = plan(capsys, str(SWEEP))
    runbook = load_runbook(SWEEP, None)
    [group] = runbook.groups
    assert "# group sweep: 12 cells (0 excluded, 0 included), 42 step instances, 12 server configurations" in text
    assert all(f"\n#   cell {cell.id}\n" in text for cell in group.cells)
    assert all(f" '{spec.id}' ({spec.kind}) on " in text for spec in runbook.steps)
    assert "RUNBOOK_PROGRAM" not in text and max(map(len, text.splitlines())) <= 160


BOOK = """\
name: masked
hosts:
  box: {address: local}
vars:
  dir: /models/x
secrets:
  TOKEN: {env: RB_PLAN_TOKEN}
steps:
  - id: fetch
    kind: download
    repo: org/model
    local_dir: $dir
"""


@pytest.fixture(scope="module")
def book(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("masked") / "runbook.yaml"
    path.write_text(BOOK)
    return path


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(middle=st.text("ab'\"\\$ é{}*", min_size=6, max_size=16))
def test_a_secret_in_a_var_is_masked_in_every_form_of_the_plan(
    book: Path, middle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A secret pasted into a --var, holding quotes, a backslash or `$`: the minimal plan_document masked
    the dumped JSON, where `"` is `\\"`, and so missed it."""
    secret = f"Q{middle}Z"
    with mock.patch.dict(os.environ, {"RB_PLAN_TOKEN": secret}):
        outputs = {
            shape: plan(capsys, str(book), "--var", f"dir=/m/{secret}", *shape)
            for shape in ((), ("--full",), ("--json",))
        }
    for shape, text in outputs.items():
        assert "***" in text, shape
        assert secret not in text and json.dumps(secret)[1:-1] not in text, shape
    document = json.loads(outputs[("--json",)])
    assert "/m/***" in document["steps"][0]["on"][0]["variants"][0]["summary"][0]


def test_each_fallback_is_shown_and_a_script_naming_a_program_ships_none(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "runbook.yaml"
    path.write_text(
        "name: fb\nhosts: {box: {address: local}}\nsteps:\n"
        "  - id: a\n    kind: shell\n"
        '    script: "# hostprograms/probe.py with the kit, zip sha256:0123456789abcdef\\necho first"\n'
        "    fallbacks: [{script: echo second}]\n"
    )
    text = plan(capsys, str(path))
    assert "## step 1 'a' (shell) on box [local], primary\n    script: # hostprograms/probe.py" in text
    assert "## step 1 'a' (shell) on box [local], fallback 1\n    script: echo second\n" in text
    assert "host program" not in text


def test_plan_full_prints_each_step_as_it_comes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`--full` of 10 000 instances of a 256 kB script is 2.6 GB: built whole before printing it took 5 GB
    (and rich, measuring each character's width, printed 1 MB/s). Each step's block is written as it comes:
    no write holds more than one instance's script."""
    script = "echo $matrix_a\n" + "# padding\n" * 5000
    values = ", ".join(str(i) for i in range(20))
    book = tmp_path / "big.yaml"
    book.write_text(
        f"name: t\nhosts: {{box: {{address: local}}}}\nsteps:\n  - id: s\n    kind: shell\n    host: box\n"
        f"    script: {json.dumps(script)}\n    matrix: {{a: [{values}]}}\n"
    )
    writes: list[int] = []
    real_write = type(sys.stdout).write

    def write(stream: Any, text: str) -> int:
        writes.append(len(text))
        return real_write(stream, text)

    with mock.patch.object(type(sys.stdout), "write", write):
        text = plan(capsys, "--full", str(book))
    assert text.count(script) == 20
    assert sum(writes) >= len(text) and max(writes) < 2 * len(script)
