"""An allocation's state machine: active -> released, only through scheduling's allocation_release."""

import pytest
from django.utils import timezone

from config.errors import Conflict
from scheduling.choices import AllocationState
from scheduling.models import Allocation, Device
from scheduling.reclaim import allocation_release
from tests.scheduling.inventory_helpers import active_request, allocate, node

pytestmark = pytest.mark.django_db


@pytest.fixture
def bound():
    host = node(devices=2)
    return allocate(active_request(), list(host.devices.all()))


def test_the_only_transition_is_active_to_released():
    transitions = {
        (transition.source, transition.target)
        for transition in Allocation._meta.get_field("state").get_all_transitions(Allocation)
    }
    assert transitions == {(AllocationState.ACTIVE, AllocationState.RELEASED)}


def test_release_gives_the_devices_back_and_records_why(bound):
    allocation_release(allocations=[bound], reason="done")
    bound.refresh_from_db()
    assert (bound.state, bound.release_reason) == (AllocationState.RELEASED, "done")
    assert bound.released_at <= timezone.now()
    assert set(Device.objects.values_list("allocated_milli", flat=True)) == {0}


def test_a_released_allocation_cannot_be_released_again_and_nothing_changes(bound):
    allocation_release(allocations=[bound], reason="done")
    first = Allocation.objects.get(pk=bound.pk)
    Device.objects.update(allocated_milli=1000)  # other work on the cards since: a second release must not touch them
    with pytest.raises(Conflict) as refused:
        allocation_release(allocations=[first], reason="again")
    assert refused.value.code == "illegal_transition"
    again = Allocation.objects.get(pk=bound.pk)
    assert (again.release_reason, again.released_at) == ("done", first.released_at)
    assert set(Device.objects.values_list("allocated_milli", flat=True)) == {1000}


def test_the_state_is_not_assigned_directly(bound):
    with pytest.raises(AttributeError):
        bound.state = AllocationState.RELEASED
