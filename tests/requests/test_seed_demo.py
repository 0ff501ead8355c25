"""The demo approval policies: seeded idempotently, and routing the demo people the way the demo tells it."""

import pytest
from django.core.management import call_command

from catalog.models import Image, ResourceSpec, Service
from requests import approvals, services
from requests.choices import ApprovalSubject, EventCode, RequestState
from requests.models import ApprovalPolicy, ApprovalRule, ApprovalRuleStage
from requests.orders import Order
from tenancy.models import Project, User

pytestmark = pytest.mark.django_db


@pytest.fixture
def seeded(settings):
    settings.DEBUG = True
    call_command("seed_demo")


def order(spec_slug: str, **parameters) -> Order:
    return Order(service=Service.objects.get(slug="gpu-workspace"), project=Project.objects.get(slug="llm-pretraining"),
                 spec=ResourceSpec.objects.get(slug=spec_slug), duration_hours=24,
                 image=Image.objects.get(name="pytorch", version="2.5-cuda12.4"), parameters=parameters)


def submit(spec_slug: str, **parameters):
    developer = User.objects.get(username="developer")
    return services.request_submit(order=order(spec_slug, **parameters), requester=developer)


def stage_approvers(request) -> list[tuple[str, list[str]]]:
    return [(stage.name, [a.approver.username for a in stage.assignments.all()])
            for stage in approvals.approval_for(request).stages.order_by("order")]


def test_seed_creates_the_demo_policies_once(seeded):
    counts = (ApprovalPolicy.objects.count(), ApprovalRule.objects.count(), ApprovalRuleStage.objects.count())
    call_command("seed_demo")
    assert (ApprovalPolicy.objects.count(), ApprovalRule.objects.count(),
            ApprovalRuleStage.objects.count()) == counts
    assert dict(ApprovalPolicy.objects.values_list("name", "subject")) == {
        "Resource requests": ApprovalSubject.RESOURCE_REQUEST, "Quota changes": ApprovalSubject.QUOTA_CHANGE}


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
    assert [stage.state for stage in approvals.approval_for(request).stages.order_by("order")] == [
        "pending", "waiting"]
