"""The `deploy` kind: the launch command and its choices from probe/inspect facts (offline), the host
program's pure parts and its process and port handling on this machine, then whole deployments of the SGLang
stand-in through the test host's real sshd: start, reuse, restart on new arguments, stop, and each failure
(crash at start-up, a backend the GPU does not support, never healthy, a foreign process on the port)."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from executor.faces.cli import main
from executor.hostprogram import bundle
from executor.runbook.planner import PlanContext
from executor.stepkind import FactsError, RenderContext, RunTime
from hostprograms import deploy as deploy_host
from hostprograms.probe import _read_launch_options, _sglang_blank, literal_lists
from sandbox.model_configs import BLOCK_SIZE, custom_code_files, drafter_config, target_config
from sandbox.prepare import VENV
from sandbox.repos import oversized_copy
from sandbox.sglang_standin.server import VERSION as STANDIN_VERSION
from steps.deploy import DeployStep
from steps.probe_facts import MLA_BACKEND_ARCHS
from steps.server.documents import Choice
from steps.stop_server import StopServerStep

SITE = next(VENV.glob("lib/python*/site-packages"), VENV)


def sglang_choices() -> dict[str, list[str]]:
    """The backend lists of the SGLang release installed on the test host, read as the probe reads them."""
    source = (SITE / "sglang" / "srt" / "arg_groups" / "choices.py").read_text()
    return literal_lists(source, ("ATTENTION_BACKEND_CHOICES", "DRAFT_ATTENTION_BACKEND_CHOICES"))


@functools.cache
def launch_options() -> list[list[str]]:
    """The launch flags of the SGLang release installed on the test host, read as the probe reads them."""
    facts = _sglang_blank()
    _read_launch_options(str(SITE / "sglang"), facts)
    options: list[list[str]] = facts["launch_options"]
    return options


def probe_facts(arch: str | None, count: int = 8) -> dict[str, Any]:
    """The probe facts the deploy step reads, as the probe derives them for `count` GPUs of `arch`."""
    lists = sglang_choices()
    attention = lists["ATTENTION_BACKEND_CHOICES"]
    mla = [b for b in attention if b in MLA_BACKEND_ARCHS or b.endswith("_mla")]
    unknown = {} if arch else {"gpu_arch": "the GPUs' compute capabilities differ or are unknown: 8.0, 9.0"}
    return {
        "gpu_count": count,
        "gpu_arch": arch,
        "gpu": {"reason": None if count else "nvidia-smi not found on PATH"},
        "mla_backends_usable_on_gpu": [b for b in mla if arch in MLA_BACKEND_ARCHS.get(b, ())] if arch else None,
        "sglang": {
            "attention_backends": attention,
            "draft_attention_backends": lists["DRAFT_ATTENTION_BACKEND_CHOICES"],
            "launch_options": launch_options(),
        },
        "unknown": unknown,
    }


def inspect_facts(block: int | None = 8, attention: str = "MLA", trust: bool = True) -> dict[str, Any]:
    tokens = {"value": block, "source": "drafter/config.json block_size", "unknown_reason": None}
    if block is None:
        tokens = {"value": None, "source": None, "unknown_reason": "config.json has no block_size"}
    return {
        "deploy": {
            "speculative_num_draft_tokens": tokens,
            "trust_remote_code": trust,
            "attention_arch": {"value": attention, "source": "target/config.json kv_lora_rank", "unknown_reason": None},
        }
    }


class Facts(RenderContext):
    """A render context over given facts of earlier steps."""

    def __init__(self, **steps: dict[str, Any]) -> None:
        self.host_name, self.host_address, self.vars, self.steps = "box", "box", {}, steps

    def fact(self, step_id: str, path: str) -> Any:
        value: Any = self.steps[step_id]
        for part in path.split("."):
            value = value[part]
        return value

    def peer(self, host: str) -> RenderContext:
        raise AssertionError("a single-node deploy sees no other host")


def dflash(**params: Any) -> DeployStep:
    base = {"id": "deploy", "kind": "deploy", "python": "~/venv/bin/python", "model_path": "$models_dir/Kimi-K2.6"}
    base |= {"draft_model_path": "$models_dir/Kimi-K2.6-DFlash", "probe": "probe", "inspect": "inspect"}
    return DeployStep.model_validate(base | params)


def flags(step: DeployStep, ctx: RenderContext) -> dict[str, str | None]:
    """The launch command's options, as a flag -> value map (None: a flag without value)."""
    words = [arg.text for group in step.launch(ctx).groups[1:] for arg in group]
    out: dict[str, str | None] = {}
    for i, word in enumerate(words):
        if word.startswith("--"):
            nxt = words[i + 1] if i + 1 < len(words) else None
            out[word] = None if nxt is None or nxt.startswith("--") else nxt
    return out


# ----------------------------------------------------------------------------- choices


def test_sm120_never_gets_trtllm_mla_and_every_choice_says_where_it_came_from() -> None:
    """The seeds' box: 8x RTX PRO 6000 (SM120), where trtllm_mla stops SGLang with "Unsupported architecture"."""
    step = dflash()
    ctx = Facts(probe=probe_facts("sm120"), inspect=inspect_facts(block=8))
    assert flags(step, ctx) == {
        "--model-path": "$models_dir/Kimi-K2.6",
        "--speculative-algorithm": "DFLASH",
        "--speculative-draft-model-path": "$models_dir/Kimi-K2.6-DFlash",
        "--speculative-num-draft-tokens": "8",
        "--tp-size": "8",
        "--attention-backend": "flashinfer",
        "--speculative-draft-attention-backend": "flashinfer",
        "--trust-remote-code": None,
        "--enable-metrics": None,  # /metrics: each eval and benchmark run's exact acceptance (server_metrics.py)
        "--host": "127.0.0.1",
        "--port": "30000",
    }
    assert "--enable-metrics" not in flags(dflash(metrics=False), ctx)
    choices = step.choices(ctx)
    assert choices["tp_size"].source == "steps.probe.facts.gpu_count = 8"
    assert "steps.probe.facts.gpu_arch = sm120" in choices["attention_backend"].source
    assert "mla_backends_usable_on_gpu = ['triton', 'flashinfer']" in choices["attention_backend"].source
    assert choices["speculative_num_draft_tokens"].source.startswith("steps.inspect.facts.deploy.")
    assert choices["trust_remote_code"].value is True and "auto_map" in choices["trust_remote_code"].source
    assert choices["speculative_algorithm"].source == "default with a draft_model_path"


@pytest.mark.parametrize(
    ("arch", "attention", "draft"),
    [("sm90", "fa3", "fa3"), ("sm100", "trtllm_mla", "fa4"), ("sm120", "flashinfer", "flashinfer")],
)
def test_attention_backends_follow_the_gpu_architecture(arch: str, attention: str, draft: str) -> None:
    chosen = flags(dflash(), Facts(probe=probe_facts(arch), inspect=inspect_facts()))
    assert (chosen["--attention-backend"], chosen["--speculative-draft-attention-backend"]) == (attention, draft)


def test_a_target_without_mla_gets_fa3_on_hopper_and_flashinfer_elsewhere() -> None:
    for arch, backend in (("sm90", "fa3"), ("sm120", "flashinfer"), ("sm100", "flashinfer")):
        step = dflash()
        ctx = Facts(probe=probe_facts(arch), inspect=inspect_facts(attention="MHA"))
        assert flags(step, ctx)["--attention-backend"] == backend
        assert step.choices(ctx)["attention_backend"].source.startswith("MHA target on steps.probe.facts.gpu_arch")


def test_every_choice_is_overridable_in_the_runbook() -> None:
    step = dflash(
        tp_size=4,
        attention_backend="triton",
        draft_attention_backend="fa3",
        speculative_num_draft_tokens=16,
        trust_remote_code=False,
        mem_fraction_static=0.85,
        speculative_algorithm="DFLASH",
        bind="0.0.0.0",
        port=31000,
        extra_args=["--reasoning-parser", "kimi_k2"],
        metrics=False,
    )
    ctx = Facts(probe=probe_facts("sm120"), inspect=inspect_facts(block=8))
    chosen = flags(step, ctx)
    assert "--enable-metrics" not in chosen
    assert chosen["--tp-size"] == "4" and chosen["--attention-backend"] == "triton"
    assert chosen["--speculative-draft-attention-backend"] == "fa3" and chosen["--speculative-num-draft-tokens"] == "16"
    assert "--trust-remote-code" not in chosen and chosen["--mem-fraction-static"] == "0.85"
    assert (chosen["--host"], chosen["--port"], chosen["--reasoning-parser"]) == ("0.0.0.0", "31000", "kimi_k2")
    assert {c.source for name, c in step.choices(ctx).items() if name != "extra_args"} == {"runbook"}


def test_a_baseline_has_no_speculative_flags() -> None:
    step = DeployStep.model_validate(
        {"id": "base", "kind": "deploy", "model_path": "/m/Kimi-K2.6", "probe": "probe", "inspect": "inspect"}
    )
    chosen = flags(step, Facts(probe=probe_facts("sm90"), inspect=inspect_facts()))
    assert not [f for f in chosen if f.startswith("--speculative")]
    assert chosen["--attention-backend"] == "fa3" and chosen["--tp-size"] == "8" and step.algorithm is None


def test_without_inspect_sglang_reads_the_block_size_and_custom_code_stays_off() -> None:
    step = dflash(inspect=None)
    choices = step.choices(Facts(probe=probe_facts("sm120")))
    assert choices["speculative_num_draft_tokens"].value is None
    assert "SGLang reads block_size from the drafter's config.json" in choices["speculative_num_draft_tokens"].source
    assert choices["trust_remote_code"].value is False
    unknown = dflash().choices(Facts(probe=probe_facts("sm120"), inspect=inspect_facts(block=None)))
    assert unknown["speculative_num_draft_tokens"].value is None
    assert "config.json has no block_size" in unknown["speculative_num_draft_tokens"].source


def test_facts_that_cannot_choose_fail_with_the_reason() -> None:
    with pytest.raises(FactsError, match=r"GPU architecture is unknown \(the GPUs' compute capabilities differ"):
        dflash().launch(Facts(probe=probe_facts(None), inspect=inspect_facts()))
    with pytest.raises(FactsError, match="the probe found no GPUs \\(nvidia-smi not found on PATH\\)"):
        dflash().launch(Facts(probe=probe_facts("sm90", count=0), inspect=inspect_facts()))
    facts = probe_facts("sm120") | {"mla_backends_usable_on_gpu": []}
    with pytest.raises(FactsError, match="no MLA attention backend of this SGLang runs on sm120"):
        dflash().launch(Facts(probe=facts, inspect=inspect_facts()))
    with pytest.raises(FactsError, match="step 'probe' has no fact `gpu_count`"):
        dflash().launch(Facts(probe={}, inspect=inspect_facts()))


def test_parameters_are_checked() -> None:
    problems: dict[str, dict[str, Any]] = {
        "needs draft_model_path": {"draft_model_path": None, "speculative_algorithm": "DFLASH"},
        # SGLang reads the name in any case: lower case must meet DFLASH's checks, not slip past them
        "speculative_algorithm DFLASH needs draft_model_path": {
            "draft_model_path": None,
            "speculative_algorithm": "dflash",
        },
        "tp_size: auto takes the GPU count from a probe step": {"probe": None},
        "SGLang rejects it for the draft": {"draft_attention_backend": "trtllm_mha"},
        "extra_args: --tp abbreviates --tp-size, which this step renders from `tp_size`; --port is rendered by this "
        "step from `port`: use its parameters": {"extra_args": ["--tp", "2", "--port=1"]},
        "model_path\n  Input should be a valid string": {"model_path": None},
        "not a variable name": {"env": {"A B": "1"}},
        "speculative_algorithm is empty": {"speculative_algorithm": " "},
    }
    for message, params in problems.items():
        with pytest.raises(ValidationError, match=message):
            dflash(**params)
    stop = StopServerStep.model_validate({"id": "stop", "kind": "stop_server", "port": 30001})
    assert stop.default_gates()[0].message == "the SGLang server did not stop"
    assert dflash().needs() == {"probe", "inspect"}


def test_plan_marks_what_is_chosen_at_run_time() -> None:
    launch = dflash().launch(PlanContext("box", {}))
    comment = launch.comment()
    assert "#       --tp-size <known at run time: steps.probe.facts.gpu_count> \\\n" in comment
    assert "--attention-backend <known at run time: by steps.probe.facts.gpu_arch" in comment
    assert "<known at run time: --trust-remote-code if steps.inspect.facts.deploy.trust_remote_code>" in comment
    assert (
        "#   ~/venv/bin/python -m sglang.launch_server \\\n#       --model-path $models_dir/Kimi-K2.6 \\\n" in comment
    )


def test_a_fact_that_reads_like_the_plan_s_mark_is_a_value_at_run_time() -> None:
    """Only the plan's `RunTime` is unknown: a host may print any text as a fact, even the plan's mark (on main
    the prefix `<known at run time` made such a fact "not known yet" and the launch command carried the mark)."""
    mark = "<known at run time: steps.probe.facts.gpu_arch>"
    probe = probe_facts("sm90") | {"gpu_arch": mark}
    choices = dflash().choices(Facts(probe=probe, inspect=inspect_facts(attention="MHA")))
    assert not [name for name, choice in choices.items() if isinstance(choice, RunTime)]
    backend = choices["attention_backend"]
    assert isinstance(backend, Choice) and backend.value == "flashinfer"  # the default for an arch not listed
    assert f"steps.probe.facts.gpu_arch = {mark}" in backend.source
    planned = dflash().choices(PlanContext("box", {}))
    assert planned["tp_size"] == RunTime("steps.probe.facts.gpu_count")
    assert isinstance(planned["attention_backend"], RunTime)  # derived from an unknown: unknown, naming its source
    assert planned["attention_backend"].source.startswith("by steps.probe.facts.gpu_arch")


def test_runbook_plan_shows_the_launch_command(tmp_path: Path, write_runbook: Any, capsys: Any) -> None:
    path = write_runbook("""\
        name: plan
        __HOSTS__
        vars:
          models_dir: /models
        steps:
          - id: probe
            kind: probe
          - id: inspect
            kind: inspect_config
            target_dir: $models_dir/Kimi-K2.6
          - id: deploy_dflash
            kind: deploy
            python: ~/venv/bin/python
            model_path: $models_dir/Kimi-K2.6
            draft_model_path: $models_dir/Kimi-K2.6-DFlash
            probe: probe
            inspect: inspect
            env: {SGLANG_ENABLE_SPEC_V2: "1"}
          - id: stop
            kind: stop_server
        """)
    assert main(["plan", "--full", str(path)]) == 0
    out = capsys.readouterr().out
    assert "# start or reuse the SGLang server on port 30000; '<known at run time: ...>' marks values" in out
    assert "#       --speculative-algorithm DFLASH \\\n" in out
    assert "#   tp_size: <known at run time: steps.probe.facts.gpu_count>\n" in out
    launch = '"launch": [["~/venv/bin/python", true], ["-m", false], ["sglang.launch_server", false], '
    launch += '["--model-path", false], ["$models_dir/Kimi-K2.6", true], ["--speculative-algorithm", false], '
    assert launch in out and '["<known at run time: steps.probe.facts.gpu_count>", false]' in out
    assert '"${HOME:?is not set}"/venv/bin/python "$prog/program.pyz" "$prog/config.json"\n' in out
    assert '"SGLANG_ENABLE_SPEC_V2": "1"' in out
    assert "# stop the server on port 30000" in out and "#   gate: facts.failure is none" in out


# ----------------------------------------------------------------------------- host program parts


def test_error_line_is_the_exception_not_the_parent_s_last_words() -> None:
    log = [
        "[2026-05-01 10:00:01] server_args=ServerArgs(model_path='/m', attention_backend='trtllm_mla')",
        "[2026-05-01 10:00:04 TP0] Scheduler hit an exception: Traceback (most recent call last):",
        '  File "/venv/sglang/srt/layers/attention/trtllm_mla_backend.py", line 88, in __init__',
        "RuntimeError: Unsupported architecture: trtllm_mla needs SM100 or SM103, this GPU is SM120",
        "[2026-05-01 10:00:04] Received sigquit from a child process. It usually means the child failed.",
    ]
    assert deploy_host.error_line(log) == log[3]
    assert deploy_host.error_line(["loading", "CUDA out of memory. Tried to allocate 2.00 GiB", "bye"]) == (
        "CUDA out of memory. Tried to allocate 2.00 GiB"
    )
    assert deploy_host.error_line(["all", "fine"]) is None


@given(st.text(alphabet=st.characters(blacklist_characters="\0\n"), max_size=15))
def test_proc_stat_fields_follow_the_last_parenthesis(name: str) -> None:
    text = f"4242 ({name}) S 1 4242 4242 0 -1 4194560 1 0 0 0 0 0 0 0 20 0 1 0 987654 1000 10 18446744073709551615\n"
    assert deploy_host.parse_stat(text) == {"state": "S", "pgrp": 4242, "starttime": 987654}


@pytest.mark.parametrize(
    ("body", "why"),
    [
        ("[" * 100_000 + "]" * 100_000, "no JSON object"),  # nested past the parser's depth: a RecursionError
        ('{"version": ' + "9" * 400 + "}", "no version"),
        ("[1]", "no JSON object"),
    ],
)
def test_a_server_info_of_any_shape_is_an_unknown_version_with_its_reason(
    body: str, why: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(deploy_host, "http", lambda *args, **kwargs: (200, body))
    version, reason = deploy_host.server_version("http://127.0.0.1:30000")
    assert version is None and reason is not None and why in reason


def test_client_address_for_a_bind_address() -> None:
    assert [deploy_host.base_url(b, 30000) for b in ("127.0.0.1", "0.0.0.0", "::", "192.0.2.5", "fe80::1")] == [
        "http://127.0.0.1:30000",
        "http://127.0.0.1:30000",
        "http://[::1]:30000",
        "http://192.0.2.5:30000",
        "http://[fe80::1]:30000",
    ]


def test_a_foreign_listener_is_found_and_named() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        assert not deploy_host.port_free("127.0.0.1", port)
        assert not deploy_host.port_free("0.0.0.0", port)
        assert deploy_host.port_holder(port).startswith(f"pid {os.getpid()} (")
    assert deploy_host.port_free("127.0.0.1", port)


def test_stopping_a_group_ends_its_children_too_and_kills_what_ignores_term() -> None:
    """A server's workers (its process group) hold GPU memory too: all must be gone."""
    script = "trap '' TERM; sleep 60 & sleep 60 & wait"
    proc = subprocess.Popen(["bash", "-c", script], start_new_session=True)
    try:
        deadline = time.monotonic() + 5
        while len(deploy_host.group_members(proc.pid)) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        members, stat = deploy_host.group_members(proc.pid), deploy_host.proc_stat(proc.pid)
        assert len(members) == 3 and stat is not None and deploy_host.alive(proc.pid, stat["starttime"])
        stopped = deploy_host.stop_group(proc.pid, timeout=0.5, child=proc)
        assert stopped == {"pids": members, "killed": True, "left": [], "gpu_freed": True}
        assert proc.returncode == -signal.SIGKILL
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_a_reused_pid_is_not_our_server() -> None:
    stat = deploy_host.proc_stat(os.getpid())
    assert stat is not None
    assert deploy_host.alive(os.getpid(), stat["starttime"])
    assert not deploy_host.alive(os.getpid(), stat["starttime"] + 1)


def test_stop_without_a_recorded_server_is_a_no_op(tmp_path: Path) -> None:
    report = deploy_host.run({"action": "stop", "port": 30999, "stop_timeout": 1, "state_dir": str(tmp_path)})
    assert report["stopped"] is False and report["failure"] is None
    assert report["note"] == "no server recorded on port 30999: nothing to stop"


def test_the_host_program_runs_with_the_stdlib_only(tmp_path: Path) -> None:
    """It runs with the SGLang venv's python, which has nothing of ours: `-I -S` sees no site-packages."""
    (tmp_path / "deploy.pyz").write_bytes(bundle("deploy"))
    config = {"action": "stop", "port": 30998, "stop_timeout": 1, "state_dir": "$state"}
    (tmp_path / "config.json").write_text(json.dumps(config))
    done = subprocess.run(
        [sys.executable, "-I", "-S", str(tmp_path / "deploy.pyz"), str(tmp_path / "config.json")],
        env={"state": str(tmp_path / "state")},
        capture_output=True,
        text=True,
        check=True,
    )
    assert json.loads(done.stdout.splitlines()[-1])["note"].startswith("no server recorded on port 30998")


# ----------------------------------------------------------------------------- whole deployments on the test host


class Site:
    """One test's deployments on a test host: a port of its own, model folders, the stand-in's switches.

    `stop_all()` (the fixture's teardown) kills whatever server is recorded on the port, so no test leaves
    a server running, whatever it asserted."""

    def __init__(self, host: Any, tmp_path: Path, write_runbook: Any, capsys: Any) -> None:
        self.host, self.tmp_path, self.write_runbook, self.capsys = host, tmp_path, write_runbook, capsys
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        self.models = host.home / f"models-deploy-{self.port}"
        self.state_file = host.home / ".runbook" / "sglang" / f"{self.port}.json"
        self.runs = 0
        self.progress: list[str] = []
        for name, config in (("Kimi-K2.6", target_config()), ("Kimi-K2.6-DFlash", drafter_config())):
            folder = self.models / name
            folder.mkdir(parents=True)
            (folder / "config.json").write_text(json.dumps(config))
            for code in custom_code_files(config):
                (folder / code).write_text("# custom code (test data)\n")

    def switches(self, **values: Any) -> None:
        (self.host.home / "sglang-standin.json").write_text(json.dumps(values))

    def deploy(self, **params: Any) -> dict[str, Any]:
        step = {"id": "deploy", "kind": "deploy", "python": str(self.host.python), "port": self.port}
        return step | {"model_path": "$models_dir/Kimi-K2.6", "ready_timeout": 60, "stop_timeout": 10} | params

    def run(self, *steps: dict[str, Any]) -> tuple[int, dict[str, Any], str]:
        """Run a runbook of these steps: (exit code, facts by step id, the failures' messages); the progress
        messages of the run are in `.progress`."""
        self.runs += 1
        doc = {"vars": {"models_dir": str(self.models)}, "steps": list(steps)}
        path = self.write_runbook(
            "name: deploy\n__HOSTS__\n" + yaml.safe_dump(doc),
            name=f"deploy{self.runs}.yaml",
            hosts=self.host.host_yaml(),
        )
        logs = self.tmp_path / f"logs{self.runs}"
        code = main(["run", str(path), "--log-dir", str(logs), "--json"])
        events = [json.loads(line) for line in self.capsys.readouterr().out.splitlines() if line.startswith("{")]
        self.progress = [e["message"] for e in events if e["event"] == "progress"]
        failures = "\n".join(f for e in events if e["event"] == "step_finished" for f in e["failures"])
        assert main(["status", "--log-dir", str(logs), "--json"]) == 0
        records = json.loads(self.capsys.readouterr().out)["steps"]
        return code, {r["step"]: r["facts"] for r in records}, failures

    def stop_all(self) -> None:
        with contextlib.suppress(OSError, ValueError, KeyError):
            os.killpg(json.loads(self.state_file.read_text())["pgid"], signal.SIGKILL)
        self.state_file.unlink(missing_ok=True)
        (self.host.home / "sglang-standin.json").unlink(missing_ok=True)
        shutil.rmtree(self.models, ignore_errors=True)


@pytest.fixture
def site(
    request: pytest.FixtureRequest, testhost: Any, tmp_path: Path, write_runbook: Any, capsys: Any
) -> Iterator[Site]:
    """`@pytest.mark.parametrize("site", ["rtx6000"], indirect=True)` picks the GPU variant (default h200)."""
    here = Site(testhost(getattr(request, "param", "h200")), tmp_path, write_runbook, capsys)
    yield here
    here.stop_all()


def running(pid: int) -> bool:
    return deploy_host.alive(pid, None)


def post_generate(base_url: str) -> dict[str, Any]:
    body = json.dumps({"text": "What is 12 * 7?", "sampling_params": {"max_new_tokens": 16, "temperature": 0}})
    request = urllib.request.Request(base_url + "/generate", data=body.encode(), method="POST")
    with urllib.request.urlopen(request, timeout=30) as answer:
        result: dict[str, Any] = json.loads(answer.read())
    return result


PROBE = {"id": "probe", "kind": "probe", "models_dir": "$models_dir", "packages": ["sglang"]}
INSPECT = {"id": "inspect", "kind": "inspect_config", "target_dir": "$models_dir/Kimi-K2.6"}
INSPECT["drafter_dir"] = "$models_dir/Kimi-K2.6-DFlash"


@pytest.mark.parametrize("site", ["rtx6000"], indirect=True)
def test_dflash_from_facts_serves_is_reused_replaced_by_a_baseline_and_stopped(site: Site) -> None:
    probe = PROBE | {"python": str(site.host.python)}
    dflash_step = site.deploy(draft_model_path="$models_dir/Kimi-K2.6-DFlash", probe="probe", inspect="inspect")
    code, facts, err = site.run(probe, INSPECT | {"python": str(site.host.python)}, dflash_step)
    assert code == 0, err
    first = facts["deploy"]
    choices = {name: c["value"] for name, c in first["choices"].items()}
    assert choices == {
        "speculative_algorithm": "DFLASH",
        "tp_size": 8,  # the RTX PRO 6000 box has 8 GPUs
        "attention_backend": "flashinfer",  # SM120: never trtllm_mla
        "draft_attention_backend": "flashinfer",
        "speculative_num_draft_tokens": BLOCK_SIZE,
        "trust_remote_code": True,
        "mem_fraction_static": None,
        "metrics": True,  # --enable-metrics by default
    }
    models = str(site.models)
    assert first["argv"][1:] == [
        "-m", "sglang.launch_server", "--model-path", f"{models}/Kimi-K2.6", "--speculative-algorithm", "DFLASH",
        "--speculative-draft-model-path", f"{models}/Kimi-K2.6-DFlash", "--speculative-num-draft-tokens",
        str(BLOCK_SIZE), "--tp-size", "8", "--attention-backend", "flashinfer",
        "--speculative-draft-attention-backend", "flashinfer", "--trust-remote-code", "--enable-metrics",
        "--host", "127.0.0.1", "--port", str(site.port),
    ]  # fmt: skip
    assert first["base_url"] == f"http://127.0.0.1:{site.port}" and first["reused"] is False
    assert first["speculative_algorithm"] == "DFLASH" and first["model_path"] == f"{models}/Kimi-K2.6"
    assert first["ready"] and first["ready_s"] > 0 and first["failure"] is None
    # what /server_info says it runs, for the report's provenance
    assert (first["server_version"], first["server_version_unknown"]) == (STANDIN_VERSION, None)
    # the server outlived the SSH session that started it, and serves with speculative decoding
    assert running(first["pid"]) and json.loads(site.state_file.read_text())["pid"] == first["pid"]
    assert "spec_accept_length" in post_generate(first["base_url"])["meta_info"]
    assert Path(first["log_file"]).is_file() and first["log_file"].startswith(str(site.host.home / ".runbook"))
    assert site.progress[0] == f"started the server: pid {first['pid']}, log {first['log_file']}"
    assert site.progress[-1].startswith("ready after ") and site.progress[-1].endswith(first["base_url"])

    code, facts, err = site.run(probe, INSPECT | {"python": str(site.host.python)}, dflash_step)
    assert code == 0, err
    again = facts["deploy"]
    assert again["reused"] is True and again["pid"] == first["pid"] and again["argv"] == first["argv"]
    assert again["server_version"] == STANDIN_VERSION
    assert site.progress[0].startswith(f"a server with these arguments runs already (pid {first['pid']})")

    baseline = site.deploy(id="deploy_baseline", probe="probe", inspect="inspect")
    code, facts, err = site.run(probe, INSPECT | {"python": str(site.host.python)}, baseline)
    assert code == 0, err
    base = facts["deploy_baseline"]
    assert base["previous"]["action"] == "stopped" and base["previous"]["pid"] == first["pid"]
    assert base["previous"]["reason"] == "its arguments differ" and base["previous"]["gpu_freed"] is True
    assert not running(first["pid"]) and base["pid"] != first["pid"] and not base["reused"]
    assert base["speculative_algorithm"] is None and not [a for a in base["argv"] if a.startswith("--speculative")]
    assert "spec_accept_length" not in post_generate(base["base_url"])["meta_info"]

    code, facts, err = site.run({"id": "stop", "kind": "stop_server", "port": site.port})
    assert code == 0, err
    stopped = facts["stop"]
    assert (
        stopped["stopped"] and stopped["gpu_freed"] and stopped["pid"] == base["pid"] and base["pid"] in stopped["pids"]
    )
    assert not running(base["pid"]) and not site.state_file.exists()
    code, facts, err = site.run({"id": "stop", "kind": "stop_server", "port": site.port})
    assert code == 0 and facts["stop"]["stopped"] is False
    assert facts["stop"]["note"] == f"no server recorded on port {site.port}: nothing to stop"


@pytest.mark.parametrize("site", ["rtx6000"], indirect=True)
def test_trtllm_mla_on_sm120_fails_at_once_with_the_log_s_error_line(site: Site) -> None:
    started = time.monotonic()
    code, facts, err = site.run(site.deploy(tp_size=8, attention_backend="trtllm_mla", ready_timeout=300))
    assert code != 0 and time.monotonic() - started < 60  # not after the 300s ready_timeout
    failed = facts["deploy"]
    assert "Unsupported architecture" in failed["error_line"] and failed["error_line"].startswith("RuntimeError:")
    assert "the server exited (killed by SIGKILL) during start-up" in failed["failure"]
    assert "the SGLang server is not serving" in err and "Unsupported architecture SM120" in err  # the gate message
    assert any("Scheduler hit an exception" in line for line in failed["log_tail"])
    assert not running(failed["pid"]) and not site.state_file.exists()


def test_a_crash_at_start_up_fails_at_once_with_its_log_line(site: Site) -> None:
    site.switches(fault="crash_at_startup")
    code, facts, err = site.run(site.deploy(tp_size=1, ready_timeout=300))
    assert code != 0
    failed = facts["deploy"]
    assert failed["error_line"].startswith("torch.OutOfMemoryError: CUDA out of memory.")
    assert failed["server_version"] is None and failed["server_version_unknown"] == "the server did not become ready"
    assert "torch.OutOfMemoryError: CUDA out of memory." in err
    assert not running(failed["pid"]) and not site.state_file.exists()


def test_a_server_never_healthy_times_out_and_is_stopped(site: Site) -> None:
    site.switches(fault="never_healthy", startup_s=0.4)
    started = time.monotonic()
    code, facts, err = site.run(site.deploy(tp_size=1, ready_timeout=4))
    assert code != 0 and time.monotonic() - started < 30
    failed = facts["deploy"]
    assert failed["failure"].startswith("the server was not ready after 4s: /health answered 503")
    assert failed["stopped"]["gpu_freed"] and not running(failed["pid"]) and not site.state_file.exists()
    assert "the server was not ready after 4s" in err


def test_a_port_taken_by_something_else_is_refused_naming_it(site: Site) -> None:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", site.port))
        sock.listen()
        code, facts, err = site.run(site.deploy(tp_size=1))
    assert code != 0
    refused = facts["deploy"]
    assert refused["pid"] is None and refused["port_holder"].startswith(f"pid {os.getpid()} (")
    assert f"port {site.port} is taken by pid {os.getpid()}" in refused["failure"]
    assert "which is not a server this runbook started" in err and not site.state_file.exists()


def test_a_new_environment_restarts_the_server(site: Site) -> None:
    code, facts, err = site.run(site.deploy(tp_size=1))
    assert code == 0, err
    first = facts["deploy"]
    code, facts, err = site.run(site.deploy(tp_size=1, env={"SGLANG_ENABLE_SPEC_V2": "1"}))
    assert code == 0, err
    second = facts["deploy"]
    assert second["previous"]["reason"] == "its environment differs" and second["pid"] != first["pid"]
    assert not running(first["pid"]) and second["env"] == {"SGLANG_ENABLE_SPEC_V2": "1"}
    environ = Path(f"/proc/{second['pid']}/environ").read_bytes().split(b"\0")
    assert b"SGLANG_ENABLE_SPEC_V2=1" in environ


def test_deploy_s_former_action_stop_names_the_stop_server_kind(tmp_path: Path, capsys: Any) -> None:
    """`action: stop` was deploy's second kind; a runbook that still says it is told what to write instead."""
    path = tmp_path / "old.yaml"
    path.write_text(
        "name: old\nhosts:\n  box: {address: local}\nsteps:\n"
        "  - id: stop\n    kind: deploy\n    model_path: /m\n    tp_size: 1\n    action: stop\n"
    )
    assert main(["validate", str(path)]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"{path}:9:5: unknown key 'action': deploy only starts a server; to stop one, use a step of "
        "`kind: stop_server` (same port)"
    ]


def test_a_stop_gets_only_the_vars_it_names() -> None:
    """Stopping starts no server, so unlike `deploy` (whose server inherits everything) a stop_server step
    receives no var or secret it does not name: no HF_TOKEN for a kill (deploy's `action: stop` got them all)."""
    stop = StopServerStep.model_validate({"id": "stop", "kind": "stop_server", "port": "$sglang_port"})
    assert stop.env_names(["HF_TOKEN", "models_dir", "sglang_port"]) == ["sglang_port"]
    assert dflash().env_names(["HF_TOKEN", "models_dir"]) == ["HF_TOKEN", "models_dir"]


def test_the_port_may_come_from_a_runbook_var() -> None:
    step = dflash(port="$sglang_port")
    assert "--port 31234" in step.launch(PlanContext("box", {"sglang_port": "31234"})).comment().replace(" \\\n#", "")
    stop = StopServerStep.model_validate({"id": "stop", "kind": "stop_server", "port": "${sglang_port}"})
    assert '"port": 31234' in stop.render(PlanContext("box", {"sglang_port": "31234"}))
    for value, message in (("web", "sglang_port = 'web' does not fit"), ("70000", "70000 is not a TCP port")):
        with pytest.raises(FactsError, match=message):
            stop.render(PlanContext("box", {"sglang_port": value}))
    with pytest.raises(ValidationError):
        dflash(port="30000; rm -rf /")


def test_the_ready_timeout_may_come_from_a_runbook_var() -> None:
    step = dflash(ready_timeout="$ready")
    facts = Facts(probe=probe_facts("sm90"), inspect=inspect_facts())
    facts.vars = {"ready": "90s"}
    assert '"ready_timeout": 90.0' in step.render(facts)
    facts.vars = {"ready": "soon"}
    with pytest.raises(FactsError, match="ready_timeout: runbook var ready = 'soon' does not fit: expected a duration"):
        step.render(facts)


def test_a_bind_address_the_host_does_not_have_is_a_clear_failure() -> None:
    with pytest.raises(deploy_host.BindError, match=r"cannot listen on 192\.0\.2\.5:\d+ on this host: "):
        deploy_host.port_free("192.0.2.5", 30000)  # TEST-NET-1: never this machine's


@pytest.mark.parametrize(
    "change",
    [
        {"pgid": 0},  # os.killpg(0, ...) would signal the deploy program's own group: the step's shell
        {"pgid": 1},
        {"pgid": "7"},
        {"pgid": None},
        {"starttime": "soon"},
        {"log_file": 3},
    ],
)
def test_a_state_file_the_program_did_not_write_is_no_server_of_ours(change: dict[str, Any], tmp_path: Path) -> None:
    """deploy writes `pgid` = `pid` (the server leads its own session): a file saying otherwise, or missing
    a field the stop and the readiness wait read, is not trusted (no signal to a group it names)."""
    state = {"pid": 4242, "pgid": 4242, "starttime": 99, "log_file": "/x.log", "port": 30000}
    (tmp_path / "30000.json").write_text(json.dumps(state))
    assert deploy_host.read_state(str(tmp_path), 30000) == state
    (tmp_path / "30000.json").write_text(json.dumps(state | change))
    assert deploy_host.read_state(str(tmp_path), 30000) is None


# ----------------------------------------------------------------------------- DDTREE and start-up memory


def test_the_ddtree_budget_renders_its_flag_and_needs_ddtree() -> None:
    step = dflash(speculative_algorithm="DDTREE", speculative_ddtree_budget=32, speculative_num_draft_tokens=8)
    rendered = flags(step, PlanContext("box", {}))
    assert rendered["--speculative-algorithm"] == "DDTREE" and rendered["--speculative-ddtree-budget"] == "32"
    assert "--speculative-ddtree-budget" not in flags(dflash(), PlanContext("box", {}))
    # a choice like the others, so the facts (and the campaign report's budget column) carry it
    budget = step.choices(PlanContext("box", {}))["speculative_ddtree_budget"]
    assert isinstance(budget, Choice) and (budget.value, budget.source) == (32, "runbook")
    assert "speculative_ddtree_budget" not in dflash().choices(PlanContext("box", {}))
    for params in ({"speculative_ddtree_budget": 16}, {"speculative_ddtree_budget": 16, "draft_model_path": None}):
        with pytest.raises(ValueError, match="speculative_ddtree_budget is DDTREE's tree budget"):
            dflash(**params)
    with pytest.raises(ValueError, match="greater than 0"):
        dflash(speculative_algorithm="DDTREE", speculative_ddtree_budget=0)
    with pytest.raises(ValueError, match="extra_args: --speculative-ddtree-budget is rendered"):
        dflash(extra_args=["--speculative-ddtree-budget", "16"])


@pytest.mark.parametrize("site", ["h100"], indirect=True)
def test_a_model_too_big_for_the_gpus_memory_fails_at_start_up_with_sglangs_line(site: Site) -> None:
    """Kimi-K2.6's ~595 GB over 8x H100 80 GB: the weights fit, the KV cache does not (SGLang's MemoryPoolConfig)."""
    oversized_copy(site.models / "Kimi-K2.6", site.models / "Kimi-K2.6-full", 595 * 10**9)
    code, facts, err = site.run(site.deploy(model_path="$models_dir/Kimi-K2.6-full", tp_size=8, ready_timeout=300))
    assert code != 0
    failed = facts["deploy"]
    assert failed["error_line"] == (
        "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. "
        "Current value: mem_fraction_static=0.88"
    )
    assert "the server exited (killed by SIGKILL) during start-up" in failed["failure"]
    assert "Not enough memory" in err and not running(failed["pid"]) and not site.state_file.exists()
    # on 4 GPUs the weights alone overflow one GPU: torch's CUDA out-of-memory while loading them
    code, facts, _ = site.run(site.deploy(model_path="$models_dir/Kimi-K2.6-full", tp_size=4, ready_timeout=300))
    assert code != 0 and facts["deploy"]["error_line"].startswith("torch.OutOfMemoryError: CUDA out of memory.")
