"""One server on one host (`deploy` and `stop_server` without `nodes`, or with a node list of one): the step's host
runs one host program that starts (or reuses) the server and waits until it serves, or stops it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from executor.runbook.durations import format_duration
from executor.stepkind import FactsError, Outcome, RenderContext, RunTime, StepContext, host_document, progress_messages
from steps.server.base import Deployment, Launch, Server, command_line, deploy_facts
from steps.server.documents import Choice, DeployFacts, StartReport, StopFacts


def start_script(step: Deployment, launch: Launch, port: int, ready_timeout: float) -> str:
    """The command that starts the server (or reuses one running with the same arguments) and waits for it."""
    config = {"action": "start", "port": port, "bind": step.bind, "env": step.env}
    config |= {"ready_timeout": ready_timeout, "stop_timeout": step.stop_timeout}
    return (
        f"# start the SGLang server on {step.bind}:{port}, or reuse the one running there with the same "
        "arguments\n" + launch.comment() + step.deploy_program(config, launch.words())
    )


def stop_script(step: Server, ctx: RenderContext) -> str:
    port = step.port_number(ctx)
    config = {"action": "stop", "port": port, "stop_timeout": step.stop_timeout}
    return f"# stop the SGLang server this runbook started on port {port}\n" + step.deploy_program(config, [])


class OneNode:
    """The topology of a server on the step's own host."""

    #: the environment this topology's launch sets itself: none (`env` is the server's as written)
    managed_env: tuple[str, ...] = ()
    #: what `runbook plan` adds to tp_size auto's source
    tp_size_note = ""

    def tp_size(self, ctx: RenderContext, probe: str, fact: Callable[[RenderContext, str], Any]) -> Choice:
        """tp_size auto: the host's GPUs (`fact` reads the probe's facts on a host)."""
        count = fact(ctx, "gpu_count")
        if not count:
            reason = fact(ctx, "gpu.reason")
            raise FactsError(f"tp_size auto: the probe found no GPUs ({reason}); nothing to deploy on")
        return Choice(value=count, source=f"steps.{probe}.facts.gpu_count = {count}")

    def start_plan(self, step: Deployment, ctx: RenderContext) -> list[tuple[str, str]]:
        label = (
            f"start or reuse the SGLang server on port {step.port_number(ctx)}; "
            f"'{RunTime('...')}' marks values chosen from earlier steps' facts"
        )
        return [(label, step.render(ctx))]

    def start_summary(self, step: Deployment, ctx: RenderContext, drafter: str) -> str:
        return (
            f"start (or reuse, same arguments) SGLang on {step.bind}:{step.port_number(ctx)} ({drafter}), ready within "
            f"{format_duration(step.ready_limit(ctx))}:"
        )

    def commands(self, step: Deployment, ctx: RenderContext) -> list[str]:
        return [command_line(step.launch(ctx), step.env, ctx.vars)]

    async def start(self, step: Deployment, ctx: StepContext) -> Outcome:
        """Start or reuse the server; the host program waits until it serves (/health, then a generation)."""
        launch = step.launch(ctx)
        ready = step.ready_limit(ctx)
        script = start_script(step, launch, step.port_number(ctx), ready)
        limit = step.timeout or ready + 2 * step.stop_timeout + 60
        result = await ctx.run(script, timeout=limit, on_output=progress_messages(ctx).feed)
        if result.timed_out or result.interrupted:
            return Outcome(result)
        report = host_document(result, StartReport, "the deploy program")
        return Outcome(result, deploy_facts(DeployFacts, dict(report), step, launch, step.env))

    def stop_plan(self, step: Server, ctx: RenderContext) -> list[tuple[str, str]]:
        return [(f"stop the server on port {step.port_number(ctx)}", stop_script(step, ctx))]

    async def stop(self, step: Server, ctx: StepContext) -> Outcome:
        # the TERM wait, then the KILL wait, and the host program's start-up and the port lock
        limit = step.timeout or 2 * step.stop_timeout + 60
        result = await ctx.run(stop_script(step, ctx), timeout=limit, on_output=progress_messages(ctx).feed)
        if result.timed_out or result.interrupted:
            return Outcome(result)
        return Outcome(result, host_document(result, StopFacts, "the deploy program (stop)"))


ONE_NODE = OneNode()
