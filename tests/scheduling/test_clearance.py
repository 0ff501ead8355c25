"""Four eyes on clearing a device's isolation: the dedicated permission, a second holder, one audit row."""

import pytest

from config.errors import Conflict, DomainError, NotPermitted
from requests import approvals
from requests.choices import ApprovalState, ApproverSource, ChangeState
from requests.models import Approval, ApprovalAssignment, ApprovalPolicy, ApprovalRule, ApprovalRuleStage
from scheduling import services
from scheduling.models import Device, IsolationClearance
from tenancy.models import AuditEvent
from tests import factories
from tests.scheduling.inventory_helpers import clearance_holder, grant, node

pytestmark = pytest.mark.django_db


@pytest.fixture
def isolated():
    device = node(devices=1).devices.get()
    return services.device_isolate(device=device, reason="XID 79: fell off the bus", actor=None)


@pytest.fixture
def holders():
    return clearance_holder(username="alice"), clearance_holder(username="bob")


def task_of(clearance, user) -> ApprovalAssignment:
    return ApprovalAssignment.objects.get(stage__approval__subject_id=clearance.pk, approver=user)


def test_operator_without_the_dedicated_permission_is_refused(isolated):
    operator = factories.operator()
    assert operator.has_perm("scheduling.change_device")
    with pytest.raises(NotPermitted) as refusal:
        services.isolation_clearance_request(device=isolated, reason="Card reseated", actor=operator)
    assert refusal.value.code == "missing_permission"
    assert not IsolationClearance.objects.exists()
    assert not Approval.objects.exists()


def test_operators_group_never_holds_the_clearance_permission():
    from tenancy.operators import operator_permission_names

    assert "scheduling.clear_device_isolation" not in operator_permission_names()
    assert "scheduling.view_isolationclearance" in operator_permission_names()


def test_a_device_that_is_not_isolated_cannot_be_cleared(holders):
    device = node(devices=1).devices.get()
    with pytest.raises(Conflict) as refusal:
        services.isolation_clearance_request(device=device, reason="Looks fine", actor=holders[0])
    assert refusal.value.code == "device_not_isolated"


def test_a_reason_is_required(isolated, holders):
    with pytest.raises(DomainError) as refusal:
        services.isolation_clearance_request(device=isolated, reason="  ", actor=holders[0])
    assert refusal.value.code == "reason_required"


def test_request_routes_to_the_other_holders_only_and_never_automatically(isolated, holders):
    alice, bob = holders
    carol = clearance_holder(username="carol")
    factories.operator(username="dave")  # an operator without the permission is not an approver
    clearance = services.isolation_clearance_request(
        device=isolated, reason="Card reseated, DCGM diag level 3 passed", actor=alice
    )
    approval = Approval.objects.get(subject_id=clearance.pk)
    assert approval.project is None and approval.state == ApprovalState.PENDING
    [stage] = approval.stages.all()
    assert stage.source == ApproverSource.USERS
    assert sorted(stage.assignments.values_list("approver__username", flat=True)) == [bob.username, carol.username]
    assert AuditEvent.objects.filter(action="isolation_clearance.requested", actor=alice).exists()
    assert Device.objects.get(pk=isolated.pk).isolated


def test_a_second_pending_clearance_is_refused(isolated, holders):
    services.isolation_clearance_request(device=isolated, reason="Reseated", actor=holders[0])
    with pytest.raises(Conflict) as refusal:
        services.isolation_clearance_request(device=isolated, reason="Reseated again", actor=holders[1])
    assert refusal.value.code == "clearance_pending"


def test_nobody_else_holds_the_permission_refuses_and_keeps_nothing(isolated):
    lonely = clearance_holder()
    with pytest.raises(DomainError) as refusal:
        services.isolation_clearance_request(device=isolated, reason="Reseated", actor=lonely)
    assert refusal.value.code == "no_eligible_approver"
    assert not IsolationClearance.objects.exists()


def test_requester_cannot_approve_their_own_clearance(isolated, holders):
    alice, bob = holders
    clearance = services.isolation_clearance_request(device=isolated, reason="Reseated", actor=alice)
    # even if alice were assigned (here: bob's task), the engine refuses self-approval first
    with pytest.raises(NotPermitted) as refusal:
        approvals.approval_decide(assignment=task_of(clearance, bob), decision="approve", comment="", actor=alice)
    assert refusal.value.code == "self_approval"
    assert Device.objects.get(pk=isolated.pk).isolated
    assert IsolationClearance.objects.get(pk=clearance.pk).state == ChangeState.PENDING_APPROVAL


def test_second_holder_approves_device_cleared_one_audit_row_names_both(isolated, holders):
    alice, bob = holders
    clearance = services.isolation_clearance_request(device=isolated, reason="Card reseated, diag passed", actor=alice)
    approvals.approval_decide(assignment=task_of(clearance, bob), decision="approve", comment="Checked", actor=bob)
    device = Device.objects.get(pk=isolated.pk)
    assert not device.isolated and device.isolation_reason == "" and device.isolated_at is None
    clearance.refresh_from_db()
    assert clearance.state == ChangeState.APPLIED
    assert clearance.approved_by == bob and clearance.decided_at is not None
    [audit] = AuditEvent.objects.filter(action="device.isolation_cleared")
    assert audit.actor == bob and audit.target_id == str(device.pk)
    assert audit.data["requested_by"] == "alice" and audit.data["approved_by"] == "bob"
    assert "alice" in audit.reason and "bob" in audit.reason
    assert audit.data["isolation_reason"] == "XID 79: fell off the bus"


def test_rejection_keeps_the_device_isolated(isolated, holders):
    alice, bob = holders
    clearance = services.isolation_clearance_request(device=isolated, reason="Reseated", actor=alice)
    approvals.approval_decide(
        assignment=task_of(clearance, bob), decision="reject", comment="Still XIDs in dmesg", actor=bob
    )
    assert Device.objects.get(pk=isolated.pk).isolated
    assert IsolationClearance.objects.get(pk=clearance.pk).state == ChangeState.REJECTED
    assert AuditEvent.objects.filter(action="isolation_clearance.rejected", reason="Still XIDs in dmesg").exists()


def test_policy_rule_without_stages_still_never_auto_approves(isolated, holders):
    policy = ApprovalPolicy.objects.create(name="Clearances", subject="isolation_clearance")
    ApprovalRule.objects.create(policy=policy, name="anything")
    clearance = services.isolation_clearance_request(device=isolated, reason="Reseated", actor=holders[0])
    assert Approval.objects.get(subject_id=clearance.pk).state == ApprovalState.PENDING
    assert Device.objects.get(pk=isolated.pk).isolated


def test_policy_rule_routes_to_named_approver_but_approval_needs_the_permission(isolated, holders):
    alice, _ = holders
    plain = factories.operator(username="erin")
    policy = ApprovalPolicy.objects.create(name="Clearances", subject="isolation_clearance")
    rule = ApprovalRule.objects.create(policy=policy, name="named")
    stage = ApprovalRuleStage.objects.create(rule=rule, name="Hardware lead", source=ApproverSource.USERS)
    stage.users.set([plain])
    clearance = services.isolation_clearance_request(device=isolated, reason="Reseated", actor=alice)
    with pytest.raises(NotPermitted) as refusal:
        approvals.approval_decide(assignment=task_of(clearance, plain), decision="approve", comment="", actor=plain)
    assert refusal.value.code == "missing_permission"
    assert Device.objects.get(pk=isolated.pk).isolated  # the decision was rolled back with the refusal
    assert task_of(clearance, plain).decision == ""
    plain = grant(plain)
    approvals.approval_decide(assignment=task_of(clearance, plain), decision="approve", comment="", actor=plain)
    assert not Device.objects.get(pk=isolated.pk).isolated


def test_clearance_appears_in_the_approvers_inbox_api(isolated, holders, api_as):
    alice, bob = holders
    services.isolation_clearance_request(device=isolated, reason="Reseated", actor=alice)
    response = api_as(bob).get("/api/v1/approvals/")
    assert response.status_code == 200, response.content
    [task] = response.json()["results"]
    assert task["project"] is None and "Clear isolation" in task["summary"]


def test_clearance_appears_in_the_approvers_inbox_page(isolated, holders, client):
    alice, bob = holders
    services.isolation_clearance_request(device=isolated, reason="Reseated", actor=alice)
    client.force_login(bob)
    response = client.get("/approvals/")
    assert response.status_code == 200
    assert "Clear isolation" in response.content.decode()
