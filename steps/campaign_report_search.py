"""A searched campaign's account in its report (`strategy: search`, README "Search"): per group, what the search
launched and what that cost in GPU time, against the grid's, why each configuration it never launched was left
out (the bound that excluded it, or the budget spent and the bands where it might still change the answer, as the
run recorded it), and whether its answers are proven.

GPU time is each launch's own record: the time of the instances of its cell (its launch, evals and benchmark) times
the GPUs it was launched on (tp x pp x dp of its argv; unknown counts as one), and the baseline's launch on each host
likewise. The grid's is an estimate from the same records, the baselines' time plus every configuration of the grid
at the mean of those launched: what a grid would have spent had its configurations cost what the launched ones did.
"""

from __future__ import annotations

from collections.abc import Sequence

from executor.documents import Table
from executor.runbook.model import DataModel
from executor.runbook.search import LEFT_OUT, NOT_REACHED, UNPROVEN
from executor.stepkind import StepView
from steps.benchmark import band_of
from steps.campaign_report_cells import Comparison
from steps.provenance import gpus_of

#: What a best the search left unproven says after its rule's verdict
UNPROVEN_WHY = (
    "unproven: the search's budget left a configuration never launched that might beat it here (the table Search "
    "gives its bound)"
)


class SearchAccount(DataModel):
    """One searched group's account."""

    group: str
    configurations: int  # the grid's server configurations (a launch each)
    launched: int
    never_launched: dict[str, str]  # server instance -> why (pruned with its bound, or the budget spent)
    launches: int  # launched + the baselines' (one per host)
    grid_launches: int  # configurations + the baselines'
    gpu_hours: float  # the launched configurations' and the baselines' time x GPUs
    grid_gpu_hours: float  # estimated (module docstring)
    screened_evals: int = 0  # the launches' evaluations a screen cut to their first prompts (`screened_from`)
    #: never launched because the budget was spent while they might still change an answer (their bands unproven)
    unproven: int = 0
    decided: bool = True  # every configuration launched or left out by a decision (none "not reached": a stopped run)
    unmeasured: int = 0  # launched, but a step of its cell failed: what it would have measured bounds nothing
    #: host -> the bands (`speed-bench/mixed c=4`) whose answer there a configuration the budget left open (on
    #: that host) might still change
    unproven_bands: dict[str, list[str]] = {}

    @property
    def share(self) -> float | None:
        return self.gpu_hours / self.grid_gpu_hours if self.grid_gpu_hours > 0 else None


def _gpus(view: StepView) -> int:
    argv = _facts(view).get("argv")
    return (gpus_of([str(word) for word in argv]) if isinstance(argv, list) else None) or 1


def _facts(view: StepView) -> dict[str, object]:
    return view.facts if isinstance(view.facts, dict) else {}


def _unproven(view: StepView) -> list[str]:
    """The bands a left-out server instance's facts name unproven (executor/run/searching `left_out_facts`);
    facts of any other shape (a tampered record) name none."""
    bands = _facts(view).get("unproven")
    return [b for b in bands if isinstance(b, str)] if isinstance(bands, list) else []


def _unproven_by_host(launches: Sequence[StepView]) -> dict[str, list[str]]:
    found: dict[str, set[str]] = {}
    for v in launches:
        if v.status == "skipped":
            found.setdefault(v.host, set()).update(_unproven(v))
    return {host: sorted(bands) for host, bands in found.items() if bands}


def mark_unproven(comparisons: Sequence[Comparison], accounts: Sequence[SearchAccount]) -> list[Comparison]:
    """The comparisons with each best whose band a search's budget left unproven on one of the comparison's hosts
    marked so (`unproven`, and its `why` says it): where it is read (the Best table, schedule.md,
    `--from-campaign`), not only in the note."""
    marked = []
    for c in comparisons:
        bands = {band for a in accounts for h in c.hosts for band in a.unproven_bands.get(h, [])}
        best = [
            b.model_copy(update={"unproven": True, "why": f"{b.why}; {UNPROVEN_WHY}"})
            if band_of(c.workload, None, b.concurrency) in bands
            else b
            for b in c.best
        ]
        marked.append(c.model_copy(update={"best": best}))
    return marked


def _seconds(views: Sequence[StepView]) -> float:
    return sum(v.duration_s or 0.0 for v in views)


def baseline_seconds(views: Sequence[StepView], baseline: str) -> float:
    """The baselines' GPU time: on each host, the baseline benchmark's launch and every step outside a matrix that
    ran against that server (its benchmark and evals: the same base URL), times its GPUs."""
    total = 0.0
    for bench in (v for v in views if v.step == baseline and isinstance(v.facts, dict)):
        launch = next((v for v in views if v.step == bench.facts.get("server") and v.host == bench.host), None)
        if launch is None or not isinstance(launch.facts, dict):
            continue
        url = launch.facts.get("base_url")
        against = [
            v
            for v in views
            if v.host == bench.host
            and v.group is None
            and v is not launch
            and isinstance(v.facts, dict)
            and v.facts.get("base_url") == url
        ]
        total += (_seconds(against) + (launch.duration_s or 0.0)) * _gpus(launch)
    return total


def account(views: Sequence[StepView], baseline: str) -> list[SearchAccount]:
    """One account per matrix group whose launches the search left some out of (a grid's has none)."""
    accounts = []
    base = baseline_seconds(views, baseline)
    hosts = len({v.host for v in views if v.step == baseline})
    for group in dict.fromkeys(v.group for v in views if v.group and v.kind == "deploy"):
        launches = [v for v in views if v.group == group and v.kind == "deploy"]
        left_out = {
            v.step: (v.message or "").removeprefix(LEFT_OUT)
            for v in launches
            if v.status == "skipped" and (v.message or "").startswith(LEFT_OUT)
        }
        if not left_out:
            continue
        ran = [v for v in launches if v.status in ("passed", "failed")]
        cells = [
            [m for m in views if m.group == group and m.host == v.host and dict(m.cell) == dict(v.cell)] for v in ran
        ]
        cost = [_seconds(cell) * _gpus(v) for v, cell in zip(ran, cells, strict=True)]
        mean = sum(cost) / len(cost) if cost else 0.0
        accounts.append(
            SearchAccount(
                group=group,
                configurations=len(launches),
                launched=len(ran),
                never_launched=left_out,
                launches=len(ran) + hosts,
                grid_launches=len(launches) + hosts,
                gpu_hours=round((base + sum(cost)) / 3600, 6),
                grid_gpu_hours=round((base + mean * len(launches)) / 3600, 6),
                unproven=sum(1 for why in left_out.values() if UNPROVEN in why),
                decided=not any(why.endswith(NOT_REACHED) for why in left_out.values()),
                unmeasured=sum(1 for cell in cells if any(m.status == "failed" for m in cell)),
                unproven_bands=_unproven_by_host(launches),
                screened_evals=sum(
                    1
                    for v in views
                    if v.group == group and v.kind == "eval_acceptance" and _facts(v).get("screened_from")
                ),
            )
        )
    return accounts


def notes(accounts: Sequence[SearchAccount]) -> list[str]:
    """A line per searched group: launches and GPU time against the grid's."""
    said = []
    for a in accounts:
        share = "" if a.share is None else f" ({a.share:.0%})"
        said.append(
            f"group {a.group} searched (strategy: search): {a.launched} of its {a.configurations} configurations "
            f"launched, {a.launches} of the grid's {a.grid_launches} launches with the baselines; GPU time "
            f"{a.gpu_hours:.4g} GPU-hours{share} against the grid's estimated {a.grid_gpu_hours:.4g} (the baselines' "
            f"and each configuration at the launched ones' mean); the {len(a.never_launched)} never launched are in "
            "the table Search, each with why (the bounds of the search's decision, where it made one)."
            + _proof(a)
            + (
                f" {a.screened_evals} evaluation{'s were' if a.screened_evals > 1 else ' was'} screened: a few "
                "prompts of each set (`screened_from` in the facts); the whole evaluation, with its gates, runs where "
                "the winner is deployed."
                if a.screened_evals
                else ""
            )
        )
    return said


def _proof(a: SearchAccount) -> str:
    """What the account says of its answers: proven only where every configuration was decided and every launch
    measured; the budget's unproven bands; nothing of a stopped run's."""
    said = ""
    if a.unproven:
        said += (
            f" The budget ended the search with {a.unproven} of them able to change an answer: in the bands named for "
            "each (in the table, and all in the run's search record with their bounds against the answer's measure), "
            "the answer is the best measured, not proven; a larger budget settles them."
        )
    if a.unmeasured:
        said += (
            f" {a.unmeasured} launched configuration{'s' if a.unmeasured > 1 else ''} measured nothing whole (a step "
            "of its cell failed): the answers are unproven against it."
        )
    if not said and a.decided:
        said = " Every configuration was decided: each answer is proven against the bounds."
    return said


def tables(accounts: Sequence[SearchAccount]) -> list[Table]:
    rows = [[a.group, config, why] for a in accounts for config, why in a.never_launched.items()]
    if not rows:
        return []
    return [
        Table(
            title="Search: configurations never launched, and why", columns=["group", "configuration", "why"], rows=rows
        )
    ]
