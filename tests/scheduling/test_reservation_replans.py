"""Reservations and held windows in time: a node planned for a reservation that fails before the start is re-planned
inside its topology domain, or its owner is told once (timeline and mail) when it is expected to start instead; the
forecast of ordinary queued work keeps it off nodes a reservation or a maintenance window holds while it would
overlap them, and says so."""

from datetime import UTC, datetime, timedelta

import pytest
import time_machine
from django.db import connection
from django.test.utils import CaptureQueriesContext

from requests.choices import EventCode
from scheduling import cycle, expected_start, outcome
from scheduling import services as scheduling_services
from scheduling.models import MaintenanceWindow, Node
from tenancy.services import quota_set
from tests.scheduling.test_cycle import add_node, queued, shop, team  # noqa: F401 (fixtures)
from tests.scheduling.test_reservations import reserve
from tests.smtp_server import text_of

pytestmark = pytest.mark.django_db
START = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)
HOUR = timedelta(hours=1)


@pytest.fixture
def clock():
    outcome._decoded.clear()
    expected_start.forget_pictures()
    with time_machine.travel(START, tick=False) as traveller:
        yield traveller


def planned(request) -> list[str]:
    request.refresh_from_db()
    return request.queue_reason["numbers"]["nodes"]


def in_domain(domain: str, *names: str) -> None:
    Node.objects.filter(name__in=names).update(topology_domain=domain)


def cordon(name: str, reason: str) -> None:
    scheduling_services.node_cordon(node=Node.objects.get(name=name), reason=reason, actor=None)


def replan_events(request) -> list[tuple[str, str]]:
    codes = [EventCode.RESERVATION_REPLANNED, EventCode.PLANNED_NODE_FAILED]
    return list(request.events.filter(code__in=codes).order_by("pk").values_list("code", "message"))


@pytest.fixture
def run(django_capture_on_commit_callbacks):
    """A cycle with its after-commit work run: the mail task runs inline (Q_SYNC), as in production."""

    def run_cycle():
        with django_capture_on_commit_callbacks(execute=True):
            return cycle.run_cycle()

    return run_cycle


def told(mailbox, owner) -> list[str]:
    return [mail["Subject"] for mail in mailbox.to(owner.developer.email) if mail["Subject"].startswith("Reservation")]


def maintenance(name, *, start, hours, reason="firmware update"):
    window = MaintenanceWindow.objects.create(starts_at=start, ends_at=start + hours * HOUR, reason=reason)
    window.nodes.set([Node.objects.get(name=name)])


def test_a_failed_planned_node_is_re_planned_inside_its_domain(shop, team, clock, mailbox, run):  # noqa: F811
    for name in ("n1", "n2", "n3"):
        add_node(shop.accelerator, name=name, cards=2)
    reservation = reserve(shop, team, START + 24 * HOUR)  # both cards of one node
    run()
    [first] = planned(reservation)
    same, other = sorted({"n1", "n2", "n3"} - {first})
    in_domain("island-a", first, same)
    in_domain("island-b", other)

    cordon(first, "PSU failure")
    run()
    assert planned(reservation) == [same]  # the node of its domain, not the other island's
    assert reservation.queue_reason["numbers"]["lost"] == [{"node": first, "reason": "cordoned: PSU failure"}]
    assert reservation.queue_reason["message"] == (
        f"Reserved from Wed 02 Dec 09:00 UTC on {same} ({first} failed: cordoned: PSU failure); it starts then."
    )
    assert reservation.queue_estimate["likely"] == (START + 24 * HOUR).isoformat()  # the start holds
    assert replan_events(reservation) == [
        (
            EventCode.RESERVATION_REPLANNED,
            f"Planned node {first} (cordoned: PSU failure) failed before the start: re-planned to {same} in the same "
            "domain; it starts as reserved, Wed 02 Dec 09:00 UTC.",
        )
    ]
    run()
    assert planned(reservation) == [same] and len(replan_events(reservation)) == 1  # told once
    assert told(mailbox, team) == []  # kept its start: no mail


def test_no_free_node_in_the_domain_tells_the_owner_once_with_its_new_start(shop, team, clock, mailbox, client, run):  # noqa: F811
    add_node(shop.accelerator, name="n1", cards=2)
    add_node(shop.accelerator, name="n2", cards=2)
    in_domain("island-a", "n1", "n2")
    reservation = reserve(shop, team, START + 24 * HOUR)
    busy = queued(shop, team, duration_hours=30)  # would still run at the start: kept off the planned node
    assert run().allocated == [busy.pk]
    [first] = planned(reservation)
    assert busy.allocations.get().node.name != first

    card = Node.objects.get(name=first).devices.get(index=1)
    scheduling_services.device_isolate(device=card, reason="XID 79: fallen off the bus")
    run()
    assert planned(reservation) == []
    later = START + 30 * HOUR  # the other node of its domain is free once the 30 h job ends
    reason = reservation.queue_reason
    assert reason["numbers"]["expected_start"] == later.isoformat()
    assert reason["message"] == (
        f"Reserved from Wed 02 Dec 09:00 UTC; {first} failed: gpu1 isolated: XID 79: fallen off the bus; no node is "
        "free for it then: expected to start Wed 02 Dec 15:00 UTC instead."
    )
    assert reservation.queue_estimate == {
        "earliest": later.isoformat(),
        "likely": later.isoformat(),
        "latest": later.isoformat(),
        "code": None,
        "reason": None,
    }
    sentence = (
        f"Planned node {first} (gpu1 isolated: XID 79: fallen off the bus) failed before the start, and no node is "
        "free for the window: expected to start Wed 02 Dec 15:00 UTC instead."
    )
    assert replan_events(reservation) == [(EventCode.PLANNED_NODE_FAILED, sentence)]
    assert told(mailbox, team) == [f"Reservation #{reservation.pk}: a planned node failed"]
    assert sentence in text_of(mailbox.to(team.developer.email)[-1])

    clock.move_to(START + HOUR)
    run()  # still no node: nothing new to tell
    assert len(replan_events(reservation)) == 1 and len(told(mailbox, team)) == 1

    client.force_login(team.developer)
    page = client.get(f"/requests/{reservation.pk}/").content.decode()
    assert "no node is free for it then: expected to start Wed 02 Dec 15:00 UTC instead" in page
    assert "fallen off the bus" in page


def test_a_plan_back_on_nodes_after_a_failure_is_noted_once(shop, team, clock, mailbox, run):  # noqa: F811
    add_node(shop.accelerator, name="n1", cards=2)
    reservation = reserve(shop, team, START + 24 * HOUR)
    run()
    cordon("n1", "reseating a cable")
    run()
    assert planned(reservation) == [] and reservation.queue_reason["numbers"]["expected_start"] is None
    assert reservation.queue_estimate["code"] == "no_window_in_horizon"
    assert reservation.queue_reason["message"].endswith(
        "its start is unknown (no node is free for its window before the reservation horizon ends)."
    )

    scheduling_services.node_uncordon(node=Node.objects.get(name="n1"), reason="cable reseated", actor=None)
    run()
    run()
    assert planned(reservation) == ["n1"]
    assert [code for code, _message in replan_events(reservation)] == [
        EventCode.PLANNED_NODE_FAILED,
        EventCode.RESERVATION_REPLANNED,
    ]
    assert replan_events(reservation)[-1][1] == "Planned again on n1: it starts as reserved, Wed 02 Dec 09:00 UTC."
    assert told(mailbox, team) == [f"Reservation #{reservation.pk}: a planned node failed"]  # the failure only


def test_the_forecast_keeps_work_off_planned_and_maintenance_nodes_while_they_are_held(shop, team, clock, api_as):  # noqa: F811
    add_node(shop.accelerator, name="n1", cards=2)
    add_node(shop.accelerator, name="n2", cards=2)
    quota_set(quota=team.project.quota, limits={"concurrent_tasks": 100}, actor=None)
    reservation = reserve(shop, team, START + 5 * HOUR)  # 10 h: holds a node from +5 h to +15 h
    cycle.run_cycle()
    [held] = planned(reservation)
    other = ({"n1", "n2"} - {held}).pop()
    maintenance(other, start=START + 2 * HOUR, hours=6)  # the other node: +2 h to +8 h
    first, second = queued(shop, team), queued(shop, team)  # 10 h each: each would overlap both windows now
    cycle.run_cycle()
    first.refresh_from_db()
    second.refresh_from_db()
    assert first.queue_reason["code"] in ("reservation_ahead", "maintenance")
    # By hand: the first starts when the maintenance ends (+8 h) on the other node; the second cannot start on the
    # planned node before the reservation's window ends (+15 h), nor on the other before the first ends (+18 h).
    assert first.queue_estimate["likely"] == (START + 8 * HOUR).isoformat()
    assert second.queue_estimate["likely"] == (START + 15 * HOUR).isoformat()
    assert second.queue_estimate["earliest"] == second.queue_estimate["latest"] == second.queue_estimate["likely"]
    assert second.queue_estimate["code"] == "reservation_ahead"
    assert second.queue_estimate["reason"] == (
        f"{held} is held for reservation #{reservation.pk} from Tue 01 Dec 14:00 UTC until Wed 02 Dec 00:00 UTC"
    )
    body = api_as(team.developer).get(f"/api/v1/requests/{second.pk}/").json()
    assert body["queue"]["expected_start"]["message"] == (
        f"Expected to start in about 15 h: {held} is held for reservation #{reservation.pk} from Tue 01 Dec 14:00 UTC "
        "until Wed 02 Dec 00:00 UTC."
    )
    assert first.queue_estimate["code"] == first.queue_reason["code"]  # the cycle's wait names the window

    # If submitted now: after both (the other node is free again at +18 h).
    preview = {
        "project": team.project.pk,
        "service": shop.service.pk,
        "spec": shop.whole.pk,
        "image": shop.image.pk,
        "duration_hours": 10,
    }
    placement = api_as(team.developer).post("/api/v1/requests/preview/", preview, format="json").json()["placement"]
    assert placement["expected_start"]["likely"] == (START + 18 * HOUR).isoformat()


def test_re_planning_costs_the_same_queries_for_one_reservation_or_many(shop, team, clock, api_as):  # noqa: F811
    for name in ("n1", "n2", "n3", "n4"):
        add_node(shop.accelerator, name=name, cards=2)
    in_domain("island-a", "n1", "n2", "n3", "n4")
    client = api_as(team.developer)

    def queries(reservations) -> tuple[int, int]:
        """A planned node of each fails: the cycle that re-plans them, then the queue that lists them."""
        cycle.run_cycle()
        for name in {planned(reservation)[0] for reservation in reservations}:
            cordon(name, "fan failure")
        with CaptureQueriesContext(connection) as in_cycle:
            cycle.run_cycle()
        cycle_queries = len(in_cycle)  # now: a request of the test client resets the log it counts from
        assert all(replan_events(reservation) for reservation in reservations)
        client.get("/api/v1/queue/")
        with CaptureQueriesContext(connection) as listed:
            rows = client.get("/api/v1/queue/").json()["results"]
        assert {row["id"] for row in rows} >= {reservation.pk for reservation in reservations}
        return cycle_queries, len(listed)

    one = queries([reserve(shop, team, START + 24 * HOUR)])
    many = queries([reserve(shop, team, START + 48 * HOUR + i * 11 * HOUR) for i in range(3)])
    assert many == one


def test_maintenance_set_on_a_planned_node_re_plans_the_reservation_in_its_domain(shop, team, clock, mailbox, run):  # noqa: F811
    for name in ("n1", "n2"):
        add_node(shop.accelerator, name=name, cards=2)
    in_domain("island-a", "n1", "n2")
    reservation = reserve(shop, team, START + 24 * HOUR)
    run()
    [first] = planned(reservation)
    maintenance(first, start=START + 30 * HOUR, hours=2, reason="BIOS update")  # inside the reservation's window
    run()
    [(code, message)] = replan_events(reservation)
    assert planned(reservation) == [({"n1", "n2"} - {first}).pop()] and code == EventCode.RESERVATION_REPLANNED
    assert f"{first} (in maintenance from Wed 02 Dec 15:00 UTC until Wed 02 Dec 17:00 UTC (BIOS update))" in message
    assert told(mailbox, team) == []
