"""`runbook plan`: every command exactly as it would run, with run-time values marked (`RunTime`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from executor.errors import Problem
from executor.loader import Runbook, secret_values
from executor.model import var_text
from executor.redact import NO_SECRETS, Redactor
from executor.render import render_command
from executor.stepkind import FactsError, RenderContext, RunTime


class PlanContext(RenderContext):
    """Renders without running: facts of earlier steps are not known yet."""

    def __init__(self, host: str, variables: Mapping[str, str]) -> None:
        self.host_name = host
        self.vars = variables

    def fact(self, step_id: str, path: str) -> RunTime:
        return RunTime.fact(step_id, path)


def secrets_redactor(runbook: Runbook, environ: Mapping[str, str]) -> Redactor:
    """Masks the values of the runbook's secrets that `environ` holds, as a run masks them (a value that
    is too short is refused as a run refuses it; one that is unset is left out: nothing runs)."""
    return Redactor(secret_values(runbook, environ, required=False).values())


def render_problems(runbook: Runbook, overrides: Mapping[str, Any], redactor: Redactor = NO_SECRETS) -> list[Problem]:
    """Steps that cannot render with these vars (a port var holding `abc`, say), each at its line.

    Checked before a run starts, so that a bad value stops it at once instead of at step 7 after
    hours of downloads; `validate` and `plan` report the same. A message never shows a secret's value
    (a `--var` may hold one): `redactor` masks it.
    """
    env = {k: var_text(v) for k, v in {**runbook.header.vars, **overrides}.items()}
    problems = []
    for spec in runbook.steps:
        for host in runbook.step_hosts[spec.id]:
            for variant in [spec, *runbook.fallbacks.get(spec.id, [])]:
                try:
                    variant.plan(PlanContext(host, env))
                except FactsError as exc:
                    line, column = runbook.step_positions.get(spec.id, (1, 1))
                    message = redactor.text(f"step '{spec.id}': {exc}")
                    problems.append(Problem(str(runbook.path), line, column, message))
    return list(dict.fromkeys(problems))


def plan_text(runbook: Runbook, overrides: Mapping[str, Any], redactor: Redactor = NO_SECRETS) -> str:
    """The plan, masked by `redactor` exactly as a run masks what it records (a `--var` holding a secret)."""
    env = {k: var_text(v) for k, v in {**runbook.header.vars, **overrides}.items()}
    secrets = dict.fromkeys(runbook.header.secrets, "<secret>")
    lines = [f"# runbook {runbook.name}: {len(runbook.steps)} steps; nothing is run"]
    if secrets:
        lines.append(
            "# secrets are shown as '***'; their values (and so the environment's byte count) come at run time"
        )
    for number, spec in enumerate(runbook.steps, start=1):
        for host in runbook.step_hosts[spec.id]:
            variants = [("primary", spec)] + [
                (f"fallback {i}", fb) for i, fb in enumerate(runbook.fallbacks.get(spec.id, []), start=1)
            ]
            for via, variant in variants:
                address = runbook.hosts[host].address
                lines.append(f"\n## step {number} '{spec.id}' ({spec.kind}) on {host} [{address}], {via}")
                for gate in variant.effective_gates():
                    lines.append(f"#   gate: {gate.that}")
                for label, script in variant.plan(PlanContext(host, env)):
                    if label:
                        lines.append(f"# {label}")
                    lines.append(render_command(script, *variant.environment(env, secrets)).display.rstrip("\n"))
    return redactor.text("\n".join(lines))
