"""The one-query project permission check answers as django-guardian's own checker does, on every grant path."""

import pytest
from django.contrib.auth.models import Group, Permission
from guardian.core import ObjectPermissionChecker
from guardian.shortcuts import assign_perm

from tenancy.choices import ProjectPermission
from tenancy.selectors import user_has_project_permission
from tests import factories

pytestmark = pytest.mark.django_db


def _guardian_says(user, project, permission) -> bool:
    user = type(user).objects.get(pk=user.pk)  # no permission cache left from an earlier question
    return user.is_active and (
        ObjectPermissionChecker(user).has_perm(permission, project) or user.has_perm(f"tenancy.{permission}")
    )


def test_every_grant_path_answers_as_guardian_does():
    project, elsewhere = factories.project(), factories.project()
    member = factories.member(project)  # REQUEST and VIEW on the project, directly
    in_group = factories.UserFactory()
    group = Group.objects.create(name="reviewers")
    in_group.groups.add(group)
    assign_perm(f"tenancy.{ProjectPermission.APPROVE}", group, project)
    global_holder = factories.UserFactory()
    global_holder.user_permissions.add(Permission.objects.get(codename=ProjectPermission.MANAGE))
    inactive = factories.member(project)
    inactive.is_active = False
    inactive.save(update_fields=["is_active"])
    superuser = factories.UserFactory(is_superuser=True)
    stranger = factories.UserFactory()

    for user in (member, in_group, global_holder, inactive, stranger):
        for target in (project, elsewhere):
            for permission in ProjectPermission.values:
                expected = _guardian_says(user, target, permission)
                assert user_has_project_permission(user=user, project=target, permission=permission) == expected, (
                    user.username,
                    target.slug,
                    permission,
                )
    assert user_has_project_permission(user=member, project=project, permission=ProjectPermission.REQUEST)
    assert not user_has_project_permission(user=member, project=elsewhere, permission=ProjectPermission.REQUEST)
    assert user_has_project_permission(user=in_group, project=project, permission=ProjectPermission.APPROVE)
    assert not user_has_project_permission(user=in_group, project=elsewhere, permission=ProjectPermission.APPROVE)
    assert user_has_project_permission(user=global_holder, project=elsewhere, permission=ProjectPermission.MANAGE)
    assert not user_has_project_permission(user=inactive, project=project, permission=ProjectPermission.VIEW)
    assert user_has_project_permission(user=superuser, project=elsewhere, permission=ProjectPermission.MANAGE)


def test_a_project_permission_is_one_query(django_assert_num_queries):
    project = factories.project()
    member = factories.member(project)
    with django_assert_num_queries(1):
        assert user_has_project_permission(user=member, project=project, permission=ProjectPermission.REQUEST)
