"""Advance reservations end to end: an order for a future window is judged in its window (horizon, quota during the
window, the month it starts in, capacity with the earliest free window offered), routed by approval rules that see
"reservation" and its lead time, waits in the queue with its start as the reason and the expected start, starts at
its start, and gives everything back when cancelled before it."""

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
import time_machine
from django.urls import reverse

from config.errors import DomainError
from requests import services
from requests.choices import RequestState
from requests.quota import quota_scopes
from requests.reservations import WindowTaken
from scheduling import cycle, expected_start, outcome, reclaim
from scheduling.allocations import allocations_meter_from_workload
from scheduling.models import MaintenanceWindow
from tenancy.services import quota_set
from tests import factories
from tests.requests.conftest import approval_rule, approver_stage, make_order, order_post
from tests.scheduling.test_cycle import add_node, queued, shop, team  # noqa: F401 (fixtures)

pytestmark = pytest.mark.django_db
START = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)
HOUR = timedelta(hours=1)


@pytest.fixture
def clock():
    """A frozen moment; the cycle outcome a process decoded last is forgotten first (as in test_expected_start)."""
    outcome._decoded.clear()
    expected_start.forget_pictures()
    with time_machine.travel(START, tick=False) as traveller:
        yield traveller


def reserve(shop, team, start, hours=10, **order):  # noqa: F811
    return services.request_submit(
        order=make_order(shop, team.project, start_at=start, duration_hours=hours, **order), requester=team.developer
    )


def refusal(call) -> DomainError:
    with pytest.raises(DomainError) as refused:
        call()
    return refused.value


def test_a_reservation_waits_for_its_window_then_starts_at_it(shop, team, clock, api_as):  # noqa: F811
    add_node(shop.accelerator, cards=2)
    reservation = reserve(shop, team, START + 24 * HOUR)
    assert reservation.state == RequestState.QUEUED and reservation.approved_spec["reservation"]["hours"] == 10
    assert cycle.run_cycle().allocated == []  # the cards are free, but its window has not begun
    reservation.refresh_from_db()
    assert reservation.queue_reason["code"] == "reservation_not_due"
    assert reservation.queue_reason["message"] == "Reserved from Wed 02 Dec 09:00 UTC on n1; it starts then."
    assert reservation.queue_reason["numbers"]["nodes"] == ["n1"]
    start = (START + 24 * HOUR).isoformat()
    assert reservation.queue_estimate == {
        "earliest": start,
        "likely": start,
        "latest": start,
        "code": None,
        "reason": None,
    }
    body = api_as(team.developer).get(f"/api/v1/requests/{reservation.pk}/").json()
    assert body["reserved_start"] == "2026-12-02T09:00:00Z"
    assert body["queue"]["expected_start"]["message"] == "Expected to start in about 24 h."

    clock.move_to(START + 24 * HOUR)
    assert cycle.run_cycle().allocated == [reservation.pk]


def test_a_future_reservation_takes_no_quota_now(shop, team, clock):  # noqa: F811
    """Until its start a reservation holds nothing: work that runs now is admitted beside it."""
    quota_set(quota=team.project.quota, limits={"gpus": 2}, actor=None)
    reserve(shop, team, START + 48 * HOUR)
    assert queued(shop, team).state == RequestState.QUEUED  # both cards, now
    project_scope = quota_scopes(team.project)[0]
    assert project_scope.usage["gpus"] == Decimal(2) and project_scope.usage["concurrent_tasks"] == 1


def test_the_window_must_start_ahead_and_end_within_the_horizon(shop, team, clock, settings):  # noqa: F811
    settings.RESERVATION_HORIZON_DAYS = 7
    past = refusal(lambda: reserve(shop, team, START - HOUR))
    assert past.code == "reservation_start_past" and past.status_code == 422
    beyond = refusal(lambda: reserve(shop, team, START + 7 * 24 * HOUR - 5 * HOUR))  # ends 5 h past the horizon
    assert beyond.code == "reservation_beyond_horizon"
    assert beyond.details["horizon_days"] == 7 and beyond.details["end"] == "2026-12-08T14:00:00+00:00"
    too_long = refusal(lambda: reserve(shop, team, START + 24 * HOUR, hours=169))  # the service allows 168 h
    assert too_long.code == "duration_out_of_range"


def test_quota_counts_overlapping_reservations_and_work_still_running_at_the_start(shop, team, clock):  # noqa: F811
    add_node(shop.accelerator, name="n1", cards=2)
    add_node(shop.accelerator, name="n2", cards=2)
    add_node(shop.accelerator, name="n3", cards=2)
    quota_set(quota=team.project.quota, limits={"gpus": 2}, actor=None)
    running = queued(shop, team)  # both cards of the quota for 10 h from now
    cycle.run_cycle()
    running.refresh_from_db()
    assert running.state == RequestState.ALLOCATED

    over = refusal(lambda: reserve(shop, team, START + 5 * HOUR))  # it still runs then
    assert over.code == "quota_exceeded" and over.status_code == 409
    assert over.details["reasons"][0]["dimension"] == "gpus" and over.details["reasons"][0]["used"] == "2.0000"
    after = reserve(shop, team, START + 10 * HOUR)  # it has ended by then
    assert after.state == RequestState.QUEUED

    overlapping = refusal(lambda: reserve(shop, team, START + 15 * HOUR))  # inside the reservation's window
    assert overlapping.code == "quota_exceeded"
    assert reserve(shop, team, START + 20 * HOUR).state == RequestState.QUEUED  # right after it


def test_cancelling_before_the_start_gives_the_window_back(shop, team, clock):  # noqa: F811
    quota_set(quota=team.project.quota, limits={"gpus": 2}, actor=None)
    first = reserve(shop, team, START + 24 * HOUR)
    assert refusal(lambda: reserve(shop, team, START + 24 * HOUR)).code == "quota_exceeded"
    services.request_cancel(request=first, actor=team.developer, reason="plans changed")
    assert reserve(shop, team, START + 24 * HOUR).state == RequestState.QUEUED


def test_monthly_card_hours_count_in_the_month_the_window_starts(shop, team, clock, settings):  # noqa: F811
    settings.RESERVATION_HORIZON_DAYS = 60
    quota_set(quota=team.project.quota, limits={"monthly_card_hours": 30}, actor=None)
    january = datetime(2027, 1, 2, 9, tzinfo=UTC)
    reserve(shop, team, january)  # 2 cards x 10 h = 20 of January's 30
    over = refusal(lambda: reserve(shop, team, january + 24 * HOUR))
    assert over.code == "quota_exceeded" and over.details["reasons"][0]["dimension"] == "monthly_card_hours"
    assert over.details["reasons"][0]["used"] == "20.0000"
    # December's budget is untouched by January's window: this month's order fits its 30.
    assert reserve(shop, team, START + 24 * HOUR).state == RequestState.QUEUED


def test_a_taken_window_is_refused_with_the_earliest_free_one(shop, team, clock, api_as):  # noqa: F811
    add_node(shop.accelerator, cards=2)
    queued(shop, team)  # both cards until START + 10 h
    cycle.run_cycle()
    taken = refusal(lambda: reserve(shop, team, START + 2 * HOUR))
    assert isinstance(taken, WindowTaken) and taken.status_code == 409
    assert taken.details["earliest_start"] == (START + 10 * HOUR).isoformat()
    assert "Earliest free window for" in taken.message and "Tue 01 Dec 19:00 UTC" in taken.message

    held = reserve(shop, team, START + 10 * HOUR)  # the earliest window: taken from now on
    assert held.state == RequestState.QUEUED
    body = api_as(team.developer).post(
        "/api/v1/requests/preview/",
        {**order_post(shop, team.project), "service": shop.service.pk, "start_at": (START + 12 * HOUR).isoformat()},
        format="json",
    )
    assert body.status_code == 200, body.json()
    capacity = body.json()["reservation"]["capacity"]
    assert capacity["fits_asked"] is False and capacity["start"] == (START + 20 * HOUR).isoformat()

    answer = api_as(team.developer).post(
        "/api/v1/requests/",
        {**order_post(shop, team.project), "service": shop.service.pk, "start_at": (START + 12 * HOUR).isoformat()},
        format="json",
    )
    assert answer.status_code == 409
    assert answer.json()["code"] == "reservation_window_taken"
    assert answer.json()["details"]["earliest_start"] == (START + 20 * HOUR).isoformat()


def test_approval_rules_see_reservations_and_their_lead_time(shop, team, clock):  # noqa: F811
    approval_rule(approver_stage(), reservation=True, reserved_within_hours=24)
    short_notice = reserve(shop, team, START + 12 * HOUR)
    assert short_notice.state == RequestState.PENDING_APPROVAL
    planned = reserve(shop, team, START + 72 * HOUR)
    assert planned.state == RequestState.QUEUED
    assert queued(shop, team).state == RequestState.QUEUED  # not a reservation: the rule does not apply


def test_planned_nodes_keep_out_work_that_would_still_run_and_take_work_that_ends_before(shop, team, clock):  # noqa: F811
    add_node(shop.accelerator, name="n1", cards=2)
    add_node(shop.accelerator, name="n2", cards=2)
    reservation = reserve(shop, team, START + 5 * HOUR)  # both cards of one node from START + 5 h
    elsewhere = queued(shop, team)  # 10 h: goes to the node nobody reserved
    overlapping = queued(shop, team)  # 10 h: would still run at the start
    before = queued(shop, team, duration_hours=3)  # over before the start: backfilled onto the planned node
    result = cycle.run_cycle()
    assert sorted(result.allocated) == sorted([elsewhere.pk, before.pk])
    overlapping.refresh_from_db()
    assert overlapping.queue_reason["code"] == "reservation_ahead"
    planned = overlapping.queue_reason["numbers"]["node"]
    assert overlapping.queue_reason["numbers"]["reservation"] == reservation.pk
    assert (
        f"when reservation #{reservation.pk} starts there (Tue 01 Dec 14:00 UTC)" in overlapping.queue_reason["message"]
    )
    assert before.allocations.get().node.name == planned != elsewhere.allocations.get().node.name


def test_a_reservation_is_never_preemptible(shop, team, clock):  # noqa: F811
    add_node(shop.accelerator, cards=2)
    reservation = reserve(shop, team, START + HOUR, priority="batch")
    clock.move_to(START + HOUR)
    cycle.run_cycle()
    assert reservation.allocations.get().preemptible is False  # a batch request's would be


def test_operators_see_the_reservations_per_spec_and_site_in_constant_queries(
    shop,  # noqa: F811
    team,  # noqa: F811
    clock,
    console,
    django_assert_max_num_queries,
):
    add_node(shop.accelerator, name="n1", cards=2)
    first = reserve(shop, team, START + 5 * HOUR)
    cycle.run_cycle()  # plans its node
    url = reverse("admin:scheduling_reservations")
    with django_assert_max_num_queries(12) as once:
        page = console.get(url).content.decode()
    assert f"#{first.pk}" in page and "Tue 01 Dec 14:00" in page and "n1" in page
    for hours in (20, 40, 60):
        reserve(shop, team, START + hours * HOUR)
    with django_assert_max_num_queries(len(once.captured_queries)):
        page = console.get(url).content.decode()
    assert page.count('class="reservation-row"') == 4 and "not planned yet" in page


def test_a_no_show_is_released_and_its_held_hours_are_reserved_but_idle_in_the_report(
    shop,  # noqa: F811
    team,  # noqa: F811
    clock,
    settings,
    api_as,
):
    settings.RESERVATION_NO_SHOW_MINUTES = 30
    add_node(shop.accelerator, cards=2)
    reservation = reserve(shop, team, START + HOUR)
    clock.move_to(START + HOUR)
    assert cycle.run_cycle().allocated == [reservation.pk]  # nothing provisions it here: it never runs
    clock.move_to(START + HOUR + timedelta(minutes=29))
    assert reclaim.reclaim_no_shows() == {}
    clock.move_to(START + HOUR + timedelta(minutes=30))
    assert reclaim.reclaim_no_shows() == {reservation.pk: reclaim.RELEASED}
    reservation.refresh_from_db()
    assert reservation.state in {RequestState.RELEASING, RequestState.RELEASED}
    assert reservation.events.filter(message__contains="no-show: nothing ran 30 minutes after").exists()
    allocation = reservation.allocations.get()
    allocations_meter_from_workload(allocation_ids=[allocation.pk])  # what starting a workload asks for
    allocation.refresh_from_db()
    assert allocation.metered_from_workload is False  # its held hours count, from the allocation, used or not
    # The usage report shows them apart: held from the window's start to the release, nothing ever ran.
    [row] = api_as(factories.operator()).get("/api/v1/usage/reserved-idle/", {"project": team.project.pk}).json()
    half_an_hour = float(reservation.gpu_equivalents) / 2
    assert (row["reservations"], row["reserved_card_hours"], row["reserved_idle_card_hours"]) == (
        1,
        half_an_hour,
        half_an_hour,
    )


def test_the_order_form_reserves_a_window_and_offers_the_earliest_free_one(shop, team, clock, client):  # noqa: F811
    add_node(shop.accelerator, cards=2)
    queued(shop, team)  # both cards until START + 10 h
    cycle.run_cycle()
    client.force_login(team.developer)
    form = client.get(f"/order/{shop.service.slug}/").content.decode()
    assert 'name="start_at"' in form and 'type="datetime-local"' in form and "whole nodes are reserved" in form

    asked = order_post(shop, team.project, start_at="2026-12-01T11:00")
    preview = client.post(f"/order/{shop.service.slug}/preview/", asked).content.decode()
    assert 'data-code="window_taken"' in preview and "Earliest free window for" in preview
    assert "Tue 01 Dec 19:00 UTC" in preview and "holds whole nodes" in preview

    response = client.post(f"/order/{shop.service.slug}/", order_post(shop, team.project, start_at="2026-12-01T19:00"))
    assert response.status_code == 302, response.content.decode()
    page = client.get(response["Location"]).content.decode()
    assert '<dd id="reserved-window">Tue 01 Dec 19:00 to Wed 02 Dec 05:00 UTC</dd>' in page


def maintenance(*nodes, start, hours, reason="firmware update"):
    window = MaintenanceWindow.objects.create(starts_at=start, ends_at=start + hours * HOUR, reason=reason)
    window.nodes.set(nodes)
    return window


def test_a_maintenance_window_keeps_work_that_would_overlap_it_waiting_and_says_until_when(shop, team, clock):  # noqa: F811
    node = add_node(shop.accelerator, name="n1", cards=6)  # room for all three, but for the maintenance
    maintenance(node, start=START + 4 * HOUR, hours=2)
    short, long = queued(shop, team, duration_hours=3), queued(shop, team)  # 3 h fits before it, 10 h does not
    assert cycle.run_cycle().allocated == [short.pk]
    long.refresh_from_db()
    assert long.queue_reason["code"] == "maintenance"
    assert long.queue_reason["message"] == (
        "it would still run on n1 when its maintenance starts (Tue 01 Dec 13:00 UTC, until Tue 01 Dec 15:00 UTC: "
        "firmware update); it waits for a node that is free for its whole term"
    )
    assert long.queue_reason["numbers"]["until"] == (START + 6 * HOUR).isoformat()

    clock.move_to(START + 4 * HOUR)  # in maintenance now: nothing starts there, whatever its length
    quick = queued(shop, team, duration_hours=1)
    assert cycle.run_cycle().allocated == []
    quick.refresh_from_db()
    assert quick.queue_reason["message"].startswith("n1 is in maintenance until Tue 01 Dec 15:00 UTC (firmware update)")

    clock.move_to(START + 6 * HOUR)
    assert sorted(cycle.run_cycle().allocated) == sorted([long.pk, quick.pk])


def test_a_reservation_is_not_offered_a_window_that_overlaps_maintenance(shop, team, clock):  # noqa: F811
    node = add_node(shop.accelerator, name="n1", cards=2)
    maintenance(node, start=START + 10 * HOUR, hours=5)
    cycle.run_cycle()
    taken = refusal(lambda: reserve(shop, team, START + 8 * HOUR))
    assert taken.code == "reservation_window_taken"
    assert taken.details["earliest_start"] == (START + 15 * HOUR).isoformat()
