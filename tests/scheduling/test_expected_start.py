"""Expected starts end to end: the cycle forecasts and stores them with the queue status; the API, the request page,
the order preview ("if submitted now") and the approval inbox ("if approved now") show them, in words."""

from datetime import UTC, datetime, timedelta

import pytest
import time_machine
from django.db import connection
from django.test.utils import CaptureQueriesContext

from requests import services, start_words
from requests.choices import RequestState
from scheduling import cycle, expected_start, outcome, reclaim
from tenancy.services import quota_set
from tests.requests.conftest import approval_rule, approver_stage, make_order
from tests.scheduling.test_cycle import add_node, queued, shop, team  # noqa: F401 (fixtures)

pytestmark = pytest.mark.django_db
START = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)
HOUR = timedelta(hours=1)


@pytest.fixture
def clock():
    """Every test here runs at the same frozen moment; a process keeps the cycle outcome (and the forecast inputs) it
    decoded last by the cycle's time, so what an earlier test's cycle left is forgotten first."""
    outcome._decoded.clear()
    expected_start.forget_pictures()
    with time_machine.travel(START, tick=False) as traveller:
        yield traveller


def order_body(shop, team, hours=3) -> dict:  # noqa: F811 (the fixtures, passed on)
    """A whole-card order's preview body."""
    return {
        "project": team.project.pk,
        "service": shop.service.pk,
        "spec": shop.whole.pk,
        "image": shop.image.pk,
        "duration_hours": hours,
    }


def stamp(moment: datetime) -> str:
    return moment.isoformat()


def test_the_cycle_stores_when_a_waiting_request_is_expected_to_start(shop, team, clock, api_as):  # noqa: F811
    add_node(shop.accelerator, cards=2)
    running, waiting = queued(shop, team), queued(shop, team)  # both want both cards, 10 hours each
    cycle.run_cycle()
    waiting.refresh_from_db()
    assert waiting.queue_reason["code"] == "capacity_in_use"
    # No ended work yet: every range is the running request's approved end.
    end = stamp(START + 10 * HOUR)
    assert waiting.queue_estimate == {"earliest": end, "likely": end, "latest": end, "code": None, "reason": None}
    clock.move_to(START + 6 * HOUR)  # read later: said relative to now
    body = api_as(team.developer).get(f"/api/v1/requests/{waiting.pk}/").json()
    assert body["queue"]["expected_start"]["likely"] == end
    assert body["queue"]["expected_start"]["message"] == "Expected to start in about 4 h."
    row = api_as(team.developer).get("/api/v1/queue/").json()["results"][0]
    assert row["id"] == waiting.pk and row["queue"]["expected_start"] == body["queue"]["expected_start"]
    assert running.pk not in [row["id"] for row in api_as(team.developer).get("/api/v1/queue/").json()["results"]]


def test_work_that_ended_early_narrows_the_range(shop, team, clock, django_capture_on_commit_callbacks):  # noqa: F811
    add_node(shop.accelerator, cards=2)
    quota_set(quota=team.project.quota, limits={"concurrent_tasks": 100}, actor=None)
    early = queued(shop, team)
    cycle.run_cycle()
    clock.move_to(START + 2.5 * HOUR)  # a quarter of its 10 hours
    with django_capture_on_commit_callbacks(execute=True):
        services.request_release(request=early, actor=team.developer, reason="done early")
    reclaim.allocation_free(request_ids=[early.pk], reason="done early")
    now = START + 2.5 * HOUR
    running, waiting = queued(shop, team), queued(shop, team)
    cycle.run_cycle()
    running.refresh_from_db()
    waiting.refresh_from_db()
    assert running.state != RequestState.QUEUED
    # One ended term, at 25 %: the running request likely ends at a quarter of its term too, at the latest at its end.
    assert waiting.queue_estimate["likely"] == stamp(now + 2.5 * HOUR)
    assert waiting.queue_estimate["earliest"] == stamp(now + 2.5 * HOUR)
    assert waiting.queue_estimate["latest"] == stamp(now + 10 * HOUR)
    assert start_words.expected_start(waiting.queue_estimate, now)["message"] == (
        "Expected to start in about 2 h (2-10 h)."
    )


def test_a_request_waiting_for_quota_gets_its_reason_not_a_time(shop, team, clock, api_as):  # noqa: F811
    add_node(shop.accelerator, cards=8)
    queued(shop, team)
    request = queued(shop, team)
    quota_set(quota=team.project.quota, limits={"concurrent_tasks": 1}, actor=None)
    cycle.run_cycle()
    body = api_as(team.developer).get(f"/api/v1/requests/{request.pk}/").json()
    expected = body["queue"]["expected_start"]
    assert (expected["likely"], expected["code"], expected["reason"]) == (None, "not_timed", "quota_exhausted")
    assert expected["message"] == "No start time while it waits for its project's quota."


def test_the_request_page_says_when_it_is_expected_to_start(client, shop, team, clock):  # noqa: F811
    add_node(shop.accelerator, cards=2)
    queued(shop, team)
    waiting = queued(shop, team)
    cycle.run_cycle()
    client.force_login(team.developer)
    page = client.get(f"/requests/{waiting.pk}/").content.decode()
    assert 'id="expected-start"' in page and "Expected to start in about 10 h." in page


def test_the_preview_says_when_an_order_would_start_if_submitted_now(shop, team, clock, api_as):  # noqa: F811
    add_node(shop.accelerator, cards=2)
    queued(shop, team)
    queued(shop, team)  # waits until +10 h, then runs 10 h
    cycle.run_cycle()
    placement = api_as(team.developer).post("/api/v1/requests/preview/", order_body(shop, team), format="json")
    placement = placement.json()["placement"]
    assert placement["fits_now"] is False
    assert placement["expected_start"]["likely"] == stamp(START + 20 * HOUR)
    assert placement["expected_start"]["message"] == "Expected to start in about 20 h."


def test_queue_and_detail_cost_the_same_queries_with_estimates(shop, team, clock, api_as):  # noqa: F811
    add_node(shop.accelerator, cards=2)
    quota_set(quota=team.project.quota, limits={"concurrent_tasks": 100}, actor=None)
    first = queued(shop, team)
    queued(shop, team)
    cycle.run_cycle()
    client = api_as(team.developer)
    paths = ["/api/v1/queue/", f"/api/v1/requests/{first.pk}/"]
    for path in paths:
        client.get(path)  # warm per-process caches

    def counted():
        found = []
        for path in paths:
            with CaptureQueriesContext(connection) as queries:
                client.get(path)
            found.append(len(queries))
        return found

    few = counted()
    for _ in range(6):
        queued(shop, team)
    cycle.run_cycle()
    rows = client.get("/api/v1/queue/").json()["results"]
    assert len(rows) == 7 and all(row["queue"]["expected_start"]["likely"] for row in rows)
    assert counted() == few


def test_the_inbox_says_when_each_request_would_start_if_approved_now(client, shop, team, clock):  # noqa: F811
    add_node(shop.accelerator, cards=2)
    cycle.run_cycle()  # the picture the inbox replays from
    approval_rule(approver_stage())
    pending = services.request_submit(order=make_order(shop, team.project), requester=team.developer)
    assert pending.state == RequestState.PENDING_APPROVAL
    client.force_login(team.approver)
    page = client.get("/approvals/").content.decode()
    assert "If approved now: Expected to start at the next scheduling cycle." in page
    # Two awaiting approval for the same two cards: as if both were approved now, the younger one waits 10 h.
    services.request_submit(order=make_order(shop, team.project), requester=team.developer)
    page = client.get("/approvals/").content.decode()
    assert "If approved now: Expected to start at the next scheduling cycle." in page
    assert "If approved now: Expected to start in about 10 h." in page


def test_an_order_s_preview_is_replayed_once_per_shape_and_cycle(shop, team, clock, api_as, monkeypatch):  # noqa: F811
    add_node(shop.accelerator, cards=2)
    queued(shop, team)
    queued(shop, team)
    cycle.run_cycle()
    replays = []  # an order's replay: the one that looks for wanted work (the cycle's own replays the whole queue)
    replay = expected_start.forecasting.replay

    def counted(**kwargs):
        replays.extend([kwargs["wanted"]] if kwargs.get("wanted") else [])
        return replay(**kwargs)

    monkeypatch.setattr(expected_start.forecasting, "replay", counted)

    def preview(hours):
        answer = api_as(team.developer).post("/api/v1/requests/preview/", order_body(shop, team, hours), "json")
        return answer.json()["placement"]["expected_start"]["likely"]

    assert preview(3) == preview(3) == stamp(START + 20 * HOUR) and len(replays) == 1  # the same shape and term
    preview(4)
    assert len(replays) == 2  # another term is another replay
    clock.shift(HOUR)
    cycle.run_cycle()  # a new picture: replayed again
    assert preview(3) == stamp(START + 20 * HOUR) and len(replays) == 3
