"""The forecast (scheduling/engine/forecast.py): expected starts on a small queue equal the hand-computed ones."""

from datetime import UTC, datetime, timedelta

from scheduling.engine import DeviceView, NodeView, PlacementEngine, RunningAllocation, Snapshot
from scheduling.engine.forecast import (
    BEYOND_FORECAST,
    MAINTENANCE,
    RESERVATION_AHEAD,
    RUNNING_WITHOUT_END,
    EarlyEnds,
    Estimate,
    HeldWindow,
    Queued,
    Running,
    forecast,
    kind_of,
    spread_draw,
)
from scheduling.engine.model import Demand

NOW = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)
HOUR = timedelta(hours=1)
NODE = NodeView("n1", 64000, 1 << 19, (DeviceView(0, "h100"), DeviceView(1, "h100")))


def running(work_id, card, started, ends):
    """`work_id` on card `card` of n1, started and ending that many hours from NOW (ends None: no end)."""
    allocation = RunningAllocation(work_id, "n1", ((card, 1000),), 1000, 1024)
    return Running((allocation,), NOW + started * HOUR, None if ends is None else NOW + ends * HOUR)


def queued(demand_id, cards, hours, priority=1):
    return Queued(Demand(demand_id, count=cards, cpu_milli=1000, memory_mib=1024, priority=priority), hours)


def estimate(work, queue, ratios=(), limit=10):
    def engine_now():
        allocations = [allocation for held in work for allocation in held.allocations]
        return PlacementEngine(Snapshot([NODE], allocations))

    return forecast(
        engine_now=engine_now, running=work, queue=queue, now=NOW, early_ends=EarlyEnds.of(ratios), limit=limit
    )


def at(hours):
    return NOW + hours * HOUR


def test_work_backfills_while_the_head_waits_when_it_ends_before_the_head_is_due():
    # A ends at +1 h, B at +3 h. The 2-card head waits for both (+3 h); the 1-card request behind it runs on A's card
    # from +1 h for 1 h, ending before the head is due. No history: every range is a point.
    work = [running("A", 0, -1, 1), running("B", 1, -1, 3)]
    estimates = estimate(work, [queued("head", 2, 4), queued("small", 1, 1)])
    assert estimates["head"] == Estimate(at(3), at(3), at(3))
    assert estimates["small"] == Estimate(at(1), at(1), at(1))


def test_work_that_would_delay_the_head_waits_for_it():
    # The same, but the small request would run 3 h from +1 h, past the head's start at +3 h: it is held back and
    # starts when the head (4 h from +3 h) ends.
    work = [running("A", 0, -1, 1), running("B", 1, -1, 3)]
    estimates = estimate(work, [queued("head", 2, 4), queued("small", 1, 3)])
    assert estimates["head"].likely == at(3)
    assert estimates["small"].likely == at(7)


def test_lower_priority_waits_behind_a_higher_priority_request_for_the_same_cards():
    work = [running("A", 0, -1, 1), running("B", 1, -1, 3)]
    estimates = estimate(work, [queued("high", 2, 4, priority=2), queued("low", 1, 1, priority=1)])
    assert estimates["high"].likely == at(3)
    assert estimates["low"].likely == at(7)  # it would fit on A's card at +1 h but is held for "high"


def test_history_of_early_ends_gives_the_earliest_and_likely_starts():
    # Ended work ran 25 %, 50 % and 100 % of its term. A (2 h term, half run, still running) is judged by 100 % only:
    # it ends at +1 h. B (4 h term, a quarter run) by 50 % and 100 %: at the earliest at 50 % (+1 h), likely at
    # 100 % (+3 h). The 2-card head needs both cards.
    work = [running("A", 0, -1, 1), running("B", 1, -1, 3)]
    estimates = estimate(work, [queued("head", 2, 4)], ratios=(0.25, 0.5, 1.0))
    assert estimates["head"] == Estimate(earliest=at(1), likely=at(3), latest=at(3))


def test_queued_work_ends_early_too_in_the_likely_replay():
    # Both cards busy until +1 h, by work that has outlived every ratio but 100 % (3 h of a 4 h term); "first" (2 h)
    # then "second" behind it, both on both cards. Likely, "first" runs half its 2 h: "second" starts at +2 h, not +3 h.
    work = [running("A", 0, -3, 1), running("B", 1, -3, 1)]
    estimates = estimate(work, [queued("first", 2, 2), queued("second", 2, 1)], ratios=(0.5, 0.5, 0.5, 1.0))
    assert estimates["first"].latest == at(1)
    assert estimates["second"].latest == at(3)
    assert estimates["second"].likely == estimates["second"].earliest == at(2)


def test_running_work_without_an_end_makes_what_waits_for_it_unknown():
    work = [running("A", 0, -1, 1), running("slurm-job", 1, -1, None)]
    estimates = estimate(work, [queued("head", 2, 4), queued("small", 1, 1)])
    assert estimates["head"] == Estimate(code=RUNNING_WITHOUT_END)
    assert estimates["small"].likely == at(1)  # A's card frees at +1 h: that much is known


def test_the_queue_beyond_the_limit_is_not_simulated():
    work = [running("A", 0, -1, 1), running("B", 1, -1, 3)]
    estimates = estimate(work, [queued("one", 1, 1), queued("two", 1, 1), queued("three", 1, 1)], limit=2)
    assert estimates["one"].likely == at(1)
    assert estimates["two"].likely == at(2)
    assert estimates["three"] == Estimate(code=BEYOND_FORECAST)


def test_an_idle_node_starts_work_now():
    estimates = estimate([], [queued("now", 2, 1)])
    assert estimates["now"] == Estimate(NOW, NOW, NOW)


def test_early_end_ratios_are_judged_by_what_the_work_has_outlived():
    ends = EarlyEnds.of([1.4, 0.2, 0.6, -1])  # clipped to 0..1
    assert ends.ratios == (0.0, 0.2, 0.6, 1.0)
    assert ends.ratio(0.5) == 0.6
    assert ends.ratio(0.5, ran=0.7) == 1.0
    assert ends.ratio(0.0, ran=0.2) == 0.6  # work that ran 20 % and still runs outlived the 20 % ratio
    assert EarlyEnds().ratio(0.5) == 1.0  # no history: work runs to its limit
    assert Estimate(NOW, NOW, at(1)).as_data()["latest"] == at(1).isoformat()


def test_asked_for_some_only_those_are_answered_and_the_replay_stops_once_they_started():
    work = [running("A", 0, -1, 1), running("B", 1, -1, 3)]
    queue = [queued("head", 2, 4), queued("small", 1, 1), queued("after", 2, 1)]
    estimates = forecast(
        engine_now=lambda: PlacementEngine(Snapshot([NODE], [a for held in work for a in held.allocations])),
        running=work,
        queue=queue,
        now=NOW,
        early_ends=EarlyEnds(),
        limit=10,
        wanted={"small"},
    )
    assert estimates == {"small": Estimate(at(1), at(1), at(1))}


def test_a_queue_the_cycle_just_left_waiting_starts_no_earlier_than_the_next_release():
    # The cycle left "small" waiting at NOW (whatever its reason): the replay trusts it and places from A's end on.
    work = [running("A", 0, -1, 1)]
    tried = forecast(
        engine_now=lambda: PlacementEngine(Snapshot([NODE], work[0].allocations)),
        running=work,
        queue=[queued("small", 1, 1)],
        now=NOW,
        early_ends=EarlyEnds(),
        limit=10,
        tried_now=True,
    )
    assert tried["small"] == Estimate(at(1), at(1), at(1))
    assert estimate(work, [queued("small", 1, 1)])["small"] == Estimate(NOW, NOW, NOW)  # card 1 is free now


def test_the_likely_replay_ends_each_piece_of_work_at_its_own_quantile_of_the_history():
    # Both cards held by work that started now for 1 h; ended work ran 10 %, 20 % .. 100 % of its term. Likely, each
    # ends at its own quantile (a stable draw by its id), so the two queued requests start at two moments, not both
    # at the median. (They ask for 10 h: the first cannot end before the second starts.)
    ratios = tuple(tenth / 10 for tenth in range(1, 11))
    work = [running("A", 0, 0, 1), running("B", 1, 0, 1)]
    estimates = estimate(work, [queued("one", 1, 10), queued("two", 1, 10)], ratios=ratios)
    ends = sorted(EarlyEnds.of(ratios).ratio(spread_draw(work_id)) for work_id in ("A", "B"))
    assert ends[0] < ends[1]
    assert [estimates["one"].likely, estimates["two"].likely] == [at(ends[0]), at(ends[1])]
    assert estimates["two"].latest == at(1)


def test_work_of_a_kind_with_enough_history_is_judged_by_its_own():
    # Ended 1-card 1-core terms of 1 h ran 50 % (twice); everything else ran its whole term. A (that kind) likely
    # ends at half its term; with a single ended term of its kind it would be judged by all of them.
    kind = kind_of(1, 1000, 1024, 1)
    ends = EarlyEnds.of([0.5, 0.5, 1.0, 1.0, 1.0, 1.0], {kind: [0.5, 0.5], (2, 1000, 1024, 1): [1.0] * 4})
    work = [running("A", 0, 0, 1), running("B", 1, 0, 4)]
    estimates = forecast(
        engine_now=lambda: PlacementEngine(Snapshot([NODE], [a for held in work for a in held.allocations])),
        running=work,
        queue=[queued("next", 1, 1)],
        now=NOW,
        early_ends=ends,
        limit=10,
    )
    assert estimates["next"].likely == at(0.5)
    assert EarlyEnds.of([0.5, 1.0, 1.0], {kind: [0.5]}).ratio(0.0, kind=kind) == 0.5  # one of its kind: all terms
    assert EarlyEnds.of([0.5, 1.0, 1.0], {kind: [0.5]}).ratio(0.5, kind=kind) == 1.0


def held_estimate(work, queue, windows):
    """As `estimate`, on two nodes (n1 and n2, two cards each) with windows held ahead."""
    second = NodeView("n2", 64000, 1 << 19, (DeviceView(0, "h100"), DeviceView(1, "h100")))

    def engine_now():
        allocations = [allocation for held in work for allocation in held.allocations]
        return PlacementEngine(Snapshot([NODE, second], allocations))

    return forecast(
        engine_now=engine_now,
        running=work,
        queue=queue,
        now=NOW,
        early_ends=EarlyEnds.of(()),
        limit=10,
        windows=windows,
    )


def test_work_stays_off_held_nodes_only_while_it_would_overlap_their_windows():
    # n1 is held for a reservation from +5 h to +15 h, n2 is in maintenance from +2 h to +8 h. A 1-hour job fits
    # before the maintenance (now, on n2 or n1); a 10-hour job waits for the maintenance to end (+8 h, n2); the next
    # 10-hour one for the reservation's window to end (+15 h, n1), and says which window kept it off.
    reservation = HeldWindow(at(5), at(15), frozenset({"n1"}), RESERVATION_AHEAD, "reservation #7")
    works = HeldWindow(at(2), at(8), frozenset({"n2"}), MAINTENANCE, "maintenance (firmware)")
    estimates = held_estimate(
        [], [queued("short", 2, 1), queued("first", 2, 10), queued("second", 2, 10)], [reservation, works]
    )
    assert estimates["short"] == Estimate(at(0), at(0), at(0))
    assert estimates["first"].likely == at(8)
    assert estimates["second"] == Estimate(
        at(15),
        at(15),
        at(15),
        RESERVATION_AHEAD,
        "n1 is held for reservation #7 from Tue 01 Dec 14:00 UTC until Wed 02 Dec 00:00 UTC",
    )


def test_without_windows_the_same_queue_starts_at_once():
    estimates = held_estimate([], [queued("first", 2, 10), queued("second", 2, 10)], [])
    assert estimates["first"].likely == estimates["second"].likely == at(0)
