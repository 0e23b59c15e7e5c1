"""`verify`: check a downloaded Hub repo on the host against the Hub's manifest for its revision.

The Hugging Face client checks sizes only, and the seeds trusted a download because its folder
existed. This kind runs hostprograms/verify.py on the host (one command, one JSON document back):
every file of the manifest present at the right size, no `*.incomplete` leftovers, sha256 of
every LFS file (git blob sha1 of the others) equal to the Hub's, and `.safetensors` headers that
tile the file exactly. Digests are cached on the host by (path, size, mtime_ns), so re-verifying
an unchanged tree reads nothing. `repair: true` deletes the bad files, fetches them again at the
manifest's commit and verifies once more; the facts list what was repaired.

The manifest comes from `HfApi().model_info(..., files_metadata=True)` (`dataset_info` for a dataset) on the host, so
HF_ENDPOINT and HF_TOKEN are the runbook's exported vars/secrets there, never part of the script.
`repo`, `repo_type`, `revision`, `local_dir`, `include` and `exclude` mean what they mean to the download step.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import ConfigDict, Field

from executor.errors import AccessDenied, AttemptFailed, StepFailed
from executor.hostprogram import host_program
from executor.render import with_vars
from executor.runbook.model import DataModel, Gate
from executor.stepkind import (
    HUB_ENV,
    AsWrittenOrVar,
    Outcome,
    ProgressLines,
    RenderContext,
    StepContext,
    StepSpec,
    host_document,
)
from steps.download import Patterns, RepoId, RepoType, resolved

if TYPE_CHECKING:
    from executor.transport.base import CommandResult, OutputSink

GIB = 1 << 30


class Facts(DataModel):
    model_config = ConfigDict(extra="forbid")


class SizeMismatch(Facts):
    path: str
    expected: int
    actual: int


class DigestMismatch(Facts):
    path: str
    algo: Literal["sha256", "git-sha1"]  # sha256 for LFS files, git blob sha1 for the others
    expected: str
    actual: str


class BadHeader(Facts):
    path: str
    reason: str


class VerifyFacts(Facts):
    """What verify found. Counts are of the manifest's files after include/exclude."""

    repo: str
    revision: str
    local_dir: str
    commit: str | None  # the manifest's commit sha; None with manifest_error
    manifest_error: str | None  # why the manifest could not be read (gated, not found, ...)
    failure_class: str | None = None  # AccessDenied: the Hub refused the token (executor/errors.py)
    files_expected: int = 0
    bytes_expected: int = 0
    files_checked: int = 0  # present on disk
    hashed: int = 0  # files read and hashed in this run
    cached: int = 0  # digests taken from the cache: (path, size, mtime_ns) unchanged
    bytes_hashed: int = 0
    hash_seconds: float = 0.0
    throughput_bytes_per_s: float | None = None  # None when nothing was hashed
    workers: int = 0  # size of the hashing pool
    workers_used: int = 0  # workers that hashed at least one file
    missing: list[str] = []
    extra: list[str] = []  # on disk, not in the manifest (`.cache/` aside); reported, not a failure
    size_mismatch: list[SizeMismatch] = []
    sha_mismatch: list[DigestMismatch] = []
    bad_headers: list[BadHeader] = []
    incomplete: list[str] = []  # `*.incomplete` leftovers, `.cache/huggingface/` included
    digest_unknown: list[str] = []  # the manifest gives no digest: only the size was checked
    repaired: list[str] = []  # deleted and fetched again by `repair: true`
    repair_errors: dict[str, str] = {}


class VerifyStep(StepSpec):
    kind: Literal["verify"] = "verify"
    #: huggingface_hub (and its `hf` CLI) read HF_ENDPOINT, HF_TOKEN, HF_HOME, HF_HUB_* from the environment
    kind_env: ClassVar[tuple[str, ...]] = HUB_ENV
    repo: RepoId  # the Hub repo, `org/name`
    repo_type: RepoType = "model"  # `dataset`: a dataset repository (huggingface_hub's repo_type)
    revision: AsWrittenOrVar = Field(default="main", min_length=1)  # a branch, tag or commit, checked against
    local_dir: str  # on the host; `~` and `$VARS` expand there
    include: Patterns = []  # huggingface_hub allow_patterns
    exclude: Patterns = []  # huggingface_hub ignore_patterns
    python: str = "python3"  # an interpreter on the host with huggingface_hub installed
    workers: int | None = Field(default=None, ge=1)  # hashing threads; default: the host's cores
    repair: bool = False  # true: delete what differs, fetch it again at the same commit and verify once more

    def render(self, ctx: RenderContext) -> str:
        if (step := resolved(self, ctx)) is not self:
            return step.render(ctx)
        fields = {"repo", "repo_type", "revision", "local_dir", "include", "exclude", "workers", "repair"}
        config = self.model_dump(include=fields)
        return host_program("verify", config, self.python)

    def summary(self, ctx: RenderContext) -> list[str]:
        if (step := resolved(self, ctx)) is not self:
            return step.summary(ctx)
        repair = "; repair: refetch what differs" if self.repair else ""
        what = f"the dataset {self.repo}" if self.repo_type == "dataset" else self.repo
        return [
            f"check {what}@{self.revision} in {with_vars(self.local_dir, ctx.vars)} against the Hub's manifest: "
            f"sizes, safetensors headers, sha256{repair}"
        ]

    def parse_facts(self, result: CommandResult) -> VerifyFacts:
        return host_document(result, VerifyFacts, "verify's host program")

    def failure_class(self, facts: Any) -> type[AttemptFailed] | None:
        """AccessDenied when the Hub refused the token for the manifest; StepFailed when the manifest could not
        be read otherwise (the network) or a repair failed; else a false gate is a definite GateFalse."""
        if not isinstance(facts, VerifyFacts):
            return None
        if facts.manifest_error is not None:
            return AccessDenied if facts.failure_class == "AccessDenied" else StepFailed
        return StepFailed if facts.repair_errors else None

    def default_gates(self) -> list[Gate]:
        return [
            Gate(that="facts.manifest_error is none", message="could not read the Hub's manifest for this revision"),
            Gate(
                that="facts.files_expected > 0",
                message="no file of the Hub's manifest matches include/exclude: nothing was verified",
            ),
            Gate(that="not facts.missing", message="files of the Hub's manifest are missing from local_dir"),
            Gate(that="not facts.incomplete", message="*.incomplete leftovers: a download did not finish"),
            Gate(that="not facts.size_mismatch", message="files differ in size from the Hub's manifest"),
            Gate(that="not facts.bad_headers", message="safetensors files are malformed or cut short"),
            Gate(that="not facts.sha_mismatch", message="file contents differ from the Hub's (digest mismatch)"),
        ]

    async def execute(self, ctx: StepContext) -> Outcome:
        result = await ctx.run(self.render(ctx), on_output=progress_sink(ctx))
        if result.timed_out or result.interrupted:
            return Outcome(result)
        return Outcome(result, self.parse_facts(result))


def progress_sink(ctx: StepContext) -> OutputSink:
    """Turn the host program's `runbook-progress {json}` stderr lines into ctx.progress calls."""

    def show(fields: dict[str, Any]) -> None:  # a line it cannot show (a key missing, text, 10**400) is skipped
        message = (
            f"hashed {fields['files_done']}/{fields['files_total']} files, "
            f"{fields['bytes_done'] / GIB:.1f}/{fields['bytes_total'] / GIB:.1f} GiB "
            f"at {fields['bytes_per_s'] / GIB:.2f} GiB/s"
        )
        ctx.progress(message, **fields)

    return ProgressLines(show).feed
