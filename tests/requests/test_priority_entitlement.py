"""A priority class is an entitlement of the project (kept on its quota), not the requester's wish.

Before the fix, any requester could put `critical` on an order that was approved automatically; now an order above
the project's entitlement is refused with `priority_not_permitted` (naming the allowed classes) and stores nothing,
or, when the requester asks for a quota exception, goes to approval and is never approved automatically.
"""

import pytest

from config.errors import DomainError
from requests import approvals, services
from requests.choices import ApprovalSubject, EventCode, OverQuota, PriorityClass, RequestState
from requests.models import Approval, ApprovalAssignment, RequestEvent, ResourceRequest
from tenancy import services as tenancy_services
from tenancy.models import AuditEvent, ProjectQuota
from tests import factories
from tests.requests.conftest import GENEROUS_QUOTA, approval_rule, approver_stage, make_order, order_post

pytestmark = pytest.mark.django_db

S = RequestState
P = PriorityClass
REQUESTS, PREVIEW = "/api/v1/requests/", "/api/v1/requests/preview/"


def submit(shop, team, priority, over_quota=OverQuota.REJECT, **overrides) -> ResourceRequest:
    return services.request_submit(
        order=make_order(shop, team.project, priority=priority, **overrides),
        requester=team.developer,
        over_quota=over_quota,
    )


def entitle(project, max_priority) -> None:
    tenancy_services.quota_set_priority_entitlement(quota=project.quota, max_priority=max_priority, actor=None)


def nothing_stored() -> bool:
    return not (ResourceRequest.objects.exists() or RequestEvent.objects.exists() or Approval.objects.exists())


def operators_stage(request) -> list:
    [stage] = Approval.objects.get(subject_id=request.pk).stages.all()
    return [stage.source, [assignment.approver for assignment in stage.assignments.all()]]


def order_body(shop, project, **overrides) -> dict:
    return {
        "service": shop.service.pk,
        "project": project.pk,
        "spec": shop.whole.pk,
        "image": shop.image.pk,
        "duration_hours": 10,
        **overrides,
    }


# --- The entitlement itself ---------------------------------------------------------------------------------


def test_a_new_project_is_entitled_to_standard_work():
    project = factories.project()
    assert ProjectQuota.objects.get(project=project).max_priority == P.STANDARD


def test_an_unknown_entitlement_is_refused_and_changes_nothing():
    project = factories.project()
    with pytest.raises(DomainError) as refusal:
        tenancy_services.quota_set_priority_entitlement(quota=project.quota, max_priority="urgent", actor=None)
    assert refusal.value.code == "invalid_priority"
    assert ProjectQuota.objects.get(project=project).max_priority == P.STANDARD


def test_changing_the_entitlement_is_audited(team):
    entitle(team.project, P.HIGH)
    tenancy_services.quota_set_priority_entitlement(
        quota=team.project.quota, max_priority=P.HIGH, actor=team.operator, reason="no change"
    )  # same value: no row
    event = AuditEvent.objects.get(action="quota.priority_entitlement_changed")
    assert event.data == {"max_priority": ["standard", "high"]}


# --- Admission ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("over_quota", [OverQuota.REJECT, OverQuota.WAIT])
def test_a_critical_order_above_the_entitlement_is_refused_and_stores_nothing(shop, team, over_quota):
    with pytest.raises(DomainError) as refusal:
        submit(shop, team, P.CRITICAL, over_quota=over_quota)  # before the fix: auto-approved and queued
    assert refusal.value.code == "priority_not_permitted"
    assert refusal.value.details == {
        "field": "priority",
        "requested": "critical",
        "max_priority": "standard",
        "allowed": ["batch", "standard"],
        "project": team.project.slug,
    }
    assert "Priority Critical is above" in refusal.value.message
    assert "(Batch (preemptible) and Standard)" in refusal.value.message  # in words; the codes are in the details
    assert nothing_stored()


@pytest.mark.parametrize("priority", [P.BATCH, P.STANDARD, P.HIGH])
def test_orders_within_the_entitlement_are_approved_automatically_as_before(shop, team, priority):
    entitle(team.project, P.HIGH)
    request = submit(shop, team, priority)
    assert (request.state, request.priority, request.quota_exception) == (S.QUEUED, priority, False)
    assert request.events.filter(code=EventCode.AUTO_APPROVED).exists()


def test_a_priority_exception_goes_to_the_operators_with_its_reason_on_the_timeline(shop, team):
    request = submit(shop, team, P.CRITICAL, over_quota=OverQuota.EXCEPTION, justification="Customer outage")

    assert (request.state, request.quota_exception) == (S.PENDING_APPROVAL, True)
    [reason] = request.quota_reasons  # within every quota limit: the priority is the only reason
    assert (reason["code"], reason["requested"], reason["limit"], reason["allowed"]) == (
        "priority_not_permitted",
        "critical",
        "standard",
        ["batch", "standard"],
    )
    event = request.events.get(code=EventCode.PRIORITY_EXCEPTION)
    assert event.data == reason and "Priority exception requested" in event.message
    assert request.events.filter(code=EventCode.ADMITTED).exists()  # the limits themselves fit
    assert operators_stage(request) == ["operators", [team.operator]]


def test_a_priority_exception_is_never_approved_automatically_even_by_a_rule_without_stages(shop, team):
    approval_rule()  # matches everything and approves automatically
    request = submit(shop, team, P.HIGH, over_quota=OverQuota.EXCEPTION, justification="Demo tomorrow")

    assert request.state == S.PENDING_APPROVAL
    assert not request.events.filter(code=EventCode.AUTO_APPROVED).exists()
    assert operators_stage(request) == ["operators", [team.operator]]


def test_a_priority_exception_needs_a_justification(shop, team):
    with pytest.raises(DomainError) as refusal:
        submit(shop, team, P.CRITICAL, over_quota=OverQuota.EXCEPTION)
    assert refusal.value.code == "justification_required"
    assert nothing_stored()


def test_an_approved_priority_exception_is_queued_with_its_priority_in_the_snapshot(shop, team):
    request = submit(shop, team, P.CRITICAL, over_quota=OverQuota.EXCEPTION, justification="Customer outage")
    task = ApprovalAssignment.objects.get(stage__approval__subject_id=request.pk, approver=team.operator)

    approvals.approval_decide(assignment=task, decision="approve", comment="", actor=team.operator)

    request.refresh_from_db()
    assert (request.state, request.approved_spec["priority"]) == (S.QUEUED, "critical")


def test_the_requester_cannot_approve_their_own_priority_exception_as_an_operator(shop, team):
    """An operator who is also a member orders critical: someone else decides, never the requester."""
    factories.member(team.project, user=team.operator)
    second = factories.operator()
    request = services.request_submit(
        order=make_order(shop, team.project, priority=P.CRITICAL, justification="Incident"),
        requester=team.operator,
        over_quota=OverQuota.EXCEPTION,
    )
    assert operators_stage(request) == ["operators", [second]]


# --- Approval rules: priority at least ... -----------------------------------------------------------------


@pytest.mark.parametrize(("priority", "routed"), [(P.STANDARD, False), (P.HIGH, True), (P.CRITICAL, True)])
def test_a_min_priority_rule_routes_orders_of_that_class_or_higher(shop, team, priority, routed):
    entitle(team.project, P.CRITICAL)
    approval_rule(approver_stage(), min_priority=P.HIGH)
    request = submit(shop, team, priority)
    assert request.state == (S.PENDING_APPROVAL if routed else S.QUEUED)


def test_a_min_priority_rule_never_matches_subjects_without_a_priority(team):
    rule = approval_rule(approver_stage(), subject=ApprovalSubject.QUOTA_CHANGE, min_priority=P.BATCH)
    facts = approvals.Facts(
        subject=ApprovalSubject.QUOTA_CHANGE, project=team.project, requester=team.lead, summary="more GPUs"
    )
    assert approvals.rule_matches(rule, facts) is False


def test_a_priority_exception_follows_a_matching_rule_with_stages(shop, team):
    approval_rule(approver_stage(), min_priority=P.CRITICAL)
    request = submit(shop, team, P.CRITICAL, over_quota=OverQuota.EXCEPTION, justification="Customer outage")
    [stage] = Approval.objects.get(subject_id=request.pk).stages.all()
    assert [assignment.approver for assignment in stage.assignments.all()] == [team.approver]


# --- Preview and API ---------------------------------------------------------------------------------------


def test_preview_shows_the_entitlement_and_the_reason_and_stores_nothing(shop, team):
    preview = services.request_preview(
        order=make_order(shop, team.project, priority=P.CRITICAL), requester=team.developer
    )
    assert preview["priority"] == {
        "requested": "critical",
        "max_priority": "standard",
        "allowed": ["batch", "standard"],
        "permitted": False,
    }
    assert preview["fits_quota"] is False
    assert [reason["code"] for reason in preview["quota_reasons"]] == ["priority_not_permitted"]
    assert nothing_stored()


def test_preview_of_a_priority_exception_shows_the_operators_route(shop, team):
    approval_rule()  # would approve automatically
    preview = services.request_preview(
        order=make_order(shop, team.project, priority=P.CRITICAL),
        requester=team.developer,
        over_quota=OverQuota.EXCEPTION,
    )
    assert preview["approval_route"]["automatic"] is False
    assert preview["approval_route"]["stages"][0]["approvers"] == [team.operator.username]


def test_api_refuses_a_critical_order_with_the_allowed_classes_and_stores_nothing(api_as, shop, team):
    response = api_as(team.developer).post(REQUESTS, order_body(shop, team.project, priority="critical"), format="json")

    assert response.status_code == 422, response.content
    body = response.json()
    assert set(body) == {"code", "message", "details"} and body["code"] == "priority_not_permitted"
    assert body["details"]["allowed"] == ["batch", "standard"]
    assert nothing_stored()


def test_api_priority_exception_is_201_pending_with_the_reason(api_as, shop, team):
    body = order_body(shop, team.project, priority="critical", over_quota="exception", justification="Outage")

    response = api_as(team.developer).post(REQUESTS, body, format="json")

    assert response.status_code == 201, response.content
    created = response.json()
    assert (created["state"], created["quota_exception"]) == ("pending_approval", True)
    assert created["quota_reasons"][0]["allowed"] == ["batch", "standard"]
    assert created["quota_reasons"][0]["code"] == "priority_not_permitted"


def test_api_preview_answers_the_entitlement(api_as, shop, team):
    response = api_as(team.developer).post(PREVIEW, order_body(shop, team.project, priority="high"), format="json")

    assert response.status_code == 200, response.content
    assert response.json()["priority"] == {
        "requested": "high",
        "max_priority": "standard",
        "allowed": ["batch", "standard"],
        "permitted": False,
    }
    assert response.json()["quota_reasons"][0]["code"] == "priority_not_permitted"


def test_project_api_shows_the_entitlement_and_cannot_change_it(api_as, team):
    entitle(team.project, P.HIGH)
    for user in (team.developer, team.lead, team.approver):
        client = api_as(user)
        body = client.get(f"/api/v1/projects/{team.project.pk}/").json()
        assert body["priority_entitlement"] == {"max_priority": "high", "allowed": ["batch", "standard", "high"]}
        for method in (client.patch, client.put):
            response = method(
                f"/api/v1/projects/{team.project.pk}/", {"priority_entitlement": "critical"}, format="json"
            )
            assert response.status_code == 405
    assert ProjectQuota.objects.get(project=team.project).max_priority == P.HIGH


def test_project_api_hides_other_tenants_entitlements(api_as, team):
    elsewhere = factories.project(quota=GENEROUS_QUOTA, max_priority=P.CRITICAL)
    assert api_as(team.developer).get(f"/api/v1/projects/{elsewhere.pk}/").status_code == 404


# --- Portal ------------------------------------------------------------------------------------------------


def test_portal_refuses_a_critical_order_naming_the_allowed_classes(client, shop, team):
    client.force_login(team.developer)

    response = client.post(f"/order/{shop.service.slug}/", order_post(shop, team.project, priority="critical"))

    assert response.status_code == 422
    body = response.content.decode()
    assert "priority_not_permitted" in body and "Allowed without approval: batch, standard" in body
    assert nothing_stored()


def test_portal_preview_shows_the_entitlement(client, shop, team):
    client.force_login(team.developer)

    response = client.post(f"/order/{shop.service.slug}/preview/", order_post(shop, team.project, priority="high"))

    body = response.content.decode()
    assert response.status_code == 200 and 'id="preview-priority"' in body
    assert "above the entitlement" in body and "High: the project may order Batch (preemptible) and Standard" in body


def test_portal_priority_exception_reaches_the_operators_inbox(client, shop, team):
    client.force_login(team.developer)
    client.post(
        f"/order/{shop.service.slug}/",
        order_post(shop, team.project, priority="critical", over_quota="exception", justification="Outage"),
    )
    request = ResourceRequest.objects.get()
    assert request.state == S.PENDING_APPROVAL

    client.force_login(team.operator)
    body = client.get("/approvals/").content.decode()
    assert f"#{request.pk}" in body and "Priority Critical / entitled to Standard" in body


def test_project_quota_page_shows_the_entitlement(client, team):
    entitle(team.project, P.HIGH)
    client.force_login(team.developer)

    body = client.get(f"/projects/{team.project.pk}/quota/").content.decode()

    assert "Priority entitlement: up to <strong>high</strong>" in body
