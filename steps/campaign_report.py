"""`campaign_report`: the report of a campaign's matrix, from the records of every step before it on every host.

It runs no command. It reads `StepContext.steps_before()` (which cell ran where, with which facts, which
failed and why) and writes into the run folder report.json (`campaign`: every cell with its host, values,
status, acceptance, throughput and latency per concurrency, speedup over its host's baseline, lossless
check and launch; the best configuration per concurrency, the crossover, the launch command per
concurrency range, the failed cells; `provenance`: one per host), report.md and three figures
(steps/campaign_report_cells.py, _document.py, _figures.py), and the answer as a schedule to deploy per
concurrency band, schedule.json and schedule.md (steps/campaign_schedule.py). `runbook report RUN_DIR` prints it.

Speedups are per host against the `baseline` benchmark step, which runs on every host of the pool.
Hosts whose GPUs differ (model or count, from each host's last probe) are not compared with one another:
the report gives the best configuration per GPU kind, unless `compare_across_gpus: true`.

Its facts say in short what the report says (best per concurrency, crossover, counts), so a gate can
check them; by default it passes when the report was written and at least one cell has a benchmark.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated, BinaryIO, ClassVar, Literal

from pydantic import Field, field_validator

from executor.documents import Figure
from executor.runbook.model import DataModel, Gate
from executor.stepkind import Outcome, RenderContext, StepContext, StepRef, StepSpec, StepView
from steps import campaign_parity, campaign_report_search, campaign_schedule, provenance, sglang_flags
from steps import campaign_report_document as document
from steps.benchmark_report import REPORT_JSON, REPORT_MD, BenchmarkFacts, write_document
from steps.campaign_report_cells import CellReport, Comparison, collect, compare, read_facts
from steps.campaign_report_sla import SlaFacts

if TYPE_CHECKING:
    from executor.transport.base import CommandResult

#: The kinds whose facts a host's provenance is made of (steps/provenance.py's Sources).
PROVENANCE_KINDS = ("probe", "download", "verify", "deploy")


class ComparisonFacts(DataModel):
    gpus: str
    hosts: list[str]
    workload: str = "random-ids"  # its label (and SPEED-Bench category: `speed/mixed`)
    input_len: int
    output_len: int
    best: dict[str, str]  # concurrency -> the best configuration's name, or the cheapest of a tie (see `tied`)
    tied: dict[str, list[str]] = {}  # concurrency -> the configurations tied at the top (only where there is a tie)
    crossover: int | None
    crossover_why: str
    sla: SlaFacts | None = None  # where the benchmarks state SLOs (steps/campaign_report_sla.py)


class CampaignReportFacts(DataModel):
    json_file: str
    markdown_file: str
    figures: list[str]
    counts: document.Counts
    comparisons: list[ComparisonFacts]  # one per GPU kind and workload
    #: the only comparison's best and crossover, for a gate (`facts.best['16']`); None where there are several
    best: dict[str, str] | None
    crossover: int | None
    failed: dict[str, str]  # cell name -> reason
    sla: SlaFacts | None = None  # the only comparison's answer under the SLOs (`facts.sla.best`); None where several
    search: list[campaign_report_search.SearchAccount] = []  # per searched group: launches, GPU time, the left out


class CampaignReportStep(StepSpec):
    """Sum the campaign up: per cell and host, the best configuration per concurrency, what to launch."""

    kind: Literal["campaign_report"] = "campaign_report"
    literal_fields: ClassVar[frozenset[str]] = frozenset({"title"})  # the report's text
    baseline: StepRef  # the baseline benchmark step (it runs on every host of the pool)
    tolerance: Annotated[float, Field(ge=0, lt=1)] = 0.02  # a cheaper configuration this close to the fastest wins
    compare_across_gpus: bool = False  # compare cells of hosts whose GPUs differ (model or count)
    #: flags in which the baseline's launch may differ from its cells' besides the speculative ones (campaign_parity)
    baseline_may_differ: list[str] = []
    title: str | None = None  # the report's title (default: `Campaign: ` and the groups' names)

    @field_validator("baseline_may_differ")
    @classmethod
    def _flags(cls, value: list[str]) -> list[str]:
        if bad := [flag for flag in value if not _differs_in(flag)]:
            raise ValueError(
                "expected launch flags such as --attention-backend (or python, env:NAME), got "
                + ", ".join(map(repr, bad))
            )
        return [sglang_flags.MANAGED_TABLE.get(flag, flag) for flag in value]  # an alias as its flag

    def check_runbook(self, steps: Mapping[str, StepSpec]) -> list[str]:
        base, groups = campaign_parity.baseline_parity(steps, self.baseline, _step_of)
        return campaign_parity.may_differ_problems(groups, self.baseline_may_differ) + [
            f"the baseline's deploy {base} and those of {p.group} differ beyond the speculative flags in "
            f"{p.shown()}: launch the baseline as the cells (the same parameters, an inspect step of the same "
            "target), or list the flags in baseline_may_differ"
            for p in groups
            if set(p.differ) - set(self.baseline_may_differ)
        ]

    def plan_notes(self, steps: Mapping[str, StepSpec]) -> list[str]:
        base, groups = campaign_parity.baseline_parity(steps, self.baseline, _step_of)
        return [p.line(base or "", self.baseline_may_differ) for p in groups]

    def default_gates(self) -> list[Gate]:
        return [
            Gate(that="facts.json_file", message="the report was not written"),
            Gate(
                that="facts.counts.benchmarked >= 1",
                message="no cell passed with a benchmark: the report lists the failed cells and why",
            ),
        ]

    def plan(self, ctx: RenderContext) -> list[tuple[str, str]]:
        return [("", "# runs nothing on the host: reads the records of the steps before it on every host and writes "
                 "report.json, report.md and the figures into the run folder\n")]  # fmt: skip

    async def execute(self, ctx: StepContext) -> Outcome:
        started = datetime.now(UTC)
        views = ctx.steps_before()
        cells = collect(views, self.baseline, self.baseline_may_differ)
        origins = host_provenance(views, cells, started.isoformat(timespec="seconds"))
        kinds = {host: gpu_kind(origin) for host, origin in origins.items()}
        searched = campaign_report_search.account(views, self.baseline)
        comparisons = campaign_report_search.mark_unproven(
            compare(cells, kinds, self.tolerance, self.compare_across_gpus), searched
        )
        campaign = document.Campaign(
            baseline=self.baseline,
            tolerance=self.tolerance,
            compare_across_gpus=self.compare_across_gpus,
            gpu_kinds=kinds,
            counts=document.counts(cells),
            comparisons=comparisons,
            failed=[
                document.Failed(name=c.name, host=c.host, status=c.status, reason=c.reason or c.status)
                for c in cells
                if c.status != "passed"
            ],
            cells=cells,
            search=searched,
        )
        report = document.build(campaign, origins, self.title or f"Campaign: {', '.join(groups(cells)) or 'no cell'}")
        write_document(ctx.run_dir, report, drawings(cells, comparisons), ctx.redactor)
        schedule = campaign_schedule.build(comparisons, cells, origins)  # masked as the report is
        campaign_schedule.write(ctx.run_dir, type(schedule).model_validate(ctx.redactor.deep(schedule.model_dump())))
        ctx.progress(f"campaign report written: {ctx.run_dir / REPORT_MD}")
        return Outcome(local_result(started), facts(ctx, campaign, report.figures))


def _differs_in(name: str) -> bool:
    """Whether `name` can be an entry of baseline_may_differ: a flag, the interpreter or a server's env var."""
    env = name.removeprefix(campaign_parity.ENV)
    return sglang_flags.is_option(name) or name == campaign_parity.PYTHON or (env != name and env.isidentifier())


def _step_of(instance: str) -> str:
    """The step a matrix instance is of (`deploy_dflash[drafter=zlab,spec=dflash-8]` -> deploy_dflash)."""
    return instance.partition("[")[0]


def groups(cells: Sequence[CellReport]) -> list[str]:
    return list(dict.fromkeys(c.group for c in cells if c.group))


def drawings(cells: Sequence[CellReport], comparisons: Sequence[Comparison]) -> dict[str, Callable[[BinaryIO], None]]:
    from steps import campaign_report_figures as draw  # here: it needs matplotlib, which `runbook report` never does

    return {
        document.THROUGHPUT_PNG: lambda out: draw.throughput(cells, comparisons, out),
        document.PARETO_PNG: lambda out: draw.pareto(cells, comparisons, out),
        document.ACCEPTANCE_PNG: lambda out: draw.acceptance(cells, out),
    }


def host_provenance(
    views: Sequence[StepView], cells: Sequence[CellReport], generated_at: str
) -> dict[str, provenance.Provenance]:
    """Per host, steps/provenance.py's provenance of the benchmarks that passed there (the baseline and the cells)."""
    result = {}
    for host in dict.fromkeys(v.host for v in views):
        passed = [v for v in views if v.host == host and v.status == "passed" and v.facts is not None]
        by_kind = {kind: {v.step: v.facts for v in passed if v.kind == kind} for kind in PROVENANCE_KINDS}
        sources = provenance.Sources(host, by_kind["probe"], by_kind["download"], by_kind["verify"], by_kind["deploy"])
        benchmarks = ((v.step, read_facts(BenchmarkFacts, v)) for v in passed if v.kind == "benchmark")
        measured = {step: facts for step, facts in benchmarks if facts is not None}
        sides = [
            provenance.Measured(
                c.name,
                c.benchmark,
                measured[c.benchmark].server,
                measured[c.benchmark].runs,
                measured[c.benchmark].requests_file,
            )
            for c in cells
            if c.host == host and c.status == "passed" and c.benchmark in measured
        ]
        result[host] = provenance.build(sources, sides, generated_at)
    return result


def gpu_kind(origin: provenance.Provenance) -> str:
    """`8x NVIDIA H200`, from the host's last probe: what makes two hosts' numbers comparable."""
    gpus = origin.gpus
    if gpus is None or gpus.model is None:
        return f"unknown GPUs ({origin.unknown.get('gpus') or origin.unknown.get('gpus.model') or 'no probe'})"
    return f"{gpus.count}x {gpus.model}"


def facts(ctx: StepContext, campaign: document.Campaign, figures: Sequence[Figure]) -> CampaignReportFacts:
    summed = [
        ComparisonFacts(
            gpus=c.gpus,
            hosts=c.hosts,
            workload=c.workload,
            input_len=c.input_len,
            output_len=c.output_len,
            best={str(b.concurrency): b.best for b in c.best},
            tied={str(b.concurrency): b.tied for b in c.best if b.tied},
            crossover=c.crossover.concurrency,
            crossover_why=c.crossover.why,
            sla=None if c.sla is None else c.sla.facts(),
        )
        for c in campaign.comparisons
    ]
    only = summed[0] if len(summed) == 1 else None
    return CampaignReportFacts(
        json_file=str(ctx.run_dir / REPORT_JSON),
        markdown_file=str(ctx.run_dir / REPORT_MD),
        figures=[str(ctx.run_dir / f.path) for f in figures],
        counts=campaign.counts,
        comparisons=summed,
        best=only.best if only else None,
        crossover=only.crossover if only else None,
        sla=only.sla if only else None,
        failed={f.name: f.reason for f in campaign.failed},
        search=campaign.search,
    )


_EMPTY = hashlib.sha256(b"").hexdigest()


def local_result(started: datetime) -> CommandResult:
    """The result of a step that ran no command on the host: exit 0, no output."""
    from executor.transport.base import CommandResult  # here: validating a runbook imports no transport

    duration = (datetime.now(UTC) - started).total_seconds()
    return CommandResult(
        exit_code=0,
        stdout=b"",
        stderr=b"",
        stdout_total=0,
        stderr_total=0,
        stdout_sha256=_EMPTY,
        stderr_sha256=_EMPTY,
        started_at=started.isoformat(timespec="milliseconds"),
        duration_s=round(duration, 6),
    )
