"""`shell`: run a script as written; optionally ship files first, fetch results after,
and parse stdout as JSON facts."""

from __future__ import annotations

from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import field_validator

from executor.files import json_data
from executor.runbook.model import Model
from executor.stepkind import FACTS_MAX_DEPTH, FactsError, Outcome, RenderContext, StepContext, StepSpec

if TYPE_CHECKING:
    from executor.transport.base import CommandResult


class FileCopy(Model):
    """One file to copy over SFTP. Local paths are relative to the runbook's folder (upload)
    or to the host's folder in the run folder (fetch)."""

    src: str  # the file copied: on the controller (upload) or the host (fetch)
    dest: str  # where it goes: a path on the host (upload), or in the host's folder of the run (fetch)


SCRIPT_LINES = 3  # of a script the readable plan shows


class ShellStep(StepSpec):
    kind: Literal["shell"] = "shell"
    #: a script may read any var, through any program it starts: every var and secret reaches it
    default_pass_env: ClassVar[tuple[str, ...]] = ("*",)
    script_fields: ClassVar[frozenset[str]] = frozenset({"script"})
    literal_fields: ClassVar[frozenset[str]] = frozenset({"upload", "fetch"})  # paths SFTP takes as written
    facts_are_output = True  # `parse: json` facts are what the script printed: it may print otherwise next time
    script: str  # bash, sent byte for byte (never templated); vars and secrets are in its environment
    parse: Literal["json", "text"] = "text"  # json: stdout is parsed into the step's facts
    upload: list[FileCopy] = []  # files copied to the host before the script runs
    fetch: list[FileCopy] = []  # files copied from the host into the run folder after the script exits 0

    @field_validator("fetch")
    @classmethod
    def _fetch_stays_in_the_run_folder(cls, value: list[FileCopy]) -> list[FileCopy]:
        for copy in value:
            dest = PurePosixPath(copy.dest)
            if dest.is_absolute() or ".." in dest.parts or "\x00" in copy.dest or not dest.parts:  # `.`: the folder
                raise ValueError(
                    f"fetch dest {copy.dest!r} must be a relative path inside the host's folder of the run (no '..')"
                )
        return value

    def local_files(self) -> list[str]:
        return [copy.src for copy in self.upload]

    def render(self, ctx: RenderContext) -> str:
        return self.script

    def summary(self, ctx: RenderContext) -> list[str]:
        lines = self.script.strip().splitlines() or [""]
        shown = [f"script: {lines[0]}", *(f"        {line}" for line in lines[1:SCRIPT_LINES])]
        more = [f"        ... {len(lines) - SCRIPT_LINES} more lines"] if len(lines) > SCRIPT_LINES else []
        copies = [f"upload {c.src} -> {c.dest}" for c in self.upload]
        copies += [f"fetch {c.src} -> {c.dest}" for c in self.fetch]
        return shown + more + copies

    def parse_facts(self, result: CommandResult) -> Any:
        if self.parse != "json":
            return None
        text = result.stdout_text.strip()
        if not text:
            raise FactsError("parse: json expected a JSON document on stdout, but stdout was empty")
        try:
            return json_data(text, FACTS_MAX_DEPTH)
        except ValueError as exc:  # a JSONDecodeError, an integer past Python's 4300 digits, or nested too deep
            raise FactsError(f"parse: json could not parse stdout: {exc}") from None

    async def execute(self, ctx: StepContext) -> Outcome:
        for copy in self.upload:
            await ctx.put(ctx.base_dir / Path(copy.src).expanduser(), copy.dest)
        outcome = await super().execute(ctx)
        if outcome.result.exit_code == 0:
            for copy in self.fetch:
                target = (ctx.output_dir / copy.dest).resolve()
                if not target.is_relative_to(ctx.output_dir.resolve()):
                    raise FactsError(f"fetch: {copy.dest!r} points outside the run folder")
                target.parent.mkdir(parents=True, exist_ok=True)
                await ctx.get(copy.src, target)
        return outcome
