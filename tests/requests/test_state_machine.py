"""The ResourceRequest state machine: every legal transition, every illegal one, and the service guard."""

import pytest
from django_fsm import TransitionNotAllowed

from config.errors import Conflict
from requests import services
from requests.choices import TERMINAL_STATES, EventCode, RequestState
from requests.models import RequestEvent, ResourceRequest
from tests.requests.conftest import make_order
from tests.requests.lifecycle import walk

S = RequestState

# Written out by hand from the design, not derived from the model, so that a changed transition fails here.
LEGAL = {
    "wait_for_quota": {S.SUBMITTED: S.WAITING_FOR_QUOTA},
    "route_for_approval": {S.SUBMITTED: S.PENDING_APPROVAL, S.WAITING_FOR_QUOTA: S.PENDING_APPROVAL},
    "approve": {S.SUBMITTED: S.APPROVED, S.WAITING_FOR_QUOTA: S.APPROVED, S.PENDING_APPROVAL: S.APPROVED},
    "reject": {S.PENDING_APPROVAL: S.REJECTED},
    "enqueue": {S.APPROVED: S.QUEUED},
    "cancel": {
        S.SUBMITTED: S.CANCELLED,
        S.WAITING_FOR_QUOTA: S.CANCELLED,
        S.PENDING_APPROVAL: S.CANCELLED,
        S.APPROVED: S.CANCELLED,
        S.QUEUED: S.CANCELLED,
    },
    "allocate": {S.QUEUED: S.ALLOCATED},
    "start_provisioning": {S.ALLOCATED: S.PROVISIONING},
    "activate": {S.PROVISIONING: S.ACTIVE},
    "preempt": {S.ALLOCATED: S.QUEUED, S.PROVISIONING: S.QUEUED, S.ACTIVE: S.QUEUED},
    "start_release": {S.ALLOCATED: S.RELEASING, S.PROVISIONING: S.RELEASING, S.ACTIVE: S.RELEASING},
    "finish_release": {S.RELEASING: S.RELEASED},
    "fail": {S.ALLOCATED: S.FAILED, S.PROVISIONING: S.FAILED, S.ACTIVE: S.FAILED, S.RELEASING: S.FAILED},
}
MATRIX = [(state, name) for state in S for name in LEGAL]


@pytest.mark.parametrize(("state", "name"), MATRIX, ids=[f"{state.value}-{name}" for state, name in MATRIX])
def test_transition_from_state(state, name):
    request = walk(ResourceRequest(), state)
    target = LEGAL[name].get(state)
    if target is None:
        with pytest.raises(TransitionNotAllowed):
            getattr(request, name)()
        assert request.state == state
    else:
        getattr(request, name)()
        assert request.state == target


def test_every_state_is_reachable_and_the_table_covers_every_transition():
    targets = {target for moves in LEGAL.values() for target in moves.values()}
    assert targets | {S.SUBMITTED} == set(S)


def test_terminal_states_are_released_rejected_cancelled_failed_and_have_no_way_out():
    assert {S.RELEASED, S.REJECTED, S.CANCELLED, S.FAILED} == TERMINAL_STATES
    for state in S:
        request = walk(ResourceRequest(), state)
        assert request.is_terminal == (state in TERMINAL_STATES)
    assert not [name for name, moves in LEGAL.items() if set(moves) & TERMINAL_STATES]


def test_state_cannot_be_assigned():
    request = ResourceRequest()
    with pytest.raises(AttributeError):
        request.state = S.ACTIVE


def test_service_refuses_illegal_transition_and_changes_nothing(shop, team):
    request = services.request_submit(order=make_order(shop, team.project), requester=team.developer)
    events = list(RequestEvent.objects.filter(request=request).values_list("id", flat=True))
    with pytest.raises(Conflict) as refusal:
        services._transition(request, "approve", actor=team.operator, code=EventCode.APPROVED, message="again")
    assert refusal.value.code == "illegal_transition"
    assert refusal.value.status_code == 409
    assert refusal.value.details == {"state": S.QUEUED, "action": "approve"}
    assert request.state == S.QUEUED
    assert ResourceRequest.objects.get(pk=request.pk).state == S.QUEUED
    assert list(RequestEvent.objects.filter(request=request).values_list("id", flat=True)) == events


def test_service_transitions_write_one_event_each(shop, team):
    request = services.request_submit(order=make_order(shop, team.project), requester=team.developer)
    for name, code in [
        ("allocate", EventCode.ALLOCATED),
        ("start_provisioning", EventCode.PROVISIONING),
        ("activate", EventCode.ACTIVE),
        ("start_release", EventCode.RELEASING),
        ("finish_release", EventCode.RELEASED),
    ]:
        services._transition(request, name, actor=team.operator, code=code, message=name)
    stored = ResourceRequest.objects.get(pk=request.pk)
    assert stored.state == S.RELEASED
    tail = list(stored.events.order_by("id").values_list("from_state", "to_state", "code"))[-5:]
    assert tail == [
        (S.QUEUED, S.ALLOCATED, "allocated"),
        (S.ALLOCATED, S.PROVISIONING, "provisioning"),
        (S.PROVISIONING, S.ACTIVE, "active"),
        (S.ACTIVE, S.RELEASING, "releasing"),
        (S.RELEASING, S.RELEASED, "released"),
    ]


def test_cancelling_a_cancelled_request_is_a_conflict_with_a_readable_message(shop, team):
    request = services.request_submit(order=make_order(shop, team.project), requester=team.developer)
    services.request_cancel(request=request, actor=team.developer)
    with pytest.raises(Conflict) as refusal:
        services.request_cancel(request=request, actor=team.developer)
    assert refusal.value.code == "illegal_transition"
    assert refusal.value.message == f"Request #{request.pk} is cancelled; 'cancel' is not possible from there."
    assert ResourceRequest.objects.get(pk=request.pk).events.filter(code=EventCode.CANCELLED).count() == 1
