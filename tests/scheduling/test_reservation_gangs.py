"""A multi-node spec reserves a window like any other: its whole gang is judged at the window's start, and the
earliest free window is the one where every member has its node."""

from datetime import UTC, datetime, timedelta

import pytest
import time_machine

from config.errors import DomainError
from requests import services
from requests.choices import EventCode, RequestState
from scheduling import cycle, expected_start, outcome
from scheduling import services as scheduling_services
from scheduling.models import Node
from tests.requests.conftest import make_order
from tests.scheduling.test_gang_cycle import racks, shop, submit, team  # noqa: F401 (fixtures)

pytestmark = pytest.mark.django_db
START = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)
HOUR = timedelta(hours=1)


def test_a_gang_reservation_is_offered_the_first_window_where_every_member_has_its_node(shop, team):  # noqa: F811
    outcome._decoded.clear()
    expected_start.forget_pictures()
    with time_machine.travel(START, tick=False):
        racks(shop.accelerator, 2, backend="slurm")  # one rack of two 4-card nodes (Slurm runs gangs): it needs both
        submit(shop, team, shop.one)  # one card on one of them for 10 h
        cycle.run_cycle()

        def reserve(start):
            order = make_order(shop, team.project, spec=shop.gang, start_at=start, duration_hours=10)
            return services.request_submit(order=order, requester=team.developer)

        with pytest.raises(DomainError) as taken:
            reserve(START + 2 * HOUR)
        assert taken.value.code == "reservation_window_taken", taken.value.message
        assert taken.value.details["earliest_start"] == (START + 10 * HOUR).isoformat(), taken.value.message
        reservation = reserve(START + 10 * HOUR)  # its first window
        assert reservation.state == RequestState.QUEUED
        assert reservation.approved_spec["reservation"]["start"] == (START + 10 * HOUR).isoformat()


def test_a_gang_reservation_whose_planned_node_fails_is_re_planned_whole_in_one_rack(shop, team):  # noqa: F811
    outcome._decoded.clear()
    expected_start.forget_pictures()
    with time_machine.travel(START, tick=False):
        racks(shop.accelerator, 3, 2, backend="slurm")  # a rack of three nodes and one of two, one domain
        Node.objects.update(topology_domain="island-a")
        order = make_order(shop, team.project, spec=shop.gang, start_at=START + 24 * HOUR, duration_hours=10)
        reservation = services.request_submit(order=order, requester=team.developer)
        cycle.run_cycle()
        reservation.refresh_from_db()
        first = reservation.queue_reason["numbers"]["nodes"]
        assert len(first) == 2
        failed = Node.objects.get(name=first[0])
        scheduling_services.node_cordon(node=failed, reason="NVLink errors", actor=None)
        cycle.run_cycle()
        reservation.refresh_from_db()
        again = reservation.queue_reason["numbers"]["nodes"]
        assert len(again) == 2 and failed.name not in again
        assert len({Node.objects.get(name=name).rack_id for name in again}) == 1  # the spec's rack, as before
        [event] = reservation.events.filter(code=EventCode.RESERVATION_REPLANNED)
        assert event.data["lost"] == [{"node": failed.name, "reason": "cordoned: NVLink errors"}]
        assert event.data["nodes"] == again and event.data["in_domain"] is True
