"""The search of a campaign (`strategy: search`): which server configuration to launch next, and which never to.

A launch is most of a campaign's cost (10-40 minutes of 8 GPUs for Kimi-K2.6), so the search judges configurations
without launching them, from bounds that the structure of the space gives (README, "Search"):

- **the family's curve.** A configuration sits on its drafter's and algorithm's axis of tokens verified per request
  and step (`Position.verified`: DFLASH's draft tokens, DDTREE's budget and its root), the baseline at one token
  with an acceptance length of 1. Acceptance length is concave along that axis (each further token is accepted
  less often than the one before it) and the verify step's cost convex (flat until the GPU is compute-bound,
  then linear), so a chord through two measured points, extended beyond them, bounds the acceptance of every
  configuration outside them from above and its cost from below: output throughput is acceptance over cost
  per token (`Measure.cost`). Acceptance never falls with more tokens (the acceptance measured at the largest
  count bounds the smaller ones') nor exceeds the tokens verified, and cost never falls either;
- **the drafter's factor.** A drafter scales acceptance the same way at every setting in practice (one that
  loses at its best setting loses at all of them): where two drafters were measured at one setting, the
  ratio of their throughputs there carries the other's bound, or measure, over to each of its settings.

A configuration is pruned in a band (a workload at a concurrency) when its bound cannot change the band's answer
as the campaign report gives it: below the incumbent beyond noise and the tolerance, or at most tied with it and
costlier (the report's tie rule deploys the cheaper one). It is pruned when pruned in every band, and the search
stops when none is left open or the budget is spent. Pure: the same measures give the same decisions, which the
run records (`Decision`) so that a resumed run keeps them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, model_validator

#: How far below a band's incumbent (beyond the tolerance) a screen's one run may be and still be measured in full
SCREEN_MARGIN = 0.05
#: How the message of a configuration's instance the search never launched begins (its report reads it)
LEFT_OUT = "search: "
#: How the message of an instance whose configuration a stopped run never reached ends
NOT_REACHED = "was not reached (the run stopped first)"
#: How an unexplored configuration's reason names the bands whose answer it leaves unproven (its report reads it)
UNPROVEN = "and it might still change the answer at"
#: What a band is called: `random-ids c=4` (the measuring step's workload and the concurrency).
Band = str
Action = Literal["launch", "prune", "unexplored"]


class SearchBudget(BaseModel):
    """How much a search may spend: server launches of its group, GPU-hours of them (launch and measurement), or
    both (the first spent stops it). Checked before each launch."""

    # lax, as the kinds' parameters: YAML 1.1 reads `1e-9` (no dot) as text, which a number's field then takes
    model_config = ConfigDict(extra="forbid", frozen=True)

    launches: StrictInt | None = Field(
        default=None, ge=1, le=10_000, description="server launches of the group, at most"
    )
    gpu_hours: float | None = Field(
        default=None, gt=0, le=1_000_000, allow_inf_nan=False, description="GPU-hours (launch and measure x GPUs)"
    )

    @model_validator(mode="after")
    def _one_given(self) -> SearchBudget:
        if self.launches is None and self.gpu_hours is None:
            raise ValueError("budget: give `launches` (server launches) or `gpu_hours`, or both")
        return self


class SearchSpec(BaseModel):
    """A matrix group's `search:` (with `strategy: search`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    budget: SearchBudget = Field(description="launches or GPU-hours, checked before each launch")
    #: the group's step (its id as written) whose facts rank the configurations: a benchmark
    measure: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_-]*$", description="the group's step that ranks configurations")
    #: the step outside the group measuring the baseline: the point of one verified token, and the incumbent
    baseline: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z_][A-Za-z0-9_-]*$",
        description="the baseline's measuring step, before the group",
    )
    #: within this fraction of the fastest, the cheaper configuration is the answer (the campaign report's)
    tolerance: float = Field(
        default=0.02, ge=0, lt=1, allow_inf_nan=False, description="within it of the fastest, the cheaper wins"
    )


@dataclass(frozen=True)
class Position:
    """Where a launch sits in the space, as its server-starting step's kind says (`StepSpec.search_position`)."""

    drafter: str | None  # the draft model (None: none)
    algorithm: str | None  # the speculative algorithm (None: no speculation)
    verified: int | None  # tokens verified per request and step (None: unknown, no curve)
    #: the campaign report's tie order, cheaper first: speculation, draft tokens, tree budget
    cost: tuple[float, float, float]
    setting: str  # what it is apart from its drafter (`DFLASH 8`): two drafters at one setting are compared
    #: the server's other launch parameters (its tp size, memory, backend), as text: configurations differing in
    #: them share no curve, no cost per token and no drafters' ratio
    rest: str = ""

    @property
    def family(self) -> tuple[str | None, str | None, str]:
        return (self.drafter, self.algorithm, self.rest)

    @property
    def place(self) -> tuple[str, str]:
        """Where two drafters compare: one setting on one server."""
        return (self.setting, self.rest)


#: the baseline's place in the tie order: no speculation is cheapest
BASELINE_COST = (0.0, 0.0, 0.0)
BASELINE_NAME = "the baseline"


@dataclass(frozen=True)
class Measure:
    """One band of a measured configuration: output throughput (median and range over the repeats, tokens/s) and
    the acceptance length the server reported (None: unknown, or no speculation)."""

    median: float
    low: float
    high: float
    accept: float | None

    def cost(self) -> float | None:
        """Seconds per request and step over tokens per request... in one number: acceptance over throughput, the
        time one verify step takes per unit of concurrency. None without an acceptance length."""
        if self.accept is None or self.median <= 0:
            return None
        return self.accept / self.median


@dataclass(frozen=True)
class Bound:
    """The most a configuration may reach in a band, and why."""

    value: float
    why: str


class Decision(BaseModel):
    """One decision of the search, as the run records it: what, for which configuration, and the evidence. Strict:
    a record read back (a resumed run's) is refused unless it is as a run writes it."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    seq: int = Field(ge=1)
    action: Action
    config: str  # the server instance: `deploy_dflash[drafter=zlab,spec=dflash-8]`
    reason: str
    #: band -> [bound, incumbent's median] where pruned: the numbers behind the reason
    evidence: dict[str, list[float]] = {}
    #: unexplored: every band whose answer it might still change (the reason names the first few)
    unproven: list[str] = []

    def as_json(self) -> dict[str, object]:
        return self.model_dump()

    @classmethod
    def from_json(cls, data: object) -> Decision:
        """A recorded decision; pydantic's ValidationError (a ValueError) when it is not as a run writes it."""
        return cls.model_validate(data)


def _line(p: tuple[int, float], q: tuple[int, float], at: int) -> float:
    """The chord through two points of a curve, at `at`."""
    return p[1] + (q[1] - p[1]) * (at - p[0]) / (q[0] - p[0])


def curve_bound(at: int, points: list[tuple[int, float]], *, concave: bool) -> float | None:
    """The most (concave: acceptance) or the least (convex: cost per token) a curve may be at `at` verified tokens,
    from measured (verified, value) points: a concave curve lies below its chords outside them and a convex one
    above; neither falls with more tokens; acceptance never exceeds the tokens verified. None: no bound (a convex
    curve with no point at or below `at`)."""
    found: float | None = float(at) if concave else None
    for n, value in points:
        if (n >= at) if concave else (n <= at):
            found = value if found is None else (min(found, value) if concave else max(found, value))
    for i, p in enumerate(points):
        for q in points[i + 1 :]:
            lo, hi = (p, q) if p[0] < q[0] else (q, p)
            if lo[0] == hi[0] or lo[0] <= at <= hi[0]:
                continue
            line = _line(lo, hi, at)
            found = line if found is None else (min(found, line) if concave else max(found, line))
    return found


#: Bands a decision's reason names (its evidence has every band's numbers): a record stays small with many bands
REASON_BANDS = 8


def _said(reasons: Iterable[str], rest: str = "the evidence has each") -> str:
    """At most REASON_BANDS of a decision's bands, and how many more (`rest`: where they are)."""
    listed = list(reasons)
    more = len(listed) - REASON_BANDS
    return "; ".join(listed[:REASON_BANDS]) + (f"; and {more} more bands ({rest})" if more > 0 else "")


@dataclass
class Search:
    """A group's search: its configurations (server instance -> position, in the group's order), what has been
    measured, and the decisions so far. `next_launch` and `prune` decide; the driver (executor.run.searching)
    launches, measures and records."""

    positions: Mapping[str, Position]
    tolerance: float
    baseline: dict[Band, Measure] = field(default_factory=dict)
    measured: dict[str, dict[Band, Measure]] = field(default_factory=dict)
    decisions: list[Decision] = field(default_factory=list)
    #: launched but with no measure (its server did not start, its measure failed or was skipped): decided
    lost: set[str] = field(default_factory=set)

    # ---- what is decided ---------------------------------------------------------------------

    def decided(self, config: str) -> Decision | None:
        """The decision that settled `config` (launched or pruned), None while it is open."""
        return next((d for d in self.decisions if d.config == config), None)

    def open(self) -> list[str]:
        """The configurations neither decided nor measured (a record may hold a measure without its launch)."""
        return [c for c in self.positions if self.decided(c) is None and c not in self.measured]

    def decide(
        self,
        action: Action,
        config: str,
        reason: str,
        evidence: dict[str, list[float]] | None = None,
        unproven: list[Band] | None = None,
    ) -> Decision:
        decision = Decision(
            seq=len(self.decisions) + 1,
            action=action,
            config=config,
            reason=reason,
            evidence=evidence or {},
            unproven=unproven or [],
        )
        self.decisions.append(decision)
        return decision

    # ---- the bounds ----------------------------------------------------------------------------

    def bands(self) -> list[Band]:
        seen = dict.fromkeys(self.baseline)
        for measures in self.measured.values():
            seen.update(dict.fromkeys(measures))
        return list(seen)

    def incumbent(self, band: Band) -> tuple[str, Measure, tuple[float, float, float]] | None:
        """The fastest measured in `band` (median), the baseline among them: (name, measure, cost)."""
        found = [(BASELINE_NAME, m, BASELINE_COST) for m in [self.baseline.get(band)] if m is not None]
        found += [(c, ms[band], self.positions[c].cost) for c, ms in self.measured.items() if band in ms]
        return max(found, key=lambda item: (item[1].median, [-x for x in item[2]])) if found else None

    def _points(self, position: Position, band: Band) -> tuple[list[tuple[int, float]], list[tuple[int, float]]]:
        """The measured points of `band` that bound a configuration at `position`: (verified, acceptance) of its
        family, the baseline's (1, 1.0) among them, and (verified, cost per token) of every speculative configuration
        measured: cost is the target's forward over the tokens verified and the drafter's, whatever drafter or
        algorithm chose them. The baseline's step runs no drafter, so its cost is a floor (`cost_floor`), never a
        chord's end: a chord from it to a speculative point would be steeper by the draft forward."""
        base = self.baseline.get(band)
        accepts = [(1, 1.0)] if base is not None and base.median > 0 else []
        costs = []
        for config, measures in self.measured.items():
            other, measure = self.positions[config], measures.get(band)
            cost = None if measure is None else measure.cost()
            if other.verified is None or other.algorithm is None or cost is None or measure is None:
                continue
            if other.rest != position.rest:  # another server (its GPUs, its memory): another cost curve
                continue
            costs.append((other.verified, cost))
            if other.family == position.family:
                accepts.append((other.verified, measure.accept or 1.0))
        return accepts, costs

    def cost_floor(self, band: Band) -> float | None:
        """The least cost per token any speculative step may have: the baseline's one-token step (no verify is
        cheaper than a decode step)."""
        base = self.baseline.get(band)
        return 1.0 / base.median if base is not None and base.median > 0 else None

    def noise(self, band: Band) -> float:
        """How far above its median a configuration's fastest repeat may be in `band`: the most any measured one's
        was (1 with one repeat). The curves run through medians; the report's `beaten` reads the fastest repeat."""
        measures = [m for ms in self.measured.values() if (m := ms.get(band)) is not None]
        measures += [m for m in [self.baseline.get(band)] if m is not None]
        return max([m.high / m.median for m in measures if m.median > 0], default=1.0)

    def family_bound(self, config: str, band: Band) -> Bound | None:
        """The bound of the family's curve (module docstring), None where the curve says nothing."""
        position = self.positions[config]
        if position.verified is None or position.algorithm is None:
            return None
        accepts, costs = self._points(position, band)
        accept = curve_bound(position.verified, accepts, concave=True)
        found = [c for c in (curve_bound(position.verified, costs, concave=False), self.cost_floor(band)) if c]
        cost = max(found, default=None)
        if accept is None or cost is None or cost <= 0:
            return None
        shown = ", ".join("the baseline" if n == 1 else f"{n}" for n, _ in sorted(accepts))
        return Bound(
            accept / cost, f"bound of its family's acceptance at {shown} verified tokens and of the cost per token"
        )

    def drafter_bound(self, config: str, band: Band) -> Bound | None:
        """The bound of the drafter's factor: another drafter's measure (or curve bound) at this setting, times
        the most this drafter got over that one where both were measured at one setting."""
        position, best = self.positions[config], None
        for other_drafter in {p.drafter for p in self.positions.values()} - {position.drafter}:
            ratio = self._ratio(position.drafter, other_drafter, band)
            twin = next(
                (c for c, p in self.positions.items() if p.drafter == other_drafter and p.place == position.place),
                None,
            )
            if ratio is None or twin is None:
                continue
            measure = self.measured.get(twin, {}).get(band)
            carried = Bound(measure.high, "measure") if measure is not None else self.family_bound(twin, band)
            if carried is not None and (best is None or ratio * carried.value < best.value):
                best = Bound(
                    ratio * carried.value,
                    f"{ratio:.3f} (the drafters' ratio where both were measured) x {twin}'s {carried.why}",
                )
        return best

    def _ratio(self, drafter: str | None, other: str | None, band: Band) -> float | None:
        """The most `drafter` got over `other` at a setting both were measured at (median over median: a drafter's
        factor is a heuristic of the space, not a bound of one run's noise, which the tolerance covers)."""
        ratios = []
        for config, measures in self.measured.items():
            position = self.positions[config]
            if position.drafter != drafter or band not in measures:
                continue
            for twin, theirs in self.measured.items():
                peer = self.positions[twin]
                if (
                    peer.drafter == other
                    and peer.place == position.place
                    and band in theirs
                    and theirs[band].median > 0
                ):
                    ratios.append(measures[band].median / theirs[band].median)
        return max(ratios) if ratios else None

    def bound(self, config: str, band: Band) -> Bound | None:
        """The least of the bounds: of the median the configuration may measure."""
        found = [b for b in (self.family_bound(config, band), self.drafter_bound(config, band)) if b is not None]
        return min(found, key=lambda b: b.value) if found else None

    # ---- pruning -----------------------------------------------------------------------------

    def contest(self, config: str, band: Band) -> tuple[Bound, tuple[str, Measure, tuple[float, float, float]]] | None:
        """`config`'s bound in `band` against the band's incumbent, None where either is unknown or not finite.
        The report's `beaten` reads the fastest repeat too: the bound is widened by the band's noise, a bound of that.
        """
        top, median = self.incumbent(band), self.bound(config, band)
        if top is None or median is None:
            return None
        bound = Bound(median.value * self.noise(band), median.why)
        return (bound, top) if math.isfinite(bound.value) and math.isfinite(top[1].median) else None

    def excluded(self, config: str, band: Band) -> tuple[str, list[float]] | None:
        """Why `config` cannot change `band`'s answer (and [bound, incumbent]), None when it might."""
        return self._verdict(config, band, self.contest(config, band))

    def _verdict(
        self, config: str, band: Band, contest: tuple[Bound, tuple[str, Measure, tuple[float, float, float]]] | None
    ) -> tuple[str, list[float]] | None:
        """`excluded` of a contest already worked out."""
        if contest is None:
            return None
        bound, (name, measure, cost) = contest
        evidence = [round(bound.value, 3), round(measure.median, 3)]
        if bound.value < min((1 - self.tolerance) * measure.median, measure.low):
            return (
                f"{band}: at most {bound.value:.0f} tok/s ({bound.why}), beaten by {name}'s {measure.median:.0f}",
                evidence,
            )
        # the report's tie order: cost, then the name (of two drafters at one setting, the first by name is deployed)
        later = (self.positions[config].cost, config) > (cost, "" if name == BASELINE_NAME else name)
        if later and bound.value <= (1 + self.tolerance) * measure.median:
            return (
                f"{band}: at most {bound.value:.0f} tok/s ({bound.why}), at most tied with {name}'s "
                f"{measure.median:.0f} within {self.tolerance:.1%}, which is cheaper"
            ), evidence
        return None

    def contending(self, screen: Mapping[Band, Measure]) -> frozenset[Band]:
        """The bands where a launched configuration, screened with one run each, may still be (or tie) the answer:
        where its screen, SCREEN_MARGIN above its fastest run, reaches the band's incumbent less the tolerance
        (a screen is one repeat: the margin is its noise), or where no incumbent is known."""
        keep = set()
        for band, measure in screen.items():
            top = self.incumbent(band)
            if top is None or measure.high * (1 + SCREEN_MARGIN) >= (1 - self.tolerance) * top[1].median:
                keep.add(band)
        return frozenset(keep)

    def prune(self) -> list[Decision]:
        """Prune every open configuration that no band leaves a chance; the decisions made."""
        made = []
        bands = self.bands()
        for config in self.open():
            why = [self.excluded(config, band) for band in bands]
            if bands and all(w is not None for w in why):
                reasons = [w for w in why if w is not None]
                made.append(
                    self.decide(
                        "prune",
                        config,
                        _said(r for r, _ in reasons),
                        {band: e for band, (_, e) in zip(bands, reasons, strict=True)},
                    )
                )
        return made

    def unexplored(self, config: str, spent: str) -> Decision:
        """`config` left open because the budget was `spent` (why): the bands where it might still change the
        answer, each with its bound against the incumbent. There the answer is the best measured, not proven."""
        said: dict[Band, str] = {}
        evidence = {}
        for band in self.bands():
            contest = self.contest(config, band)
            if self._verdict(config, band, contest) is not None:
                continue
            if contest is None:
                said[band] = f"{band}: no bound yet"
                continue
            bound, (name, measure, _) = contest
            said[band] = f"{band}: up to {bound.value:.0f} tok/s ({bound.why}) against {name}'s {measure.median:.0f}"
            evidence[band] = [round(bound.value, 3), round(measure.median, 3)]
        if not said:  # nothing measured (pruning needs a band): nothing bounds it anywhere
            reason = f"never launched: {spent}, {UNPROVEN} every band (unproven: nothing was measured to bound it)"
            return self.decide("unexplored", config, reason, evidence)
        bands = list(said)
        more = f" and {len(bands) - REASON_BANDS} more" if len(bands) > REASON_BANDS else ""
        named = ", ".join(bands[:REASON_BANDS]) + more
        details = _said(said.values(), "the evidence has each with a bound")
        reason = f"never launched: {spent}, {UNPROVEN} {named} (unproven there); {details}"
        return self.decide("unexplored", config, reason, evidence, bands)

    # ---- what to launch next -----------------------------------------------------------------

    def next_launch(self, candidates: Iterable[str]) -> tuple[str, str] | None:
        """The configuration to launch next of `candidates` (open ones a lane can run), and why; None: none."""
        allowed = [c for c in candidates if self.decided(c) is None and c not in self.measured]
        if not allowed:
            return None
        measured_drafters = {self.positions[c].drafter for c in self.measured}
        settings = {self.positions[c].setting for c in self.measured}
        for config in allowed:  # a drafter not yet measured, at a setting another was: their ratio
            p = self.positions[config]
            if p.drafter not in measured_drafters and p.setting in settings:
                return config, f"compares drafter {p.drafter} with the others at {p.setting}"
        leader = self.leader()
        fresh = [
            c
            for c in allowed
            if self.positions[c].drafter == leader
            and not any(self.positions[m].family == self.positions[c].family for m in self.measured)
        ]
        if fresh:
            first = self._middle(fresh)
            return first, f"the middle of a family not yet measured ({self.positions[first].setting})"

        def hope(config: str) -> float:
            ratios = []
            for band in self.bands():
                top, bound = self.incumbent(band), self.bound(config, band)
                ratios.append(math.inf if bound is None or top is None else bound.value / top[1].median)
            return max(ratios, default=math.inf)

        frontier = [c for c in allowed if self._next_to_measured(c)] or allowed
        ahead = [c for c in frontier if self.positions[c].drafter == leader and hope(c) > 1] or frontier
        best = max(ahead, key=lambda c: (self._inside(c), hope(c), -list(self.positions).index(c)))
        if self._inside(best):
            why = "between two measured points of its axis (measured, it bounds the far ends), its bound"
        else:
            why = "next to a measured configuration, its bound leaves the most room:"
        return best, f"{why} {hope(best):.2f} x an incumbent"

    def _next_to_measured(self, config: str) -> bool:
        """Whether a neighbour of `config` on its family's axis was measured: measuring next to one tightens the
        chords most (a far one's bound is the loosest, so the most hopeful, and the least informative)."""
        position = self.positions[config]
        axis = sorted((p.verified or 0, c) for c, p in self.positions.items() if p.family == position.family)
        at = [c for _, c in axis].index(config)
        return any(axis[j][1] in self.measured for j in (at - 1, at + 1) if 0 <= j < len(axis))

    def _inside(self, config: str) -> bool:
        """Whether `config` lies between two measured points of its family's axis (the baseline's one verified token
        among them). Measured first, such a point gives the chords extended to the far ends of the axis a nearer
        end, which tightens their bounds; a far end measured first leaves the inner one's bound open (`headroom`'s
        DDTREE 64 before 16: 7 launches, 6 the other way)."""
        position = self.positions[config]
        verified = position.verified or 0
        points = [self.positions[c].verified or 0 for c in self.measured if self.positions[c].family == position.family]
        points += [1] if self.baseline else []
        return any(p < verified for p in points) and any(p > verified for p in points)

    def _middle(self, fresh: list[str]) -> str:
        """The middle of the first family among `fresh` (the lower one of two): the chords through it and the
        baseline bound the ranks above it, and the acceptance it measures (never less than a smaller rank's)
        with the cost measured below it bounds the ranks under it."""
        family = self.positions[fresh[0]].family
        axis = sorted((self.positions[c].verified or 0, c) for c in fresh if self.positions[c].family == family)
        return axis[(len(axis) - 1) // 2][1]

    def leader(self) -> str | None:
        """The drafter that wins the most bands where drafters were measured at one setting (the first declared
        while none was)."""
        drafters = list(dict.fromkeys(p.drafter for p in self.positions.values()))
        wins = dict.fromkeys(drafters, 0)
        for band in self.bands():
            for setting in {p.setting for p in self.positions.values()}:
                at = [
                    (ms[band].median, self.positions[c].drafter)
                    for c, ms in self.measured.items()
                    if self.positions[c].setting == setting and band in ms
                ]
                if len(at) > 1:
                    wins[max(at)[1]] += 1
        return max(drafters, key=lambda d: (wins[d], -drafters.index(d))) if drafters else None
