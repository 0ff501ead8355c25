"""Tenancy services: every write, the object permissions it implies, its refusals and its audit row."""

from decimal import Decimal

import pytest

from config.errors import Conflict, DomainError
from tenancy import services
from tenancy.choices import ROLE_PERMISSIONS, ProjectPermission, Role
from tenancy.models import AuditEvent, Membership, ProjectQuota, User
from tests import factories

pytestmark = pytest.mark.django_db

ALL_PROJECT_PERMISSIONS = set(ProjectPermission.values)


def held_permissions(user: User, project) -> set[str]:
    """The project object permissions the user holds, read on a fresh user so no cache answers."""
    fresh = User.objects.get(pk=user.pk)
    return {perm for perm in ProjectPermission.values if fresh.has_perm(f"tenancy.{perm}", project)}


def last_audit(action: str) -> AuditEvent:
    return AuditEvent.objects.filter(action=action).latest("id")


@pytest.fixture
def actor(db):
    return factories.operator(username="opsy")


# --- project_create ---------------------------------------------------------------------------------------


def test_project_create_creates_quota_row_with_given_limits(actor):
    lead = factories.UserFactory()

    project = services.project_create(
        tenant=factories.tenant(),
        name="Vision",
        slug="vision",
        lead=lead,
        cost_centre="CC-7",
        actor=actor,
        quota={"gpus": Decimal("8")},
    )

    quota = ProjectQuota.objects.get(project=project)
    assert quota.gpus == Decimal("8")
    assert quota.cpu_cores is None
    assert quota.updated_by == actor


def test_project_create_makes_the_lead_a_lead_member_with_all_four_permissions(actor):
    lead = factories.UserFactory()

    project = services.project_create(
        tenant=factories.tenant(), name="Vision", slug="vision", lead=lead, cost_centre="CC-7", actor=actor
    )

    assert Membership.objects.get(project=project, user=lead).role == Role.LEAD
    assert held_permissions(lead, project) == {
        "view_project",
        "request_on_project",
        "approve_on_project",
        "manage_project",
    }


def test_project_create_with_unknown_quota_dimension_creates_nothing(actor):
    tenant = factories.tenant()

    with pytest.raises(DomainError) as refusal:
        services.project_create(
            tenant=tenant,
            name="Vision",
            slug="vision",
            lead=factories.UserFactory(),
            cost_centre="CC-7",
            actor=actor,
            quota={"tpus": 2},
        )

    assert refusal.value.code == "unknown_quota_dimension"
    assert not tenant.projects.exists()


# --- membership_grant / membership_revoke ------------------------------------------------------------------


@pytest.mark.parametrize("role", Role.values)
def test_membership_grant_gives_exactly_the_role_permissions(role, actor):
    project = factories.project()
    user = factories.UserFactory()

    membership = services.membership_grant(project=project, user=user, role=role, actor=actor)

    assert membership.role == role
    assert membership.granted_by == actor
    assert held_permissions(user, project) == set(ROLE_PERMISSIONS[role])


def test_membership_grant_gives_no_permission_on_other_projects(actor):
    project, other = factories.project(), factories.project()
    user = factories.UserFactory()

    services.membership_grant(project=project, user=user, role=Role.LEAD, actor=actor)

    assert held_permissions(user, other) == set()


def test_changing_role_from_lead_to_member_removes_the_extra_permissions(actor):
    project = factories.project()
    user = factories.member(project, Role.LEAD)
    assert held_permissions(user, project) == ALL_PROJECT_PERMISSIONS

    services.membership_grant(project=project, user=user, role=Role.MEMBER, actor=actor)

    assert held_permissions(user, project) == {"view_project", "request_on_project"}
    assert Membership.objects.get(project=project, user=user).role == Role.MEMBER


def test_changing_role_from_member_to_approver_swaps_request_for_approve(actor):
    project = factories.project()
    user = factories.member(project, Role.MEMBER)

    services.membership_grant(project=project, user=user, role=Role.APPROVER, actor=actor)

    assert held_permissions(user, project) == {"view_project", "approve_on_project"}
    assert Membership.objects.filter(project=project, user=user).count() == 1


def test_membership_grant_with_unknown_role_is_refused(actor):
    project = factories.project()
    user = factories.UserFactory()

    with pytest.raises(DomainError) as refusal:
        services.membership_grant(project=project, user=user, role="owner", actor=actor)

    assert refusal.value.code == "invalid_role"
    assert not Membership.objects.filter(project=project, user=user).exists()


def test_membership_revoke_removes_membership_and_all_object_permissions(actor):
    project = factories.project()
    user = factories.member(project, Role.APPROVER)

    services.membership_revoke(project=project, user=user, actor=actor)

    assert not Membership.objects.filter(project=project, user=user).exists()
    assert held_permissions(user, project) == set()


def test_revoking_the_project_lead_is_a_conflict_and_changes_nothing(actor):
    project = factories.project()
    lead = project.lead

    with pytest.raises(Conflict) as refusal:
        services.membership_revoke(project=project, user=lead, actor=actor)

    assert refusal.value.code == "lead_role_required"
    assert refusal.value.status_code == 409
    assert Membership.objects.get(project=project, user=lead).role == Role.LEAD
    assert held_permissions(lead, project) == ALL_PROJECT_PERMISSIONS


@pytest.mark.parametrize("role", [Role.MEMBER, Role.APPROVER])
def test_demoting_the_project_lead_is_a_conflict_and_changes_nothing(role, actor):
    project = factories.project()
    lead = project.lead

    with pytest.raises(Conflict) as refusal:
        services.membership_grant(project=project, user=lead, role=role, actor=actor)

    assert refusal.value.code == "lead_role_required"
    assert Membership.objects.get(project=project, user=lead).role == Role.LEAD
    assert held_permissions(lead, project) == ALL_PROJECT_PERMISSIONS


# --- project_update ---------------------------------------------------------------------------------------


def test_project_update_changing_lead_promotes_new_lead_and_demotes_old_lead(actor):
    project = factories.project()
    old_lead = project.lead
    new_lead = factories.member(project, Role.MEMBER)

    updated = services.project_update(project=project, actor=actor, lead=new_lead)

    assert updated.lead == new_lead
    assert Membership.objects.get(project=project, user=new_lead).role == Role.LEAD
    assert held_permissions(new_lead, project) == ALL_PROJECT_PERMISSIONS
    assert Membership.objects.get(project=project, user=old_lead).role == Role.MEMBER
    assert held_permissions(old_lead, project) == set(ROLE_PERMISSIONS[Role.MEMBER])


def test_project_update_can_appoint_a_lead_who_was_not_a_member(actor):
    project = factories.project()
    newcomer = factories.UserFactory()

    services.project_update(project=project, actor=actor, lead=newcomer)

    assert Membership.objects.get(project=project, user=newcomer).role == Role.LEAD
    assert held_permissions(newcomer, project) == ALL_PROJECT_PERMISSIONS


def test_project_update_with_unknown_field_is_refused(actor):
    project = factories.project(name="Vision")

    with pytest.raises(DomainError) as refusal:
        services.project_update(project=project, actor=actor, name="Renamed", members=[])

    assert refusal.value.code == "invalid_field"
    assert refusal.value.details == {"fields": ["members"]}
    project.refresh_from_db()
    assert project.name == "Vision"


def test_project_update_records_before_and_after_of_changed_fields(actor):
    project = factories.project(name="Vision")

    services.project_update(project=project, actor=actor, name="Vision 2", active=True)

    event = last_audit("project.updated")
    assert event.data == {"name": ["Vision", "Vision 2"]}
    assert event.actor == actor


# --- quota_set ----------------------------------------------------------------------------------------------


def test_quota_set_records_before_and_after_for_each_changed_dimension(actor):
    project = factories.project(quota={"cpu_cores": 32, "memory_gb": 256})

    quota = services.quota_set(
        quota=project.quota,
        actor=actor,
        reason="Bigger training run",
        limits={"gpus": Decimal("8"), "cpu_cores": 64, "memory_gb": 256},
    )

    assert quota.gpus == Decimal("8")
    assert quota.cpu_cores == 64
    assert quota.updated_by == actor
    event = last_audit("quota.changed")
    assert event.data == {"gpus": [None, "8"], "cpu_cores": [32, 64]}
    assert event.reason == "Bigger training run"
    assert event.actor == actor
    assert event.target_id == str(quota.pk)


def test_quota_set_none_lifts_a_limit(actor):
    project = factories.project(quota={"concurrent_tasks": 3})

    quota = services.quota_set(quota=project.quota, limits={"concurrent_tasks": None}, actor=actor)

    assert quota.concurrent_tasks is None
    assert last_audit("quota.changed").data == {"concurrent_tasks": [3, None]}


def test_quota_set_without_changes_writes_no_audit_row(actor):
    project = factories.project(quota={"gpus": Decimal("4"), "cpu_cores": 32})
    audit_rows = AuditEvent.objects.count()

    services.quota_set(quota=project.quota, limits={"gpus": Decimal("4.00"), "cpu_cores": 32}, actor=actor)

    assert AuditEvent.objects.count() == audit_rows
    assert ProjectQuota.objects.get(pk=project.quota.pk).updated_by is None


def test_quota_set_rejects_unknown_dimension_and_leaves_row_unchanged(actor):
    project = factories.project(quota={"gpus": Decimal("4")})

    with pytest.raises(DomainError) as refusal:
        services.quota_set(quota=project.quota, limits={"gpus": Decimal("8"), "tpus": 2}, actor=actor)

    assert refusal.value.code == "unknown_quota_dimension"
    assert ProjectQuota.objects.get(pk=project.quota.pk).gpus == Decimal("4")
    assert not AuditEvent.objects.filter(action="quota.changed").exists()


def test_quota_set_rejects_negative_value_and_leaves_row_unchanged(actor):
    project = factories.project(quota={"gpus": Decimal("4"), "cpu_cores": 32})

    with pytest.raises(DomainError) as refusal:
        services.quota_set(quota=project.quota, limits={"gpus": Decimal("-1"), "cpu_cores": 64}, actor=actor)

    assert refusal.value.code == "negative_quota"
    assert refusal.value.details == {"gpus": "-1"}
    quota = ProjectQuota.objects.get(pk=project.quota.pk)
    assert (quota.gpus, quota.cpu_cores) == (Decimal("4"), 32)
    assert not AuditEvent.objects.filter(action="quota.changed").exists()


def test_quota_set_works_on_tenant_quota(actor):
    quota = services.tenant_quota_ensure(tenant=factories.tenant(), actor=actor)

    quota = services.quota_set(quota=quota, limits={"monthly_card_hours": Decimal("1000")}, actor=actor)

    assert quota.monthly_card_hours == Decimal("1000")
    assert last_audit("quota.changed").data == {"monthly_card_hours": [None, "1000"]}


def test_tenant_quota_ensure_is_idempotent(actor):
    tenant = factories.tenant()

    first = services.tenant_quota_ensure(tenant=tenant, actor=actor)
    second = services.tenant_quota_ensure(tenant=tenant, actor=actor)

    assert first.pk == second.pk
    assert AuditEvent.objects.filter(action="quota.created").count() == 1


# --- user_set_manager ---------------------------------------------------------------------------------------


def test_user_set_manager_sets_the_manager(actor):
    user, boss = factories.UserFactory(), factories.UserFactory()

    services.user_set_manager(user=user, manager=boss, actor=actor)

    assert User.objects.get(pk=user.pk).manager == boss


def test_user_set_manager_refuses_the_user_as_own_manager(actor):
    user = factories.UserFactory()

    with pytest.raises(Conflict) as refusal:
        services.user_set_manager(user=user, manager=user, actor=actor)

    assert refusal.value.code == "manager_cycle"


def test_user_set_manager_refuses_a_longer_cycle_and_keeps_the_old_manager(actor):
    a, b, c = factories.UserFactory(), factories.UserFactory(), factories.UserFactory()
    services.user_set_manager(user=b, manager=a, actor=actor)
    services.user_set_manager(user=c, manager=b, actor=actor)

    with pytest.raises(Conflict) as refusal:
        services.user_set_manager(user=a, manager=c, actor=actor)

    assert refusal.value.code == "manager_cycle"
    assert User.objects.get(pk=a.pk).manager is None


# --- every service leaves an audit row naming the actor -------------------------------------------------


def test_tenant_create_is_audited_with_actor(actor):
    tenant = services.tenant_create(name="Research", slug="research", actor=actor)

    event = last_audit("tenant.created")
    assert (event.actor, event.target_id, event.target_repr) == (actor, str(tenant.pk), "Research")


def test_project_create_is_audited_with_actor(actor):
    lead = factories.UserFactory()

    project = services.project_create(
        tenant=factories.tenant(), name="Vision", slug="vision", lead=lead, cost_centre="CC-7", actor=actor
    )

    event = last_audit("project.created")
    assert (event.actor, event.target_id) == (actor, str(project.pk))
    assert event.data == {"lead": lead.username}
    assert last_audit("membership.granted").actor == actor


def test_membership_grant_is_audited_with_actor_and_roles(actor):
    project = factories.project()
    user = factories.member(project, Role.MEMBER)

    services.membership_grant(project=project, user=user, role=Role.APPROVER, actor=actor)

    event = last_audit("membership.granted")
    assert event.actor == actor
    assert event.target_id == str(project.pk)
    assert event.data == {"user": user.username, "role": "approver", "previous_role": "member"}


def test_membership_grant_of_the_same_role_writes_no_audit_row(actor):
    project = factories.project()
    user = factories.member(project, Role.MEMBER)
    audit_rows = AuditEvent.objects.count()

    services.membership_grant(project=project, user=user, role=Role.MEMBER, actor=actor)

    assert AuditEvent.objects.count() == audit_rows


def test_membership_revoke_is_audited_with_actor(actor):
    project = factories.project()
    user = factories.member(project)

    services.membership_revoke(project=project, user=user, actor=actor)

    event = last_audit("membership.revoked")
    assert (event.actor, event.data) == (actor, {"user": user.username})


def test_project_update_is_audited_with_actor(actor):
    project = factories.project()

    services.project_update(project=project, actor=actor, active=False)

    event = last_audit("project.updated")
    assert (event.actor, event.data) == (actor, {"active": [True, False]})


def test_tenant_quota_ensure_is_audited_with_actor(actor):
    quota = services.tenant_quota_ensure(tenant=factories.tenant(), actor=actor)

    event = last_audit("quota.created")
    assert (event.actor, event.target_id) == (actor, str(quota.pk))


def test_user_set_manager_is_audited_with_actor(actor):
    user, boss = factories.UserFactory(), factories.UserFactory()

    services.user_set_manager(user=user, manager=boss, actor=actor)

    event = last_audit("user.manager_changed")
    assert event.actor == actor
    assert event.data == {"from": None, "to": boss.username}


def test_project_update_keeps_the_reason_on_the_audit_row(actor):
    project = factories.project()

    services.project_update(project=project, actor=actor, reason="Budget closed", active=False)

    assert last_audit("project.updated").reason == "Budget closed"
