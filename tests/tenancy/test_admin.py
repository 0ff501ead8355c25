"""The tenancy operator console: who gets in, what pages cost, and that every save goes through a service."""

from decimal import Decimal

import pytest
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME

from tenancy import services, team
from tenancy.choices import ROLE_PERMISSIONS, ProjectPermission, QuotaDimension, Role
from tenancy.models import AuditEvent, Membership, Project, ProjectQuota, User
from tests import factories
from tests.admin_pages import as_posted

pytestmark = pytest.mark.django_db

CHANGELIST_QUERY_BOUND = 12
TENANCY_CHANGELISTS = [
    "/admin/tenancy/project/",
    "/admin/tenancy/tenant/",
    "/admin/tenancy/membership/",
    "/admin/tenancy/projectquota/",
    "/admin/tenancy/tenantquota/",
    "/admin/tenancy/auditevent/",
    "/admin/tenancy/user/",
    "/admin/tenancy/invitation/",
]


def held_permissions(user: User, project: Project) -> set[str]:
    fresh = User.objects.get(pk=user.pk)
    return {perm for perm in ProjectPermission.values if fresh.has_perm(f"tenancy.{perm}", project)}


@pytest.fixture
def operator_client(client, roles):
    client.force_login(roles.operator)
    return client


def _populate(count: int) -> None:
    """Rows for every tenancy changelist: projects with tenant caps, members with managers, audit events."""
    for _ in range(count):
        project = factories.project()
        services.tenant_quota_ensure(tenant=project.tenant, actor=None)
        developer = factories.member(project)
        services.user_set_manager(user=developer, manager=project.lead, actor=None)
        services.quota_set(quota=project.quota, limits={"gpus": Decimal("2")}, actor=None)
        team.invitation_create(
            project=project, email=f"guest-{project.slug}@example.org", role="member", actor=project.lead
        )


def _changelist_queries(client, url: str, assert_max_queries) -> int:
    with assert_max_queries(CHANGELIST_QUERY_BOUND) as queries:
        response = client.get(url)
    assert response.status_code == 200
    return len(queries)


@pytest.mark.parametrize("url", TENANCY_CHANGELISTS)
def test_operator_opens_changelist_with_query_count_independent_of_rows(
    operator_client, url, django_assert_max_num_queries
):
    _populate(2)
    operator_client.get(url)  # warm per-process caches (content types, permissions) before measuring

    with_few_rows = _changelist_queries(operator_client, url, django_assert_max_num_queries)
    _populate(4)  # more rows of every kind: one query a row would show
    with_many_rows = _changelist_queries(operator_client, url, django_assert_max_num_queries)

    assert with_few_rows == with_many_rows


@pytest.mark.parametrize("url", ["/admin/tenancy/project/", "/admin/tenancy/projectquota/"])
def test_changelist_shows_the_rows(operator_client, roles, url):
    response = operator_client.get(url)

    assert roles.project.name in response.content.decode()
    assert roles.other_project.name in response.content.decode()


@pytest.mark.parametrize("url", ["/admin/", "/admin/tenancy/project/"])
def test_developer_is_redirected_to_admin_login(client, roles, url):
    client.force_login(roles.developer)

    response = client.get(url)

    assert response.status_code == 302
    assert response.url.startswith("/admin/login/")


def test_adding_a_membership_in_admin_assigns_object_permissions(operator_client, roles):
    newcomer = factories.UserFactory()

    response = operator_client.post(
        "/admin/tenancy/membership/add/",
        {
            "user": newcomer.pk,
            "project": roles.project.pk,
            "role": Role.APPROVER,
        },
    )

    assert response.status_code == 302, response.content
    membership = Membership.objects.get(user=newcomer, project=roles.project)
    assert membership.role == Role.APPROVER
    assert membership.granted_by == roles.operator
    assert held_permissions(newcomer, roles.project) == set(ROLE_PERMISSIONS[Role.APPROVER])
    event = AuditEvent.objects.filter(action="membership.granted").latest("id")
    assert (event.actor, event.data["user"]) == (roles.operator, newcomer.username)


def test_deleting_a_membership_in_admin_removes_object_permissions(operator_client, roles):
    membership = Membership.objects.get(user=roles.developer, project=roles.project)

    response = operator_client.post(f"/admin/tenancy/membership/{membership.pk}/delete/", {"post": "yes"})

    assert response.status_code == 302
    assert not Membership.objects.filter(pk=membership.pk).exists()
    assert held_permissions(roles.developer, roles.project) == set()


def test_object_permission_page_redirects_without_assigning(operator_client, roles):
    url = f"/admin/tenancy/project/{roles.project.pk}/permissions/user-manage/{roles.outsider.pk}/"

    response = operator_client.post(url, {"permissions": ["manage_project", "view_project"]})

    assert response.status_code == 302
    assert response.url == f"/admin/tenancy/project/{roles.project.pk}/change/"
    assert held_permissions(roles.outsider, roles.project) == set()
    assert not Membership.objects.filter(user=roles.outsider).exists()


def test_deactivate_action_first_asks_for_a_reason(operator_client, roles):
    response = operator_client.post(
        "/admin/tenancy/project/",
        {
            "action": "deactivate_projects",
            ACTION_CHECKBOX_NAME: [roles.project.pk],
        },
    )

    assert response.status_code == 200
    assert 'name="reason"' in response.content.decode()
    roles.project.refresh_from_db()
    assert roles.project.active is True


def test_deactivate_action_with_reason_deactivates_and_audits(operator_client, roles):
    response = operator_client.post(
        "/admin/tenancy/project/",
        {
            "action": "deactivate_projects",
            ACTION_CHECKBOX_NAME: [roles.project.pk],
            "apply": "Confirm",
            "reason": "Budget closed for the year",
        },
    )

    assert response.status_code == 302
    roles.project.refresh_from_db()
    roles.other_project.refresh_from_db()
    assert roles.project.active is False
    assert roles.other_project.active is True
    event = AuditEvent.objects.filter(action="project.updated").latest("id")
    assert event.actor == roles.operator
    assert event.target_id == str(roles.project.pk)
    assert event.data == {"active": [True, False]}
    assert event.reason == "Budget closed for the year"


def test_changing_a_quota_in_admin_writes_a_quota_changed_audit_event(operator_client, roles):
    quota = roles.project.quota
    form = {
        dimension: ""
        for dimension in ("accelerator_memory_gb", "cpu_cores", "memory_gb", "concurrent_tasks", "monthly_card_hours")
    }
    form["max_priority"] = "standard"  # unchanged: no entitlement audit row

    response = operator_client.post(
        f"/admin/tenancy/projectquota/{quota.pk}/change/", {**form, "gpus": "8", "reason": "New cards"}
    )

    assert response.status_code == 302, response.content
    quota = ProjectQuota.objects.get(pk=quota.pk)
    assert quota.gpus == Decimal("8")
    assert quota.updated_by == roles.operator
    event = AuditEvent.objects.filter(action="quota.changed").latest("id")
    assert event.actor == roles.operator
    assert event.target_id == str(quota.pk)
    assert event.data == {"gpus": [None, "8"]}
    assert event.reason == "New cards"


def test_demoting_the_lead_in_membership_admin_is_a_form_error(operator_client, roles):
    membership = Membership.objects.get(user=roles.lead, project=roles.project)
    url = f"/admin/tenancy/membership/{membership.pk}/change/"

    response = operator_client.post(url, {"role": Role.MEMBER})

    assert response.status_code == 200
    assert "appoint another lead first" in response.content.decode()
    assert Membership.objects.get(pk=membership.pk).role == Role.LEAD
    assert held_permissions(roles.lead, roles.project) == set(ProjectPermission.values)


def test_changing_a_members_role_in_membership_admin_goes_through_the_service(operator_client, roles):
    membership = Membership.objects.get(user=roles.developer, project=roles.project)
    url = f"/admin/tenancy/membership/{membership.pk}/change/"

    response = operator_client.post(url, {"role": Role.APPROVER})

    assert response.status_code == 302
    assert Membership.objects.get(pk=membership.pk).role == Role.APPROVER
    assert held_permissions(roles.developer, roles.project) == set(ROLE_PERMISSIONS[Role.APPROVER])


def test_deleting_the_lead_membership_in_admin_is_refused(operator_client, roles):
    membership = Membership.objects.get(user=roles.lead, project=roles.project)
    url = f"/admin/tenancy/membership/{membership.pk}/delete/"

    assert "appoint another lead first" in operator_client.get(url).content.decode()
    assert operator_client.post(url, {"post": "yes"}).status_code == 403
    assert Membership.objects.filter(pk=membership.pk).exists()
    assert held_permissions(roles.lead, roles.project) == set(ProjectPermission.values)


def test_bulk_delete_including_a_lead_membership_deletes_nothing(operator_client, roles):
    lead_row = Membership.objects.get(user=roles.lead, project=roles.project)
    member_row = Membership.objects.get(user=roles.developer, project=roles.project)

    response = operator_client.post(
        "/admin/tenancy/membership/",
        {
            "action": "delete_selected",
            ACTION_CHECKBOX_NAME: [lead_row.pk, member_row.pk],
            "post": "yes",
        },
    )

    assert response.status_code == 403
    assert Membership.objects.filter(pk__in=[lead_row.pk, member_row.pk]).count() == 2


# --- The priority entitlement (operators only) --------------------------------------------------------------

QUOTA_FORM = {dimension: "" for dimension in QuotaDimension.values}  # every limit left empty (unlimited)


def test_operator_changes_the_priority_entitlement_audited(operator_client, roles):
    quota = roles.project.quota

    response = operator_client.post(
        f"/admin/tenancy/projectquota/{quota.pk}/change/",
        {**QUOTA_FORM, "max_priority": "high", "reason": "Launch week"},
    )

    assert response.status_code == 302, response.content
    quota = ProjectQuota.objects.get(pk=quota.pk)
    assert (quota.max_priority, quota.updated_by) == ("high", roles.operator)
    event = AuditEvent.objects.get(action="quota.priority_entitlement_changed")
    assert (event.actor, event.data, event.reason) == (
        roles.operator,
        {"max_priority": ["standard", "high"]},
        "Launch week",
    )
    assert not AuditEvent.objects.filter(action="quota.changed").exists()  # no limit changed


def test_the_changelist_shows_and_filters_by_entitlement(operator_client, roles):
    services.quota_set_priority_entitlement(quota=roles.project.quota, max_priority="high", actor=None)

    body = operator_client.get("/admin/tenancy/projectquota/?max_priority__exact=high").content.decode()

    assert roles.project.name in body and roles.other_project.name not in body


def test_operator_sets_the_entitlement_on_the_projects_page(operator_client, roles):
    url = f"/admin/tenancy/project/{roles.project.pk}/change/"
    page = operator_client.get(url)
    assert 'name="quota-0-max_priority"' in page.content.decode()

    response = operator_client.post(
        url, {**as_posted(page), "quota-0-max_priority": "critical", "quota-0-reason": "Incident response"}
    )

    assert response.status_code == 302, response.context and response.context["errors"]
    assert ProjectQuota.objects.get(project=roles.project).max_priority == "critical"
    assert AuditEvent.objects.filter(action="quota.priority_entitlement_changed", actor=roles.operator).exists()


@pytest.mark.parametrize("who", ["anonymous", "developer", "approver", "lead"])
def test_nobody_but_operators_may_change_the_entitlement(client, roles, who):
    if who != "anonymous":
        client.force_login(getattr(roles, who))
    quota = roles.project.quota

    response = client.post(
        f"/admin/tenancy/projectquota/{quota.pk}/change/", {**QUOTA_FORM, "max_priority": "critical"}
    )

    assert response.status_code == 302 and response.url.startswith("/admin/login/")
    assert ProjectQuota.objects.get(pk=quota.pk).max_priority == "standard"
    assert not AuditEvent.objects.filter(action="quota.priority_entitlement_changed").exists()


def test_adding_a_member_on_the_projects_page_saves_through_the_service(operator_client, roles):
    url = f"/admin/tenancy/project/{roles.project.pk}/change/"
    data = as_posted(operator_client.get(url))
    prefix = "memberships"
    index = int(data[f"{prefix}-TOTAL_FORMS"])
    data.update(
        {
            f"{prefix}-TOTAL_FORMS": index + 1,
            f"{prefix}-{index}-user": roles.outsider.pk,
            f"{prefix}-{index}-role": Role.MEMBER,
            f"{prefix}-{index}-project": roles.project.pk,
        }
    )

    response = operator_client.post(url, data)

    assert response.status_code == 302, response.context and response.context["errors"]
    assert Membership.objects.get(project=roles.project, user=roles.outsider).role == Role.MEMBER
    assert held_permissions(roles.outsider, roles.project) == ROLE_PERMISSIONS[Role.MEMBER]


def test_editing_a_tenant_in_the_console_saves_through_the_service_audited(operator_client, roles):
    tenant = factories.project().tenant
    url = f"/admin/tenancy/tenant/{tenant.pk}/change/"
    data = {**as_posted(operator_client.get(url)), "name": "Renamed"}
    data.pop("active", None)  # unticked: the tenant is deactivated
    assert operator_client.post(url, data).status_code == 302
    tenant.refresh_from_db()
    assert (tenant.name, tenant.active) == ("Renamed", False)
    event = AuditEvent.objects.get(action="tenant.updated", target_id=str(tenant.pk))
    assert (event.actor, event.data) == (roles.operator, {"fields": ["active", "name"]})


def test_editing_an_account_in_the_console_is_audited_and_the_manager_recorded(client):
    admin = factories.UserFactory(is_staff=True, is_superuser=True)  # accounts are edited by administrators only
    client.force_login(admin)
    person = factories.UserFactory()
    manager = factories.UserFactory()
    url = f"/admin/tenancy/user/{person.pk}/change/"
    data = {**as_posted(client.get(url)), "is_staff": "on", "manager": manager.pk}
    joined = data.pop("date_joined")  # a split date and time in the browser's form
    data.update(date_joined_0=joined.strftime("%Y-%m-%d"), date_joined_1=joined.strftime("%H:%M:%S"))
    assert client.post(url, data).status_code == 302
    person.refresh_from_db()
    assert (person.is_staff, person.manager) == (True, manager)
    updated = AuditEvent.objects.get(action="user.updated", target_id=str(person.pk))
    # The fields the form saw change (the re-posted join date may count); the manager has its own row.
    assert updated.actor == admin and "is_staff" in updated.data["fields"] and "manager" not in updated.data["fields"]
    changed = AuditEvent.objects.get(action="user.manager_changed", target_id=str(person.pk))
    assert changed.data == {"from": None, "to": manager.username}
