"""A campaign compares like with like: its baseline is launched with every flag its cells get, but the speculative
ones (`--speculative-*`). A baseline without the inspect step its cells have gets another attention backend
(flashinfer against trtllm_mla on Blackwell) and no `--trust-remote-code` (SGLang refuses Kimi's tokenizer
without it): its speedups would measure that, not speculative decoding.

Checked twice, each time where it can be known:
- at `validate` (and so in `runbook plan`), from the deploy steps' parameters (`terms`): how each flag of the
  baseline's deploy and of each cell's is set (a value, or the facts it is chosen from: the probe, the config of
  which target); a difference refuses the runbook unless the campaign report lists the flag in
  `baseline_may_differ`;
- in the report, from the argv each server ran with (`steps/campaign_report_cells.py`): a cell whose launch
  differs from its host's baseline in another flag gets no speedup, with the reason.

Flags that only address a server (`--host`, `--port`, a node's rank and rendezvous) are never a difference.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from executor.stepkind import StepSpec
from steps import sglang_flags
from steps.deploy import DeployStep


def terms(step: DeployStep, target_of: Callable[[str], str | None]) -> dict[str, str]:
    """How each non-speculative flag of `step`'s launch is set, as text two deploys compare: the value written,
    or the facts it is chosen from (`target_of`: the target folder an inspect step reads)."""
    target = target_of(step.inspect) if step.inspect else None
    probe = f"steps.{step.probe}" if step.probe else None
    attention, trust = step.attention_backend, step.trust_remote_code
    if attention == "auto":
        config = f"the attention of {target}" if target else "no inspect step (the target's attention unread)"
        attention = f"auto: the GPU architecture of {probe}, {config}" if probe else "left to SGLang (no probe)"
    found = {
        "--model-path": step.model_path,
        "--tp-size": f"auto: the GPUs of {probe}" if step.tp_size == "auto" else str(step.tp_size),
        "--attention-backend": attention,
        "--trust-remote-code": (
            str(trust) if trust != "auto" else f"auto: custom code of {target}" if target else "off: no inspect step"
        ),
        "--mem-fraction-static": "SGLang's default"
        if step.mem_fraction_static is None
        else str(step.mem_fraction_static),
        "--nnodes": str(len(step.nodes or []) or 1),
    }
    written = sglang_flags.flag_values(step.extra_args)
    found |= {flag: " ".join(values) for flag, values in written.items()}
    found |= {PYTHON: step.python} | {ENV + name: value for name, value in step.env.items()}
    return {flag: how for flag, how in found.items() if not _speculative(flag)}


#: How `terms` names what is not a flag yet sets how the server runs: the interpreter (so the SGLang install) and
#: each variable of the server's environment (SGLang reads SGLANG_* as settings: `env:SGLANG_ENABLE_TORCH_COMPILE`).
PYTHON = "python"
ENV = "env:"


def may_differ_problems(parities: Sequence[Parity], allowed: Sequence[str]) -> list[str]:
    """Why entries of `baseline_may_differ` allow nothing: a speculative or addressing flag (always free to differ),
    or one that no deploy of the campaign sets (a typo, an abbreviation, a flag the runbook never gives)."""
    known = {flag for parity in parities for flag in parity.flags}
    problems = [
        f"baseline_may_differ: {flag} is a speculative flag or one that only addresses the server: it may always differ"
        for flag in allowed
        if _speculative(flag)
    ]
    unset = [flag for flag in allowed if not _speculative(flag) and flag not in known]
    if unset and parities:
        problems.append(
            f"baseline_may_differ: {', '.join(unset)}: set by no deploy of the campaign (they set "
            f"{', '.join(sorted(known))}): write a flag as the deploys give it, in full"
        )
    return problems


def _speculative(flag: str) -> bool:
    return sglang_flags.is_speculative(flag) or flag in sglang_flags.ADDRESSING


@dataclass(frozen=True)
class Parity:
    """The baseline's deploy against the cells' deploys of one matrix group (or one step)."""

    group: str
    deploys: list[str]
    differ: dict[str, tuple[str, str]]  # flag -> (how the baseline sets it, how a cell does)
    flags: set[str]  # every flag (and `terms`' python, env:NAME) the baseline or a cell sets

    def line(self, baseline: str, allowed: Sequence[str]) -> str:
        """What `runbook plan` says of it."""
        head = f"baseline parity: {baseline} and {self.group} ({len(self.deploys)} deploys)"
        if not self.differ:
            return f"{head}: the same flags but the speculative ones (checked again on each launch's argv)"
        allowed_note = " (allowed by baseline_may_differ)" if set(self.differ) <= set(allowed) else ""
        return f"{head}: differ in {self.shown()}{allowed_note}"

    def shown(self) -> str:
        """Each differing flag with how the baseline and a cell set it."""
        return "; ".join(f"{flag} (baseline `{base}`, cells `{cell}`)" for flag, (base, cell) in self.differ.items())


def baseline_parity(
    steps: Mapping[str, StepSpec], baseline: str, group_of: Callable[[str], str]
) -> tuple[str | None, list[Parity]]:
    """(the baseline benchmark's deploy, one Parity per group of the other benchmarks' deploys); no deploy:
    nothing to compare (None, [])."""
    base = _served_by(steps, baseline)
    if base is None:
        return None, []

    def target_of(inspect: str) -> str | None:
        step = steps.get(inspect)
        target = getattr(step, "target_dir", None)
        return target if isinstance(target, str) else None

    reference = terms(base, target_of)
    groups: dict[str, Parity] = {}
    for step_id, step in steps.items():
        cell = _served_by(steps, step_id) if step_id != baseline and step.kind == "benchmark" else None
        if cell is None or cell.id == base.id:
            continue
        parity = groups.setdefault(group_of(cell.id), Parity(group_of(cell.id), [], {}, set(reference)))
        if cell.id not in parity.deploys:
            parity.deploys.append(cell.id)
        own = terms(cell, target_of)
        parity.flags.update(own)
        for flag in dict.fromkeys([*reference, *own]):
            if reference.get(flag) != own.get(flag):
                parity.differ.setdefault(flag, (reference.get(flag, "not given"), own.get(flag, "not given")))
    return base.id, list(groups.values())


def _served_by(steps: Mapping[str, StepSpec], benchmark: str) -> DeployStep | None:
    server = getattr(steps.get(benchmark), "server", None)
    deploy = steps.get(server) if isinstance(server, str) else None
    return deploy if isinstance(deploy, DeployStep) else None


def launch_difference(baseline_argv: Sequence[str], cell_argv: Sequence[str], allowed: Sequence[str]) -> str | None:
    """Why a cell's launch may not be compared with its baseline's (the argv each ran with), None when only
    speculative or allowed flags differ."""
    base, cell = sglang_flags.flag_values(baseline_argv), sglang_flags.flag_values(cell_argv)
    differ = [flag for flag in sglang_flags.parity_differences(base, cell) if flag not in allowed]
    if not differ:
        return None
    shown = "; ".join(f"{flag}: {_shown(base.get(flag))} vs {_shown(cell.get(flag))}" for flag in differ)
    return (
        f"the baseline ran with other flags than this cell, beyond the speculative ones ({shown}): not a "
        "comparison of speculative decoding (list the flags in baseline_may_differ to compare anyway)"
    )


def _shown(values: list[str] | None) -> str:
    return "not given" if values is None else " ".join(values) or "given"
