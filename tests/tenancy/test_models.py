"""Tenancy invariants that the database itself enforces, and how tenancy objects print."""

from decimal import Decimal

import pytest
from django.db import IntegrityError, transaction

from tenancy import services
from tenancy.choices import QuotaDimension, Role
from tenancy.models import AuditEvent, Membership, Project, ProjectQuota, TenantQuota
from tests import factories

pytestmark = pytest.mark.django_db


def test_second_membership_for_same_user_and_project_is_rejected():
    project = factories.project()
    user = factories.member(project)

    with pytest.raises(IntegrityError), transaction.atomic():
        Membership.objects.create(user=user, project=project, role=Role.APPROVER)

    assert Membership.objects.filter(user=user, project=project).count() == 1


def test_same_user_may_be_member_of_two_projects():
    first, second = factories.project(), factories.project()
    user = factories.member(first)

    Membership.objects.create(user=user, project=second, role=Role.MEMBER)

    assert set(user.memberships.values_list("project", flat=True)) == {first.pk, second.pk}


def test_membership_role_outside_the_choices_is_rejected_by_check_constraint():
    project = factories.project()
    user = factories.UserFactory()

    with pytest.raises(IntegrityError, match="membership_role_valid"), transaction.atomic():
        Membership.objects.create(user=user, project=project, role="owner")


def test_user_cannot_be_their_own_manager():
    user = factories.UserFactory()
    user.manager = user

    with pytest.raises(IntegrityError, match="user_not_own_manager"), transaction.atomic():
        user.save()

    user.refresh_from_db()
    assert user.manager is None


def test_project_name_is_unique_within_a_tenant():
    existing = factories.project(name="Vision")

    with pytest.raises(IntegrityError, match="project_name_unique_in_tenant"), transaction.atomic():
        Project.objects.create(
            tenant=existing.tenant, name="Vision", slug="vision-again", lead=existing.lead, cost_centre="CC-1"
        )


def test_same_project_name_is_allowed_in_another_tenant():
    existing = factories.project(name="Vision")
    other_tenant = factories.tenant()

    twin = Project.objects.create(
        tenant=other_tenant, name="Vision", slug="vision-elsewhere", lead=existing.lead, cost_centre="CC-1"
    )

    assert Project.objects.filter(name="Vision").count() == 2
    assert twin.tenant != existing.tenant


def test_negative_project_quota_gpus_is_rejected_by_check_constraint():
    quota = factories.project().quota

    with pytest.raises(IntegrityError, match="project_quota_gpus_non_negative"), transaction.atomic():
        ProjectQuota.objects.filter(pk=quota.pk).update(gpus=Decimal("-1"))

    quota.refresh_from_db()
    assert quota.gpus is None


def test_negative_tenant_quota_card_hours_is_rejected_by_check_constraint():
    quota = services.tenant_quota_ensure(tenant=factories.tenant(), actor=None)

    with pytest.raises(IntegrityError, match="tenant_quota_card_hours_non_negative"), transaction.atomic():
        TenantQuota.objects.filter(pk=quota.pk).update(monthly_card_hours=Decimal("-0.5"))


def test_quota_limits_returns_all_six_dimensions():
    project = factories.project(quota={"gpus": Decimal("4"), "cpu_cores": 64})

    limits = ProjectQuota.objects.get(project=project).limits()

    assert set(limits) == set(QuotaDimension.values)
    assert len(limits) == 6
    assert limits["gpus"] == Decimal("4")
    assert limits["cpu_cores"] == 64
    assert limits["monthly_card_hours"] is None


def test_tenant_quota_limits_start_unlimited():
    quota = services.tenant_quota_ensure(tenant=factories.tenant(), actor=None)

    assert quota.limits() == dict.fromkeys(QuotaDimension.values)


def test_str_of_tenant_project_and_membership():
    tenant = factories.tenant(name="Research", slug="research")
    project = factories.project(tenant_obj=tenant, name="Vision", slug="vision")
    user = factories.member(project, Role.APPROVER, user=factories.UserFactory(username="ada"))

    assert str(tenant) == "Research"
    assert str(project) == "Research / Vision"
    assert str(Membership.objects.get(user=user, project=project)) == "ada is approver of vision"
    assert str(user) == "ada"


def test_str_of_quotas_and_audit_event():
    tenant = factories.tenant(name="Research", slug="research")
    project = factories.project(tenant_obj=tenant, name="Vision", slug="vision")
    tenant_quota = services.tenant_quota_ensure(tenant=tenant, actor=None)

    assert str(project.quota) == "Quota of Research / Vision"
    assert str(tenant_quota) == "Quota of Research"
    created = AuditEvent.objects.filter(action="project.created").get()
    assert str(created) == "project.created on Research / Vision"
