"""`download`: fetch a Hub repo onto the host with a chain of methods, and prove it complete.

The seeds' first download method (`huggingface-cli`) exited without downloading and nobody noticed.
So no method is trusted: one attempt of this step runs, each an audited command on the host,

1. a precheck (hostprograms/download.py `check`): the Hub's commit and file list for the revision (after
   include/exclude), access to the files with the token at hand, what `local_dir` already holds, free disk.
   Complete already: done, no method runs (`skipped`). Not enough disk for the bytes still to fetch plus
   `min_free_margin`: refused before anything is downloaded, with the numbers;
2. each method of `methods` in order (`hf download`, `huggingface_hub.snapshot_download`, plain HTTP with
   Range resume), pinned to the commit the precheck saw, each followed by the same check offline against
   that file list: a method has won only when every file is at its path with the Hub's size, whatever its
   exit status said.

The token is the secret HF_TOKEN (or HUGGING_FACE_HUB_TOKEN), which the engine exports into the host's
environment; the Hub client and the HTTP method read it from there (or from the host's token file) the same
way (the kit's HubToken is huggingface_hub's lookup), never from a command line.
Progress: while a method runs, its script prints the size of `local_dir` on stderr every few seconds, and the
step turns these lines into live progress (bytes done of total, rate, ETA); the audit log keeps one record per
command, its output clipped. The Hub client's own progress bars are off (HF_HUB_DISABLE_PROGRESS_BARS).

Xet (`xet`): `off` (the default) exports HF_HUB_DISABLE_XET=1 to every method, so the Hub client takes the plain
HTTP path (its resolve URLs), whose stall watchdog (HF_HUB_DOWNLOAD_TIMEOUT) and retries the tests exercise;
`auto` lets the client use hf-xet where the repo is stored in Xet, a path no test can serve (README, "Downloads
as real repos take them"). A dataset repository (`repo_type: dataset`) is fetched the same way by every method.

Resuming: the HTTP method continues a file from the bytes already fetched (its `{path}.incomplete`, or a
shorter file at its path). huggingface_hub (1.x as of 1.33, and 2.x) resumes only within one process, after
a transfer breaks off: each process downloads into a fresh uniquely named `*.incomplete` file, so after an
interruption it starts that file over, keeping only the files it had completed.
"""

from __future__ import annotations

import json
import math
import re
import shlex
import time
import urllib.parse
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal, TypeVar

from pydantic import BeforeValidator, ConfigDict, Field, field_validator, model_validator

from executor.hostprogram import PROGRESS_PREFIX, host_program
from executor.render import heredoc, host_word, pasted_word, var_names, with_vars
from executor.runbook.durations import Duration, format_duration
from executor.runbook.model import DataModel, Gate
from executor.stepkind import (
    HUB_ENV,
    VAR_REF,
    AsWrittenOrVar,
    FactsError,
    Outcome,
    ProgressLines,
    ProgressSink,
    RenderContext,
    RunTime,
    StepContext,
    StepSpec,
    host_document,
    resolve_var,
)

if TYPE_CHECKING:
    from executor.transport.base import CommandResult

Method = Literal["hf_cli", "snapshot_download", "http"]
RepoType = Literal["model", "dataset"]  # huggingface_hub's repo_type: a dataset is fetched the same way
Xet = Literal["auto", "off"]
PROGRESS_EVERY_S = 2
#: The checks list files and stat them; they get this long whatever the step's own timeout.
CHECK_TIMEOUT_S = 120.0
#: How much of an error line a method's `ended` keeps: `failure` names every method in one line, which a
#: failed gate shows up to 200 characters.
GIST_CHARS = 40
ERROR_PREFIX = "Error: "  # how the `hf` CLI starts the line of its error (huggingface_hub cli/_output.py `error`)
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12, "KIB": 2**10, "MIB": 2**20}
_UNITS |= {"GIB": 2**30, "TIB": 2**40}


def human_bytes(count: float) -> str:
    """Decimal units, as disk vendors and `df -H` count: 612.3 GB."""
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(count) >= scale:
            return f"{count / scale:.1f} {unit}"
    return f"{count:.0f} B"


def parse_margin(value: Any) -> float | int:
    """`min_free_margin`: a ratio of the bytes to fetch (a float in [0, 1], or "5%"), or bytes (an int, or
    "20GB", "10 GiB"). Returns a float for a ratio, an int for bytes."""
    if isinstance(value, bool):
        raise ValueError("expected a ratio (0.05, '5%') or a size ('20GB', 20000000000)")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"a margin cannot be negative, got {value}")
        return value
    if isinstance(value, float):
        if not 0 <= value <= 1:
            raise ValueError(f"a ratio margin is between 0 and 1 (0.05 is 5%), got {value}")
        return value
    if isinstance(value, str):
        text = value.strip().replace(" ", "").upper()
        if text.endswith("%"):
            return parse_margin(float(text[:-1]) / 100)
        match = re.fullmatch(r"(\d+(?:\.\d+)?)([KMGT]I?B|B)?", text)
        if match:
            return int(float(match.group(1)) * _UNITS[match.group(2) or ""])
    raise ValueError(f"expected a ratio (0.05, '5%') or a size ('20GB', '10GiB', 20000000000), got {value!r}")


def _as_list(value: Any) -> Any:
    return [value] if isinstance(value, str) else value


Patterns = Annotated[list[AsWrittenOrVar], BeforeValidator(_as_list, json_schema_input_type=str | list[str])]
REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")  # `org/name`, as the Hub spells it
#: A Hub repo id, or a runbook var alone that holds one (resolved on the controller: `resolved`)
RepoId = Annotated[str, Field(pattern=f"^(?:{REPO_ID.pattern[1:-1]}|{VAR_REF.pattern[1:-1]})$")]
HubStepT = TypeVar("HubStepT", bound=StepSpec)


def _repo_id(text: str) -> str:
    if not REPO_ID.match(text):
        raise ValueError("expected a Hub repo id, `org/name`")
    return text


def _sent_as_is(text: str) -> str:
    if not text or var_names(text):
        raise ValueError("expected a value sent to the Hub as written: not empty, no $var in it")
    return text


def resolved(step: HubStepT, ctx: RenderContext) -> HubStepT:
    """`step` (a download or a verify) with its `repo`, `revision` and `include`/`exclude` patterns that name a
    runbook var alone (`repo: $speed_bench_repo`) replaced by the var's value on ctx's host. They reach the Hub as
    written, so the controller resolves them: an unset var, or a value that is no repo id, fails the step naming
    the parameter and the var before anything runs (`resolve_var`); a step without such a var is itself."""

    def value(name: str, text: str) -> str:
        if not VAR_REF.match(text):
            return text
        return resolve_var(ctx, text, name, _repo_id if name == "repo" else _sent_as_is)

    given = {name: getattr(step, name) for name in ("repo", "revision", "include", "exclude")}
    update = {n: [value(n, p) for p in v] if isinstance(v, list) else value(n, v) for n, v in given.items()}
    return step if update == given else step.model_copy(update=update)


class MethodTry(DataModel):
    """One method of the chain as it ran: `reason` says why it failed (None: it completed the download)."""

    method: Method
    complete: bool
    exit_code: int | None
    timed_out: bool
    duration_s: float
    ended: str  # how its command ended, in brief: "exited 0", "exit 1 (GatedRepoError)", "timed out after 1h"
    reason: str | None


class DiskCheck(DataModel):
    """Free disk where `local_dir` is, against the bytes still to fetch; `shortfall` says why it refused."""

    path: str
    free_bytes: int
    need_bytes: int | None  # None: the file list is unknown (see hub_error)
    margin_bytes: int | None
    shortfall: str | None


class DownloadFacts(DataModel):
    repo: str
    repo_type: RepoType = "model"
    revision: str
    xet: Xet = "auto"  # the step's choice: off exported HF_HUB_DISABLE_XET=1 to every method
    commit: str | None  # what the revision pointed at; None when the Hub did not say (hub_error)
    local_dir: str  # as the host expanded it
    complete: bool
    method: Method | None  # the method that completed the download; None when skipped or failed
    skipped: bool  # already complete before any method ran
    tried: list[MethodTry]
    files: int
    bytes: int
    present_bytes: int  # bytes of files already complete before any method ran
    resumed_bytes: int  # bytes of partial files the HTTP method continued with Range requests
    fetched_bytes: int  # bytes the methods fetched
    duration_s: float
    rate_bytes_per_s: float | None  # fetched bytes per second of the methods; None when none ran
    token_source: str | None  # where the host's token came from ("env HF_TOKEN", "file ..."); never its value
    hub_error: str | None
    disk: DiskCheck
    incomplete: list[str]  # files not complete at the end, with their state
    removed_leftovers: list[str]  # stale `*.incomplete` files removed once the download was complete
    failure: str | None  # why the download is not complete, one line
    failure_class: str | None = None  # AccessDenied: the Hub refused the token (executor/errors.py)


#: How the readable plan names each method (its commands follow, but http's: a host program).
METHOD_SHOWN: dict[Method, str] = {
    "hf_cli": "hf_cli (the hf CLI)",
    "snapshot_download": "snapshot_download (huggingface_hub)",
    "http": "http (hostprograms/download.py, continuing partial files)",
}


class DownloadStep(StepSpec):
    kind: Literal["download"] = "download"
    #: huggingface_hub (and its `hf` CLI) read HF_ENDPOINT, HF_TOKEN, HF_HOME, HF_HUB_* from the environment
    kind_env: ClassVar[tuple[str, ...]] = HUB_ENV
    repo: RepoId  # the Hub repo, `org/name` (or a runbook var alone holding it, as are revision and each pattern)
    repo_type: RepoType = "model"  # `dataset`: a dataset repository (huggingface_hub's repo_type)
    revision: AsWrittenOrVar = Field(default="main", min_length=1)  # a branch, tag or commit (pinned at the start)
    local_dir: str  # on the host; `~` and `$vars` expand there
    #: `off`: every method runs with HF_HUB_DISABLE_XET=1 (the Hub client's plain HTTP path, the one whose resume
    #: and stall timeout are tested); `auto`: the client takes Xet (hf-xet) where the repo and the host have it
    xet: Xet = "off"
    include: Patterns = []  # only the files matching these patterns (huggingface_hub allow_patterns)
    exclude: Patterns = []  # none of the files matching these (huggingface_hub ignore_patterns)
    #: tried in order until the files are all there at the Hub's sizes: `hf download`, snapshot_download, plain HTTP
    methods: list[Method] = Field(default=["hf_cli", "snapshot_download", "http"], min_length=1)
    hf_cli: str = "hf"  # the `hf` command on the host (the hf_cli method)
    python: str = "python3"  # an interpreter on the host with huggingface_hub installed
    #: free disk to keep besides the bytes to fetch: a ratio of them (0.05, "5%") or bytes (an int, "20GB")
    min_free_margin: Annotated[float | int, BeforeValidator(parse_margin, json_schema_input_type=float | str)] = 0.05
    method_timeout: Duration | None = None  # of each method's command (default: the step's timeout)

    @field_validator("local_dir")
    @classmethod
    def _absolute(cls, value: str) -> str:
        if not value.startswith(("/", "~", "$")):
            raise ValueError(
                f"local_dir must be an absolute path on the host (or start with ~ or a $var), got {value!r}"
            )
        return value.rstrip("/") or "/"

    @field_validator("methods")
    @classmethod
    def _distinct(cls, value: list[Method]) -> list[Method]:
        if len(set(value)) != len(value):
            raise ValueError(f"each method may appear once, got {value}")
        return value

    def fetches(self) -> list[str]:
        """The repository and the files of it this step fetches, for the probe to ask the Hub about before any
        download begins (steps/probe.py): huggingface_hub's HfFileSystem form, `hf://[datasets/]org/name@REVISION`
        (the revision URL-quoted, as HfFileSystem writes it), one address per `include` pattern with the pattern as
        its path (each must match a file there). A var alone stays `$name`: the probe resolves it on its host."""
        revision = self.revision if VAR_REF.match(self.revision) else urllib.parse.quote(self.revision, safe="")
        base = f"hf://{'datasets/' if self.repo_type == 'dataset' else ''}{self.repo}@{revision}"
        return [f"{base}/{pattern}" for pattern in self.include] or [base]

    def default_gates(self) -> list[Gate]:
        return [
            Gate(that="facts.hub_error is none", message="the Hub did not let the host read the repo's files"),
            Gate(that="facts.disk.shortfall is none", message="not enough free disk: refused before downloading"),
            Gate(that="facts.failure is none", message="the download is not complete"),
        ]

    # ---- scripts ---------------------------------------------------------------------------------------
    # Each script sets `local_dir` first (vars and ~ in it expand on the host) and passes "$local_dir" on.

    def _local_dir(self) -> str:
        return f"local_dir={host_word(self.local_dir)}\n"

    def _host_program(self, command: str, known: Any = None) -> str:
        """The host program doing `command`; `known` is the precheck's file list (after the precheck)."""
        config: dict[str, Any] = {"command": command, "local_dir": self.local_dir, "repo": self.repo}
        config |= {"repo_type": self.repo_type, "revision": self.revision}
        config |= {"include": self.include, "exclude": self.exclude}
        return host_program("download", config if known is None else config | {"known": known}, self.python)

    def precheck_script(self) -> str:
        return "# the Hub's file list for the revision, access to the files, what is on disk, free disk\n" + (
            self._host_program("check")
        )

    def check_script(self, known: Any) -> str:
        return "# is every file of the precheck's list complete in local_dir?\n" + self._host_program("check", known)

    def _hf_cli_words(self, commit: str | RunTime) -> str:
        """`hf download`'s arguments but the local dir."""
        words = [self.repo, *(["--repo-type", self.repo_type] if self.repo_type != "model" else []), "--revision"]
        words.append(str(commit))
        words += [w for p in self.include for w in ("--include", p)]
        words += [w for p in self.exclude for w in ("--exclude", p)]
        return shlex.join(words)

    def _snapshot_call(self, commit: str | RunTime, local_dir: str, quote: Callable[[Any], str] = repr) -> str:
        """The snapshot_download call, `local_dir` a Python expression, the other values literals (`quote`)."""
        patterns = [quote(p) if p else "None" for p in (self.include, self.exclude)]
        kind = f"repo_type={quote(self.repo_type)}, " if self.repo_type != "model" else ""
        return (
            f"snapshot_download(repo_id={quote(self.repo)}, {kind}revision={quote(str(commit))}, "
            f"local_dir={local_dir}, allow_patterns={patterns[0]}, ignore_patterns={patterns[1]})"
        )

    def method_command(self, method: Method, commit: str | RunTime, known: Any) -> str:
        if method == "hf_cli":
            return f'{host_word(self.hf_cli)} download {self._hf_cli_words(commit)} --local-dir "$local_dir"\n'
        if method == "snapshot_download":
            call = (
                "import sys\n\nfrom huggingface_hub import snapshot_download\n\n"
                f"{self._snapshot_call(commit, 'sys.argv[1]')}\n"
            )
            return heredoc(call, command=f'{host_word(self.python)} - "$local_dir"', delimiter="RUNBOOK_PYTHON")
        return self._host_program("fetch", known)

    def method_script(self, method: Method, commit: str | RunTime, known: Any) -> str:
        """The method's command, with the size of local_dir printed on stderr now and every few seconds."""
        position = f"{self.methods.index(method) + 1} of {len(self.methods)}"
        return (
            f"# download method {position}: {method}\n"
            "export HF_HUB_DISABLE_PROGRESS_BARS=1 HF_HUB_DISABLE_UPDATE_CHECK=1"
            + (" HF_HUB_DISABLE_XET=1  # xet: off\n" if self.xet == "off" else "\n")
            + self._local_dir()
            + 'mkdir -p -- "$local_dir" || exit 1\n'
            "report_size() {\n"
            f'  printf \'{PROGRESS_PREFIX.decode()}{{"disk_bytes": %s}}\\n\' "$(du -sb -- "$local_dir" | cut -f1)"'
            " >&2\n"
            "}\n"
            f"report_size\n( while sleep {PROGRESS_EVERY_S}; do report_size; done ) &\nreporter=$!\n"
            + self.method_command(method, commit, known)
            + 'status=$?\nkill "$reporter" 2> /dev/null\nexit "$status"\n'
        )

    def plan(self, ctx: RenderContext) -> list[tuple[str, str]]:
        if (step := resolved(self, ctx)) is not self:
            return step.plan(ctx)
        commit = RunTime("the precheck", what=f"commit of {self.revision}")
        known = str(RunTime("the precheck", what="the precheck's file list"))
        steps = [("precheck", self.precheck_script())]
        steps += [(f"method: {m}", self.method_script(m, commit, known)) for m in self.methods]
        return [*steps, ("after each method", self.check_script(known))]

    def summary(self, ctx: RenderContext) -> list[str]:
        if (step := resolved(self, ctx)) is not self:
            return step.summary(ctx)
        what = f"the dataset {self.repo}" if self.repo_type == "dataset" else self.repo
        xet = "HF_HUB_DISABLE_XET=1" if self.xet == "off" else "hf-xet where the repo has Xet"
        return [
            f"download {what}@{self.revision} into {with_vars(self.local_dir, ctx.vars)}: a precheck (file list, "
            "disk), then each method in turn until complete:",
            "methods: "
            + ", then ".join(f"{n}. {METHOD_SHOWN[m]}" for n, m in enumerate(self.methods, start=1))
            + f"; xet: {self.xet} ({xet})",
        ]

    def commands(self, ctx: RenderContext) -> list[str]:
        if (step := resolved(self, ctx)) is not self:
            return step.commands(ctx)
        commit = RunTime("the precheck", what=f"commit of {self.revision}")
        local_dir = pasted_word(self.local_dir, ctx.vars)
        # JSON's strings are Python's (double-quoted): the call pastes inside one single-quoted word
        where = json.dumps(with_vars(self.local_dir, ctx.vars))
        call = "from huggingface_hub import snapshot_download; " + self._snapshot_call(commit, where, json.dumps)
        shown = {
            "hf_cli": f"{pasted_word(self.hf_cli, ctx.vars)} download {self._hf_cli_words(commit)} "
            f"--local-dir {local_dir}",
            "snapshot_download": f"{pasted_word(self.python, ctx.vars)} -c {shlex.quote(call)}",
        }
        return [shown[method] for method in self.methods if method in shown]  # http: the host program's

    # ---- running ---------------------------------------------------------------------------------------

    async def _check(self, ctx: StepContext, script: str, what: str) -> tuple[CommandResult, dict[str, Any]]:
        result = await ctx.run(script, timeout=CHECK_TIMEOUT_S)
        if result.timed_out:
            raise FactsError(f"the {what} timed out after {CHECK_TIMEOUT_S:g}s")
        if result.exit_code != 0:
            raise FactsError(f"the {what} did not report ({result.ended}): {last_line(result) or 'no output'}")
        return result, host_document(result, HostReport, f"the {what}").model_dump(exclude_none=True)

    async def execute(self, ctx: StepContext) -> Outcome:
        if (step := resolved(self, ctx)) is not self:
            return await step.execute(ctx)
        started = time.monotonic()
        result, pre = await self._check(ctx, self.precheck_script(), "precheck")
        disk = self.disk_check(pre)
        facts = self._facts_before(pre, disk)
        if facts.failure is not None:
            return Outcome(result, self._finish(facts, started, 0.0))
        if not pre["incomplete"]:
            facts.complete = facts.skipped = True
            ctx.progress(f"{self.repo}: already complete ({facts.files} files, {human_bytes(facts.bytes)})")
            return Outcome(result, self._finish(facts, started, 0.0))
        commit = pre["commit"]
        known = {"repo": self.repo, "repo_type": self.repo_type, "commit": commit, "gated": pre["gated"]}
        known["manifest"] = pre["manifest"]
        method_s, state = 0.0, pre
        for method in self.methods:
            # what is on disk now counts as done; partial files only for the method that continues them
            done_before = state["complete_bytes"] + (state["partial_bytes"] if method == "http" else 0)
            meter = ProgressMeter(ctx, self.repo, method, facts.bytes, done_before)
            t0 = time.monotonic()
            run = await ctx.run(
                self.method_script(method, commit, known), timeout=self.method_timeout, on_output=meter.feed
            )
            method_s += time.monotonic() - t0
            if method == "http":
                facts.resumed_bytes = resumed_bytes(run)
            result, state = await self._check(ctx, self.check_script(known), f"check after {method}")
            ended, ended_in_full = method_end(run, self.method_timeout)
            done, summary = not state["incomplete"], incomplete_summary(state)
            facts.tried.append(
                MethodTry(
                    method=method,
                    complete=done,
                    exit_code=run.exit_code,
                    timed_out=run.timed_out,
                    duration_s=round(time.monotonic() - t0, 3),
                    ended=ended,
                    reason=None if done else f"{ended_in_full}; {summary}",
                )
            )
            facts.incomplete = describe_incomplete(state)
            facts.removed_leftovers = state.get("removed", [])
            if done:
                facts.complete, facts.method = True, method
                ctx.progress(
                    f"{self.repo}: complete via {method} ({facts.files} files, {human_bytes(facts.bytes)})",
                    method=method,
                    bytes_done=facts.bytes,
                    bytes_total=facts.bytes,
                )
                break
        if not facts.complete:
            tried = ", ".join(f"{t.method} {t.ended}" for t in facts.tried)
            facts.failure = f"{tried}; {summary}"
        return Outcome(result, self._finish(facts, started, method_s))

    def _facts_before(self, pre: dict[str, Any], disk: DiskCheck) -> DownloadFacts:
        """The facts as the precheck found the host: nothing fetched yet, a failure where the Hub or the disk
        already says one."""
        return DownloadFacts(
            repo=self.repo,
            repo_type=self.repo_type,
            revision=self.revision,
            xet=self.xet,
            commit=pre.get("commit"),
            local_dir=pre["local_dir"],
            complete=False,
            method=None,
            skipped=False,
            tried=[],
            files=pre.get("files", 0),
            bytes=pre.get("bytes", 0),
            present_bytes=pre.get("complete_bytes", 0),
            resumed_bytes=0,
            fetched_bytes=0,
            duration_s=0.0,
            rate_bytes_per_s=None,
            token_source=pre.get("token_source"),
            hub_error=pre.get("hub_error"),
            disk=disk,
            incomplete=describe_incomplete(pre),
            removed_leftovers=pre.get("removed", []),
            failure=pre.get("hub_error") or disk.shortfall,
            failure_class=pre.get("failure_class"),
        )

    def _finish(self, facts: DownloadFacts, started: float, method_s: float) -> DownloadFacts:
        if facts.complete:
            facts.fetched_bytes = max(facts.bytes - facts.present_bytes - facts.resumed_bytes, 0)
        facts.duration_s = round(time.monotonic() - started, 3)
        if facts.tried and method_s > 0:
            facts.rate_bytes_per_s = round(facts.fetched_bytes / method_s, 1)
        return facts

    def disk_check(self, pre: dict[str, Any]) -> DiskCheck:
        """Refuse when free disk is below the bytes still to fetch plus the margin.

        Partial files count as still to fetch: the Hub client starts them over (see the module's docstring).
        """
        disk = pre["disk"]
        if "bytes" not in pre:
            return DiskCheck(
                path=disk["path"], free_bytes=disk["free_bytes"], need_bytes=None, margin_bytes=None, shortfall=None
            )
        need = pre["bytes"] - pre["complete_bytes"]
        ratio = isinstance(self.min_free_margin, float)
        margin = math.ceil(need * self.min_free_margin) if ratio else int(self.min_free_margin)
        shortfall = None
        if need > 0 and disk["free_bytes"] < need + margin:
            margin_text = f"{self.min_free_margin * 100:g}% margin" if ratio else f"{human_bytes(margin)} margin"
            shortfall = (
                f"need {human_bytes(need)} + {margin_text} = {human_bytes(need + margin)}, "
                f"{human_bytes(disk['free_bytes'])} free on {disk['path']}"
            )
        return DiskCheck(
            path=disk["path"], free_bytes=disk["free_bytes"], need_bytes=need, margin_bytes=margin, shortfall=shortfall
        )


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _said(text: str) -> list[str]:
    """The lines of an output stream without colours, blanks and progress lines."""
    lines = [_ANSI.sub("", line).strip() for line in text.splitlines()]
    return [line for line in lines if line and not line.startswith(PROGRESS_PREFIX.decode())]


def last_line(result: CommandResult) -> str:
    """The line a failed command's error is on: on stderr (else stdout), its last `Error: ...` line, else its last
    line (a traceback's exception, a shell's complaint). The `hf` CLI of huggingface_hub (1.x as of 1.33, and 2.x:
    cli/hf.py `main`) prints `Error: MESSAGE` (a message may go on over more lines) and then, last, `Hint: set
    HF_DEBUG=1 as environment variable for full traceback.`: the last line is the hint, never the error."""
    for text in (result.stderr_text, result.stdout_text):
        if lines := _said(text):
            return next((line for line in reversed(lines) if line.startswith(ERROR_PREFIX)), lines[-1])
    return ""


def describe_incomplete(report: dict[str, Any]) -> list[str]:
    return [f"{f['path']}: {f['state']} ({f['have']} of {f['size']} bytes)" for f in report.get("incomplete", [])]


def gist(line: str) -> str:
    """A few words of an error line: a Python exception's class, an `Error: ...` message, else the text after
    the last `: ` (bash: `.../script: line 3: /x/hf: No such file or directory`)."""
    if match := re.match(r"^(?:[\w]+\.)*(\w+(?:Error|Exception|Exit|Interrupt))\b", line):
        return match.group(1)
    if line.startswith(ERROR_PREFIX):
        return _clip(line.removeprefix(ERROR_PREFIX), GIST_CHARS)
    return _clip(line.rsplit(": ", 1)[-1], GIST_CHARS)


def method_end(run: CommandResult, limit: float | None) -> tuple[str, str]:
    """How a method's command ended: (in brief, in full), e.g. ("exit 1 (GatedRepoError)", "exit 1 (<its line>)")."""
    if run.timed_out:
        ended = f"timed out after {format_duration(limit)}" if limit else "timed out"
        return ended, ended
    if run.exit_code == 0:
        return "exited 0", "exited 0"
    line = last_line(run)
    ended = run.ended
    return (f"{ended} ({gist(line)})", f"{ended} ({line})") if line else (ended, ended)


def incomplete_summary(after: dict[str, Any]) -> str:
    missing = after["incomplete"]
    names = ", ".join(f"{f['path']} {f['state']}" for f in missing[:3]) + (", ..." if len(missing) > 3 else "")
    return f"{len(missing)} of {after['files']} files incomplete: {names}"


#: Bytes or files as the download program counts them (from the Hub's sizes and the host's disk): a JSON integer,
#: never negative, below 2**63 (what a file system holds): a Hub answering a size of 10**400 fails the step naming
#: the field, where `human_bytes` or a rate would raise OverflowError.
ByteCount = Annotated[int, Field(strict=True, ge=0, lt=2**63)]


class _Open(DataModel):
    """A part of the download program's document: the counts checked, its other keys kept as the host sent them."""

    model_config = ConfigDict(extra="allow")


class _Disk(_Open):
    path: str
    free_bytes: ByteCount


class _File(_Open):
    path: str
    state: str
    have: ByteCount
    size: ByteCount


class HostReport(_Open):
    """A document of the download program (precheck, check): its counts validated here, the one place they are
    read; its other keys are read where they are used. `files`, `bytes` and the rest are absent when the Hub's
    file list is unknown (`hub_error`)."""

    local_dir: str
    files: ByteCount | None = None
    bytes: ByteCount | None = None
    complete_bytes: ByteCount | None = None
    partial_bytes: ByteCount | None = None
    incomplete: list[_File] | None = None
    disk: _Disk
    hub_error: str | None = None
    #: The one class the program recognises (executor/errors.py): another name is a document of an unexpected shape
    failure_class: Literal["AccessDenied"] | None = None

    @model_validator(mode="after")
    def _listing_whole(self) -> HostReport:
        """The comparison with the Hub's list comes whole or not at all (null as absent): `bytes` without
        `complete_bytes` would be a KeyError where the disk check subtracts them."""
        listing = (self.files, self.bytes, self.complete_bytes, self.partial_bytes, self.incomplete)
        if any(v is None for v in listing) and any(v is not None for v in listing):
            raise ValueError("files, bytes, complete_bytes, partial_bytes and incomplete come together or not at all")
        return self


class _Fetched(DataModel):
    resumed_from: ByteCount


class FetchReport(DataModel):
    """What the HTTP method's report says of the files it fetched."""

    fetched: list[_Fetched]


def resumed_bytes(run: CommandResult) -> int:
    """Bytes the HTTP method continued from, by its report; 0 when it did not report."""
    try:
        report = host_document(run, FetchReport, "the HTTP method")
    except FactsError:
        return 0
    return sum(f.resumed_from for f in report.fetched)


class ProgressMeter:
    """Turns the size lines of a method's script into live progress: bytes done of total, rate, ETA.

    `done` starts at the bytes complete before the method ran and grows with the folder's size; the rate is
    over the method's time so far. The script prints the size lines on stderr (the method's own output goes
    around them); `feed` is the OutputSink for the command.
    """

    def __init__(
        self, ctx: ProgressSink, repo: str, method: str, total: int, done_before: int, clock: Any = time.monotonic
    ) -> None:
        self.ctx, self.repo, self.method, self.total, self.done_before = ctx, repo, method, total, done_before
        self.clock = clock
        self.first: tuple[float, int] | None = None
        self.feed = ProgressLines(self._size_line).feed

    def _size_line(self, fields: dict[str, Any]) -> None:  # a line without a size it can read is skipped
        self.update(int(fields["disk_bytes"]))

    def update(self, disk_bytes: int) -> None:
        now = self.clock()
        if self.first is None:
            self.first = (now, disk_bytes)
        t0, base = self.first
        done = min(max(self.done_before + disk_bytes - base, 0), self.total)
        elapsed = now - t0
        rate = (done - self.done_before) / elapsed if elapsed > 0 else None
        eta = (self.total - done) / rate if rate else None
        percent = 100 * done / self.total if self.total else 100.0
        text = f"{self.repo} via {self.method}: {human_bytes(done)} of {human_bytes(self.total)} ({percent:.0f}%)"
        if rate is not None:
            text += f", {human_bytes(rate)}/s"
        if eta is not None:
            text += f", ETA {format_duration(eta)}"
        self.ctx.progress(
            text,
            method=self.method,
            bytes_done=done,
            bytes_total=self.total,
            rate_bytes_per_s=None if rate is None else round(rate, 1),
            eta_s=None if eta is None else round(eta, 1),
        )
