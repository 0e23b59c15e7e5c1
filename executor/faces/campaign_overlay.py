"""`--from-campaign RUN [--band C]`: a campaign's schedule (steps/campaign_schedule.py's schedule.json in its
run folder) laid over a runbook as vars, the way `--inventory` lays a site over it.

Precedence, lowest first: the runbook's vars, the inventory's, the campaign's band, then `--var` (what is typed
last wins): the inventory says where (hosts, models_dir), the campaign says which drafter and settings, and a
`--var` still overrides one of them by hand. The campaign's vars reach the run as `--var` pairs placed before
those given, so a `--resume` carries them as it carries any `--var`.

The run folder is data someone may have tampered with: schedule.json is opened as every run file is (a regular
file, no symlink, no FIFO), refused unread past SCHEDULE_MAX_BYTES, and validated whole against the strict
`ScheduleFile`: a var it may not set, a value not of its pattern (a host address, a shell string), NaN, a
missing or unknown key is refused with exit 2 (`InvalidRunbook`), naming the file and what was expected.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import ValidationError

from executor.errors import InvalidRunbook, Problem
from executor.files import json_data, open_run_file, refusal
from executor.stepkind import VAR_REF, shape_errors
from steps.campaign_schedule import (
    FLAGSHIP,
    GPU_KIND,
    GPUS_VAR,
    OVERLAY_VARS,
    SCHEDULE_JSON,
    Band,
    Schedule,
    ScheduleFile,
)

if TYPE_CHECKING:
    from executor.runbook.loader import Runbook
    from executor.runbook.planner import CampaignVar

#: The largest schedule.json read (a report's is a few KiB): past it, refused unread.
SCHEDULE_MAX_BYTES = 1 << 20
SCHEDULE_MAX_DEPTH = 8  # file, schedules, schedule, bands, band, vars: deeper was not written by a report


@dataclass(frozen=True)
class Overlay:
    """One band of a campaign's schedule, as vars to lay over a runbook, each with where it comes from."""

    run: str  # the campaign's run id (its folder's name)
    band: Band
    schedule: Schedule
    values: dict[str, str]  # var -> value

    def vars_given(self, overridden: Collection[str]) -> list[CampaignVar]:
        """Its vars with their sources, those named in `overridden` (--var given) marked so."""
        from executor.runbook.planner import CampaignVar

        return [
            CampaignVar(name=name, value=value, source=self.source(name), overridden=name in overridden)
            for name, value in self.values.items()
        ]

    def source(self, name: str) -> str:
        """`from campaign RUN, band 1-15: CELL, schedule.json` (report.json's recommendation)."""
        if name == GPUS_VAR:
            return f"from campaign {self.run}: the GPUs it measured on, checked by the probe, {SCHEDULE_JSON}"
        tie = f", the cheapest of a tie at {', '.join(map(str, self.band.on_tie))}" if self.band.on_tie else ""
        unproven = self.band.unproven
        doubt = f", unproven at {', '.join(map(str, unproven))} (the search's budget: schedule.md)" if unproven else ""
        where = f"band {self.band.shown}: {self.band.configuration}"
        return f"from campaign {self.run}, {where}{tie}{doubt}, {SCHEDULE_JSON}"


def _refused(where: Path | str, message: str) -> InvalidRunbook:
    return InvalidRunbook([Problem(str(where), 1, 1, message)])


def read_schedule(run_dir: Path) -> ScheduleFile:
    """schedule.json of a campaign's run folder, checked whole; InvalidRunbook (exit 2) saying why not."""
    path = run_dir / SCHEDULE_JSON
    if not os.path.lexists(path):
        what = "a run folder" if os.path.lexists(run_dir / "run.json") else "no run folder"
        raise _refused(path, f"no {SCHEDULE_JSON} ({what}: a campaign's `campaign_report` step writes one)")
    try:
        with open_run_file(path) as handle:  # no symlink, no FIFO: opened without waiting, as a regular file
            too_big = os.fstat(handle.fileno()).st_size > SCHEDULE_MAX_BYTES
            data = b"" if too_big else handle.read(SCHEDULE_MAX_BYTES + 1)
    except OSError as exc:
        raise _refused(path, f"unreadable ({refusal(exc)})") from None
    if too_big or len(data) > SCHEDULE_MAX_BYTES:
        raise _refused(path, f"refused unread: larger than {SCHEDULE_MAX_BYTES >> 20} MiB (the limit of a schedule)")
    try:
        document = json_data(data.decode("utf-8"), SCHEDULE_MAX_DEPTH)
        return ScheduleFile.model_validate(document)
    except ValidationError as exc:
        raise _refused(path, f"not a schedule a campaign report writes: {shape_errors(exc)}") from None
    except ValueError as exc:  # not UTF-8, not JSON, nested too deep
        raise _refused(path, f"not a schedule a campaign report writes: {str(exc)[:200]}") from None


def campaign_overlay(runbook: Runbook, run_dir: Path, band: int | None) -> Overlay:
    """The vars of the band holding concurrency `band` of the campaign in `run_dir`, checked against `runbook`:
    it must declare them, and download the model the campaign measured. InvalidRunbook (exit 2) otherwise, and for
    several bands without `band`, a band whose answer is the baseline, a schedule of several GPU kinds."""
    schedule = _only_schedule(run_dir, read_schedule(run_dir))
    chosen = _band(run_dir, schedule, band)
    missing = [name for name in [*OVERLAY_VARS, GPUS_VAR] if name not in runbook.header.vars]
    if missing:
        raise _refused(
            "--from-campaign",
            f"runbook {runbook.name} does not declare the vars a campaign's band sets ({', '.join(missing)}): "
            f"deploy it with a runbook that reads them, such as {FLAGSHIP}",
        )
    downloaded = _downloaded_repos(runbook)
    if schedule.target_repo is not None and schedule.target_repo not in downloaded:
        raise _refused(
            "--from-campaign",
            f"campaign {run_dir.name} measured the model {schedule.target_repo}; runbook {runbook.name} downloads "
            f"{', '.join(sorted(downloaded)) or 'no model'}: its answer is not of this model",
        )
    return Overlay(run_dir.name, chosen, schedule, {**chosen.vars, GPUS_VAR: schedule.gpus})


def laid_under(
    run_dir: Path, band: int | None, given: Collection[str], laid: list[CampaignVar]
) -> Callable[[Runbook], list[str]]:
    """For `load_checked`'s `lay_under`: the --var pairs of the band of the campaign in `run_dir` laid over the
    runbook it loads, each var with its source added to `laid` (marked overridden where `given` names it)."""

    def lay(runbook: Runbook) -> list[str]:
        found = campaign_overlay(runbook, run_dir, band).vars_given(given)
        laid.extend(found)
        return [each.pair for each in found]

    return lay


def _only_schedule(run_dir: Path, document: ScheduleFile) -> Schedule:
    """The schedule of the campaign's one GPU kind, which the site's probe will check (`campaign_gpus`)."""
    where = run_dir / SCHEDULE_JSON
    if not document.schedules:
        raise _refused(where, "no schedule: no configuration of the campaign passed with a benchmark")
    if len(document.schedules) > 1:
        kinds = "; ".join(s.gpus for s in document.schedules)
        raise _refused(where, f"the campaign ran on several GPU kinds ({kinds}): no one answer to deploy on a site")
    schedule = document.schedules[0]
    if re.fullmatch(GPU_KIND, schedule.gpus) is None:
        raise _refused(where, f"the campaign's GPUs are {schedule.gpus!r}, not one GPU kind: no answer for one site")
    return schedule


def _band(run_dir: Path, schedule: Schedule, concurrency: int | None) -> Band:
    listed = "; ".join(
        f"--band {b.low}: concurrency {b.shown}, "
        + ("the baseline (no speculation)" if b.baseline else b.configuration)
        for b in schedule.bands
    )
    if concurrency is None:
        if len(schedule.bands) > 1:
            raise _refused("--band", f"campaign {run_dir.name} has {len(schedule.bands)} bands; name one: {listed}")
        concurrency = schedule.bands[0].low
    band = next(b for b in schedule.bands if b.holds(concurrency))  # the bands cover 1 on (Schedule checks it)
    if band.baseline:
        command = f": {band.command}" if band.command else ""
        raise _refused(
            "--band",
            f"at concurrency {band.shown} campaign {run_dir.name}'s answer is the baseline: speculation stops paying "
            f"(crossover {schedule.crossover}); {FLAGSHIP} measures a drafter against the baseline and has no deploy "
            f"without one: launch the baseline as the campaign did{command}",
        )
    if band.unknown is not None:
        raise _refused("--band", f"band {band.shown} ({band.configuration}) is not deployable by vars: {band.unknown}")
    return band


def _downloaded_repos(runbook: Runbook) -> set[str]:
    """The repos the runbook's download steps fetch, a `$var` as the runbook (with its inventory) sets it."""
    found = set()
    for spec in runbook.steps:
        repo = getattr(spec, "repo", None) if spec.kind == "download" else None
        if isinstance(repo, str):
            found.add(str(runbook.header.vars.get(repo.strip("${}"), repo)) if VAR_REF.match(repo) else repo)
    return found
