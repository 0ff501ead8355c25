"""Reads of tenancy data; every "which projects may this user see" question is answered here."""

from django.contrib.auth.models import Permission
from django.contrib.contenttypes.models import ContentType
from django.db import connection
from django.db.models import QuerySet
from guardian.models import GroupObjectPermission, UserObjectPermission
from guardian.shortcuts import get_objects_for_user

from tenancy.choices import ProjectPermission
from tenancy.models import AuditEvent, Invitation, Membership, Project, User


def projects_with_permission(*, user: User, permission: str) -> QuerySet[Project]:
    """Projects on which the user holds the object permission, or all of them with the global permission."""
    if not user.is_authenticated:
        return Project.objects.none()
    return get_objects_for_user(
        user, f"tenancy.{permission}", klass=Project, accept_global_perms=True, with_superuser=True
    )


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


def team_of(project: Project) -> QuerySet[Membership]:
    return Membership.objects.filter(project=project).select_related("user", "granted_by").order_by("user__username")


def invitations_open(project: Project) -> QuerySet[Invitation]:
    return Invitation.objects.filter(project=project, accepted_at__isnull=True, revoked_at__isnull=True).select_related(
        "invited_by"
    )
