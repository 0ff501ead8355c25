"""The idle decision alone (metering/idle/decide.py): pure, no database, the clock passed in."""

from datetime import UTC, datetime, timedelta

from metering.idle import decide
from metering.idle.decide import ACT, CLEAR, NOTHING, WARN, Activity, Terms, Watch

T0 = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)
TERMS = Terms(
    utilization_below_pct=5,
    watch_sessions=True,
    watch_gateway=False,
    idle=timedelta(hours=2),
    lead=timedelta(minutes=30),
)
NOT_WARNED = Watch()


def minutes(n: int) -> datetime:
    return T0 + timedelta(minutes=n)


def quiet(now: datetime, **overrides) -> Activity:
    """Started at T0, read just now at 0 %, never busy, no session."""
    return Activity(**{"started_at": T0, "last_reading_at": now, "last_utilization_pct": 0.0, **overrides})


def step(now, activity=None, watch=NOT_WARNED, stoppable=True, terms=TERMS):
    return decide.next_step(terms=terms, activity=activity or quiet(now), watch=watch, now=now, stoppable=stoppable)


def test_idle_since_is_the_latest_sign_of_use_with_one_reason_per_signal():
    now = minutes(100)
    verdict = decide.decide(TERMS, quiet(now, last_busy_reading_at=minutes(20), last_session_at=minutes(40)), now)
    assert verdict.idle_since == minutes(40)
    assert verdict.idle_for(now) == timedelta(minutes=60)
    assert [reason["code"] for reason in verdict.reasons] == ["accelerators_idle", "no_sessions"]
    assert verdict.reasons[0]["details"]["last_busy_at"] == minutes(20).isoformat()
    assert verdict.reasons[0]["details"]["threshold_pct"] == 5


def test_no_recent_readings_is_no_evidence_so_not_idle():
    now = minutes(200)
    verdict = decide.decide(TERMS, quiet(now, last_reading_at=minutes(100)), now)
    assert verdict.idle_since is None and verdict.reasons[0]["code"] == "no_readings"
    assert decide.decide(TERMS, quiet(now, last_reading_at=None), now).idle_since is None
    assert step(now, quiet(now, last_reading_at=minutes(100))).kind == NOTHING


def test_a_policy_without_utilisation_judges_on_the_other_signals():
    terms = Terms(None, watch_sessions=True, watch_gateway=True, idle=timedelta(hours=2), lead=timedelta(minutes=30))
    activity = Activity(started_at=T0, last_session_at=minutes(10), last_call_at=minutes(30))
    assert decide.decide(terms, activity, minutes(60)).idle_since == minutes(30)
    nothing = Terms(None, False, False, timedelta(hours=2), timedelta(minutes=30))
    assert decide.decide(nothing, activity, minutes(60)).reasons[0]["code"] == "no_signals"


def test_warned_at_idle_time_minus_lead_then_acted_on_at_the_idle_time():
    assert step(minutes(89)).kind == NOTHING
    warn = step(minutes(90))
    assert (warn.kind, warn.acts_at) == (WARN, minutes(120))
    warned = Watch(warned_at=minutes(90))
    assert step(minutes(119), watch=warned).kind == NOTHING
    assert step(minutes(120), watch=warned).kind == ACT


def test_nothing_is_stopped_without_a_warning_the_whole_lead_before():
    late = step(minutes(300))  # the sweep was down: warned now, the owner still gets the lead
    assert (late.kind, late.acts_at) == (WARN, minutes(330))
    warned_late = Watch(warned_at=minutes(300))
    assert step(minutes(329), watch=warned_late).kind == NOTHING
    assert step(minutes(330), watch=warned_late).kind == ACT


def test_used_again_after_the_warning_clears_it():
    warned = Watch(warned_at=minutes(90))
    busy_again = quiet(minutes(100), last_busy_reading_at=minutes(95))
    assert step(minutes(100), busy_again, watch=warned).kind == CLEAR
    session = quiet(minutes(100), last_session_at=minutes(99))
    assert step(minutes(100), session, watch=warned).kind == CLEAR


def test_a_snooze_moves_the_stop_and_is_warned_again_before_it():
    snoozed = Watch(snoozed_at=minutes(95), snoozed_until=minutes(180))
    assert step(minutes(149), watch=snoozed).kind == NOTHING
    again = step(minutes(150), watch=snoozed)
    assert (again.kind, again.acts_at) == (WARN, minutes(180))
    assert step(minutes(180), watch=Watch(warned_at=minutes(150), snoozed_at=minutes(95))).kind == ACT
    used = quiet(minutes(120), last_session_at=minutes(110))  # used after the snooze: a new episode
    assert step(minutes(120), used, watch=snoozed).kind == CLEAR


def test_work_that_cannot_be_stopped_is_warned_never_acted_on():
    warn = step(minutes(90), stoppable=False)
    assert (warn.kind, warn.acts_at) == (WARN, None)
    assert step(minutes(10_000), watch=Watch(warned_at=minutes(90)), stoppable=False).kind == NOTHING


def test_durations_in_words():
    assert [decide.duration_in_words(timedelta(minutes=m)) for m in (0, 59, 60, 90, 150)] == [
        "0 min",
        "59 min",
        "1 h",
        "1 h 30 min",
        "2 h 30 min",
    ]


ENDPOINT = Terms(
    utilization_below_pct=5,
    watch_sessions=False,
    watch_gateway=True,
    idle=timedelta(hours=1),
    lead=timedelta(minutes=15),
    readings_required=False,
)


def test_an_endpoint_without_readings_is_judged_by_its_gateway_calls():
    now = minutes(100)
    calls_only = Activity(started_at=T0, last_call_at=minutes(30))
    verdict = decide.decide(ENDPOINT, calls_only, now)
    assert verdict.idle_since == minutes(30)
    assert [reason["code"] for reason in verdict.reasons] == ["no_gateway_calls"]
    assert verdict.reasons[0]["details"]["last_call_at"] == minutes(30).isoformat()
    stale = Activity(started_at=T0, last_call_at=minutes(30), last_reading_at=minutes(10), last_busy_reading_at=T0)
    assert decide.decide(ENDPOINT, stale, now).idle_since == minutes(30)  # old readings neither block nor count


def test_an_endpoint_s_fresh_readings_count_too():
    now = minutes(100)
    busy_card = Activity(
        started_at=T0, last_call_at=minutes(30), last_reading_at=minutes(99), last_busy_reading_at=minutes(80)
    )
    verdict = decide.decide(ENDPOINT, busy_card, now)
    assert verdict.idle_since == minutes(80)
    assert [reason["code"] for reason in verdict.reasons] == ["accelerators_idle", "no_gateway_calls"]


def test_an_endpoint_is_warned_the_lead_before_and_scaled_at_the_idle_time_and_a_call_clears_it():
    def endpoint_step(now, watch=NOT_WARNED, last_call_at=T0):
        activity = Activity(started_at=T0, last_call_at=last_call_at)
        return decide.next_step(terms=ENDPOINT, activity=activity, watch=watch, now=now, stoppable=True)

    assert endpoint_step(minutes(44)).kind == NOTHING
    warn = endpoint_step(minutes(45))
    assert (warn.kind, warn.acts_at) == (WARN, minutes(60))
    warned = Watch(warned_at=minutes(45))
    assert endpoint_step(minutes(59), warned).kind == NOTHING
    assert endpoint_step(minutes(60), warned).kind == ACT
    assert endpoint_step(minutes(58), warned, last_call_at=minutes(50)).kind == CLEAR
