"""The forecast (scheduling/engine/forecast.py): expected starts on a small queue equal the hand-computed ones."""

from datetime import UTC, datetime, timedelta

from scheduling.engine import DeviceView, NodeView, PlacementEngine, RunningAllocation, Snapshot
from scheduling.engine.forecast import (
    BEYOND_FORECAST,
    LIKELY_DRAWS,
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


def test_the_likely_start_is_the_median_over_draws_of_each_pieces_own_quantile():
    # Both cards held by work that started now for 1 h; ended work ran 10 %, 20 % .. 100 % of its term. In each
    # likely replay each piece ends at its own quantile (a stable draw by its id and the replay), so the two queued
    # requests start at two moments, not both at the median; each one's likely start is the median over the draws.
    # (They ask for 10 h: the first cannot end before the second starts.) A's draws end it at 90, 100, 40, 10 and
    # 30 %, B's at 40, 70, 60, 70 and 40 %: "one" starts at 40, 70, 40, 10 and 30 % (median 40 %), "two" at 90, 100,
    # 60, 70 and 40 % (median 70 %).
    ratios = tuple(tenth / 10 for tenth in range(1, 11))
    work = [running("A", 0, 0, 1), running("B", 1, 0, 1)]
    estimates = estimate(work, [queued("one", 1, 10), queued("two", 1, 10)], ratios=ratios)
    history = EarlyEnds.of(ratios)
    draws = [sorted(history.ratio(spread_draw(work_id, draw)) for work_id in "AB") for draw in range(LIKELY_DRAWS)]
    assert draws == [[0.4, 0.9], [0.7, 1.0], [0.4, 0.6], [0.1, 0.7], [0.3, 0.4]]
    assert [estimates["one"].likely, estimates["two"].likely] == [at(0.4), at(0.7)]
    assert estimates["two"].latest == at(1)


def test_a_kinds_history_is_shrunk_toward_all_ended_terms_by_its_count():
    # Ended terms: one of A's kind (1 card, 1 core, 1 h) ran 25 %, four of another kind their whole term. The kind's
    # one term weighs 1 / (1 + 2), all five terms the other 2/3: 25 % holds 1/3 + 2/3 * 1/5 = 7/15 of the weight.
    # Three of A's five draws are below that: it likely ends at a quarter of its term, and "next" starts then (by all
    # terms alone, 25 % would hold 1/5: one draw, and "next" would wait for A's limit).
    kind = kind_of(1, 1000, 1024, 1)
    ends = EarlyEnds.of([0.25, 1.0, 1.0, 1.0, 1.0], {kind: [0.25], (2, 1000, 1024, 1): [1.0] * 4})
    work = [running("A", 0, 0, 1), running("B", 1, 0, 4)]
    estimates = forecast(
        engine_now=lambda: PlacementEngine(Snapshot([NODE], [a for held in work for a in held.allocations])),
        running=work,
        queue=[queued("next", 1, 1)],
        now=NOW,
        early_ends=ends,
        limit=10,
    )
    assert [spread_draw("A", draw) < 7 / 15 for draw in range(LIKELY_DRAWS)] == [False, False, True, True, True]
    assert [spread_draw("B", draw) < 1 / 5 for draw in range(LIKELY_DRAWS)] == [False] * LIKELY_DRAWS
    assert estimates["next"].likely == at(0.25)
    assert (ends.ratio(0.46, kind=kind), ends.ratio(0.47, kind=kind)) == (0.25, 1.0)
    # A kind with no ended term is judged by all of them (1/5 at 25 %).
    new_kind = kind_of(1, 1000, 1024, 2)
    assert (ends.ratio(0.19, kind=new_kind), ends.ratio(0.2, kind=new_kind)) == (0.25, 1.0)
    # Eight terms of its kind weigh 8 / (8 + 2): 25 % holds 0.8 + 0.2 * 8/12 = 14/15.
    many = EarlyEnds.of([0.25] * 8 + [1.0] * 4, {kind: [0.25] * 8, (2, 1000, 1024, 1): [1.0] * 4})
    assert (many.ratio(0.93, kind=kind), many.ratio(0.94, kind=kind)) == (0.25, 1.0)
    assert many.ratio(0.0, ran=0.3, kind=kind) == 1.0  # work that ran 30 % outlived every 25 % term


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
