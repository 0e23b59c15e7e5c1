"""The pure decisions of a campaign's `strategy: search` (executor.runbook.search), driven in-process over whole
landscapes (configuration -> band -> measure) as a run would: prune, launch the next, measure it, until none is
left. On the grid recorded on our SGLang stand-in it launches at most half of the grid's launches and still finds
each band's answer (the grid's best, or one the campaign report finds tied with it), every configuration ends
decided and every prune names its bands with bound and incumbent. On a synthetic landscape of another optimum
(the second drafter, a DDTREE budget at low concurrency) and on the grid recorded on the stand-in's `headroom`
landscape of such an optimum, it finds every answer within the same budget of half the grid's launches, and what
the budget left open says which answers it might still change, with its bounds (no set of that many launches
proves those grids under the bounds); with no budget it proves every answer. Over
random inputs: a concave curve's bound never lies below the curve and a convex one's never above, the search is
deterministic, and a configuration beating every other by half is never pruned. And the recorded decision and the
budget's model."""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from executor.runbook.loader import load_runbook
from executor.runbook.search import (
    SCREEN_MARGIN,
    Band,
    Decision,
    Measure,
    Position,
    Search,
    SearchBudget,
    curve_bound,
)

STANDIN_FILE = Path(__file__).parent / "search_landscapes" / "standin_flagship.json"
#: the same grid on the stand-in's `headroom` landscape (sandbox/demo.py LANDSCAPES, `python3 -m
#: sandbox.record_landscape headroom FILE`): z-lab's drafter everywhere, a DDTREE budget at concurrency 1
HEADROOM_FILE = Path(__file__).parent / "search_landscapes" / "standin_headroom.json"
TOLERANCE = 0.02  # the campaign report's and SearchSpec's default
BASELINE = "the baseline"  # the name Search.incumbent gives it
INSTANCE = re.compile(r"\[drafter=(?P<drafter>[^,\]]+),spec=(?P<spec>(?P<algorithm>dflash|ddtree)-(?P<tokens>\d+))\]$")
#: the grid's settings: (algorithm, draft tokens for DFLASH or tree budget for DDTREE)
SPECS = [("dflash", 4), ("dflash", 8), ("dflash", 16), ("ddtree", 16), ("ddtree", 32), ("ddtree", 64)]
CONCURRENCIES = [1, 4, 16, 32]


@dataclass(frozen=True)
class Landscape:
    """What every launch of a grid measures: the baseline's bands, and each configuration's (deploy instance id)
    in the group's order."""

    baseline: dict[Band, Measure]
    configs: dict[str, dict[Band, Measure]]


def load_landscape(path: Path) -> Landscape:
    """A recorded landscape: `baseline` -> band -> [median, min, max, accept], `configs` -> instance -> same."""
    data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))

    def bands(rows: dict[str, list[Any]]) -> dict[Band, Measure]:
        return {band: Measure(*row) for band, row in rows.items()}

    return Landscape(bands(data["baseline"]), {config: bands(rows) for config, rows in data["configs"].items()})


def position(config: str) -> Position:
    """Where a deploy instance sits: DFLASH verifies its draft tokens, DDTREE its budget and the root."""
    found = INSTANCE.search(config)
    assert found is not None, config
    tokens = int(found["tokens"])
    if found["algorithm"] == "dflash":
        return Position(found["drafter"], "DFLASH", tokens, (1.0, float(tokens), 0.0), found["spec"])
    return Position(found["drafter"], "DDTREE", tokens + 1, (1.0, math.inf, float(tokens)), found["spec"])


def landscape_search(landscape: Landscape) -> Search:
    """A search over the landscape's configurations, its baseline measured."""
    return Search({c: position(c) for c in landscape.configs}, TOLERANCE, baseline=dict(landscape.baseline))


def drive(search: Search, landscape: Landscape, budget: int | None = None) -> None:
    """The driver's loop: prune, launch the next (every configuration a candidate), measure it, until none is left
    or `budget` launches were made (then every open one is left unexplored, as the driver does)."""
    while True:
        search.prune()
        if budget is not None and len(launched(search)) >= budget:
            for config in search.open():
                search.unexplored(config, f"the search's budget of {budget} launches was spent")
            return
        chosen = search.next_launch(list(landscape.configs))
        if chosen is None:
            return
        search.decide("launch", *chosen)
        search.measured[chosen[0]] = dict(landscape.configs[chosen[0]])


def launched(search: Search) -> list[str]:
    return [d.config for d in search.decisions if d.action == "launch"]


def tied_with_best(landscape: Landscape, band: Band) -> set[str]:
    """The grid's answers to a band: its best by median and those the report finds tied with it (within the
    tolerance, where the report deploys the cheaper)."""
    medians = {BASELINE: landscape.baseline[band].median}
    medians |= {c: measures[band].median for c, measures in landscape.configs.items()}
    best = max(medians.values())
    return {name for name, median in medians.items() if median >= (1 - TOLERANCE) * best}


def assert_answers(search: Search, landscape: Landscape) -> None:
    """Every band's incumbent is one of the grid's answers to it."""
    for band in landscape.baseline:
        top = search.incumbent(band)
        assert top is not None
        assert top[0] in tied_with_best(landscape, band), band


def assert_half_of_the_grid(search: Search, landscape: Landscape) -> None:
    """At most half of the grid's launches, the baseline's included."""
    assert 2 * (len(launched(search)) + 1) <= len(landscape.configs) + 1, launched(search)


def acceptance(drafter_factor: float, q: float, algorithm: str, verified: int) -> float:
    """A drafter's acceptance length at `verified` tokens: concave, 1 at one token; a tree accepts a bit more."""
    return 1 + drafter_factor * (1.08 if algorithm == "ddtree" else 1.0) * (1 - q ** (verified - 1))


def modelled_landscape(
    drafters: dict[str, float], q: float, slope: dict[int, float], workloads: dict[str, float], spread: float
) -> Landscape:
    """A landscape from the physical model: throughput = base(conc) x acceptance / cost, the cost per token
    convex in the tokens verified (1 + slope(conc) x (n - 1), the target's, whatever the drafter), acceptance as
    `acceptance` with the drafter's factor scaled by the workload; repeats within +-spread of the median."""

    def measure(median: float, accept: float | None) -> Measure:
        return Measure(median, median * (1 - spread), median * (1 + spread), accept)

    def bands(drafter_factor: float | None, algorithm: str, verified: int) -> dict[Band, Measure]:
        found = {}
        for workload, scale in workloads.items():
            for conc, k in slope.items():
                accept = None if drafter_factor is None else acceptance(drafter_factor * scale, q, algorithm, verified)
                throughput = 5000.0 * conc * (accept or 1.0) / (1 + k * (verified - 1))
                found[f"{workload} c={conc}"] = measure(throughput, accept)
        return found

    configs = {
        f"deploy_dflash[drafter={drafter},spec={algorithm}-{tokens}]": bands(
            factor, algorithm, tokens if algorithm == "dflash" else tokens + 1
        )
        for drafter, factor in drafters.items()
        for algorithm, tokens in SPECS
    }
    return Landscape(bands(None, "", 1), configs)


#: the second drafter (zlab) wins everywhere; long drafts are accepted (q 0.9) and verifying is nearly free at
#: concurrency 1, so a DDTREE budget wins there (ddtree-32), ddtree-16 at 4, dflash-8 at 16 (dflash-4 on the
#: low-acceptance workload), dflash-4 or the baseline at 32
ZLAB_TREES = modelled_landscape(
    {"tmp-long": 3.0, "zlab": 4.0},
    q=0.9,
    slope={1: 0.004, 4: 0.02, 16: 0.1, 32: 0.3},
    workloads={"chat": 1.0, "random-ids": 0.4},
    spread=0.01,
)


#: the bar's budget on a grid of 12 configurations: 5 launches, 6 of the grid's 13 with the baseline's
HALF = 5


def assert_unproven_where_open(search: Search, landscape: Landscape) -> set[Band]:
    """Each configuration the budget left open names the bands where it might still change the answer, with its
    bound there (never excluded: at least tied with the incumbent) against the incumbent's median; those bands."""
    open_bands: set[Band] = set()
    for decision in (d for d in search.decisions if d.action == "unexplored"):
        assert decision.evidence, decision
        for band, (bound, incumbent) in decision.evidence.items():
            top = search.incumbent(band)
            assert top is not None and incumbent == round(top[1].median, 3)
            assert bound >= (1 - TOLERANCE) * incumbent
            assert f"{band}: up to {bound:.0f} tok/s (" in decision.reason, decision.reason
        open_bands |= set(decision.evidence)
    return open_bands


def test_the_stand_in_grid_is_answered_with_at_most_half_of_its_launches() -> None:
    """On the 12-configuration grid recorded on the stand-in: at most 5 launched (6 of 13 with the baseline),
    every band's incumbent one of the grid's answers, every configuration decided (launched or pruned)."""
    landscape = load_landscape(STANDIN_FILE)
    search = landscape_search(landscape)
    drive(search, landscape)
    assert len(launched(search)) <= 5, launched(search)
    assert_half_of_the_grid(search, landscape)
    assert_answers(search, landscape)
    assert search.open() == []
    assert sorted(d.config for d in search.decisions) == sorted(landscape.configs)


def test_the_stand_in_grid_measured_twice_over_is_answered_in_every_band_with_one_launch_more() -> None:
    """The same grid with two repeats per point (`--var bench_repeats=2`): the repeats' noise makes zlab's DFLASH 4
    the best at speed-bench c=32 by 3.4% (beyond the tolerance; with one repeat tmp-long's was), so the grid's
    answers are four configurations. The search names each, launching 6 of 12 (7 of the grid's 13 launches with
    the baseline: over half by one; the one more is zlab's DFLASH 4, an answer). Within the bar's budget it misses
    that band, and its record says the band is unproven, with zlab's DFLASH 4's bound there."""
    landscape = load_landscape(STANDIN_FILE.with_name("standin_flagship_2repeats.json"))
    assert tied_with_best(landscape, "speed-bench/mixed c=32") == {"deploy_dflash[drafter=zlab,spec=dflash-4]"}
    search = landscape_search(landscape)
    drive(search, landscape)
    assert_answers(search, landscape)
    assert len(launched(search)) <= 6 and "deploy_dflash[drafter=zlab,spec=dflash-4]" in launched(search)
    within = landscape_search(landscape)  # with the bar's budget: that band missed, and said to be unproven
    drive(within, landscape, budget=HALF)
    [missed] = [b for b in landscape.baseline if within.incumbent(b)[0] not in tied_with_best(landscape, b)]
    [left] = [d for d in within.decisions if d.action == "unexplored"]
    assert (missed, left.config) == ("speed-bench/mixed c=32", "deploy_dflash[drafter=zlab,spec=dflash-4]")
    assert missed in assert_unproven_where_open(within, landscape)


def test_each_prune_on_the_stand_in_grid_gives_its_bands_and_numbers() -> None:
    """A prune's reason names every band; its evidence gives, for each, a bound below the incumbent's median or
    within the tolerance of it."""
    landscape = load_landscape(STANDIN_FILE)
    search = landscape_search(landscape)
    drive(search, landscape)
    pruned = [d for d in search.decisions if d.action == "prune"]
    assert pruned
    for decision in pruned:
        assert decision.reason
        assert set(decision.evidence) == set(landscape.baseline)
        for band, (bound, incumbent) in decision.evidence.items():
            assert f"{band}: at most" in decision.reason
            assert bound <= (1 + TOLERANCE) * incumbent, (decision.config, band)


def test_a_landscape_of_another_optimum_is_answered_in_every_band() -> None:
    """Where zlab wins and a DDTREE budget is fastest at low concurrency, dflash-4 or the baseline at high:
    every band's incumbent is one of the grid's answers, every configuration decided."""
    assert tied_with_best(ZLAB_TREES, "chat c=1") == {"deploy_dflash[drafter=zlab,spec=ddtree-32]"}
    assert tied_with_best(ZLAB_TREES, "chat c=32") == {"deploy_dflash[drafter=zlab,spec=dflash-4]"}
    assert tied_with_best(ZLAB_TREES, "random-ids c=32") == {BASELINE}
    search = landscape_search(ZLAB_TREES)
    drive(search, ZLAB_TREES)
    assert_answers(search, ZLAB_TREES)
    assert search.open() == []


def test_a_landscape_of_another_optimum_within_half_its_launches_names_every_answer_and_what_is_unproven() -> None:
    """Within the bar's budget the search names every band's answer on the synthetic landscape; no order of launches
    proves them all with 6 of the grid's 13 (zlab's dflash-16 and ddtree-64 keep bounds above the chat c=1
    incumbent from their families' chords), so the three configurations still open say where, with their bounds."""
    search = landscape_search(ZLAB_TREES)
    drive(search, ZLAB_TREES, budget=HALF)
    assert_answers(search, ZLAB_TREES)
    assert_half_of_the_grid(search, ZLAB_TREES)
    unexplored = {d.config for d in search.decisions if d.action == "unexplored"}
    assert unexplored == {
        f"deploy_dflash[drafter={d},spec={s}]"
        for d, s in [("zlab", "dflash-16"), ("zlab", "ddtree-64"), ("tmp-long", "dflash-16")]
    }
    assert "chat c=1" in assert_unproven_where_open(search, ZLAB_TREES)


def test_the_headroom_landscape_has_another_optimum_and_each_band_is_answered() -> None:
    """The recorded second landscape is what it is for: z-lab's drafter, DDTREE 32 at concurrency 1 (DDTREE 16
    tied), DFLASH 8 at 16 and 32, where the stand-in's defaults have tmp-long everywhere and DFLASH 4 or the
    baseline at 16-32; and the search names each band's answer, every configuration decided."""
    landscape = load_landscape(HEADROOM_FILE)
    zlab = "deploy_dflash[drafter=zlab,spec={}]".format
    for workload in ("speed-bench/mixed", "random-ids"):
        assert {zlab("ddtree-32"), zlab("ddtree-16")} <= tied_with_best(landscape, f"{workload} c=1")
        assert all(tied_with_best(landscape, f"{workload} c={c}") == {zlab("dflash-8")} for c in (16, 32))
    search = landscape_search(landscape)
    drive(search, landscape)
    assert_answers(search, landscape)
    assert search.open() == []
    # the fewest launches any set closes it with under these bounds (a brute force over every 5-launch set finds
    # none): ddtree-16, between the baseline and ddtree-32, before ddtree-64 beyond them (7 when the far one went first)
    assert len(launched(search)) == 6, launched(search)


def test_the_headroom_landscape_within_half_its_launches_names_every_answer_and_what_is_unproven() -> None:
    """The bar on the second landscape recorded on the stand-in: 5 of the 12 launched (6 of the grid's 13 with the
    baseline's), every band's answer named, and the two DFLASH 16s the budget left open say which answers they might
    still change, with their bounds: no set of 5 launches proves this grid under the bounds (a brute force over all
    792), since at concurrency 1 three configurations of zlab's are within 1.6% of each other."""
    landscape = load_landscape(HEADROOM_FILE)
    search = landscape_search(landscape)
    drive(search, landscape, budget=HALF)
    assert len(launched(search)) == HALF
    assert_half_of_the_grid(search, landscape)
    assert_answers(search, landscape)
    unexplored = {d.config for d in search.decisions if d.action == "unexplored"}
    assert unexplored == {
        "deploy_dflash[drafter=zlab,spec=dflash-16]",
        "deploy_dflash[drafter=tmp-long,spec=dflash-16]",
    }
    assert {"speed-bench/mixed c=1", "random-ids c=1"} <= assert_unproven_where_open(search, landscape)


def sampled(start: float, increments: list[float]) -> list[float]:
    """A curve at 1, 2, ... tokens: `start`, then these increments in turn."""
    values = [start]
    for step in increments:
        values.append(values[-1] + step)
    return values


@settings(max_examples=50, deadline=None)
@given(
    st.lists(st.floats(0.001, 1.0), min_size=63, max_size=63),
    st.sets(st.integers(1, 64), max_size=6),
    st.integers(1, 64),
)
def test_a_concave_bound_never_lies_below_the_curve(increments: list[float], measured: set[int], at: int) -> None:
    """An acceptance curve (1 at one token, nondecreasing, concave, so never over the tokens verified) sampled
    at other points: `curve_bound(concave=True)` at `at` is at least the curve there."""
    curve = sampled(1.0, sorted(increments, reverse=True))
    points = [(n, curve[n - 1]) for n in sorted(measured - {at})]
    bound = curve_bound(at, points, concave=True)
    assert bound is not None
    assert bound >= curve[at - 1] * (1 - 1e-9)


@settings(max_examples=50, deadline=None)
@given(
    st.floats(0.1, 10.0),
    st.lists(st.floats(0.001, 1.0), min_size=63, max_size=63),
    st.sets(st.integers(1, 64), max_size=6),
    st.integers(1, 64),
)
def test_a_convex_bound_never_lies_above_the_curve(
    start: float, increments: list[float], measured: set[int], at: int
) -> None:
    """A cost curve (positive, nondecreasing, convex) sampled at other points: `curve_bound(concave=False)` at
    `at` is at most the curve there, and there is one wherever a point lies at or below `at`."""
    curve = sampled(start, sorted(increments))
    points = [(n, curve[n - 1]) for n in sorted(measured - {at})]
    bound = curve_bound(at, points, concave=False)
    assert bound is not None or all(n > at for n, _ in points)
    assert bound is None or bound <= curve[at - 1] * (1 + 1e-9)


@st.composite
def separable_landscapes(draw: st.DrawFn) -> Landscape:
    """A landscape of the model (`modelled_landscape`) with 1-3 drafters whose factors scale acceptance alike at
    every setting, random curves and slopes, one or two workloads."""
    factors = draw(st.lists(st.floats(1.0, 2.5), min_size=1, max_size=3))
    concurrencies = draw(st.lists(st.sampled_from(CONCURRENCIES), min_size=1, max_size=4, unique=True))
    per_request = draw(st.floats(0.001, 0.02))
    return modelled_landscape(
        {f"d{i}": factor for i, factor in enumerate(factors)},
        q=draw(st.floats(0.6, 0.95)),
        slope={conc: per_request * conc for conc in sorted(concurrencies)},
        workloads=dict(draw(st.lists(st.sampled_from([("chat", 1.0), ("random-ids", 0.5)]), min_size=1, unique=True))),
        spread=draw(st.sampled_from([0.0, 0.01])),
    )


@settings(max_examples=30, deadline=None)
@given(separable_landscapes())
def test_the_search_is_deterministic(landscape: Landscape) -> None:
    """The same landscape twice: the same decisions, reasons and evidence, in the same order."""
    first, second = landscape_search(landscape), landscape_search(landscape)
    drive(first, landscape)
    drive(second, landscape)
    assert [d.as_json() for d in first.decisions] == [d.as_json() for d in second.decisions]


@settings(max_examples=50, deadline=None)
@given(separable_landscapes(), st.sampled_from(SPECS))
def test_a_configuration_beating_every_other_by_half_is_never_pruned(
    landscape: Landscape, spec: tuple[str, int]
) -> None:
    """A drafter of its own planted at one setting, its fastest repeat 1.5 x every other's (and the baseline's) in
    every band, at the target's cost per token there (its acceptance what that takes, never over the tokens
    verified): it is launched, never pruned, and the incumbent of every band. (Where the bounds' assumptions hold,
    only a drafter of its own can beat its neighbours by half: on a drafter's axis acceptance is concave and
    never falls, cost is the target's, and the drafters' ratio carries over.)"""
    planted = f"deploy_dflash[drafter=planted,spec={spec[0]}-{spec[1]}]"
    verified = position(planted).verified
    assert verified is not None
    twin = next(c for c in landscape.configs if position(c).setting == position(planted).setting)
    measures = {}
    for band, measure in landscape.configs[twin].items():
        rivals = [landscape.baseline[band], *(ms[band] for ms in landscape.configs.values())]
        median = 1.5 * max(m.high for m in rivals) * measure.median / measure.low
        cost = measure.cost()
        assert cost is not None
        assume(median * cost <= verified)
        ratio = median / measure.median
        measures[band] = Measure(median, measure.low * ratio, measure.high * ratio, median * cost)
    grown = Landscape(landscape.baseline, landscape.configs | {planted: measures})
    search = landscape_search(grown)
    drive(search, grown)
    assert planted in launched(search)
    assert all(search.incumbent(band)[0] == planted for band in landscape.baseline)


def test_a_decision_survives_its_record() -> None:
    """`Decision.as_json` then `from_json` (through JSON text): the same decision, evidence included."""
    evidence = {"random-ids c=1": [2999.5, 3120.25], "random-ids c=4": [8000.0, 14741.024]}
    config = "deploy_dflash[drafter=zlab,spec=ddtree-64]"
    decision = Decision(seq=3, action="prune", config=config, reason="random-ids c=1: ...", evidence=evidence)
    assert Decision.from_json(json.loads(json.dumps(decision.as_json()))) == decision
    launch = Decision(seq=1, action="launch", config="deploy_dflash[drafter=zlab,spec=dflash-8]", reason="the middle")
    assert Decision.from_json(json.loads(json.dumps(launch.as_json()))) == launch


@pytest.mark.parametrize(
    "fields",
    [{}, {"launches": 0}, {"gpu_hours": math.nan}, {"gpu_hours": -1.0}, {"launches": 0, "gpu_hours": 2.0}],
    ids=["no field", "0 launches", "NaN gpu_hours", "negative gpu_hours", "0 launches with gpu_hours"],
)
def test_a_budget_that_spends_nothing_is_refused(fields: dict[str, float]) -> None:
    """A search budget needs launches (at least 1) or GPU-hours (a positive number), or both."""
    with pytest.raises(ValidationError):
        SearchBudget(**fields)  # type: ignore[arg-type]


def test_a_budget_of_launches_or_gpu_hours_is_accepted() -> None:
    """Either field alone, or both, makes a budget."""
    assert SearchBudget(launches=6).launches == 6
    assert SearchBudget(gpu_hours=2.5).gpu_hours == 2.5


def test_a_screen_keeps_the_bands_within_reach_of_their_incumbent() -> None:
    """A launched configuration's one-run screen keeps a band for its full measurement when that run, 5%
    (SCREEN_MARGIN) above, reaches the incumbent less the tolerance; far below it, the band stays at one run."""
    grid = load_landscape(STANDIN_FILE)
    search = landscape_search(grid)
    band = next(iter(grid.baseline))
    incumbent = grid.baseline[band].median
    reach = (1 - TOLERANCE) * incumbent / (1 + SCREEN_MARGIN)
    screen = {band: Measure(reach, reach, reach, 2.0), "unknown band c=1": Measure(1.0, 1.0, 1.0, None)}
    assert search.contending(screen) == {band, "unknown band c=1"}  # no incumbent there: measured in full
    below = reach * 0.99
    assert search.contending({band: Measure(below, below, below, 2.0)}) == frozenset()


def test_the_sweeps_launches_differ_only_where_the_search_orders_them() -> None:
    """The flagship sweep's 12 launches sit at 12 places of one server (their `rest` one text: the steps a deploy
    reads, its drafter's inspect, are no launch parameter), so the drafters' ratio carries between them."""
    runbook = load_runbook(Path(__file__).resolve().parents[3] / "runbooks" / "k26_dflash_sweep.yaml")
    specs = {spec.id: spec for spec in runbook.steps}
    positions = [specs[server].search_position() for server in runbook.groups[0].servers]
    assert all(p is not None for p in positions)
    assert len({p.rest for p in positions if p}) == 1
    assert len({(p.drafter, p.place) for p in positions if p}) == 12
