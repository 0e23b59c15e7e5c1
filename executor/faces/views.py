"""What `runbook status --json`, `runs --json` and `report --json` say about stored runs, as JSON-able data, and
a report in short (its summary and its sections: the MCP `report`'s answers).

One module answers for the CLI (executor/faces/cli.py prints these) and the MCP server (executor/faces/mcp_server.py
returns them), so an agent and a person reading the same run folder get the same answer. Nothing here
prints, and nothing here imports the engine or a display: these are read by commands that need no SSH (a
report's summary reads its benchmark or campaign part through the step's model, imported when asked for).
Everything read was stored redacted by the run (see README "Secrets").
"""

from __future__ import annotations

import dataclasses
import os
import shlex
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from executor.documents import NewerDocument, Provenance, Shown, Table, provenance_lacks, read_shown
from executor.errors import ResumeError, StateError
from executor.files import LOG_DIR, json_data, open_run_file, refusal
from executor.run.state import (
    JSON_COLUMN_MAX_DEPTH,
    STAMP_LEN,
    STOPPED,
    STOPPED_NOTE,
    WRITE_FAILED,
    RunMeta,
    find_run,
    open_state,
    scan_runs,
)

if TYPE_CHECKING:
    from steps.benchmark_report import Report
    from steps.campaign_report_document import CampaignReport

#: How many runs `runs` lists, newest first.
RECENT_RUNS = 20
REPORT_FILE = "report.json"
#: The largest report.json read (a campaign's is a few MiB at most): past it, refused unparsed.
REPORT_MAX_BYTES = 16 << 20
#: How deep a report.json may nest: twice what a stored record may (state.JSON_COLUMN_MAX_DEPTH), as a report's
#: provenance holds step facts a few levels down. One deeper was not written by a step, and printing it
#: (`report --json`, the MCP `report`) would exhaust the stack.
REPORT_MAX_DEPTH = 2 * JSON_COLUMN_MAX_DEPTH
#: The most parts (a note, a line of a table's frame, a column's name, a cell, a figure) `runbook report` prints: a
#: report.json within REPORT_MAX_BYTES may hold millions, which a console draws a few thousand a second (an hour
#: for 16 MiB of empty cells); a campaign's tables hold a few thousand. `report --json` prints all of them.
SHOWN_MAX = 20_000
#: The lines of a table's frame: its title, the rules above and below its heads, the rule below its rows.
TABLE_FRAME = 4

_Part = TypeVar("_Part")


def latest(log_dir: Path, run_id: str | None) -> RunMeta:
    """The run `run_id` names (a whole id or a unique prefix), or the latest; an unreadable run folder is
    explained rather than an older run shown in its place."""
    if run_id is not None and (run_id.endswith((".yaml", ".yml")) or os.path.isfile(run_id)):
        # `runbook status runbooks/x.yaml`, as `run` takes it, answered `no run runbooks/x.yaml in logs`; os.path
        # answers False where pathlib raises (a name too long)
        raise ResumeError(
            f"{run_id} is a runbook, not a run: give a run's id (runbook runs lists them), or none for the latest"
        )
    meta = find_run(log_dir, run_id, naming="give the run to show (runbook status RUN_ID)")
    if meta is None:
        raise ResumeError(f"no run in {log_dir}")
    return meta


def note(status: str) -> str | None:
    """What a run's status needs said beside it."""
    if status == STOPPED:
        return STOPPED_NOTE
    if status == WRITE_FAILED:
        return "a write to its run folder failed; --resume continues it once the disk is fixed"
    return None


def status(log_dir: Path, run_id: str | None = None) -> dict[str, Any]:
    """`runbook status --json`: the run (`run.json` with its status, note and end), every step's record
    (status, attempts, duration, via, the failing gate and its message, facts) and the failed cells."""
    meta = latest(log_dir, run_id)
    with open_state(log_dir / meta.run_id) as state:
        records = state.records()
        run_status = state.status()
        finished_at = state.get("finished_at")
        cells = failed_cells(state.get("failed_cells"))
    steps = [dataclasses.asdict(r) for r in records]
    for step in steps:  # a failure a var's value caused: with the command that resumes with another value
        if step["cause"] is not None and step["status"] == "failed":
            step["cause"] = step["cause"] | {"resume": resume_with(meta.path, meta.run_id, log_dir, step["cause"])}
    return {
        "run": meta.__dict__ | {"status": run_status, "note": note(run_status), "finished_at": finished_at},
        "steps": steps,
        "failed_cells": cells,
    }


def resume_with(runbook_path: str, run_id: str, log_dir: Path, cause: Mapping[str, str]) -> str:
    """The command that resumes run `run_id` with another value of the var whose value caused a failure (a
    step record's `cause`): `runbook run FILE --resume RUN --var NAME=NEW_VALUE`."""
    where = [] if log_dir == LOG_DIR else ["--log-dir", str(log_dir)]
    return shlex.join(
        ["runbook", "run", runbook_path, "--resume", run_id, *where, "--var", f"{cause['var']}=NEW_VALUE"]
    )


def caused_by(cause: Mapping[str, str]) -> str:
    """A cause as the console says it: `sglang_port=30000 (the step's port)`."""
    held = f" (the step's {cause['param']})" if cause.get("param") else ""
    return f"{cause['var']}={cause['value']}{held}"


def failed_cells(stored: str | None) -> list[dict[str, str]]:
    """The failed cells a run stored (`group`, `cell`, `reason` each), in the order they failed."""
    if not stored:
        return []
    try:
        cells = json_data(stored)
    except ValueError:
        raise StateError("state.db: failed_cells is not JSON", reason="failed_cells is not JSON") from None
    if not isinstance(cells, list) or not all(
        isinstance(c, dict) and all(isinstance(c.get(k), str) for k in ("group", "cell", "reason")) for c in cells
    ):
        raise StateError("state.db: failed_cells is not a list of cells", reason="failed_cells is malformed")
    return cells


def runs(log_dir: Path) -> list[dict[str, Any]]:
    """`runbook runs --json`: recent runs, newest first; a run folder that cannot be read is a row saying
    why (`status: unreadable`, `note`), never an exception."""
    found = scan_runs(log_dir)
    rows: list[dict[str, Any]] = []
    for meta in found.runs:
        try:
            with open_state(log_dir / meta.run_id) as state:
                run_status, finished_at = state.status(), state.get("finished_at")
                state.records()  # a step row that cannot be read makes the run unreadable here too
            rows.append(meta.__dict__ | {"status": run_status, "note": note(run_status), "finished_at": finished_at})
        except StateError as exc:
            rows.append(meta.__dict__ | {"status": "unreadable", "note": exc.reason, "finished_at": None})
    for folder in found.unreadable:
        unknown = dict.fromkeys(f.name for f in dataclasses.fields(RunMeta)) | {"run_id": folder.run_id}
        rows.append(
            unknown | {"runbook": folder.runbook, "status": "unreadable", "note": folder.reason, "finished_at": None}
        )
    # newest first, unreadable folders among the others: run ids start with their UTC start time
    return sorted(rows, key=lambda row: (row["run_id"][:STAMP_LEN], row["started_at"] or ""), reverse=True)[
        :RECENT_RUNS
    ]


def read_report(run_dir: Path) -> tuple[dict[str, Any], Shown]:
    """`runbook report --json`: the run's report.json as it is, and what it shows (read once: a report's tables
    may hold many thousand cells); refused (ResumeError) when there is none, it is not shaped as a report
    (`shown_report`), or its provenance is incomplete (`provenance_lacks`)."""
    path = run_dir / REPORT_FILE
    if not os.path.lexists(path):
        what = "a run folder without a report" if os.path.exists(run_dir / "run.json") else "not a run folder"
        raise ResumeError(f"{run_dir}: no {REPORT_FILE} ({what}; a step that reports writes one, e.g. benchmark)")
    try:
        with open_run_file(path) as handle:  # its size checked before it is read, and what is read bounded too
            too_big = os.fstat(handle.fileno()).st_size > REPORT_MAX_BYTES
            data = b"" if too_big else handle.read(REPORT_MAX_BYTES + 1)
        if too_big or len(data) > REPORT_MAX_BYTES:
            raise ResumeError(f"{path}: refused: larger than {REPORT_MAX_BYTES >> 20} MiB (the limit of a report)")
        document = json_data(data.decode("utf-8"), REPORT_MAX_DEPTH)
    except OSError as exc:
        raise StateError(f"{path} is unreadable ({refusal(exc)})", reason=f"{REPORT_FILE}: {refusal(exc)}") from None
    except ValueError as exc:
        raise _not_a_report(path, exc) from None
    shown = shown_report(document, path)
    lacks = provenance_lacks(document.get("provenance"))
    if lacks:
        needs = ", ".join(f.name for f in dataclasses.fields(Provenance))
        raise ResumeError(
            f"{path}: refused: {lacks} (needs {needs}): nothing says which commits, "
            "servers, GPUs and commands its numbers are of; run the step that wrote it again for a report that does"
        )
    return dict(document), shown


def request_files(document: dict[str, Any]) -> list[tuple[str, str]]:
    """The per-request records a report names (steps/request_records.py), as (what, path relative to the run
    folder), each once: every benchmark side's and acceptance eval's its provenance holds (a campaign's per
    host), and each campaign cell's evals. Read as plain data: a reader of older reports finds none."""
    provenance = document.get("provenance")
    origins = list(provenance.values()) if isinstance(provenance, dict) and "benchmarks" not in provenance else []
    origins = origins or [provenance]
    named: list[tuple[Any, Any]] = []
    for origin in filter(lambda each: isinstance(each, dict), origins):
        benchmarks = origin.get("benchmarks")
        benchmarks = benchmarks if isinstance(benchmarks, list) else []
        named += [(b.get("step"), b.get("requests")) for b in benchmarks if isinstance(b, dict)]
        acceptance = origin.get("acceptance")
        named += [(acceptance.get("step"), acceptance.get("requests"))] if isinstance(acceptance, dict) else []
    campaign = document.get("campaign")
    cells = campaign.get("cells") if isinstance(campaign, dict) else None
    for each in cells if isinstance(cells, list) else []:
        evals = each.get("acceptance") if isinstance(each, dict) else None
        evals = evals if isinstance(evals, list) else []
        named += [(e.get("step"), e.get("requests_file")) for e in evals if isinstance(e, dict)]
    found = {path: str(what) for what, path in named if isinstance(path, str) and path}
    return [(what, path) for path, what in found.items()]


def shown_report(document: Any, path: Path) -> Shown:
    """What a report shows (executor/documents.py's `Shown`: title, notes, tables, figures), typed; ResumeError
    naming `path` when it is not shaped as a report, or a newer runbook wrote it. What it means is the writer's
    business."""
    try:
        return read_shown(document)
    except NewerDocument as exc:
        raise ResumeError(f"{path}: refused: {exc}") from None
    except (TypeError, KeyError, RecursionError) as exc:
        raise _not_a_report(path, exc) from None


def shown_within(shown: Shown, most: int = SHOWN_MAX) -> tuple[Shown, int]:
    """`shown` cut to its first `most` parts in the order they are printed (notes, each table's frame and
    columns then its rows, figures), and how many parts it left out (a table whose frame and columns do not
    fit is left out with its rows)."""
    budget = _Budget(most)
    notes = budget.take(shown.notes, lambda note: 1)
    tables = []
    for table in shown.tables:
        if budget.take([table], lambda head: TABLE_FRAME + len(head.columns)):
            tables.append(dataclasses.replace(table, rows=budget.take(table.rows, _cells)))
        else:
            budget.left_out += sum(map(_cells, table.rows))
    figures = budget.take(shown.figures, lambda figure: 1)
    return dataclasses.replace(shown, notes=notes, tables=tables, figures=figures), budget.left_out


@dataclasses.dataclass
class _Budget:
    """The parts `shown_within` may still print, and those it has left out."""

    left: int
    left_out: int = 0

    def take(self, parts: list[_Part], size: Callable[[_Part], int]) -> list[_Part]:
        """The first of `parts` that fit, in order; from the first that does not, none (all counted left out)."""
        for kept, part in enumerate(parts):
            if size(part) > self.left:
                self.left = 0
                self.left_out += sum(map(size, parts[kept:]))
                return parts[:kept]
            self.left -= size(part)
        return parts


def _cells(row: list[str]) -> int:
    return max(1, len(row))  # a row of no columns is still a line


def _not_a_report(path: Path, exc: BaseException) -> ResumeError:
    return ResumeError(
        f"{path}: not a report (expected title, notes, tables of title/columns/rows, figures of title/path): {exc!r}"
    )


#: The notes and failed cells a report's summary (the MCP `report` without a section) lists: the rest are in the
#: report (its notes in report.md, every failed cell in the section "Failed and skipped cells").
SUMMARY_ITEMS = 20


#: The comparisons (GPU kind and workload) whose crossover a campaign's headline says: one line, not a table.
HEADLINE_COMPARISONS = 3


def report_summary(run_dir: Path) -> dict[str, Any]:
    """What a report found, in short (the MCP `report` without a section): its title, a headline, the speedup (a
    benchmark's) or the best configuration per concurrency (a campaign's), the verdicts, its first notes, the
    sections (each table by title, with its rows) to ask for, its figures, and where the whole report is.
    Refused as `report` refuses one, and where its benchmark or campaign part is not what the step writes."""
    document, shown = read_report(run_dir)
    findings = _findings(document, run_dir / REPORT_FILE)
    return {
        "ok": True,
        "run_dir": str(run_dir),
        "title": shown.title,
        **findings,
        "notes": shown.notes[:SUMMARY_ITEMS],
        "notes_left_out": max(0, len(shown.notes) - SUMMARY_ITEMS),
        "sections": [{"name": table.title, "rows": len(table.rows)} for table in shown.tables],
        "figures": [
            {"title": figure.title, "path": str(run_dir / figure.path)} | _missing(run_dir / figure.path, "missing")
            for figure in shown.figures
        ],
        "requests": [{"of": what, "path": str(run_dir / path)} for what, path in request_files(document)],
        "report_json": str(run_dir / REPORT_FILE),
        "report_md": str(run_dir / "report.md"),
        **_missing(run_dir / "report.md", "report_md_missing"),
    }


def _missing(path: Path, key: str) -> dict[str, bool]:
    """`{key: true}` where `path` is not there, else nothing: report.md and the figures are written after
    report.json, and a run a full disk stopped may lack them."""
    return {} if os.path.exists(path) else {key: True}


def report_table(run_dir: Path, name: str) -> Table:
    """The table of the run's report titled `name` (or the one whose title it is the start of, case aside);
    ResumeError listing the titles when none is, or several are."""
    tables = read_report(run_dir)[1].tables
    exact = [table for table in tables if table.title == name]
    started = [table for table in tables if table.title.casefold().startswith(name.casefold())]
    if exact or len(started) == 1:
        return (exact or started)[0]
    titles = "; ".join(table.title for table in tables)
    said = f"several sections start with {name!r}" if started else f"no section {name!r}"
    raise ResumeError(f"{run_dir / REPORT_FILE}: {said}; its sections: {titles}")


def _findings(document: dict[str, Any], path: Path) -> dict[str, Any]:
    """The kind of report and what it found (`_benchmark_findings`, `_campaign_findings`), read through the
    model its step writes (a tampered part is refused naming the field); a report of another writer: its title."""
    from pydantic import ValidationError  # here: `runbook report` reads a report without pydantic, to start fast

    from steps.benchmark_report import Report
    from steps.campaign_report_document import CampaignReport

    kind = "campaign" if "campaign" in document else "benchmark" if "data" in document else None
    if kind is None:
        return {"kind": "report", "headline": document.get("title")}
    try:
        if kind == "campaign":
            return _campaign_findings(CampaignReport.model_validate(document))
        return _benchmark_findings(Report.model_validate(document))
    except ValidationError as exc:
        error = exc.errors()[0]
        where = ".".join(map(str, error["loc"])) or "the document"
        raise ResumeError(
            f"{path}: refused: not a {kind} report as its step writes one: {where}: {error['msg']}"
        ) from None


def _benchmark_findings(report: Report) -> dict[str, Any]:
    """A benchmark report's headline (its speedup's range), the speedup per concurrency, the acceptance length per
    prompt set, and the verdicts: was speculation on, how many outputs matched the baseline's per prompt set
    (and the tolerance its eval allowed), which concurrencies were noisy on either side."""
    data = report.data
    speedup, acceptance = data.speedup, data.acceptance
    versus = f"{data.candidate.label} vs {data.baseline.label}"
    if speedup.min is None or speedup.max is None:
        why = speedup.unknown.get("min") or speedup.unknown.get("max") or "nothing to compare"
        headline = f"{versus}: speedup unknown ({why})"
    else:
        mean = "" if speedup.mean is None else f" (mean {speedup.mean:.2f}x)"
        at = ", ".join(speedup.by_concurrency)
        headline = f"{versus}: {speedup.min:.2f}x to {speedup.max:.2f}x the output throughput{mean} at concurrency {at}"
    lossless = (acceptance.lossless or {}) if acceptance else {}
    return {
        "kind": "benchmark",
        "headline": headline,
        "speedup": speedup.model_dump(mode="json"),
        "acceptance": {
            name: {"mean": each.mean, "weighted_mean": each.weighted_mean}
            for name, each in (acceptance.sets if acceptance else {}).items()
        },
        "verdicts": {
            "speculation_on": acceptance.speculation_on if acceptance else None,
            "lossless": {
                name: each.model_dump(
                    mode="json", include={"compared", "identical", "differing", "max_differing_fraction"}
                )
                for name, each in lossless.items()
            },
            "noisy": {
                side: [point.max_concurrency for point in measured.points if point.noisy]
                for side, measured in (("baseline", data.baseline), ("candidate", data.candidate))
            },
        },
    }


def _campaign_findings(report: CampaignReport) -> dict[str, Any]:
    """A campaign report's headline (its counts, and per comparison where speculation stops paying), the best
    configuration per concurrency of each comparison (GPU kind and workload) with its crossover and launch
    commands, and the verdicts: the counts and the first failed or skipped cells with why."""
    campaign = report.campaign
    counts = campaign.counts
    crossovers = [
        f"{each.gpus}, {each.shown_workload}: "
        + (
            f"speculation stops paying at concurrency {each.crossover.concurrency}"
            if each.crossover.concurrency is not None
            else f"no crossover ({each.crossover.why})"
        )
        for each in campaign.comparisons[:HEADLINE_COMPARISONS]
    ]
    more = len(campaign.comparisons) - HEADLINE_COMPARISONS
    crossovers += [f"{more} more comparisons (best)"] if more > 0 else []
    tally = f"{counts.cells} cells: {counts.passed} passed, {counts.failed} failed, {counts.skipped} skipped"
    return {
        "kind": "campaign",
        "headline": "; ".join([tally, *crossovers]),
        "best": [each.model_dump(mode="json", exclude={"cells"}) for each in campaign.comparisons],
        "verdicts": {
            "counts": counts.model_dump(mode="json"),
            "failed": [each.model_dump(mode="json") for each in campaign.failed[:SUMMARY_ITEMS]],
            "failed_left_out": max(0, len(campaign.failed) - SUMMARY_ITEMS),
        },
    }
