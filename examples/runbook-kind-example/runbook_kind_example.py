"""`disk_free`: how much disk is free under a path on the host, failing the step below `min_free_gb`.

A step kind is a StepSpec subclass: its parameters are pydantic fields, `render` is the script it runs on
the host, `parse_facts` turns the output into facts (what gates and later steps read as
`steps.ID.facts`), and `default_gates` says what must hold when the runbook gives no gates.

    - id: room
      kind: disk_free
      path: $models_dir
      min_free_gb: 700
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from executor import CommandResult, FactsError, Gate, RenderContext, StepSpec, host_word


class DiskFreeFacts(BaseModel):
    path: str  # as the host expanded it
    mount: str  # the filesystem's mount point
    free_bytes: int  # what an unprivileged user may still write
    total_bytes: int


class DiskFree(StepSpec):
    kind: Literal["disk_free"] = "disk_free"
    path: str  # on the host; `~` and `$vars` expand there
    min_free_gb: float = Field(default=0, ge=0)

    def render(self, ctx: RenderContext) -> str:
        where = host_word(self.path)
        return f"# free disk under {self.path}\ncd {where} && printf '%s\\n' \"$PWD\" && df -Pk . | tail -n 1\n"

    def parse_facts(self, result: CommandResult) -> DiskFreeFacts:
        lines = result.stdout_text.splitlines()
        fields = lines[-1].split() if len(lines) == 2 else []
        if len(fields) < 6 or not fields[1].isdigit() or not fields[3].isdigit():
            raise FactsError(f"df printed no line of a filesystem: {result.stdout_text[-200:]!r}")
        return DiskFreeFacts(
            path=lines[0], mount=fields[5], free_bytes=int(fields[3]) * 1024, total_bytes=int(fields[1]) * 1024
        )

    def default_gates(self) -> list[Gate]:
        need = int(self.min_free_gb * 10**9)
        return [
            Gate(that="exit_code == 0", message=f"{self.path} cannot be read on the host"),
            Gate(
                that=f"facts.free_bytes >= {need}", message=f"less than {self.min_free_gb:g} GB free under {self.path}"
            ),
        ]
