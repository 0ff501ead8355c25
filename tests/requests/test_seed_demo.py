"""The demo approval policies: seeded idempotently, and routing the demo people the way the demo tells it."""

import pytest
from django.core.management import call_command

from catalog.models import Image, ResourceSpec, Service
from config.errors import DomainError
from requests import approvals, services
from requests.choices import ApprovalSubject, EventCode, OverQuota, RequestState
from requests.models import ApprovalPolicy, ApprovalRule, ApprovalRuleStage
from requests.orders import Order
from tenancy.models import Project, User

pytestmark = pytest.mark.django_db


@pytest.fixture
def seeded(demo_once, settings):
    """The module's demo (seeded once) with DEBUG on, as the demo runs."""
    settings.DEBUG = True


def order(
    spec_slug: str, project: str = "llm-pretraining", priority: str = "standard", justification: str = "", **parameters
) -> Order:
    return Order(
        service=Service.objects.get(slug="gpu-workspace"),
        project=Project.objects.get(slug=project),
        spec=ResourceSpec.objects.get(slug=spec_slug),
        duration_hours=24,
        image=Image.objects.get(name="pytorch", version="2.5-cuda12.4"),
        priority=priority,
        justification=justification,
        parameters=parameters,
    )


def submit(spec_slug: str, over_quota: str = OverQuota.REJECT, **order_fields):
    developer = User.objects.get(username="developer")
    return services.request_submit(order=order(spec_slug, **order_fields), requester=developer, over_quota=over_quota)


def stage_approvers(request) -> list[tuple[str, list[str]]]:
    return [
        (stage.name, [a.approver.username for a in stage.assignments.all()])
        for stage in approvals.approval_for(request).stages.order_by("order")
    ]


def test_seed_creates_the_demo_policies_once(seeded):
    counts = (ApprovalPolicy.objects.count(), ApprovalRule.objects.count(), ApprovalRuleStage.objects.count())
    call_command("seed_demo")
    assert (ApprovalPolicy.objects.count(), ApprovalRule.objects.count(), ApprovalRuleStage.objects.count()) == counts
    assert dict(ApprovalPolicy.objects.values_list("name", "subject")) == {
        "Resource requests": ApprovalSubject.RESOURCE_REQUEST,
        "Quota changes": ApprovalSubject.QUOTA_CHANGE,
    }


def test_one_h100_waits_for_the_project_approver(seeded):
    request = submit("h100-1x")
    assert request.state == RequestState.PENDING_APPROVAL
    assert stage_approvers(request) == [("Project approver", ["approver"])]


def test_small_mig_slice_is_approved_automatically(seeded):
    request = submit("h100-mig-1g")
    assert request.state == RequestState.QUEUED
    assert request.events.filter(code=EventCode.AUTO_APPROVED).exists()
    assert approvals.approval_for(request) is None


def test_production_needs_the_project_approver_then_the_developers_manager(seeded):
    request = submit("h100-1x", environment="production")
    assert stage_approvers(request) == [("Project approver", ["approver"]), ("Requester's manager", ["lead"])]
    assert [stage.state for stage in approvals.approval_for(request).stages.order_by("order")] == ["pending", "waiting"]


def test_demo_projects_have_sensible_priority_entitlements(seeded):
    entitlements = dict(Project.objects.values_list("slug", "quota__max_priority"))
    assert entitlements == {"llm-pretraining": "high", "vision": "standard", "recommendations": "high"}


@pytest.mark.parametrize(("project", "priority"), [("llm-pretraining", "critical"), ("vision", "high")])
def test_demo_priority_above_the_entitlement_is_refused(seeded, project, priority):
    with pytest.raises(DomainError) as refusal:
        submit("h100-mig-1g", project=project, priority=priority)  # the self-service slice: no rule to catch it
    assert refusal.value.code == "priority_not_permitted"


def test_demo_priority_exception_goes_to_the_lead_then_the_operators(seeded):
    request = submit(
        "h100-mig-1g", over_quota=OverQuota.EXCEPTION, project="vision", priority="high", justification="Customer demo"
    )
    assert request.state == RequestState.PENDING_APPROVAL
    assert stage_approvers(request) == [("Project lead", ["lead"]), ("Operators", ["admin", "operator"])]
