"""grants_of answers in one statement what Django's has_perm and guardian's get_objects_for_user answer in three
queries: held to their own answers for every way a permission can be held or not."""

import pytest
from django.conf import settings
from django.contrib.auth.backends import ModelBackend
from django.contrib.auth.models import Group, Permission
from django.utils.module_loading import import_string
from guardian.shortcuts import assign_perm

from tenancy.choices import ProjectPermission, Role
from tenancy.models import Project, User
from tenancy.selectors import Grants, grants_of, projects_with_permission
from tests import factories
from tests.module_data import shared_by_module

pytestmark = pytest.mark.django_db

GLOBAL = ["requests.view_resourcerequest", "requests.view_quotachangerequest", "tenancy.view_project"]


def global_permission(name: str) -> Permission:
    app_label, codename = name.split(".")
    return Permission.objects.get(content_type__app_label=app_label, codename=codename)


def group_with(*, permissions=(), on_project=None) -> Group:
    group = Group.objects.create(name=f"group-{Group.objects.count()}")
    group.permissions.add(*map(global_permission, permissions))
    if on_project is not None:
        assign_perm(f"tenancy.{ProjectPermission.VIEW}", group, on_project)
    return group


@shared_by_module
def people():
    """One user for each way of holding (or not) a global or a project permission."""
    home, other = factories.project(), factories.project()
    member = factories.member(home)
    approver_elsewhere = factories.member(other, Role.APPROVER)
    direct_global = factories.UserFactory()
    direct_global.user_permissions.add(global_permission("tenancy.view_project"))
    group_global = factories.UserFactory()
    group_global.groups.add(group_with(permissions=["tenancy.view_project"]))
    group_object = factories.UserFactory()
    group_object.groups.add(group_with(on_project=other))
    member_who_sees_requests = factories.member(home)
    member_who_sees_requests.user_permissions.add(global_permission("requests.view_resourcerequest"))
    inactive_member = factories.member(other)
    inactive_with_global = factories.UserFactory(is_active=False)
    inactive_with_global.user_permissions.add(global_permission("tenancy.view_project"))
    return {
        "lead": home.lead,
        "member": member,
        "approver_elsewhere": approver_elsewhere,
        "direct_global": direct_global,
        "group_global": group_global,
        "group_object": group_object,
        "member_who_sees_requests": member_who_sees_requests,
        "inactive_member": inactive_member,
        "inactive_with_global": inactive_with_global,
        "nobody": factories.UserFactory(),
        "operator": factories.operator(),
        "superuser": factories.UserFactory(is_superuser=True),
        "inactive_superuser": factories.UserFactory(is_superuser=True, is_active=False),
    }


def test_it_mirrors_the_two_authentication_backends_it_stands_in_for():
    """The backends that answer permissions: local passwords' (Django's model backend, its permission methods
    untouched) and guardian's; the sign-in lockout's backend (django-axes) answers none."""
    granting = [path for path in settings.AUTHENTICATION_BACKENDS if hasattr(import_string(path), "has_perm")]
    assert granting == ["tenancy.sign_in_backends.LocalPasswordBackend", "guardian.backends.ObjectPermissionBackend"]
    local = import_string(granting[0])
    assert issubclass(local, ModelBackend)
    assert all(
        getattr(local, name) is getattr(ModelBackend, name)
        for name in ("has_perm", "get_all_permissions", "get_user_permissions", "get_group_permissions")
    )


def test_the_directory_backends_grant_nothing(people):
    """With LDAP configured its backend is listed and answers has_perm, but never grants (no LDAP permissions)."""
    from tenancy.directory.ldap import DirectoryLDAPBackend

    backend = DirectoryLDAPBackend()
    assert backend.settings.FIND_GROUP_PERMS is False
    assert not any(backend.has_perm(person, "tenancy.view_project") for person in people.values())


@pytest.mark.parametrize("project_permission", [ProjectPermission.VIEW, ProjectPermission.APPROVE])
def test_grants_are_what_django_and_guardian_answer(people, project_permission):
    every_project = set(Project.objects.values_list("pk", flat=True))
    for who, person in people.items():
        grants = grants_of(user=person, permissions=GLOBAL, project_permission=project_permission)

        fresh = User.objects.get(pk=person.pk)  # Django caches a user's permissions on the object
        assert grants.held == {name for name in GLOBAL if fresh.has_perm(name)}, who
        guardian = set(projects_with_permission(user=fresh, permission=project_permission).values_list("pk", flat=True))
        assert (every_project if grants.project_ids is None else set(grants.project_ids)) == guardian, who


def test_the_cases_differ_and_take_one_query(people, django_assert_num_queries):
    def grants(who):
        return grants_of(user=people[who], permissions=GLOBAL, project_permission=ProjectPermission.VIEW)

    with django_assert_num_queries(1):
        member = grants("member")

    assert member.held == frozenset()
    assert member.project_ids == [people["member"].memberships.get().project_id]
    assert grants("group_object").project_ids == [people["approver_elsewhere"].memberships.get().project_id]
    assert grants("direct_global").project_ids is None
    assert grants("member_who_sees_requests").held == {"requests.view_resourcerequest"}
    assert grants("operator").held >= {"requests.view_resourcerequest", "requests.view_quotachangerequest"}
    assert grants("inactive_with_global") == grants("nobody") == Grants(frozenset(), [])
    assert grants("inactive_superuser") == Grants(frozenset(), None)  # guardian's superuser rule ignores is_active
