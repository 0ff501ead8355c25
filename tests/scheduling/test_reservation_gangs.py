"""A multi-node spec reserves a window like any other: its whole gang is judged at the window's start, and the
earliest free window is the one where every member has its node."""

from datetime import UTC, datetime, timedelta

import pytest
import time_machine

from config.errors import DomainError
from requests import services
from requests.choices import RequestState
from scheduling import cycle, expected_start, outcome
from tests.requests.conftest import make_order
from tests.scheduling.test_gang_cycle import racks, shop, submit, team  # noqa: F401 (fixtures)

pytestmark = pytest.mark.django_db
START = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)
HOUR = timedelta(hours=1)


def test_a_gang_reservation_is_offered_the_first_window_where_every_member_has_its_node(shop, team):  # noqa: F811
    outcome._decoded.clear()
    expected_start._decoded.clear()
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
