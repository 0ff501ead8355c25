"""The approval engine: routing by policy, approver sources and modes, decisions, reminders, quota changes."""

from datetime import timedelta
from decimal import Decimal

import pytest
from django.contrib.auth.models import Group
from django.utils import timezone
from django_q.models import Schedule

from config.errors import Conflict, DomainError, NotPermitted
from requests import approvals, services
from requests.choices import (
    ApprovalMode,
    ApprovalState,
    ApproverSource,
    ChangeState,
    EventCode,
    OverQuota,
    RequestState,
    StageState,
)
from requests.models import Approval, ApprovalAssignment, ApprovalRule, QuotaChangeRequest, ResourceRequest
from requests.quota_changes import quota_change_request_submit
from requests.schedules import REMINDER_TASK, ensure_schedules
from requests.selectors import approval_inbox
from tenancy.choices import Role
from tenancy.models import AuditEvent, ProjectQuota
from tests import factories
from tests.requests.conftest import approval_rule, approver_stage, make_order

S = RequestState
ANY, ALL = ApprovalMode.ANY, ApprovalMode.ALL
pytestmark = pytest.mark.django_db


def submit(shop, team, requester=None, **overrides) -> ResourceRequest:
    return services.request_submit(
        order=make_order(shop, team.project, **overrides), requester=requester or team.developer
    )


def fresh(request: ResourceRequest) -> ResourceRequest:
    return ResourceRequest.objects.get(pk=request.pk)


def approval_of(subject) -> Approval:
    return approvals.approval_for(subject)


def approvers(subject) -> list[list[str]]:
    """Usernames per stage, in stage order."""
    return [
        sorted(a.approver.username for a in stage.assignments.all())
        for stage in approval_of(subject).stages.order_by("order")
    ]


def task(subject, user) -> ApprovalAssignment:
    return ApprovalAssignment.objects.get(
        stage__approval=approval_of(subject), approver=user, stage__state=StageState.PENDING
    )


def decide(subject, user, decision="approve", comment=""):
    return approvals.approval_decide(assignment=task(subject, user), decision=decision, comment=comment, actor=user)


def named(*users):
    return (ApproverSource.USERS, ANY, {"users": list(users)})


# --- approver sources -----------------------------------------------------------------------------------


def _group(team):
    group = Group.objects.create(name="gpu-reviewers")
    group.user_set.add(team.developer2, team.approver)
    return (ApproverSource.GROUP, ANY, {"group": group}), [team.approver, team.developer2]


def _tenant_admins(team):
    team.project.tenant.admins.add(team.developer2)
    return (ApproverSource.TENANT_ADMINS, ANY, {}), [team.developer2]


SOURCES = {
    "named_users": lambda team: (named(team.approver, team.developer2), [team.approver, team.developer2]),
    "group": _group,
    "project_role_approver": lambda team: (approver_stage(Role.APPROVER), [team.approver]),
    "project_role_lead": lambda team: (approver_stage(Role.LEAD), [team.lead]),
    "manager": lambda team: ((ApproverSource.MANAGER, ANY, {}), [team.lead]),
    "tenant_admins": _tenant_admins,
    "operators": lambda team: ((ApproverSource.OPERATORS, ANY, {}), [team.operator]),
}


@pytest.mark.parametrize("source", SOURCES)
def test_each_approver_source_resolves_its_approvers(shop, team, source):
    stage, expected = SOURCES[source](team)
    approval_rule(stage)
    request = submit(shop, team)
    assert request.state == S.PENDING_APPROVAL
    assert approvers(request) == [sorted(user.username for user in expected)]
    [assignment] = approval_inbox(user=expected[0])
    assert assignment.stage.approval.subject_id == request.pk


# --- modes and stages -----------------------------------------------------------------------------------


def test_any_mode_one_approval_passes_the_stage(shop, team):
    approval_rule(named(team.approver, team.developer2))
    request = submit(shop, team)
    decide(request, team.approver)
    assert fresh(request).state == S.QUEUED
    assert approval_of(request).state == ApprovalState.APPROVED
    assert not approval_inbox(user=team.developer2).exists()


def test_all_mode_needs_every_approver_and_notes_each_vote(shop, team):
    approval_rule((ApproverSource.USERS, ALL, {"users": [team.approver, team.developer2]}))
    request = submit(shop, team)
    decide(request, team.approver)
    assert fresh(request).state == S.PENDING_APPROVAL
    vote = fresh(request).events.get(code=EventCode.STAGE_VOTE)
    assert (vote.actor, vote.from_state, vote.to_state) == (team.approver, S.PENDING_APPROVAL, S.PENDING_APPROVAL)
    decide(request, team.developer2)
    assert fresh(request).state == S.QUEUED
    assert fresh(request).events.filter(code=EventCode.APPROVED, actor=team.developer2).exists()


def test_stages_run_in_order(shop, team):
    approval_rule(approver_stage(), named(team.operator))
    request = submit(shop, team)
    stages = approval_of(request).stages.order_by("order")
    assert [stage.state for stage in stages] == [StageState.PENDING, StageState.WAITING]
    assert not approval_inbox(user=team.operator).exists()
    decide(request, team.approver)
    assert [stage.state for stage in stages.all()] == [StageState.APPROVED, StageState.PENDING]
    assert fresh(request).state == S.PENDING_APPROVAL
    assert fresh(request).events.filter(code=EventCode.STAGE_APPROVED).count() == 1
    assert approval_inbox(user=team.operator).count() == 1
    decide(request, team.operator)
    assert fresh(request).state == S.QUEUED


# --- which rule decides ---------------------------------------------------------------------------------


def test_first_policy_by_order_wins(shop, team):
    late = approval_rule(named(team.developer2))
    early = approval_rule(named(team.approver))
    late.policy.order, early.policy.order = 20, 10
    late.policy.save(), early.policy.save()
    assert approvers(submit(shop, team)) == [[team.approver.username]]


def test_first_rule_by_order_wins_within_a_policy(shop, team):
    second = approval_rule(named(team.developer2))
    second.order = 20
    second.save()
    first = ApprovalRule.objects.create(policy=second.policy, name="first", order=10)
    first.stages.create(order=1, name="Lead", source=ApproverSource.PROJECT_ROLE, project_role=Role.LEAD)
    assert approvers(submit(shop, team)) == [[team.lead.username]]


# Each condition with a value the standard order (whole spec: 2 NVIDIA cards, compute, 10 h at 8.00/h = 80.00,
# environment=production, in the team's project) has, and one it does not.
CONDITIONS = {
    "service_kind": lambda shop, team: ({"service_kind": "compute"}, {"service_kind": "bare_metal"}),
    "vendor": lambda shop, team: ({"vendor": factories.vendor("nvidia")}, {"vendor": factories.vendor("amd")}),
    "accelerator_model": lambda shop, team: (
        {"accelerator_model": shop.accelerator},
        {"accelerator_model": factories.AcceleratorModelFactory()},
    ),
    "spec": lambda shop, team: ({"spec": shop.whole}, {"spec": shop.sliced}),
    "tenant": lambda shop, team: ({"tenant": team.project.tenant}, {"tenant": factories.tenant()}),
    "project": lambda shop, team: ({"project": team.project}, {"project": factories.project()}),
    "min_accelerator_count": lambda shop, team: ({"min_accelerator_count": 2}, {"min_accelerator_count": 3}),
    "min_cost_estimate": lambda shop, team: (
        {"min_cost_estimate": Decimal("80.00")},
        {"min_cost_estimate": Decimal("80.01")},
    ),
    "parameter": lambda shop, team: (
        {"parameter_name": "environment", "parameter_value": "production"},
        {"parameter_name": "environment", "parameter_value": "staging"},
    ),
    "quota_exception_no": lambda shop, team: ({"quota_exception": False}, {"quota_exception": True}),
    "min_priority": lambda shop, team: ({"min_priority": "standard"}, {"min_priority": "high"}),
}


@pytest.mark.parametrize("condition", CONDITIONS)
@pytest.mark.parametrize("matching", [True, False], ids=["matches", "does_not_match"])
def test_rule_condition(shop, team, condition, matching):
    match, miss = CONDITIONS[condition](shop, team)
    approval_rule(named(team.approver), **(match if matching else miss))
    request = submit(shop, team, parameters={"environment": "production"})
    if matching:
        assert (request.state, approvers(request)) == (S.PENDING_APPROVAL, [[team.approver.username]])
    else:
        assert request.state == S.QUEUED
        assert request.events.filter(code=EventCode.AUTO_APPROVED).exists()


def test_quota_exception_rule_routes_only_quota_exceptions(shop, team):
    approval_rule(named(team.approver), quota_exception=True)
    assert submit(shop, team).state == S.QUEUED
    ProjectQuota.objects.filter(project=team.project).update(gpus=1)
    request = services.request_submit(
        order=make_order(shop, team.project, justification="Launch week"),
        requester=team.developer,
        over_quota=OverQuota.EXCEPTION,
    )
    assert approvers(request) == [[team.approver.username]]


def test_inactive_policy_is_ignored(shop, team):
    rule = approval_rule(named(team.approver))
    rule.policy.active = False
    rule.policy.save()
    assert submit(shop, team).state == S.QUEUED


def test_no_matching_rule_approves_automatically_and_freezes_the_spec(shop, team):
    approval_rule(named(team.approver), min_accelerator_count=8)
    request = fresh(submit(shop, team))
    assert request.state == S.QUEUED
    assert approval_of(request) is None
    assert list(request.events.values_list("code", flat=True)) == [
        EventCode.SUBMITTED,
        EventCode.ADMITTED,
        EventCode.AUTO_APPROVED,
        EventCode.QUEUED,
    ]
    assert request.approved_spec["spec"]["slug"] == shop.whole.slug
    assert request.snapshot_intact


# --- who may decide -------------------------------------------------------------------------------------


def test_requester_is_never_an_approver_even_holding_the_role(shop, team):
    approval_rule(named(team.lead, team.approver))
    request = submit(shop, team, requester=team.lead)
    assert approvers(request) == [[team.approver.username]]


def test_requester_cannot_decide_on_their_own_request(shop, team):
    approval_rule(approver_stage())
    request = submit(shop, team, requester=team.lead)
    assignment = task(request, team.approver)
    with pytest.raises(NotPermitted) as refusal:
        approvals.approval_decide(assignment=assignment, decision="approve", comment="", actor=team.lead)
    assert refusal.value.code == "self_approval"
    assert fresh(request).state == S.PENDING_APPROVAL
    assert not ApprovalAssignment.objects.exclude(decision="").exists()


def test_empty_stage_falls_back_to_operators_with_a_note(shop, team):
    approval_rule(approver_stage(Role.LEAD))
    request = submit(shop, team, requester=team.lead)
    [stage] = approval_of(request).stages.all()
    assert approvers(request) == [[team.operator.username]]
    assert "routed to operators" in stage.note


def test_someone_not_assigned_cannot_decide(shop, team):
    approval_rule(approver_stage())
    request = submit(shop, team)
    with pytest.raises(NotPermitted) as refusal:
        approvals.approval_decide(
            assignment=task(request, team.approver), decision="approve", comment="", actor=team.developer2
        )
    assert refusal.value.code == "not_your_approval"
    assert fresh(request).state == S.PENDING_APPROVAL


def test_deciding_twice_is_a_conflict(shop, team):
    approval_rule((ApproverSource.USERS, ALL, {"users": [team.approver, team.developer2]}))
    request = submit(shop, team)
    assignment = task(request, team.approver)
    decide(request, team.approver)
    with pytest.raises(Conflict) as refusal:
        approvals.approval_decide(
            assignment=assignment, decision="reject", comment="changed my mind", actor=team.approver
        )
    assert refusal.value.code == "already_decided"
    assert fresh(request).state == S.PENDING_APPROVAL


def test_rejecting_needs_a_comment(shop, team):
    approval_rule(approver_stage())
    request = submit(shop, team)
    with pytest.raises(DomainError) as refusal:
        decide(request, team.approver, "reject", "  ")
    assert refusal.value.code == "comment_required"
    assert fresh(request).state == S.PENDING_APPROVAL


def test_rejection_ends_the_request_with_the_comment_on_the_timeline(shop, team):
    approval_rule(approver_stage(), named(team.operator))
    request = submit(shop, team)
    decide(request, team.approver, "reject", "Use the MIG slice for notebooks.")
    request = fresh(request)
    assert request.state == S.REJECTED
    event = request.events.get(code=EventCode.REJECTED)
    assert (event.actor, event.data["comment"]) == (team.approver, "Use the MIG slice for notebooks.")
    assert "Use the MIG slice for notebooks." in event.message
    assert [stage.state for stage in approval_of(request).stages.order_by("order")] == [
        StageState.REJECTED,
        StageState.CANCELLED,
    ]


def test_cancelling_a_pending_request_withdraws_its_approval(shop, team):
    approval_rule(approver_stage())
    request = submit(shop, team)
    assert approval_inbox(user=team.approver).count() == 1
    services.request_cancel(request=request, actor=team.developer)
    assert approval_of(request).state == ApprovalState.CANCELLED
    assert not approval_inbox(user=team.approver).exists()


# --- reminders ------------------------------------------------------------------------------------------


def _age(approval, hours, field="created_at"):
    Approval.objects.filter(pk=approval.pk).update(**{field: timezone.now() - timedelta(hours=hours)})


def test_stale_approvals_are_reminded_once_per_sla_period(shop, team):
    approval_rule(approver_stage())
    stale, recent = submit(shop, team), submit(shop, team)
    _age(approval_of(stale), 25)
    sla = timedelta(hours=24)
    assert approvals.approvals_remind_stale(older_than=sla) == 1
    reminder = stale.events.get(code=EventCode.REMINDER)
    assert reminder.data == {"waiting_on": [team.approver.username]}
    assert not recent.events.filter(code=EventCode.REMINDER).exists()
    assert approvals.approvals_remind_stale(older_than=sla) == 0
    _age(approval_of(stale), 25, "reminded_at")
    assert approvals.approvals_remind_stale(older_than=sla) == 1
    assert stale.events.filter(code=EventCode.REMINDER).count() == 2


def test_reminder_schedule_is_created_once():
    Schedule.objects.filter(func=REMINDER_TASK).delete()
    ensure_schedules()
    ensure_schedules()
    [schedule] = Schedule.objects.filter(func=REMINDER_TASK)
    assert (schedule.schedule_type, schedule.repeats) == (Schedule.HOURLY, -1)


# --- quota change requests ------------------------------------------------------------------------------


def test_approved_quota_change_is_applied_audited_and_readmits(shop, team, django_capture_on_commit_callbacks):
    ProjectQuota.objects.filter(project=team.project).update(concurrent_tasks=1)
    submit(shop, team)
    waiting = services.request_submit(
        order=make_order(shop, team.project), requester=team.developer, over_quota=OverQuota.WAIT
    )
    change = quota_change_request_submit(
        project=team.project, limits={"concurrent_tasks": 2}, justification="Second training run", actor=team.lead
    )
    assert change.state == ChangeState.PENDING_APPROVAL
    [stage] = approval_of(change).stages.all()
    assert (stage.source, approvers(change)) == (ApproverSource.OPERATORS, [[team.operator.username]])
    with django_capture_on_commit_callbacks(execute=True):
        decide(change, team.operator)
    assert QuotaChangeRequest.objects.get(pk=change.pk).state == ChangeState.APPLIED
    assert ProjectQuota.objects.get(project=team.project).concurrent_tasks == 2
    audit = AuditEvent.objects.get(action="quota.changed")
    assert (audit.actor, audit.data) == (team.operator, {"concurrent_tasks": [1, 2]})
    assert fresh(waiting).state == S.QUEUED


def test_quota_change_is_never_approved_by_a_rule_without_stages(team):
    approval_rule(subject="quota_change")
    change = quota_change_request_submit(
        project=team.project, limits={"gpus": 20}, justification="More", actor=team.lead
    )
    assert change.state == ChangeState.PENDING_APPROVAL
    assert approvers(change) == [[team.operator.username]]


def test_only_the_project_lead_may_ask_for_a_quota_change(team):
    with pytest.raises(NotPermitted) as refusal:
        quota_change_request_submit(
            project=team.project, limits={"gpus": 20}, justification="More", actor=team.developer
        )
    assert refusal.value.code == "not_project_lead"
    assert not QuotaChangeRequest.objects.exists()


def test_rejected_quota_change_leaves_the_quota_alone(team):
    change = quota_change_request_submit(
        project=team.project, limits={"gpus": 20}, justification="More", actor=team.lead
    )
    decide(change, team.operator, "reject", "Capacity is booked until June.")
    assert QuotaChangeRequest.objects.get(pk=change.pk).state == ChangeState.REJECTED
    assert ProjectQuota.objects.get(project=team.project).gpus == Decimal(16)
    assert not AuditEvent.objects.filter(action="quota.changed").exists()
    assert AuditEvent.objects.filter(action="quota_change.rejected", reason="Capacity is booked until June.").exists()
