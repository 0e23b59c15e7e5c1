"""A campaign compares like with like (steps/campaign_parity.py): `validate` refuses a campaign whose baseline is
deployed unlike its cells beyond the speculative flags, unless the report lists the flags in
`baseline_may_differ`, and `runbook plan` says the parity. On the flagship sweep, in-process."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path
from typing import Any

import pytest
import yaml

from executor.faces.cli import main

SWEEP = Path(__file__).resolve().parents[2] / "runbooks" / "k26_dflash_sweep.yaml"


def sweep(tmp_path: Path, baseline: dict[str, Any] | None = None, cell: dict[str, Any] | None = None,
          **report: Any) -> Path:  # fmt: skip
    """The flagship sweep with parameters of its baseline deploy, of its cells' deploy and of its report changed
    (None as a value: the parameter removed)."""
    data = yaml.safe_load(SWEEP.read_text())
    steps = {step.get("id") or step["group"]: step for step in data["steps"]}
    deploys = {
        "baseline": steps["deploy_baseline"],
        "cell": next(s for s in steps["sweep"]["steps"] if s["id"] == "deploy_dflash"),
    }
    for name, changes in (("baseline", baseline), ("cell", cell), ("report", report)):
        target = steps["report"] if name == "report" else deploys[name]
        for key, value in (changes or {}).items():
            target.pop(key) if value is None else target.__setitem__(key, value)
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def cli(*args: str) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(args))
    return code, out.getvalue() + err.getvalue()


def test_the_sweep_s_old_baseline_is_refused_naming_each_flag_and_why(tmp_path: Path) -> None:
    """The baseline of before: no inspect step, so another attention backend and no --trust-remote-code."""
    code, said = cli("validate", str(sweep(tmp_path, baseline={"inspect": None})))
    assert code == 2
    assert (
        "step 'report': the baseline's deploy deploy_baseline and those of deploy_dflash differ beyond the "
        "speculative flags in --attention-backend (baseline `auto: the GPU architecture of steps.probe, no inspect "
        "step (the target's attention unread)`, cells `auto: the GPU architecture of steps.probe, the attention of "
        "$models_dir/Kimi-K2.6`); --trust-remote-code (baseline `off: no inspect step`, cells `auto: custom code of "
        "$models_dir/Kimi-K2.6`): launch the baseline as the cells"
    ) in said
    assert said.startswith(f"{tmp_path / 'sweep.yaml'}:")  # FILE:LINE:COL
    allowed = ["--attention-backend", "--trust-remote-code"]
    path = sweep(tmp_path, baseline={"inspect": None}, baseline_may_differ=allowed)
    assert cli("validate", str(path))[0] == 0
    code, plan = cli("plan", str(path))
    assert code == 0 and "baseline parity: deploy_baseline and deploy_dflash (12 deploys): differ in" in plan
    assert "(allowed by baseline_may_differ)" in plan


def test_the_sweep_s_plan_shows_the_parity(tmp_path: Path) -> None:
    code, plan = cli("plan", str(SWEEP))
    assert code == 0
    assert (
        "baseline parity: deploy_baseline and deploy_dflash (12 deploys): the same flags but the speculative ones "
        "(checked again on each launch's argv)"
    ) in plan


@pytest.mark.parametrize(
    ("cell", "flag"),
    [
        ({"mem_fraction_static": 0.8}, "--mem-fraction-static"),
        ({"tp_size": 4}, "--tp-size"),
        ({"attention_backend": "triton"}, "--attention-backend"),
        ({"trust_remote_code": False}, "--trust-remote-code"),
        ({"extra_args": ["--reasoning-parser", "kimi_k2"]}, "--tool-call-parser"),
        ({"extra_args": ["--reasoning-parser", "kimi_k2", "--tool-call-parser", "kimi_k2", "--context-length", "8192"]},
         "--context-length"),
        ({"model_path": "$models_dir/Kimi-K2.5"}, "--model-path"),
        ({"env": {"SGLANG_ENABLE_TORCH_COMPILE": "1"}}, "env:SGLANG_ENABLE_TORCH_COMPILE"),  # SGLang reads it
        ({"python": "/root/venv_other/bin/python"}, "python"),  # another SGLang install
    ],
)  # fmt: skip
def test_any_non_speculative_difference_is_refused_and_allowed_only_by_name(
    tmp_path: Path, cell: dict[str, Any], flag: str
) -> None:
    code, said = cli("validate", str(sweep(tmp_path, cell=cell)))
    assert code == 2 and f"differ beyond the speculative flags in {flag} (" in said
    assert cli("validate", str(sweep(tmp_path, cell=cell, baseline_may_differ=[flag])))[0] == 0


def test_speculative_and_addressing_differences_are_the_comparison(tmp_path: Path) -> None:
    cell = {"draft_attention_backend": "fa3", "port": 30001, "bind": "0.0.0.0",
            "extra_args": ["--reasoning-parser", "kimi_k2", "--tool-call-parser", "kimi_k2",
                           "--speculative-draft-window-size", "512"]}  # fmt: skip
    assert cli("validate", str(sweep(tmp_path, cell=cell))) == (0, cli("validate", str(sweep(tmp_path)))[1])


def test_baseline_may_differ_takes_flags_an_alias_as_its_flag(tmp_path: Path) -> None:
    code, said = cli("validate", str(sweep(tmp_path, baseline_may_differ=["attention_backend"])))
    assert (
        code == 2 and "expected launch flags such as --attention-backend (or python, env:NAME), got 'attention_" in said
    )
    path = sweep(tmp_path, cell={"tp_size": 4}, baseline_may_differ=["--tensor-parallel-size"])
    assert cli("validate", str(path))[0] == 0


@pytest.mark.parametrize(
    ("allowed", "why"),
    [
        (["--speculative-algorithm"], "--speculative-algorithm is a speculative flag or one that only addresses"),
        (["--port"], "--port is a speculative flag or one that only addresses the server: it may always differ"),
        (["--attention-backnd"], "--attention-backnd: set by no deploy of the campaign (they set --attention-backend,"),
        (["--attention-back"], "--attention-back: set by no deploy of the campaign"),  # an abbreviation allows nothing
        (["env:SGLANG_NOWHERE"], "env:SGLANG_NOWHERE: set by no deploy of the campaign"),
    ],
)
def test_a_baseline_may_differ_entry_that_allows_nothing_is_refused_at_its_step(
    tmp_path: Path, allowed: list[str], why: str
) -> None:
    """A typo or an abbreviation would otherwise be accepted and allow nothing, silently; a speculative flag always
    may differ: each is refused at validate, FILE:LINE:COL naming the report step."""
    path = sweep(tmp_path, baseline_may_differ=allowed)
    code, said = cli("validate", str(path))
    assert code == 2 and said.startswith(f"{path}:") and f"step 'report': baseline_may_differ: {why}" in said
