"""`shell`: run a script as written; optionally parse its stdout as JSON facts."""

from __future__ import annotations

import json
from typing import Any, Literal

from executor.stepkind import FactsError, RenderContext, StepSpec
from executor.transport.base import CommandResult


class ShellStep(StepSpec):
    kind: Literal["shell"] = "shell"
    script: str
    parse: Literal["json", "text"] = "text"

    def render(self, ctx: RenderContext) -> str:
        return self.script

    def parse_facts(self, result: CommandResult) -> Any:
        if self.parse != "json":
            return None
        text = result.stdout_text.strip()
        if not text:
            raise FactsError("parse: json expected a JSON document on stdout, but stdout was empty")
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise FactsError(f"parse: json could not parse stdout: {exc}") from None
