"""What a request's detail shows of its allocation (scheduling.allocations.allocation_details, the ALLOCATION_DETAILS
hook): node, term and each card in index order, whatever order the cards were bound in."""

from datetime import timedelta

import pytest

from scheduling.allocations import allocation_details
from scheduling.models import Allocation
from tests.scheduling.inventory_helpers import active_request, allocate, node

pytestmark = pytest.mark.django_db


def test_the_latest_allocation_with_its_term_and_its_cards_in_index_order():
    request = active_request()
    host = node(devices=4, name="gpu-host")
    cards = list(host.devices.order_by("index"))
    earlier = allocate(request, [cards[0]])
    Allocation.objects.filter(pk=earlier.pk).update(started_at=earlier.started_at - timedelta(days=1))
    latest = allocate(request, [cards[3], cards[1], cards[2]], milli=500)  # bound out of index order
    latest.refresh_from_db()

    details = allocation_details(request)

    assert details["node"] == "gpu-host" and details["state"] == latest.state
    assert details["started_at"] == latest.started_at and details["released_at"] is None
    assert details["expires_at"] == latest.term_started_at + timedelta(hours=request.duration_hours)
    assert [(d["index"], d["uuid"], d["model"], d["milli"]) for d in details["devices"]] == [
        (card.index, card.uuid, card.model.name, 500) for card in (cards[1], cards[2], cards[3])
    ]
    assert all(device["mig_instance"] is None for device in details["devices"])


def test_a_request_that_never_held_an_allocation_has_none():
    assert allocation_details(active_request()) is None
