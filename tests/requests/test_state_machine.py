"""The ResourceRequest state machine: every legal transition, every illegal one, and the service guard."""

import pytest
from django.contrib.contenttypes.models import ContentType
from django_fsm import TransitionNotAllowed

from config.errors import Conflict
from requests import services
from requests.choices import TERMINAL_STATES, EventCode, RequestState
from requests.models import RequestEvent, ResourceRequest
from tenancy.models import AuditEvent
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
    "ask_for_capacity": {S.ACTIVE: S.QUEUED},  # a serving endpoint at zero replicas, woken by a call
    "start_release": {S.ALLOCATED: S.RELEASING, S.PROVISIONING: S.RELEASING, S.ACTIVE: S.RELEASING},
    "finish_release": {S.RELEASING: S.RELEASED},
    "fail": {S.ALLOCATED: S.FAILED, S.PROVISIONING: S.FAILED, S.ACTIVE: S.FAILED, S.RELEASING: S.FAILED},
    "retry_provisioning": {S.FAILED: S.PROVISIONING},
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


def _model_transitions() -> dict[str, dict[str, str]]:
    """The machine django-fsm actually built from the model's @transition methods, shaped like LEGAL."""
    moves: dict[str, dict[str, str]] = {}
    for move in ResourceRequest._meta.get_field("state").get_all_transitions(ResourceRequest):
        moves.setdefault(move.name, {})[move.source] = move.target
    return moves


def test_the_table_is_the_models_state_machine():
    # Both ways: a transition added to the model without the table, or one the table keeps after the model
    # dropped it, fails here.
    assert _model_transitions() == LEGAL


def test_every_state_is_reachable_and_the_table_covers_every_transition():
    targets = {target for moves in LEGAL.values() for target in moves.values()}
    assert targets | {S.SUBMITTED} == set(S)


def test_terminal_states_are_released_rejected_cancelled_and_have_no_way_out():
    # FAILED is not terminal: an operator may retry provisioning from it.
    assert {S.RELEASED, S.REJECTED, S.CANCELLED} == TERMINAL_STATES
    for state in S:
        request = walk(ResourceRequest(), state)
        assert request.is_terminal == (state in TERMINAL_STATES)
    # Terminal means exactly: no transition of the model leaves the state.
    sources = {source for moves in _model_transitions().values() for source in moves}
    assert sources == set(S) - TERMINAL_STATES


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


def test_provisioning_transitions_choose_their_own_event_codes(shop, team):
    request = services.request_submit(order=make_order(shop, team.project), requester=team.developer)
    services._transition(request, "allocate", actor=None, code=EventCode.ALLOCATED, message="allocated")
    failure = {"step": "boot", "code": "bmc_unreachable", "message": "BMC down.", "attempts": 3, "details": {}}
    services.requests_start_provisioning(started=[(services._locked(request), "started", {"run": 1})])
    services.request_fail(request=request, failure=failure, message="failed", data={"run": 1})
    services.request_retry_provisioning(
        request=request, actor=team.operator, reason="BMC back", message="retried", data={"run": 2}
    )
    services.requests_activate(activated=[(services._locked(request), {"node": "n1"}, "active", {"run": 2})])
    stored = ResourceRequest.objects.get(pk=request.pk)
    assert stored.state == S.ACTIVE
    tail = list(
        stored.events.order_by("id").values_list("from_state", "to_state", "code", "actor", "intervention", "data")
    )[-4:]
    assert tail == [
        (S.ALLOCATED, S.PROVISIONING, "provisioning", None, False, {"run": 1}),
        (S.PROVISIONING, S.FAILED, "failed", None, False, {"run": 1, "failure": failure}),
        (S.FAILED, S.PROVISIONING, "provisioning_retried", team.operator.pk, True, {"run": 2, "reason": "BMC back"}),
        (S.PROVISIONING, S.ACTIVE, "active", None, False, {"run": 2, "delivered": {"node": "n1"}}),
    ]


def test_cancelling_a_cancelled_request_is_a_conflict_with_a_readable_message(shop, team):
    request = services.request_submit(order=make_order(shop, team.project), requester=team.developer)
    services.request_cancel(request=request, actor=team.developer)
    with pytest.raises(Conflict) as refusal:
        services.request_cancel(request=request, actor=team.developer)
    assert refusal.value.code == "illegal_transition"
    assert refusal.value.message == f"Request #{request.pk} is cancelled; 'cancel' is not possible from there."
    assert ResourceRequest.objects.get(pk=request.pk).events.filter(code=EventCode.CANCELLED).count() == 1


def _audited(request) -> list[tuple]:
    return list(
        AuditEvent.objects.filter(
            target_type=ContentType.objects.get_for_model(ResourceRequest), target_id=str(request.pk)
        )
        .order_by("id")
        .values_list("action", "actor", "reason", "data")
    )


def test_every_transition_also_writes_the_shared_audit_trail_with_actor_and_reason(shop, team):
    """Single moves (submission, allocation, failure, retry, release) and the scheduler's batches (provisioning
    started, activated) alike: one audit row per move of state, naming the new state, who moved it and why; a note
    that leaves the state as it is stays on the timeline only."""
    request = services.request_submit(order=make_order(shop, team.project), requester=team.developer)
    services._transition(request, "allocate", actor=None, code=EventCode.ALLOCATED, message="Placed on n1.")
    failure = {"step": "boot", "code": "bmc_unreachable", "message": "BMC down.", "attempts": 3, "details": {}}
    services.requests_start_provisioning(started=[(services._locked(request), "started", {"run": 1})])
    services.request_fail(request=request, failure=failure, message="Boot failed.", data={"run": 1})
    services.request_retry_provisioning(
        request=request, actor=team.operator, reason="BMC back", message="retried", data={"run": 2}
    )
    services.requests_activate(activated=[(services._locked(request), {"node": "n1"}, "active", {"run": 2})])
    services.record_event(request=request, actor=team.operator, code=EventCode.EXPIRY_WARNING, message="a note")
    services.request_release(request=request, actor=team.developer, reason="done with it")
    services.request_finish_release(request=request, message="Released.")

    moves = [event for event in request.events.order_by("id") if event.is_transition]
    audited = _audited(request)
    assert [action for action, *_ in audited] == [f"request.{event.to_state}" for event in moves]
    assert [(actor, data["from"], data["to"], data["code"], data["event"]) for _, actor, _, data in audited] == [
        (event.actor_id, event.from_state, event.to_state, event.code, event.pk) for event in moves
    ]
    reasons = {action: (actor, reason) for action, actor, reason, _ in audited}
    assert reasons["request.submitted"][0] == team.developer.pk
    assert reasons["request.allocated"] == (None, "Placed on n1.")
    assert reasons["request.failed"] == (None, "Boot failed.")
    assert reasons["request.releasing"] == (team.developer.pk, "done with it")
    assert [action for action, *_ in audited if action == "request.provisioning"] == ["request.provisioning"] * 2
    assert (team.operator.pk, "BMC back") in [(actor, reason) for action, actor, reason, _ in audited]
    assert not AuditEvent.objects.filter(reason="a note").exists()


def test_a_cancellation_is_audited_with_its_reason(shop, team):
    request = services.request_submit(order=make_order(shop, team.project), requester=team.developer)
    services.request_cancel(request=request, actor=team.developer, reason="ordered the wrong spec")
    action, actor, reason, data = _audited(request)[-1]
    assert (action, actor, reason) == ("request.cancelled", team.developer.pk, "ordered the wrong spec")
    assert (data["from"], data["to"], data["code"]) == (S.QUEUED, S.CANCELLED, EventCode.CANCELLED)
