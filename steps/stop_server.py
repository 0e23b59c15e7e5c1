"""`stop_server`: stop the SGLang server a `deploy` step started on a port, so that its GPUs are free.

The server is the one recorded on the port in `state_dir` on the host; the deploy step's host program
(hostprograms/deploy.py, `stop`) stops its process group (TERM, wait `stop_timeout`, KILL) and checks that
no process of it is left to hold GPU memory. No server recorded, or one no longer running, is no failure:
the facts say so (`stopped: false` and a `note`). Kept apart from `deploy` so that each kind has one job,
its own parameters and its own facts.
"""

from __future__ import annotations

from typing import Literal

from executor.model import Gate
from executor.stepkind import Outcome, RenderContext, StepContext, host_document, progress_messages
from steps import node_group
from steps.deploy import ServerStep, StopFacts

__all__ = ["StopFacts", "StopServerStep"]  # StopFacts: the stop program's document, in steps.deploy with the others


class StopServerStep(ServerStep):
    """Stop the server recorded on `port` (any python3 runs the host program: it is stdlib only)."""

    kind: Literal["stop_server"] = "stop_server"

    def default_gates(self) -> list[Gate]:
        return [Gate(that="facts.failure is none", message="the SGLang server did not stop")]

    def render(self, ctx: RenderContext) -> str:
        port = self.port_number(ctx)
        config = {"action": "stop", "port": port, "stop_timeout": self.stop_timeout}
        return f"# stop the SGLang server this runbook started on port {port}\n" + self._program(config, [])

    def plan(self, ctx: RenderContext) -> list[tuple[str, str]]:
        if self.group:
            return node_group.stop_plan(self, ctx)
        return [(f"stop the server on port {self.port_number(ctx)}", self.render(ctx))]

    async def execute(self, ctx: StepContext) -> Outcome:
        if self.group:
            return await node_group.stop(self, ctx)
        # the TERM wait, then the KILL wait, and the host program's start-up and the port lock
        limit = self.timeout or 2 * self.stop_timeout + 60
        result = await ctx.run(self.render(ctx), timeout=limit, on_output=progress_messages(ctx).feed)
        if result.timed_out or result.interrupted:
            return Outcome(result)
        return Outcome(result, host_document(result, StopFacts, "the deploy program (stop)"))
