"""The cells of a campaign as its report sees them, and the choices the report makes from them.

Pure functions of the earlier steps' records (`StepView`s), so the same records always give the same
report and every choice can be tested offline:

- `collect`: one `CellReport` per benchmark instance of a matrix group on each host, with the instances of
  its group on that host whose axis values agree with its own (its deploy, its evals, a failed download):
  its status (failed when any of them failed, skipped when its benchmark did not run), the launch its
  deploy recorded, the acceptance its evals measured, its points and its speedup over the baseline
  benchmark of the same host; and one `CellReport` per host for that baseline;
- `compare`: the cells that may be compared (one GPU kind, one workload) -> the best configuration per
  concurrency, the crossover and the launch command to paste per concurrency range.

The best configuration at a concurrency is named only when it beats every other beyond the noise of the
repeats and the `tolerance`: the fastest (median output throughput over the repeats) beats a configuration
when its slowest repeat is faster than that one's fastest repeat (their min-max ranges do not overlap) and
its median is more than `tolerance` above. Those it does not beat are tied with it (`Best.tied`), and the
report recommends the cheapest of the tie: the one using the fewest GPUs, then no speculation, then the
fewest draft tokens, then the smallest tree budget (DDTREE) (`CellReport.cost`). A point of one
repeat has no spread: only the tolerance ties it.
"""

from __future__ import annotations

import dataclasses
import json
import math
import shlex
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from pydantic import ValidationError

from executor.runbook.campaign import AxisValue, cell_text
from executor.runbook.model import DataModel
from executor.stepkind import StepView, shape_errors
from steps.benchmark_report import Acceptance, BenchmarkFacts, Side, Speedup, speedup, tok_s
from steps.benchmark_results import BenchPoint
from steps.benchmark_workloads import DEFAULT, RANDOM_IDS
from steps.campaign_parity import launch_difference
from steps.campaign_report_sla import SlaAnswer
from steps.campaign_report_sla import answer as sla_answer
from steps.provenance import gpus_of
from steps.server.documents import DeployFacts

Status = Literal["passed", "failed", "skipped"]


class Launch(DataModel):
    """The server a cell measured, as its deploy step recorded it."""

    deploy: str | None  # the deploy step (instance)
    algorithm: str | None  # None: no speculative decoding
    draft_tokens: int | None  # --speculative-num-draft-tokens as chosen
    budget: int | None  # --speculative-ddtree-budget as chosen
    gpus: int | None  # GPUs the server runs on (tp x pp x dp of its argv)
    draft_model: str | None  # --speculative-draft-model-path
    argv: list[str] | None
    server_version: str | None

    @property
    def command(self) -> str | None:
        """The launch command, ready to paste."""
        return None if self.argv is None else shlex.join(self.argv)


class CellPoint(DataModel):
    """One concurrency of a cell: medians and min-max over its repeats, and its speedup."""

    concurrency: int
    repeats: int
    output_throughput: tuple[float, float, float] | None  # (median, min, max) tokens/s
    tpot_ms: tuple[float, float, float] | None  # of the runs' median TPOT
    ttft_ms: tuple[float, float, float] | None  # of the runs' median TTFT
    noisy: bool
    speedup: float | None  # over the same host's baseline at this concurrency
    # where its benchmark stated SLOs: the client's request_goodput (req/s) and slo_attainment (steps/benchmark_slo.py)
    goodput: tuple[float, float, float] | None = None
    slo_attainment: tuple[float, float, float] | None = None


class CellReport(DataModel):
    """One measured configuration on one host: a matrix cell's benchmark instance, or a host's baseline."""

    name: str  # `dflash[drafter=zlab,tokens=4]` (`@host` added when the campaign spans several hosts)
    group: str | None  # None for a baseline
    host: str
    values: dict[str, Any]  # the benchmark instance's axis values
    status: Status
    reason: str | None  # why it failed or was skipped: `INSTANCE: message`
    benchmark: str  # the benchmark step (instance)
    # the workload (and SPEED-Bench category) of its points: a benchmark of several gives a report for each,
    # compared on its own (a drafter can win on chat and lose on code)
    workload: str = RANDOM_IDS
    dataset: str = "random-ids"
    input_len: int | None
    output_len: int | None
    launch: Launch
    acceptance: list[Acceptance]  # one per eval instance of the cell (e.g. thinking on and off)
    points: list[CellPoint]
    speedup: Speedup | None  # None: a baseline, or no baseline of the same workload on its host
    speedup_unknown: str | None  # why speedup is None for a cell
    slo_ms: dict[str, float] | None = None  # the SLOs its benchmark measured goodput against (the client's keys)

    @property
    def baseline(self) -> bool:
        return self.group is None

    @property
    def cost(self) -> tuple[float, int, float, float, str]:
        """What choosing it costs, smaller first: GPUs, then speculation (no drafter is cheapest), then draft
        tokens (unknown: SGLang's default, counted as the most), then the DDTree budget (none: no tree); the name
        last so that the choice never depends on the order of the records. Draft tokens and budget are two keys:
        one `tokens or budget` key let the name decide between budgets of equal draft tokens (`ddtree-128`
        before `ddtree-32`)."""
        launch = self.launch
        return (
            math.inf if launch.gpus is None else launch.gpus,
            0 if launch.algorithm is None else 1,
            math.inf if launch.draft_tokens is None else launch.draft_tokens,
            0 if launch.budget is None else launch.budget,
            self.name,
        )

    def throughput_at(self, concurrency: int) -> float | None:
        """Its median output throughput at `concurrency`; None where unmeasured or not above 0 (a server that
        produced no token is no configuration to choose)."""
        spread = self.throughput_spread_at(concurrency)
        return None if spread is None else spread[0]

    def throughput_spread_at(self, concurrency: int) -> tuple[float, float, float] | None:
        """`throughput_at` with the min and max over the repeats: (median, min, max)."""
        for p in self.points:
            if p.concurrency == concurrency and p.output_throughput is not None and p.output_throughput[0] > 0:
                return p.output_throughput
        return None


def consistent(a: Mapping[str, AxisValue], b: Mapping[str, AxisValue]) -> bool:
    """Whether two instances can be of one cell: every axis both use has the same value."""
    return all(a[axis] == b[axis] for axis in a.keys() & b.keys())


def _three(spread: Any) -> tuple[float, float, float] | None:
    return None if spread is None else (spread.median, spread.min, spread.max)


def read_facts(model: type[Any], view: StepView | None) -> Any:
    """The facts of a passed step as `model`; None when it did not pass or its facts do not fit, a NaN or
    an infinity included (a tampered state.db): no report shows, ranks or plots such a number."""
    return checked_facts(model, view)[0]


def checked_facts(model: type[Any], view: StepView | None) -> tuple[Any, str | None]:
    """`read_facts`, with why the recorded facts of a passed step are unusable (None when they fit or it did not
    pass), so that a cell whose numbers a report cannot use says so instead of showing no number without a word."""
    if view is None or view.status != "passed" or view.facts is None:
        return None, None
    try:
        json.dumps(view.facts, allow_nan=False)
        return model.model_validate(view.facts), None
    except ValidationError as exc:
        return None, shape_errors(exc)
    except (ValueError, TypeError) as exc:  # NaN or infinity: json's own message; a 5000-digit integer's
        return None, str(exc)[:200]


def _launch(view: StepView | None) -> Launch:
    facts: DeployFacts | None = read_facts(DeployFacts, view)
    if facts is None:
        return Launch(
            deploy=None if view is None else view.step,
            algorithm=None,
            draft_tokens=None,
            budget=None,
            gpus=None,
            draft_model=None,
            argv=None,
            server_version=None,
        )

    def chosen(name: str) -> int | None:
        choice = facts.choices.get(name)
        value = None if choice is None else choice.value
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    return Launch(
        deploy=view.step if view else None,
        algorithm=facts.speculative_algorithm,
        draft_tokens=chosen("speculative_num_draft_tokens"),
        budget=chosen("speculative_ddtree_budget"),
        gpus=gpus_of(facts.argv),
        draft_model=facts.draft_model_path,
        argv=facts.argv,
        server_version=facts.server_version,
    )


def _side(view: StepView, facts: BenchmarkFacts) -> Side:
    return Side(
        step=view.step,
        label=view.step,
        input_len=facts.input_len,
        output_len=facts.output_len,
        workloads=facts.workloads or [DEFAULT.resolved(False)],  # facts from before workloads: random ids
        runs=facts.runs,
        points=facts.points,
    )


def per_workload(cell: CellReport, view: StepView, facts: BenchmarkFacts | None) -> list[CellReport]:
    """The cell's report split by the workloads (and SPEED-Bench categories) its benchmark ran, each with its
    points and its speedup over the baseline's same workload; named `NAME (speed/mixed)` where the benchmark
    ran other than random ids alone."""
    if facts is None or not facts.points:
        return [cell]
    side = _side(view, facts)
    keys = side.slices()
    reports = []
    for key in keys:
        part = cell.speedup.by_workload.get(key) if cell.speedup else None
        gain = None if part is None else Speedup(**part.model_dump(), by_workload={key: part})
        unknown = cell.speedup_unknown
        if cell.speedup is not None and gain is None:
            unknown = f"the baseline ran no workload {key}"
        workload = side.workload(key)
        name = cell.name if keys == [RANDOM_IDS] else f"{cell.name} ({key})"
        reports.append(
            cell.model_copy(
                update={
                    "name": name,
                    "workload": key,
                    "dataset": workload.dataset if workload else "random-ids",
                    "points": _points(side.sliced(key).points, gain),
                    "speedup": gain,
                    "speedup_unknown": unknown,
                }
            )
        )
    return reports


def _points(points: Sequence[BenchPoint], gain: Speedup | None) -> list[CellPoint]:
    by = gain.by_concurrency if gain else {}
    return [
        CellPoint(
            concurrency=p.max_concurrency,
            repeats=p.repeats,
            output_throughput=_three(p.output_throughput),
            tpot_ms=_three(p.median_tpot_ms),
            ttft_ms=_three(p.median_ttft_ms),
            noisy=p.noisy,
            speedup=by.get(str(p.max_concurrency)),
            goodput=_three(p.request_goodput),
            slo_attainment=_three(p.slo_attainment),
        )
        for p in points
    ]


def _status(own: StepView, mates: Sequence[StepView]) -> tuple[Status, str | None]:
    failed = [m for m in mates if m.status == "failed"]
    if failed:
        return "failed", f"{failed[0].step}: {failed[0].message or 'failed'}"
    if own.status != "passed":
        return "skipped", f"{own.step}: {own.message or own.status}"
    return "passed", None


def collect(views: Sequence[StepView], baseline: str, may_differ: Sequence[str] = ()) -> list[CellReport]:
    """The baseline of each host, then every cell's benchmark on each host, in run order. A cell whose launch
    differs from its host's baseline's in a flag beyond the speculative ones and `may_differ` gets no speedup."""
    several = len({v.host for v in views}) > 1
    steps = {(v.host, v.step): v for v in views}
    benchmarks = [v for v in views if v.kind == "benchmark"]
    bases = [v for v in benchmarks if v.step == baseline]
    baselines = {v.host: (v, read_facts(BenchmarkFacts, v)) for v in bases}
    launches: dict[str, Launch] = {}  # each host's baseline launch
    reports = []
    for view in [*bases, *(v for v in benchmarks if v.group is not None and v.step != baseline)]:
        is_cell = view.step != baseline
        mates = [
            m
            for m in views
            if is_cell
            and m.group == view.group
            and m.host == view.host
            and consistent(m.cell, view.cell)
            and m is not view
        ]
        facts, unusable = checked_facts(BenchmarkFacts, view)
        deploy = steps.get((view.host, facts.server)) if facts else None
        deploy = deploy or next((m for m in mates if m.kind == "deploy"), None)
        status, reason = _status(view, [*mates, view])
        if unusable is not None and status == "passed":  # passed, but its recorded numbers cannot be used
            status, reason = "failed", f"{view.step}: its recorded facts are unusable: {unusable}"
        gain, unknown = _speedup(view, facts, baselines.get(view.host)) if is_cell else (None, None)
        launch = _launch(deploy)
        base_launch = launches.setdefault(view.host, launch) if not is_cell else launches.get(view.host)
        unlike = _unlike(base_launch, launch, may_differ) if is_cell and gain is not None else None
        gain, unknown = (None, unlike) if unlike else (gain, unknown)
        name = f"{view.group}[{cell_text(view.cell)}]" if is_cell else view.step
        cell = CellReport(
            name=name + (f"@{view.host}" if several else ""),
            group=view.group if is_cell else None,
            host=view.host,
            values=dict(view.cell),
            status=status,
            reason=reason,
            benchmark=view.step,
            input_len=facts.input_len if facts else None,
            output_len=facts.output_len if facts else None,
            launch=launch,
            acceptance=[a for a in (_acceptance(m) for m in mates if m.kind == "eval_acceptance") if a is not None],
            points=[],
            speedup=gain,
            speedup_unknown=unknown,
            slo_ms=next((r.slo_ms for r in facts.runs if r.slo_ms), None) if facts else None,
        )
        reports += per_workload(cell, view, facts)
    return reports


def _speedup(
    view: StepView, facts: BenchmarkFacts | None, base: tuple[StepView, BenchmarkFacts | None] | None
) -> tuple[Speedup | None, str | None]:
    if facts is None:
        return None, None
    base_view, base_facts = base or (None, None)
    if base_view is None or base_facts is None:
        return None, f"no baseline benchmark passed on host {view.host}"
    if (base_facts.input_len, base_facts.output_len) != (facts.input_len, facts.output_len):
        return None, (
            f"the baseline {base_view.step} ran {base_facts.input_len} input / {base_facts.output_len} output tokens, "
            f"this cell {facts.input_len} / {facts.output_len}"
        )
    return speedup(_side(base_view, base_facts), _side(view, facts)), None


def _unlike(baseline: Launch | None, cell: Launch, may_differ: Sequence[str]) -> str | None:
    """Why a cell may not be compared with its baseline: their argv differ beyond the speculative flags."""
    if baseline is None or baseline.argv is None or cell.argv is None:
        return None
    return launch_difference(baseline.argv, cell.argv, may_differ)


def _acceptance(view: StepView) -> Acceptance | None:
    if not isinstance(view.facts, dict):
        return None
    acceptance: Acceptance | None = read_facts(
        Acceptance, dataclasses.replace(view, facts={**view.facts, "step": view.step})
    )
    return acceptance


# ---- choosing ------------------------------------------------------------------------------------------


class Best(DataModel):
    """The choice at one concurrency: the best configuration, or the cheapest of those tied at the top."""

    concurrency: int
    best: str  # the chosen cell's name: the one that beats every other, or the cheapest of `tied`
    host: str
    output_throughput: float  # its median
    fastest: str
    fastest_throughput: float
    #: the configurations the fastest does not beat beyond the noise of the repeats and the tolerance (itself
    #: included), cheapest first; empty when the best beats every other (no tie)
    tied: list[str]
    why: str  # the rule's verdict in words: what the best beats and by how much, or what is tied
    #: a search's budget left a configuration never launched that might beat it (campaign_report_search)
    unproven: bool = False


class Crossover(DataModel):
    """The first concurrency from which no speculative configuration beats its baseline, or null and why."""

    concurrency: int | None
    why: str


class Recommendation(DataModel):
    """A run of consecutive concurrencies with the same best configuration, and how to launch it."""

    concurrencies: list[int]
    best: str
    host: str
    command: str | None  # shlex-joined argv of its deploy; None when the deploy's facts have none
    unknown: str | None  # why command is None
    on_tie: list[int] = []  # the concurrencies at which it is recommended as the cheapest of a tie


class Comparison(DataModel):
    """The cells compared with one another: one GPU kind (unless told otherwise) and one workload."""

    gpus: str  # "8x NVIDIA H200", or "any" when told to compare across GPU kinds
    hosts: list[str]
    workload: str = RANDOM_IDS  # its label (and SPEED-Bench category: `speed/mixed`)
    dataset: str = "random-ids"
    input_len: int
    output_len: int
    cells: list[str]  # the names of the passed cells (baselines included) compared
    best: list[Best]
    crossover: Crossover
    recommended: list[Recommendation]
    sla: SlaAnswer | None = None  # where the benchmarks state SLOs (steps/campaign_report_sla.py)

    @property
    def shown_workload(self) -> str:
        """`random-ids, 1024 in / 512 out`, or `speed/mixed, 512 out` (a dataset's prompts are of any length)."""
        if self.dataset == "random-ids":
            return f"{self.workload}, {self.input_len} in / {self.output_len} out"
        return f"{self.workload}, {self.output_len} out"


def choose(cells: Sequence[CellReport], concurrency: int, tolerance: float) -> Best | None:
    """The best cell at `concurrency`, or the cheapest of those tied at the top (see the module's docstring);
    None when none measured it."""
    measured = [(c, t) for c in cells if (t := c.throughput_spread_at(concurrency)) is not None]
    if not measured:
        return None
    ranked = sorted(measured, key=lambda ct: (-ct[1][0], ct[0].cost))  # a tie of medians goes to the cheaper
    fastest, top = ranked[0]

    def beaten(spread: tuple[float, float, float]) -> bool:
        return spread[0] < (1 - tolerance) * top[0] and spread[2] < top[1]

    top_group = sorted((c for c, t in measured if not beaten(t)), key=lambda c: c.cost)
    chosen = top_group[0]
    tied = [c.name for c in top_group] if len(top_group) > 1 else []
    return Best(
        concurrency=concurrency,
        best=chosen.name,
        host=chosen.host,
        output_throughput=chosen.throughput_at(concurrency) or 0.0,
        fastest=fastest.name,
        fastest_throughput=top[0],
        tied=tied,
        why=_tie_why(fastest.name, tolerance) if tied else _beats_why(ranked, tolerance),
    )


def _beats_why(ranked: Sequence[tuple[CellReport, tuple[float, float, float]]], tolerance: float) -> str:
    """Why the fastest is the best: its slowest repeat against the runner-up's fastest, and their medians."""
    if len(ranked) == 1:
        return "the only configuration measured"
    (_, best), (runner, second) = ranked[0], ranked[1]
    return (
        f"beats the runner-up {runner.name} beyond the noise: its slowest repeat {tok_s(best[1])} tok/s > the "
        f"runner-up's fastest {tok_s(second[2])}; median +{best[0] / second[0] - 1:.1%} (> {percent(tolerance)})"
    )


def percent(fraction: float) -> str:
    """A tolerance in percent as given (0.005: `0.5%`, 0.025: `2.5%`): `:.0%` said 0% and 2%, a rule other than
    the one applied."""
    return f"{fraction * 100:.6g}%"


def _tie_why(fastest: str, tolerance: float) -> str:
    return (
        f"tied: the fastest, {fastest}, is not faster than the others beyond the noise (their min-max ranges over "
        f"the repeats overlap) or by more than {percent(tolerance)}; the cheapest is recommended"
    )


def crossover(cells: Sequence[CellReport], concurrencies: Sequence[int]) -> Crossover:
    """Scanning down from the highest concurrency, the last one at which no speculative cell beats its baseline."""
    speculative = [c for c in cells if not c.baseline]
    if not speculative:
        return Crossover(concurrency=None, why="no speculative configuration passed: nothing to cross over")
    if not concurrencies:
        return Crossover(concurrency=None, why="no concurrency was measured")

    def speedups(concurrency: int) -> list[float]:
        points = [p for c in speculative for p in c.points if p.concurrency == concurrency]
        return [p.speedup for p in points if p.speedup is not None]

    def beats(concurrency: int) -> bool:
        return any(s > 1.0 for s in speedups(concurrency))

    known = [c for c in concurrencies if speedups(c)]  # where no speedup is known, none is shown not to pay
    if not known:
        why = "no speedup over a baseline is known (no baseline of the same workload passed on the cells' hosts)"
        return Crossover(concurrency=None, why=why)
    found: int | None = None
    for concurrency in sorted(known, reverse=True):
        if beats(concurrency):
            break
        found = concurrency
    if found is None:
        return Crossover(
            concurrency=None, why=f"speculation still pays at the highest concurrency measured ({max(concurrencies)})"
        )
    lower = [c for c in known if c < found]
    return Crossover(
        concurrency=found,
        why=f"from concurrency {found} on, no speculative configuration beats its host's baseline"
        + ("" if lower else " (it never did at any concurrency measured)"),
    )


def recommend(cells: Sequence[CellReport], best: Sequence[Best]) -> list[Recommendation]:
    """The runs of consecutive concurrencies (in `best`'s order) sharing a best cell, each with its launch command;
    on a tie the cheapest of the tied is the one recommended (`choose`)."""
    by_name = {c.name: c for c in cells}
    runs: list[Recommendation] = []
    for b in best:
        if not runs or runs[-1].best != b.best:
            launch = by_name[b.best].launch
            command = launch.command
            unknown = None if command else f"the deploy step {launch.deploy or '(none)'} recorded no launch command"
            runs.append(Recommendation(concurrencies=[], best=b.best, host=b.host, command=command, unknown=unknown))
        runs[-1].concurrencies.append(b.concurrency)
        runs[-1].on_tie += [b.concurrency] if b.tied else []
    return runs


def compare(
    cells: Sequence[CellReport], gpu_kinds: Mapping[str, str], tolerance: float, across_gpus: bool
) -> list[Comparison]:
    """One comparison per GPU kind (hosts grouped by `gpu_kinds`: host -> kind) and workload, of the passed
    cells with points (none where only the baseline passed); every kind together when `across_gpus`."""
    keyed: dict[tuple[str, str, str, int, int], list[CellReport]] = {}
    for c in cells:
        if c.status != "passed" or not c.points or c.input_len is None or c.output_len is None:
            continue
        kind = "any" if across_gpus else gpu_kinds.get(c.host, "unknown")
        keyed.setdefault((kind, c.workload, c.dataset, c.input_len, c.output_len), []).append(c)
    comparisons = []
    for (kind, workload, dataset, input_len, output_len), members in keyed.items():
        if all(c.baseline for c in members):  # no cell of the campaign passed there: nothing to choose from
            continue
        concurrencies = sorted({p.concurrency for c in members for p in c.points})
        best = [b for b in (choose(members, c, tolerance) for c in concurrencies) if b is not None]
        comparisons.append(
            Comparison(
                gpus=kind,
                hosts=list(dict.fromkeys(c.host for c in members)),
                workload=workload,
                dataset=dataset,
                input_len=input_len,
                output_len=output_len,
                cells=[c.name for c in members],
                best=best,
                crossover=crossover(members, [b.concurrency for b in best]),
                recommended=recommend(members, best),
                sla=sla_answer(members),
            )
        )
    return comparisons
