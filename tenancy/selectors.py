"""Reads of tenancy data; every "which projects may this user see" question is answered here."""

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache

from django.contrib.auth.models import Group, Permission
from django.contrib.contenttypes.models import ContentType
from django.db import connection
from django.db.models import QuerySet
from guardian.models import GroupObjectPermission, UserObjectPermission
from guardian.shortcuts import get_objects_for_user

from tenancy.choices import ProjectPermission
from tenancy.models import AuditEvent, DirectoryGrant, Invitation, Membership, Project, User


def projects_with_permission(*, user: User, permission: str) -> QuerySet[Project]:
    """Projects on which the user holds the object permission, or all of them with the global permission."""
    if not user.is_authenticated:
        return Project.objects.none()
    return get_objects_for_user(
        user, f"tenancy.{permission}", klass=Project, accept_global_perms=True, with_superuser=True
    )


@dataclass(frozen=True)
class Grants:
    """Of the permissions asked about, the global ones the user holds, and the projects on which the user holds the
    project permission asked about (None: every project)."""

    held: frozenset[str]
    project_ids: list[int] | None


@cache
def _grants_sql(asked: int) -> str:
    """The user's global permissions among `asked` ones named "app_label.codename", directly or through a group,
    then the projects with a given object permission of the user's or of a group's."""
    user_permissions, user_groups = User.user_permissions.through._meta.db_table, User.groups.through._meta.db_table
    permission, content_type = Permission._meta.db_table, ContentType._meta.db_table
    names = ", ".join(f"%(permission{n})s" for n in range(asked))
    return f"""
        SELECT 'global', ct.app_label || '.' || p.codename
        FROM {permission} p JOIN {content_type} ct ON ct.id = p.content_type_id
        WHERE ct.app_label || '.' || p.codename IN ({names})
          AND (p.id IN (SELECT permission_id FROM {user_permissions} WHERE user_id = %(user)s)
               OR p.id IN (SELECT gp.permission_id FROM {Group.permissions.through._meta.db_table} gp
                           JOIN {user_groups} ug ON ug.group_id = gp.group_id WHERE ug.user_id = %(user)s))
        UNION ALL
        SELECT 'project', CAST(pr.id AS varchar(255)) FROM {Project._meta.db_table} pr
        WHERE CAST(pr.id AS varchar(255)) IN (
            SELECT o.object_pk FROM {UserObjectPermission._meta.db_table} o
            JOIN {permission} p ON p.id = o.permission_id
            WHERE o.user_id = %(user)s AND p.content_type_id = %(project_type)s AND p.codename = %(codename)s
            UNION
            SELECT o.object_pk FROM {GroupObjectPermission._meta.db_table} o
            JOIN {permission} p ON p.id = o.permission_id
            WHERE o.group_id IN (SELECT group_id FROM {user_groups} WHERE user_id = %(user)s)
              AND p.content_type_id = %(project_type)s AND p.codename = %(codename)s)
    """


def grants_of(*, user: User, permissions: Sequence[str], project_permission: str) -> Grants:
    """In one statement, what `user.has_perm(p)` answers for each of `permissions` and what projects_with_permission
    answers for `project_permission`: Django's model backend reads the user's and their groups' permissions (two
    queries) and guardian's object query cost as much again to build, on every list and detail call. Guardian's
    backend grants nothing without an object, so the model backend's rules are the whole answer: an active user's
    own and groups' permissions, everything for an active superuser; guardian's projects: every one for a superuser
    or a global grant, else those of the user's and their groups' object permissions (tests/tenancy hold both to
    Django's and guardian's own answers)."""
    if not user.is_authenticated:
        return Grants(frozenset(), [])
    project_codename = f"tenancy.{project_permission}"
    asked = [*permissions, project_codename]
    with connection.cursor() as cursor:
        cursor.execute(
            _grants_sql(len(asked)),
            {
                **{f"permission{n}": name for n, name in enumerate(asked)},
                "user": user.pk,
                "project_type": ContentType.objects.get_for_model(Project).pk,
                "codename": project_permission,
            },
        )
        rows = cursor.fetchall()
    granted = {name for kind, name in rows if kind == "global"}

    def has_perm(name: str) -> bool:
        return user.is_active and (user.is_superuser or name in granted)

    held = frozenset(filter(has_perm, permissions))
    if user.is_superuser or has_perm(project_codename):
        return Grants(held, None)
    return Grants(held, [int(pk) for kind, pk in rows if kind == "project"])


def project_list_visible_to(*, user: User) -> QuerySet[Project]:
    return (
        projects_with_permission(user=user, permission=ProjectPermission.VIEW)
        .select_related("tenant", "tenant__quota", "lead", "quota")
        .order_by("tenant__name", "name")
    )


def user_has_project_permission(*, user: User, project: Project, permission: str) -> bool:
    if not user.is_authenticated or not user.is_active:
        return False
    if user.is_superuser:
        return True
    # The project's own grant first: members (nearly every caller) hold it, and then the global permissions are
    # never read (two queries saved on every order and preview).
    return _holds_on_project(user, project, permission) or user.has_perm(f"tenancy.{permission}")


def _holds_on_project(user: User, project: Project, permission: str) -> bool:
    """Whether django-guardian grants the permission on the project to the user or to one of the user's groups: one
    query (guardian's checker takes two, and builds a cache of every permission a request never asks again)."""
    granted = "p.id = {grant}.permission_id AND p.content_type_id = %s AND p.codename = %s AND {grant}.object_pk = %s"
    sql = (
        f"SELECT EXISTS (SELECT 1 FROM {UserObjectPermission._meta.db_table} u, {Permission._meta.db_table} p "
        f"WHERE u.user_id = %s AND {granted.format(grant='u')}) "
        f"OR EXISTS (SELECT 1 FROM {GroupObjectPermission._meta.db_table} g, {Permission._meta.db_table} p, "
        f"{User.groups.through._meta.db_table} m WHERE m.user_id = %s AND m.group_id = g.group_id "
        f"AND {granted.format(grant='g')})"
    )
    grant = [ContentType.objects.get_for_model(Project).pk, permission, str(project.pk)]
    with connection.cursor() as cursor:
        cursor.execute(sql, [user.pk, *grant, user.pk, *grant])
        return bool(cursor.fetchone()[0])


def audit_events_for(*, target) -> QuerySet[AuditEvent]:
    return AuditEvent.objects.filter(
        target_type=ContentType.objects.get_for_model(target, for_concrete_model=False),
        target_id=str(target.pk),
    ).select_related("actor")


def team_of(project: Project) -> list[Membership]:
    """The project's members, each with `directory_groups`: the directory groups that gave the place (empty: given by
    hand), and `is_service_account`."""
    memberships = list(
        Membership.objects.filter(project=project)
        .select_related("user", "granted_by", "user__service_account")
        .order_by("user__username")
    )
    given: dict[int, set[str]] = {}
    for user_id, groups in DirectoryGrant.objects.filter(project=project).values_list("user_id", "groups"):
        given.setdefault(user_id, set()).update(groups)
    for membership in memberships:
        membership.directory_groups = sorted(given.get(membership.user_id, ()))
        membership.is_service_account = hasattr(membership.user, "service_account")
    return memberships


def invitations_open(project: Project) -> QuerySet[Invitation]:
    return Invitation.objects.filter(project=project, accepted_at__isnull=True, revoked_at__isnull=True).select_related(
        "invited_by"
    )
