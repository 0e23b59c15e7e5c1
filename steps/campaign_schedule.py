"""A campaign's answer as a schedule to deploy: `schedule.json` (per concurrency band, the vars the flagship
runbook reads: `runbook run runbooks/k26_dflash.yaml --from-campaign RUN --band C`) and `schedule.md` (the launch
command to paste per band), written beside report.json by `campaign_report`.

A band is a run of consecutive measured concurrencies with the same recommended configuration (the report's
`recommended`, so its tie rule: the cheapest of a tie); it reaches from its first measured concurrency up to
the next band's first less one (the first from 1, the last open), so that every concurrency is in one band.
A band whose configuration is the baseline sets no var: speculation does not pay there (`baseline: true`).
A schedule is given per GPU kind (hosts of other GPUs are never compared), from that kind's first workload:
the one the campaign's benchmark lists first (the flagship sweep: its realistic prompts, SPEED-Bench).

`ScheduleFile` is the file's whole shape, and it is strict (unknown keys, other types, a var outside
`OVERLAY_VARS` or a value not of its pattern are refused), so that the reader (executor/faces/
campaign_overlay.py) takes only what this module could have written.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import Annotated, Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from executor import durable, strict_json
from executor.files import LOG_DIR
from executor.runbook.model import DataModel
from steps.campaign_report_cells import CellReport, Comparison
from steps.provenance import Provenance

SCHEDULE_JSON, SCHEDULE_MD = "schedule.json", "schedule.md"
#: The flagship that reads a schedule's vars (what schedule.md tells to run).
FLAGSHIP = "runbooks/k26_dflash.yaml"
#: The vars a band may set, each with the pattern its whole value must match, and nothing else: no host, no
#: port, no path but a folder name under the site's models_dir, no text a shell would read as more than a word.
OVERLAY_VARS: dict[str, str] = {
    "drafter_repo": r"[A-Za-z0-9][A-Za-z0-9_.-]{0,95}/[A-Za-z0-9_.-]{1,96}",
    "drafter_dir": r"(?!\.\.?$)[A-Za-z0-9_.-]{1,96}",
    "speculative_algorithm": r"DFLASH|DDTREE",
    "speculative_num_draft_tokens": r"auto|[1-9][0-9]{0,3}",
    "ddtree_budget": r"none|[1-9][0-9]{0,4}",
}
#: The var a schedule sets besides its band's: the GPU kind it was measured on, which the flagship's probe checks.
GPUS_VAR = "campaign_gpus"
GPU_KIND = r"[1-9][0-9]{0,4}x [A-Za-z0-9 ._()-]{1,100}"
MAX_BANDS = 64  # concurrencies measured are a handful: a schedule of more bands was not written by a report
MAX_TEXT = 4096  # a launch command, a configuration's name


class _Strict(DataModel):
    model_config = ConfigDict(defer_build=True, extra="forbid", strict=True)


Text = Annotated[str, Field(max_length=MAX_TEXT)]
Concurrency = Annotated[int, Field(ge=1, le=1 << 20)]


class Band(_Strict):
    """Concurrencies low..high (high None: and above) and what serves them best."""

    low: Concurrency
    high: Concurrency | None
    measured: Annotated[list[Concurrency], Field(min_length=1, max_length=MAX_BANDS)]  # where the campaign measured
    configuration: Text  # the report's cell name (a baseline's: its benchmark step)
    baseline: bool  # speculation does not pay here: the baseline is recommended
    on_tie: Annotated[list[Concurrency], Field(max_length=MAX_BANDS)]  # where it is the cheapest of a tie
    vars: dict[str, str]  # the flagship's vars that deploy it (none for the baseline)
    unknown: Text | None  # why a speculative configuration has no vars
    command: Text | None  # the launch command its deploy ran, to paste
    #: where a search's budget left a configuration never launched that might beat it (the report's `unproven`)
    unproven: Annotated[list[Concurrency], Field(max_length=MAX_BANDS)] = []

    @field_validator("vars")
    @classmethod
    def _vars(cls, value: dict[str, str]) -> dict[str, str]:
        for name, text in value.items():
            pattern = OVERLAY_VARS.get(name)
            if pattern is None:
                raise ValueError(f"var {name!r} is none a schedule may set (it may set {', '.join(OVERLAY_VARS)})")
            if not re.fullmatch(pattern, text):
                raise ValueError(f"var {name} = {text[:100]!r} is not of the form /{pattern}/")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> Band:
        if self.high is not None and self.high < self.low:
            raise ValueError(f"band {self.low}-{self.high}: its end is below its start")
        if self.baseline and self.vars:
            raise ValueError(f"band {self.shown}: the baseline's band sets no var")
        if not self.baseline and not self.vars and self.unknown is None:
            raise ValueError(f"band {self.shown}: a speculative configuration without its vars says why (unknown)")
        odd = sorted(set(self.on_tie + self.unproven) - set(self.measured))
        if odd:
            raise ValueError(f"band {self.shown}: on_tie or unproven names {odd}, where it measured none")
        if self.vars and set(self.vars) != set(OVERLAY_VARS):
            raise ValueError(
                f"band {self.shown}: sets {', '.join(self.vars)}, not every one of {', '.join(OVERLAY_VARS)}"
            )
        return self

    @property
    def shown(self) -> str:
        """`1-15`, `16+`."""
        return f"{self.low}+" if self.high is None else f"{self.low}-{self.high}"

    def holds(self, concurrency: int) -> bool:
        return self.low <= concurrency and (self.high is None or concurrency <= self.high)


class Schedule(_Strict):
    """The bands of one GPU kind, from one workload's comparison."""

    gpus: Annotated[str, Field(max_length=200)]  # "8x NVIDIA H200" (or "any", or why unknown: then not deployable)
    workload: Text
    target_repo: Annotated[str, Field(max_length=200)] | None  # the model the cells served, as downloaded
    crossover: Concurrency | None  # the report's: from here on no speculative configuration beats the baseline
    bands: Annotated[list[Band], Field(min_length=1, max_length=MAX_BANDS)]

    @model_validator(mode="after")
    def _contiguous(self) -> Schedule:
        ends = [(b.low, b.high) for b in self.bands]
        expected = [(1 if i == 0 else (ends[i - 1][1] or 0) + 1) for i in range(len(ends))]
        if [low for low, _ in ends] != expected or any(high is None for _, high in ends[:-1]) or ends[-1][1]:
            shown = ", ".join(b.shown for b in self.bands)
            raise ValueError(
                f"bands {shown}: expected bands from 1 on, each starting where the last ended, the last open"
            )
        return self


class ScheduleFile(_Strict):
    """schedule.json."""

    schema_version: Literal[1] = 1
    report: Literal["report.json"] = "report.json"  # what it is made from, in the same folder
    schedules: Annotated[list[Schedule], Field(max_length=16)]  # one per GPU kind


def build(
    comparisons: Sequence[Comparison], cells: Sequence[CellReport], origins: Mapping[str, Provenance]
) -> ScheduleFile:
    """Per GPU kind, the schedule of its first comparison (its first workload)."""
    first: dict[str, Comparison] = {}
    for comparison in comparisons:
        first.setdefault(comparison.gpus, comparison)
    by_name = {c.name: c for c in cells}
    return ScheduleFile(schedules=[_schedule(c, by_name, origins) for c in first.values()])


def _schedule(comparison: Comparison, cells: Mapping[str, CellReport], origins: Mapping[str, Provenance]) -> Schedule:
    runs = comparison.recommended
    unproven = {b.concurrency for b in comparison.best if b.unproven}
    bands = []
    for i, run in enumerate(runs):
        cell = cells[run.best]
        repos = {r.local_dir.rstrip("/"): r.repo for r in origins[cell.host].repos} if cell.host in origins else {}
        found, unknown = ({}, None) if cell.baseline else drafter_vars(cell, repos)
        bands.append(
            Band(
                low=1 if i == 0 else run.concurrencies[0],
                high=runs[i + 1].concurrencies[0] - 1 if i + 1 < len(runs) else None,
                measured=run.concurrencies,
                configuration=run.best,
                baseline=cell.baseline,
                on_tie=run.on_tie,
                vars=found,
                unknown=unknown,
                command=run.command,
                unproven=[c for c in run.concurrencies if c in unproven],
            )
        )
    speculative = [cells[r.best] for r in runs if not cells[r.best].baseline]
    target = _model_path(speculative[0].launch.argv or []) if speculative else None
    repos = {r.local_dir.rstrip("/"): r.repo for o in origins.values() for r in o.repos}
    return Schedule(
        gpus=comparison.gpus,
        workload=comparison.shown_workload,
        target_repo=repos.get((target or "").rstrip("/")),
        crossover=comparison.crossover.concurrency,
        bands=bands,
    )


def _model_path(argv: Sequence[str]) -> str | None:
    return next((argv[i + 1] for i, word in enumerate(argv[:-1]) if word == "--model-path"), None)


def drafter_vars(cell: CellReport, repos: Mapping[str, str]) -> tuple[dict[str, str], str | None]:
    """The flagship's vars that launch `cell`'s configuration (its drafter as downloaded on its host, the
    speculative settings its deploy chose), or none and why."""
    launch = cell.launch
    if launch.draft_model is None or launch.algorithm is None:
        return {}, f"its deploy {launch.deploy or '(none)'} recorded no drafter and algorithm"
    repo = repos.get(launch.draft_model.rstrip("/"))
    if repo is None:
        return {}, f"no download or verify step on host {cell.host} recorded the repository of {launch.draft_model}"
    found = {
        "drafter_repo": repo,
        "drafter_dir": PurePosixPath(launch.draft_model).name,
        "speculative_algorithm": launch.algorithm,
        "speculative_num_draft_tokens": "auto" if launch.draft_tokens is None else str(launch.draft_tokens),
        "ddtree_budget": "none" if launch.budget is None else str(launch.budget),
    }
    odd = [f"{n} = {v!r}" for n, v in found.items() if not re.fullmatch(OVERLAY_VARS[n], v)]
    return ({}, f"not a value the flagship takes: {', '.join(odd)}") if odd else (found, None)


def markdown(schedule: ScheduleFile, run_id: str, ref: str) -> str:
    """schedule.md: per GPU kind, the band table and the commands to paste (`ref`: how they name the run)."""
    lines = [f"# Deployable schedule of campaign {run_id}", ""]
    lines += [
        "Per concurrency band, the configuration the report recommends (its tie rule: the cheapest of a tie) and "
        f"how to deploy it: `runbook run {FLAGSHIP} --from-campaign {ref} --band C` lays the band's vars "
        "(schedule.json) over the flagship, or paste the launch command the campaign ran.",
        "",
    ]
    for s in schedule.schedules:
        lines += [f"## {s.gpus}, {s.workload}", ""]
        crossover = (
            "speculation pays at every concurrency measured"
            if s.crossover is None
            else (f"from concurrency {s.crossover} on, no speculative configuration beats the baseline")
        )
        lines += [f"Crossover: {crossover}.", ""]
        for b in s.bands:
            tie = f" (the cheapest of a tie at {', '.join(map(str, b.on_tie))})" if b.on_tie else ""
            what = "the baseline, no speculation" if b.baseline else b.configuration
            lines += [f"### Concurrency {b.shown}: {what}{tie}", ""]
            if b.unproven:
                lines += [
                    f"The answer at concurrency {', '.join(map(str, b.unproven))} is unproven: the campaign's search "
                    "spent its budget with a configuration never launched that might beat it there (report.md, table "
                    "Search, gives its bound); a larger budget and `--resume` settle it.",
                    "",
                ]
            if b.vars:
                lines += ["```", f"runbook run {FLAGSHIP} --from-campaign {ref} --band {b.low}", "```", ""]
                lines += [f"- `{name}: {value}`" for name, value in b.vars.items()] + [""]
            elif b.unknown:
                lines += [f"Not deployable through the flagship: {b.unknown}.", ""]
            lines += ["```", b.command or "(its deploy recorded no launch command)", "```", ""]
    return "\n".join(lines)


def campaign_ref(run_dir: Path) -> str:
    """How `--from-campaign` finds this run from where the run was started: its id where its folder is in the default
    log folder, else the folder's absolute path (a run under `--log-dir DIR`: the id alone would not be found)."""
    folder = run_dir.resolve()
    return run_dir.name if folder.parent == LOG_DIR.resolve() else shlex.quote(str(folder))


def write(run_dir: Path, schedule: ScheduleFile) -> None:
    """schedule.json and schedule.md into the run folder, each replaced whole (durable.replace_file)."""
    document = strict_json.dumps(schedule.model_dump(mode="json"), indent=2) + "\n"
    durable.replace_file(run_dir / SCHEDULE_JSON, document.encode("utf-8"), SCHEDULE_JSON, mode=0o644)
    text = markdown(schedule, run_dir.name, campaign_ref(run_dir))
    durable.replace_file(run_dir / SCHEDULE_MD, text.encode("utf-8"), SCHEDULE_MD, mode=0o644)
