"""`runbook report RUN --format csv`: a report's measurements as one tidy table, a row per cell x workload x
concurrency, each row carrying what its numbers are of (README "Results others can use").

A benchmark report (steps/benchmark_report.py) gives a row per side (baseline, candidate) and concurrency; a
campaign report (steps/campaign_report_document.py) a row per cell (its baselines first) and concurrency, and
one row without a concurrency for a cell that measured none (failed or skipped, with why). The provenance
columns come from the report's `provenance` (steps/provenance.py; a campaign's is per host): the SGLang version,
launch command and models of the server the row measured, the revisions and commits of those models where a
download or verify step named them, the host's GPUs, the client's module and dataset and the range of seeds
of the row's runs, the per-request records file, and when the report was made.

Every cell is text a spreadsheet takes as data (`cell`): control and format characters written as escapes
(one line per row, whatever a label holds: executor/terminal.py's `shown`), a text longer than CELL_MAX_CHARS
cut saying how much was left, and one that starts with `=`, `+`, `-`, `@`, a tab or a CR (a formula to
Excel, LibreOffice and Google Sheets: CSV injection) prefixed with `'`, which they show and do not evaluate.
Numbers are written as Python writes them (`str`), booleans `true`/`false`, an unknown value as the empty cell.
"""

from __future__ import annotations

import csv
import shlex
import statistics
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import IO, Any

from pydantic import ValidationError

from executor.documents import Table
from executor.errors import ResumeError
from executor.faces.views import REPORT_FILE
from executor.terminal import shown
from steps.benchmark_report import BenchmarkData, Report, exact_lengths
from steps.benchmark_results import BenchPoint, BenchRun, Spread
from steps.benchmark_workloads import RANDOM_IDS, slice_key
from steps.campaign_report_cells import CellPoint, CellReport
from steps.campaign_report_document import CampaignReport
from steps.provenance import DeploymentProvenance, Provenance, RepoProvenance, same_path

#: The longest text a cell holds (a server's launch command fits); a longer one is cut, saying so.
CELL_MAX_CHARS = 4096
#: What a spreadsheet reads as the start of a formula.
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")

#: The columns, in order: what the row is, what it measured, what its numbers are of.
WHAT = ["report", "run", "host", "cell", "role", "group", "status", "reason", "workload", "workload_category"]
WHAT += ["input_len", "output_len", "concurrency", "repeats"]
MEASURED = ["output_throughput", "output_throughput_min", "output_throughput_max", "request_throughput"]
MEASURED += ["ttft_ms", "tpot_ms", "itl_ms", "e2e_latency_ms", "p99_ttft_ms", "p99_tpot_ms", "accept_length"]
MEASURED += ["accept_length_exact", "noisy", "speedup"]
ORIGIN = ["sglang_version", "model", "model_revision", "model_commit", "draft_model", "draft_revision"]
ORIGIN += ["draft_commit", "speculative_algorithm", "server_gpus", "server_argv", "gpu_model", "gpu_count"]
ORIGIN += ["gpu_driver", "cuda_version", "client", "dataset", "seed_first", "seed_last", "client_command"]
ORIGIN += ["requests_file", "generated_at"]
COLUMNS = [*WHAT, *MEASURED, *ORIGIN]


def cell(value: Any) -> str:
    """`value` as a CSV cell a spreadsheet shows as data (module docstring)."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    text = shown(str(value), keep="")
    if len(text) > CELL_MAX_CHARS:
        text = f"{text[:CELL_MAX_CHARS]}... ({len(text) - CELL_MAX_CHARS:,} more characters)"
    return "'" + text if text.startswith(FORMULA_STARTS) else text


def tidy_table(document: dict[str, Any], run_dir: Path) -> Table:
    """The report's rows (module docstring), every cell made safe; ResumeError for a report that is neither a
    benchmark's nor a campaign's as their steps write them (its tables alone say nothing a row could)."""
    rows = tidy_rows(report_of(document, run_dir), run_dir.name)
    return Table(title="tidy rows", columns=list(COLUMNS), rows=[[cell(row.get(c)) for c in COLUMNS] for row in rows])


def report_of(document: dict[str, Any], run_dir: Path) -> Report | CampaignReport:
    """report.json's benchmark or campaign report, read through the model its step writes; ResumeError naming
    the field for one that is not what the step writes, or for a report that is neither (another writer's)."""
    path = run_dir / REPORT_FILE
    try:
        if "campaign" in document:
            return CampaignReport.model_validate(document)
        if "data" in document:
            return Report.model_validate(document)
    except ValidationError as exc:
        error = exc.errors()[0]
        where = ".".join(map(str, error["loc"])) or "the document"
        raise ResumeError(f"{path}: not a report as its step writes one: {where}: {error['msg']}") from None
    raise ResumeError(f"{path}: neither a benchmark's report nor a campaign's: it has no rows to tidy")


def tidy_rows(report: Report | CampaignReport, run: str) -> list[dict[str, Any]]:
    """The rows of run `run`'s report as values (not yet cells): a dict per row, keyed by COLUMNS."""
    if isinstance(report, CampaignReport):
        return campaign_rows(report, run)
    return benchmark_rows(report, run)


def write(table: Table, stream: IO[str]) -> None:
    """`table` as CSV (a header, then its rows; `\\n` ends each) on `stream`."""
    writer = csv.writer(stream, lineterminator="\n")
    writer.writerow(table.columns)
    writer.writerows(table.rows)


# ---- the rows ------------------------------------------------------------------------------------------


def workload_of(workload: str, category: str | None) -> dict[str, Any]:
    """The workload columns of a row: its workload's label and SPEED-Bench category (empty: the whole workload)."""
    return {"workload": workload, "workload_category": category}


def benchmark_rows(report: Report, run: str) -> list[dict[str, Any]]:
    """A row per side and concurrency of a benchmark report, the candidate's with its speedup."""
    data = report.data
    rows = []
    for role, side in (("baseline", data.baseline), ("candidate", data.candidate)):
        what: dict[str, Any] = {"report": "benchmark", "run": run, "cell": side.label, "role": role}
        what |= {"status": "passed"}
        what |= {"input_len": side.input_len, "output_len": side.output_len}
        for point in side.points:
            slot = (point.workload, point.category, point.max_concurrency)
            row = what | workload_of(point.workload, point.category) | _point(point) | _speedup(data, role, point)
            row |= _exact(side.sliced(slice_key(point.workload, point.category)).runs, point.max_concurrency)
            rows.append(row | origin(report.provenance, side.label, *slot))
    return rows


def _speedup(data: BenchmarkData, role: str, point: BenchPoint) -> dict[str, Any]:
    """A candidate's speedup at the point's workload and concurrency (a report of one workload: its own)."""
    if role != "candidate":
        return {}
    gain = data.speedup.by_workload.get(slice_key(point.workload, point.category)) or data.speedup
    return {"speedup": gain.by_concurrency.get(str(point.max_concurrency))}


def _exact(runs: list[BenchRun], concurrency: int) -> dict[str, Any]:
    """The median exact acceptance length (the server's counters) of the point's runs that have one; empty
    where none has (a baseline, a server without /metrics)."""
    values, _ = exact_lengths(runs, concurrency)
    return {"accept_length_exact": statistics.median(values) if values else None}


def _median(spread: Spread | None) -> float | None:
    return None if spread is None else spread.median


def _point(point: BenchPoint) -> dict[str, Any]:
    """A benchmark point's medians over its repeats (and the output throughput's range)."""
    throughput = point.output_throughput
    return {
        "concurrency": point.max_concurrency,
        "repeats": point.repeats,
        "output_throughput": _median(throughput),
        "output_throughput_min": None if throughput is None else throughput.min,
        "output_throughput_max": None if throughput is None else throughput.max,
        "request_throughput": _median(point.request_throughput),
        "ttft_ms": _median(point.median_ttft_ms),
        "tpot_ms": _median(point.median_tpot_ms),
        "itl_ms": _median(point.median_itl_ms),
        "e2e_latency_ms": _median(point.median_e2e_latency_ms),
        "p99_ttft_ms": _median(point.p99_ttft_ms),
        "p99_tpot_ms": _median(point.p99_tpot_ms),
        "accept_length": _median(point.accept_length),
        "noisy": point.noisy,
    }


def campaign_rows(report: CampaignReport, run: str) -> list[dict[str, Any]]:
    """A row per cell and concurrency of a campaign report (one for a cell without any)."""
    rows = []
    for each in report.campaign.cells:
        what: dict[str, Any] = {"report": "campaign", "run": run, "host": each.host, "cell": each.name}
        what |= {"role": "baseline" if each.group is None else "candidate", "group": each.group}
        what |= {"status": each.status, "reason": each.reason, "input_len": each.input_len}
        what |= {"output_len": each.output_len, "dataset": each.dataset}
        workload, _, category = each.workload.partition("/")  # `speed-bench/low_entropy`: steps/benchmark_workloads.py
        provenance = report.provenance.get(each.host)
        measured: list[CellPoint | None] = [*each.points] or [None]
        for point in measured:
            slot = (workload, category or None, None if point is None else point.concurrency)
            row = what | workload_of(*slot[:2]) | _cell_point(point) | _launch(each)
            rows.append(row | (origin(provenance, each.name, *slot) if provenance else {}))
    return rows


def _cell_point(point: CellPoint | None) -> dict[str, Any]:
    """A campaign cell's point: its medians (and the output throughput's range) over its repeats."""
    if point is None:
        return {}
    throughput = point.output_throughput or (None, None, None)
    return {
        "concurrency": point.concurrency,
        "repeats": point.repeats,
        "output_throughput": throughput[0],
        "output_throughput_min": throughput[1],
        "output_throughput_max": throughput[2],
        "ttft_ms": None if point.ttft_ms is None else point.ttft_ms[0],
        "tpot_ms": None if point.tpot_ms is None else point.tpot_ms[0],
        "noisy": point.noisy,
        "speedup": point.speedup,
    }


def _launch(each: CellReport) -> dict[str, Any]:
    """The server a campaign cell launched, as the cell says (a failed cell has no provenance of its own)."""
    launch = each.launch
    return {
        "sglang_version": launch.server_version,
        "draft_model": launch.draft_model,
        "speculative_algorithm": launch.algorithm,
        "server_gpus": launch.gpus,
        "server_argv": None if launch.argv is None else shlex.join(launch.argv),
    }


# ---- what the numbers are of ---------------------------------------------------------------------------


def origin(
    provenance: Provenance, side: str, workload: str, category: str | None, concurrency: int | None
) -> dict[str, Any]:
    """The provenance columns of `side`'s row of `workload` (and category) at `concurrency`: its server, models,
    GPUs and runs (a report from before workloads names none: its runs are random ids)."""
    columns: dict[str, Any] = {"generated_at": provenance.generated_at}
    deployment = next((d for d in provenance.deployments if d.side == side), None)
    if deployment is not None:
        columns |= {"host": deployment.host} | _server(deployment, provenance.repos)
    gpus = provenance.gpus
    if gpus is not None:
        columns |= {"gpu_model": gpus.model, "gpu_count": gpus.count, "gpu_driver": gpus.driver_version}
        columns |= {"cuda_version": gpus.cuda_version}
    for bench in (b for b in provenance.benchmarks if b.side == side):
        slot = (workload, category, concurrency)
        runs = [r for r in bench.runs if (r.workload or RANDOM_IDS, r.category, r.concurrency) == slot]
        columns |= {"requests_file": bench.requests}
        if runs:
            columns |= {"seed_first": min(r.seed for r in runs), "seed_last": max(r.seed for r in runs)}
            columns |= {"client_command": runs[0].command} | _client(runs[0].command)
    return columns


def _server(deployment: DeploymentProvenance, repos: Sequence[RepoProvenance]) -> dict[str, Any]:
    """The server's version, launch command and models, each model's repo, revision and commit where known."""
    columns = {
        "sglang_version": deployment.server_version,
        "speculative_algorithm": deployment.speculative_algorithm,
        "server_gpus": deployment.gpus,
        "server_argv": None if deployment.argv is None else shlex.join(deployment.argv),
    }
    for prefix, path in (("model", deployment.model_path), ("draft", deployment.draft_model_path)):
        repo = _repo_at(path, repos)
        name = "model" if prefix == "model" else "draft_model"
        columns[name] = path if repo is None else repo.repo
        if repo is not None:
            columns |= {f"{prefix}_revision": repo.revision, f"{prefix}_commit": repo.commit}
    return columns


def _repo_at(path: str | None, repos: Iterable[RepoProvenance]) -> RepoProvenance | None:
    """The repo downloaded to `path`, as provenance matches a server's model with it."""
    if not path:
        return None
    return next((r for r in repos if same_path(r.local_dir, path)), None)


def _client(command: str) -> dict[str, Any]:
    """The benchmark client's module (`-m`) and dataset (`--dataset-name`) in its command line."""
    try:
        words = shlex.split(command)
    except ValueError:  # a command rendered with host words that do not split here
        return {}
    found = {}
    for flag, column in (("-m", "client"), ("--dataset-name", "dataset")):
        if flag in words[:-1]:
            found[column] = words[words.index(flag) + 1]
    return found
