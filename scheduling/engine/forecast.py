"""When queued work is expected to start: the scheduling cycle simulated forward in time. Pure Python, no Django.

From the engine's state once the cycle committed, the running work with its approved ends and the queue in the
order the cycle considers it, `forecast` replays what later cycles would do: at each moment running work ends, it
gives the work back and places the queue in order with the cycle's own rules (`place_in_order`: priorities hold
lower-priority work back; `backfill`: the head of the queue keeps its node from work that would still run when it is
due). A queued request's expected start is the moment the replay places it.

The replay runs for a range:
- ``latest``: everything runs to its approved end (the limit);
- ``likely``: each piece of work ends at its own quantile of the measured ratios of actual to approved duration
  (`EarlyEnds`; the quantile a stable draw by its id, `spread_draw`), so that the replay's ends spread over time as
  ended work's did: taking every piece at the median would free all capacity at one moment, too late for the
  first requests in line and too early for those further back. Which piece draws an early end is chance, and one
  replay's start for a request is one sample of when it starts: the likely start is the median over LIKELY_DRAWS
  replays, each with its own draws (the median is the estimate that misses the actual start by least, on average);
- ``earliest``: each piece at half its quantile in the first of those draws.
Running work that has already outlived a ratio is judged only by the ratios it has not outlived yet.

Windows held ahead (`HeldWindow`: the whole nodes planned for an approved reservation not begun, or an operator's
maintenance window) are closed in the replay as they are in the cycle: from now until the window ends, a held node
takes only work that is over, at its approved end, before the window starts (backfill), and is open again once the
window ended (a moment of the replay). Work kept off a held node it would otherwise have started on says so: its
estimate carries the window's code and a sentence naming it.

What it cannot time it says so (an `Estimate` without times and a code) rather than guess: running work without an
end, work beyond the simulated share of the queue (`limit`) or that no release in view makes room for.
"""

from __future__ import annotations

import bisect
import hashlib
import heapq
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from scheduling.engine import backfill
from scheduling.engine.model import Binding, Demand, RunningAllocation
from scheduling.engine.place import PlacementEngine, place_in_order

# Why a queued request has no expected start (its wait reason comes with it where the queue has one).
RUNNING_WITHOUT_END = "running_without_end"  # work it waits for has no end to release it at
BEYOND_FORECAST = "beyond_forecast"  # further back in the queue than the forecast simulates
NO_RELEASE_FITS = "no_release_fits"  # none of the work in view ends in a way that makes room for it
NOT_TIMED = "not_timed"  # it waits for something other than capacity (quota, approval, a backend, a shape no node has)
# The waits for a node held for a window ahead: work would still run there when a reservation starts, or when (or
# while) the node is in maintenance.
RESERVATION_AHEAD = "reservation_ahead"
MAINTENANCE = "maintenance"
# The waits the replay times: capacity taken by work that ends, work ahead of it and windows held that end.
TIMED_REASONS = frozenset(
    {*backfill.CROWDED_OUT, "higher_priority_ahead", "preemption_pending", RESERVATION_AHEAD, MAINTENANCE}
)

# A replay's scale of each piece of work's own quantile (`spread_draw`) of the early-end ratios; None: the limit.
LIKELY, EARLIEST, LATEST = 1.0, 0.5, None
LIKELY_DRAWS = 5  # likely replays, each with its own quantiles: an odd number, so that the median is one of them
MAX_STEPS = 2000  # moments of release a replay looks through before it calls the rest unknown


@dataclass(frozen=True)
class Running:
    """Running work as the forecast needs it: its allocations (a replicated request has several), when it started
    and when its approved term ends (None: it has no end, e.g. an open-ended Slurm job)."""

    allocations: tuple[RunningAllocation, ...]
    started: datetime
    ends: datetime | None


@dataclass(frozen=True)
class Queued:
    demand: Demand
    hours: float  # the approved duration


@dataclass(frozen=True)
class HeldWindow:
    """Whole nodes held from `start` to `end`: for a reservation (`code` RESERVATION_AHEAD) or in maintenance
    (MAINTENANCE); `label` names it in a sentence ("reservation #12", "maintenance (firmware update)")."""

    start: datetime
    end: datetime
    nodes: frozenset[str]
    code: str
    label: str

    def sentence(self, node: str) -> str:
        return f"{node} is held for {self.label} from {_said(self.start)} until {_said(self.end)}"


def _said(moment: datetime) -> str:
    return f"{moment:%a %d %b %H:%M} UTC"


# Work alike in how early it ends: cards, cores (milli), memory (MiB) and approved hours (the limit its owner chose).
# A piece of work is judged by the ended terms of its kind shrunk toward all ended terms, as a Dirichlet-process
# posterior borrows from its prior: the kind's n ended terms weigh n / (n + KIND_PRIOR_TERMS), all ended terms the
# rest. A kind with little history is judged mostly by all work, and more by its own as its ended terms add up.
Kind = tuple[int, int, int, int]
KIND_PRIOR_TERMS = 2


def kind_of(cards: int, cpu_milli: int, memory_mib: int, hours: float) -> Kind:
    return (cards, cpu_milli, memory_mib, round(hours))


@dataclass(frozen=True)
class EarlyEnds:
    """Ratios of actual to approved duration of ended work (0..1, sorted), all and per kind: how early work
    historically ends."""

    ratios: tuple[float, ...] = ()
    by_kind: dict[Kind, tuple[float, ...]] = field(default_factory=dict)
    # kind -> the distribution work of that kind is judged by, worked out at its first use
    _judged_by: dict[Kind | None, Shrunk] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def of(cls, ratios, kinds: dict[Kind, list[float]] | None = None) -> EarlyEnds:
        def clipped(values):
            return tuple(sorted(min(1.0, max(0.0, ratio)) for ratio in values))

        return cls(clipped(ratios), {kind: clipped(values) for kind, values in (kinds or {}).items()})

    def ratio(self, share: float, ran: float = 0.0, kind: Kind | None = None) -> float:
        """The `share` quantile of the ratios above `ran` (work that ran that share of its term and still runs ends
        later than that) in the distribution its kind is judged by; 1.0 (its limit) when no history is left to
        judge by."""
        if kind not in self._judged_by:
            self._judged_by[kind] = Shrunk.of(self.by_kind.get(kind, ()), self.ratios)
        return self._judged_by[kind].quantile_above(share, ran)

    def lasts(self, queued: Queued, scale: float | None, draw: int) -> timedelta:
        """How long queued work runs once started, at `scale` times its own quantile in `draw` (None: its whole
        term)."""
        if scale is None:
            return timedelta(hours=queued.hours)
        demand = queued.demand
        kind = kind_of(demand.count, demand.cpu_milli, demand.memory_mib, queued.hours)
        return timedelta(hours=queued.hours * self.ratio(scale * spread_draw(demand.id, draw), kind=kind))

    def end_of(self, running: Running, now: datetime, scale: float | None, draw: int) -> datetime | None:
        """When running work ends at `scale` times its own quantile in `draw` (None: at its limit)."""
        if running.ends is None or scale is None:
            return running.ends
        term = (running.ends - running.started).total_seconds()
        if term <= 0:
            return running.ends
        ran = max(0.0, (now - running.started).total_seconds()) / term
        first = running.allocations[0]
        kind = kind_of(len(first.devices), first.cpu_milli, first.memory_mib, term / 3600)
        ratio = self.ratio(scale * spread_draw(first.id, draw), ran=ran, kind=kind)
        return max(now, running.started + timedelta(seconds=term * ratio))


@dataclass(frozen=True)
class Shrunk:
    """A distribution of early-end ratios: the distinct values, sorted, and the weight of those up to each one
    (whole numbers: equal weights give exactly the quantiles of the plain sorted list)."""

    values: tuple[float, ...]
    cumulative: tuple[int, ...]

    @classmethod
    def of(cls, own: tuple[float, ...], everything: tuple[float, ...]) -> Shrunk:
        """A kind's ended terms (`own`) shrunk toward all of them: its n ratios weigh n / (n + KIND_PRIOR_TERMS), all
        N the rest. Scaled by (n + KIND_PRIOR_TERMS) * N to whole numbers: each of its own weighs N, each of all
        KIND_PRIOR_TERMS (with no other history, its own are all there is)."""
        weights: dict[float, int] = {}
        for ratios, weight in ((own, len(everything) or 1), (everything, KIND_PRIOR_TERMS)):
            for ratio in ratios:
                weights[ratio] = weights.get(ratio, 0) + weight
        values = tuple(sorted(weights))
        return cls(values, tuple(itertools.accumulate(weights[value] for value in values)))

    def quantile_above(self, share: float, ran: float) -> float:
        """The smallest ratio above `ran` (all, at 0) whose weight with the ones before it, of those above `ran`,
        exceeds `share` of theirs; 1.0 when none is above."""
        first = bisect.bisect_right(self.values, ran) if ran > 0 else 0
        if first == len(self.values):
            return 1.0
        below = self.cumulative[first - 1] if first else 0
        wanted = share * (self.cumulative[-1] - below)
        at = bisect.bisect_right(self.cumulative, wanted, lo=first, key=lambda weight: weight - below)
        return self.values[min(at, len(self.values) - 1)]


def spread_draw(work_id: str, draw: int) -> float:
    """The quantile in (0, 1) a piece of work ends at in likely replay `draw`: the same in every cycle (its
    estimates do not jump between cycles), spread evenly over work and independent between draws."""
    digest = hashlib.blake2b(f"{work_id}/{draw}".encode(), digest_size=8).digest()
    return (int.from_bytes(digest, "big") + 0.5) / 2**64


@dataclass(frozen=True)
class Estimate:
    """A queued request's expected start (earliest <= likely <= latest), or None times and the `code` saying why.
    A timed estimate's `code` and `reason` name the held window that kept it off a node it would have started on
    (RESERVATION_AHEAD or MAINTENANCE, and a sentence), when one did."""

    earliest: datetime | None = None
    likely: datetime | None = None
    latest: datetime | None = None
    code: str | None = None
    reason: str | None = None  # the wait reason of an untimed request (NOT_TIMED); a timed one's held window

    def as_data(self) -> dict:
        def stamp(moment):
            return None if moment is None else moment.isoformat()

        return {
            "earliest": stamp(self.earliest),
            "likely": stamp(self.likely),
            "latest": stamp(self.latest),
            "code": self.code,
            "reason": self.reason,
        }


def untimed(reason: str) -> Estimate:
    return Estimate(code=NOT_TIMED, reason=reason)


def forecast(
    *,
    engine_now: Callable[[], PlacementEngine],
    running: Sequence[Running],
    queue: Sequence[Queued],
    now: datetime,
    early_ends: EarlyEnds,
    limit: int,
    wanted: frozenset | set | None = None,
    tried_now: bool = False,
    windows: Sequence[HeldWindow] = (),
) -> dict[str, Estimate]:
    """Each queued demand's expected start (by demand id). `engine_now()` gives a fresh engine holding `running`
    (and nothing queued, no node closed for `windows`); `queue` is in the order the cycle considers it; the first
    `limit` are replayed. With `wanted`, only those ids are answered for, and each replay stops once they are placed.
    `tried_now`: the queue was just placed at `now` by the cycle, which left it waiting: its answer stands, the replay
    places from the first release after `now` on. `windows`: the nodes held ahead and when."""
    replayed, beyond = list(queue[:limit]), queue[limit:]

    def replay(share, draw=0):
        return _replay(engine_now(), running, replayed, now, early_ends, share, draw, wanted, tried_now, windows)

    likely_draws = [replay(LIKELY, draw) for draw in range(LIKELY_DRAWS)]
    replays = [replay(EARLIEST), *likely_draws, replay(LATEST)]
    endless = any(work.ends is None for work in running)
    kept_off = likely_draws[0].kept_off
    estimates = {}
    for queued in replayed:
        first, *likely_starts, last = [one.starts.get(queued.demand.id) for one in replays]
        if None in (first, *likely_starts, last):
            estimates[queued.demand.id] = Estimate(code=RUNNING_WITHOUT_END if endless else NO_RELEASE_FITS)
            continue
        likely = sorted(likely_starts)[LIKELY_DRAWS // 2]
        earliest, likely, latest = sorted([first, likely, last])  # replays may place differently: still a range
        held = kept_off.get(queued.demand.id)
        said = {} if held is None else {"code": held[0].code, "reason": held[0].sentence(held[1])}
        estimates[queued.demand.id] = Estimate(earliest, likely, latest, **said)
    estimates.update((queued.demand.id, Estimate(code=BEYOND_FORECAST)) for queued in beyond)
    return estimates if wanted is None else {key: value for key, value in estimates.items() if key in wanted}


@dataclass
class _Replayed:
    starts: dict[str, datetime] = field(default_factory=dict)  # demand id -> when it starts
    # demand id -> the held window (and its node) that last kept it off a node it would have started on
    kept_off: dict[str, tuple[HeldWindow, str]] = field(default_factory=dict)


class _Step:
    """What `backfill.reserve_for_head` asks of the cycle's engine, at one moment of a replay: `at_start(placed)`, the
    state before the moment's placements plus those ahead of the head (`placed`). The replay's engine holds just that
    while the reservation is worked out (what was placed behind the head is given back first), so a fork of it is."""

    def __init__(self, engine: PlacementEngine):
        self.engine = engine

    def at_start(self, placed) -> PlacementEngine:
        return self.engine.fork()


def _replay(engine, running, queue, now, early_ends: EarlyEnds, share, draw, wanted, tried_now, windows):
    """When each queued demand starts if work ends at `share` times its own quantile in `draw` (None: at its
    limit), by demand id, and which held window kept it off a node; with `wanted`, until those have started; with
    `tried_now`, placing from the first release after `now`."""
    holding: dict[str, tuple[RunningAllocation, ...]] = {}
    # What holds capacity -> when it gives it back: the approved end, as the cycle knows it.
    ends: dict[str, datetime] = {}
    releases: list = []  # (moment it is given back in this replay, tie-break, id; None: a held window ends)
    order = itertools.count()
    for work in running:
        work_id = work.allocations[0].id
        holding[work_id] = work.allocations
        if work.ends is not None:
            ends[work_id] = work.ends
            heapq.heappush(releases, (early_ends.end_of(work, now, share, draw), next(order), work_id))
    windows = [window for window in windows if window.end > now]
    for window in windows:  # its nodes open again then
        heapq.heappush(releases, (window.end, next(order), None))
    hours = {queued.demand.id: queued.hours for queued in queue}
    by_id = {queued.demand.id: queued for queued in queue}
    waiting, replayed, moment = list(queue), _Replayed(), now
    starts = replayed.starts
    for step in range(MAX_STEPS):
        placed = {}
        if step or not tried_now:
            demands = [queued.demand for queued in waiting]
            engine, placed = _place_around_held(engine, demands, holding, ends, hours, moment, windows, replayed)
        for demand_id, allocations in placed.items():
            starts[demand_id], holding[demand_id] = moment, allocations
            ends[demand_id] = moment + timedelta(hours=hours[demand_id])
            heapq.heappush(releases, (moment + early_ends.lasts(by_id[demand_id], share, draw), next(order), demand_id))
        waiting = [queued for queued in waiting if queued.demand.id not in starts]
        if not waiting or not releases or (wanted is not None and wanted <= starts.keys()):
            break
        moment = max(moment, releases[0][0])
        while releases and releases[0][0] <= moment:
            _at, _tie, work_id = heapq.heappop(releases)
            if work_id is None:
                continue
            for allocation in holding.pop(work_id):
                engine.release(_binding(allocation))
            ends.pop(work_id)
    return replayed


def _place_around_held(engine, demands, holding, ends, hours, moment, windows, replayed: _Replayed):
    """The cycle at `moment` with the nodes of windows not over held (scheduling/reservations.py): the demands
    placed in order with those nodes closed, then, in order, those left waiting onto a held node where they are over
    before every window there starts. Returns the engine to go on with (no node closed) and the placed demands'
    allocations."""
    held: dict[str, list[HeldWindow]] = {}
    for window in windows:
        if window.end > moment:
            for node in window.nodes:
                held.setdefault(node, []).append(window)
    if not held:
        return _place_at(engine, demands, holding, ends, hours, moment)
    closed = engine.fork()
    for node in held.keys() & closed.node_index.keys():
        closed.close_node(node)
    _closed, placed = _place_at(closed, demands, holding, ends, hours, moment)
    engine = engine.fork()
    engine.hold(allocation for allocations in placed.values() for allocation in allocations)
    for demand in demands:
        if demand.id in placed or not engine.fits(demand):  # fits: no explaining of a wait nobody reads
            continue
        bindings = engine.place_one(demand)
        over = moment + timedelta(hours=hours[demand.id])
        blocking = [(w, b.node) for b in bindings for w in held.get(b.node, ()) if w.start < over]
        if blocking or any(b.node not in held for b in bindings):  # elsewhere: the head of the queue keeps it
            for binding in bindings:
                engine.release(binding)
            if blocking:
                replayed.kept_off[demand.id] = min(blocking, key=lambda pair: pair[0].start)
            continue
        placed[demand.id] = tuple(_allocation(binding) for binding in bindings)
    return engine, placed


def _place_at(engine, demands: list[Demand], holding, ends, hours, moment):
    """The cycle at `moment`: the demands placed in order, and those behind the head of the queue that would delay
    it withdrawn again (backfill). Returns the engine to go on with and the placed demands' allocations."""
    result = place_in_order(engine, demands)
    behind = _behind_head(result, demands)
    if behind:
        for binding in behind:
            engine.release(binding)
        allocations = [allocation for work_id in ends for allocation in holding[work_id]]  # those with an end
        reservation = backfill.reserve_for_head(
            engine=_Step(engine),
            allocations=allocations,
            expires=ends,
            result=result,
            demands=demands,
            hours=hours,
            now=moment,
        )
        engine = engine.fork()  # the one just forked for the reservation is frozen
        if reservation is not None:
            backfill.hold_back_delaying(result, reservation, demands, hours, moment)
        kept = set(result.bindings)
        engine.hold(_allocation(binding) for binding in behind if binding in kept)
    placed: dict[str, list[RunningAllocation]] = {}
    for binding in result.bindings:
        placed.setdefault(binding.demand_id, []).append(_allocation(binding))
    return engine, {demand_id: tuple(allocations) for demand_id, allocations in placed.items()}


def _behind_head(result, demands: list[Demand]) -> list[Binding]:
    """The bindings of demands behind the first one crowded out (the head a reservation is made for)."""
    reasons = {pending.demand_id: pending.reason for pending in result.pending}
    head_at = next((i for i, demand in enumerate(demands) if reasons.get(demand.id) in backfill.CROWDED_OUT), None)
    if head_at is None:
        return []
    behind = {demand.id for demand in demands[head_at + 1 :]}
    return [binding for binding in result.bindings if binding.demand_id in behind]


def _allocation(binding: Binding) -> RunningAllocation:
    return RunningAllocation(binding.demand_id, binding.node, binding.devices, binding.cpu_milli, binding.memory_mib)


def _binding(allocation: RunningAllocation) -> Binding:
    return Binding(allocation.id, allocation.node, allocation.devices, allocation.cpu_milli, allocation.memory_mib)
