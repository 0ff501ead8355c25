"""Fixtures for the request workflow: a small catalog, a project with members, and order helpers."""

from decimal import Decimal
from types import SimpleNamespace

from catalog.models import Vendor
from requests.choices import ApprovalMode, ApprovalSubject, ApproverSource
from requests.models import ApprovalPolicy, ApprovalRule, ApprovalRuleStage
from requests.orders import Order
from tenancy.choices import Role
from tests import factories
from tests.module_data import shared_by_module

GENEROUS_QUOTA = {
    "gpus": Decimal(16),
    "accelerator_memory_gb": 1280,
    "cpu_cores": 256,
    "memory_gb": 2048,
    "concurrent_tasks": 10,
    "monthly_card_hours": Decimal(10000),
}


@shared_by_module
def shop():
    """A compute service offering a whole-card spec (2 cards, 80 GB each) and a MIG slice spec, one image."""
    nvidia = Vendor.objects.get(slug="nvidia")
    accelerator = factories.AcceleratorModelFactory(vendor=nvidia, memory_gb=80)
    slice_profile = factories.SliceProfileFactory(
        accelerator=accelerator, name="1g.10gb", compute_fraction=Decimal("0.1429"), memory_gb=10
    )
    whole = factories.ResourceSpecFactory(
        accelerator_models=[accelerator], accelerator_count=2, cpu_cores=16, memory_gb=128, hourly_price=Decimal("4.00")
    )
    sliced = factories.ResourceSpecFactory(
        accelerator_models=[accelerator],
        accelerator_count=1,
        slice_profile=slice_profile,
        cpu_cores=4,
        memory_gb=32,
        hourly_price=Decimal("0.50"),
    )
    image = factories.ImageFactory(compatible_vendors=[nvidia])
    service = factories.ServiceFactory(specs=[whole, sliced], images=[image], max_duration_hours=168)
    return SimpleNamespace(service=service, whole=whole, sliced=sliced, image=image, accelerator=accelerator)


@shared_by_module
def team():
    """A project with a generous quota: lead, approver, two developers (one managed by the lead), operator."""
    return project_team()


def project_team() -> SimpleNamespace:
    """The `team` fixture's people, for a shared fixture that builds on them."""
    project = factories.project(quota=GENEROUS_QUOTA)
    developer = factories.member(project)
    developer.manager = project.lead
    developer.save(update_fields=["manager"])
    return SimpleNamespace(
        project=project,
        lead=project.lead,
        developer=developer,
        developer2=factories.member(project),
        approver=factories.member(project, Role.APPROVER),
        operator=factories.operator(),
    )


def make_order(shop, project, *, spec=None, **overrides) -> Order:
    values = {
        "service": shop.service,
        "project": project,
        "duration_hours": 10,
        "spec": spec or shop.whole,
        "image": shop.image,
    }
    return Order(**{**values, **overrides})


def order_post(shop, project, **overrides) -> dict:
    """The order form's POST for the shop's whole-card spec, as a browser sends it."""
    data = {
        "project": project.pk,
        "spec": shop.whole.pk,
        "image": shop.image.pk,
        "duration_hours": 10,
        "priority": "standard",
        "environment": "development",
        "justification": "",
        "over_quota": "reject",
    }
    return {**data, **overrides}


def approval_rule(*stages, subject=ApprovalSubject.RESOURCE_REQUEST, **conditions) -> ApprovalRule:
    """One active policy with one rule; each stage is (source, mode, extra fields)."""
    policy = ApprovalPolicy.objects.create(name=f"Policy {ApprovalPolicy.objects.count() + 1}", subject=subject)
    rule = ApprovalRule.objects.create(policy=policy, name="rule", **conditions)
    for order, (source, mode, extra) in enumerate(stages, start=1):
        users = extra.pop("users", [])
        stage = ApprovalRuleStage.objects.create(
            rule=rule, order=order, name=f"Stage {order}", source=source, mode=mode, **extra
        )
        stage.users.set(users)
    return rule


def approver_stage(role=Role.APPROVER, mode=ApprovalMode.ANY):
    return (ApproverSource.PROJECT_ROLE, mode, {"project_role": role})
