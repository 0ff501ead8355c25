"""What a person's directory groups give them, by the operators' group mappings, and applying it.

`rights_for` is the pure part (also the admin's preview of "who would get what"); `directory_rights_apply` makes a
person's directory-given rights exactly those, in one transaction. A right the person already held by hand is
manual: the directory neither records nor ever takes it away. Taking a right away also revokes the person's API
tokens, re-routes the approvals waiting on them (the `directory_rights_removed` signal, which the approval engine
hears) and tells the project's lead, whose running work keeps running under the project.
"""

from collections import defaultdict
from dataclasses import dataclass, field

from django.db import transaction
from django.db.models import Prefetch
from django_q.tasks import async_task

from tenancy.api_tokens import api_tokens_revoke_all
from tenancy.choices import ROLE_STRENGTH, GroupGrant, Role
from tenancy.models import DirectoryAccount, DirectoryGrant, GroupMapping, Membership, Project, Tenant, User
from tenancy.operators import OPERATOR_GROUP, sync_operator_group
from tenancy.services import audit_record, membership_grant, membership_revoke
from tenancy.signals import directory_rights_removed

TELL_LEAD_TASK = "tenancy.tasks.tell_lead_of_directory_removal"


@dataclass(frozen=True, order=True)
class Right:
    """One thing a mapping gives: a grant on a tenant, a project, or (the operator role) on nothing."""

    grant: str
    tenant_id: int | None = None
    project_id: int | None = None

    @classmethod
    def of(cls, row: GroupMapping | DirectoryGrant) -> "Right":
        return cls(row.grant, row.tenant_id, row.project_id)


def is_operator(user: User | None) -> bool:
    """An active operator: staff in the Operators group, or a superuser (prefetched groups are used when present)."""
    if user is None or not user.is_active:
        return False
    return user.is_superuser or (user.is_staff and any(group.name == OPERATOR_GROUP for group in user.groups.all()))


def active_mappings() -> list[GroupMapping]:
    return list(
        GroupMapping.objects.filter(active=True)
        .select_related("tenant", "project", "written_by")
        .prefetch_related("written_by__groups")
    )


def mapping_applies(mapping: GroupMapping) -> bool:
    """Nothing a mapping does makes anyone an operator unless an operator wrote it (and still is one)."""
    return mapping.grant != GroupGrant.OPERATOR or is_operator(mapping.written_by)


def rights_for(groups: list[str], mappings: list[GroupMapping]) -> dict[Right, list[str]]:
    """The rights these groups give, each with the groups that give it (group names compare in any case)."""
    member_of = {group.casefold() for group in groups}
    given: dict[Right, list[str]] = defaultdict(list)
    for mapping in mappings:
        if mapping.group.casefold() in member_of and mapping_applies(mapping):
            given[Right.of(mapping)].append(mapping.group)
    return dict(given)


@dataclass
class RightsChange:
    """What applying a person's groups did."""

    granted: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    kept_manual: list[str] = field(default_factory=list)
    kept_as_lead: list[str] = field(default_factory=list)  # the project's accountable lead is never removed by a sync
    tokens_revoked: int = 0


def describe(right: Right, names: dict[tuple[str, int], str]) -> str:
    label = GroupGrant(right.grant).label
    if right.project_id:
        return f"{label} of {names[('project', right.project_id)]}"
    if right.tenant_id:
        return f"{label} of {names[('tenant', right.tenant_id)]}"
    return label


def _names(rights) -> dict[tuple[str, int], str]:
    projects = {r.project_id for r in rights if r.project_id}
    tenants = {r.tenant_id for r in rights if r.tenant_id}
    names = {("project", pk): slug for pk, slug in Project.objects.filter(pk__in=projects).values_list("pk", "slug")}
    names.update({("tenant", pk): slug for pk, slug in Tenant.objects.filter(pk__in=tenants).values_list("pk", "slug")})
    return names


# --- What holding a right means, per kind -----------------------------------------------------------------------


def _holds(user: User, right: Right) -> bool:
    match right.grant:
        case GroupGrant.TENANT_MEMBER:
            return Tenant.people.through.objects.filter(tenant_id=right.tenant_id, user_id=user.pk).exists()
        case GroupGrant.TENANT_ADMIN:
            return Tenant.admins.through.objects.filter(tenant_id=right.tenant_id, user_id=user.pk).exists()
        case GroupGrant.OPERATOR:
            return user.is_staff and user.groups.filter(name=OPERATOR_GROUP).exists()
    return Membership.objects.filter(user=user, project_id=right.project_id).exists()


def _give(user: User, right: Right) -> None:
    match right.grant:
        case GroupGrant.TENANT_MEMBER:
            Tenant.objects.get(pk=right.tenant_id).people.add(user)
        case GroupGrant.TENANT_ADMIN:
            Tenant.objects.get(pk=right.tenant_id).admins.add(user)
        case GroupGrant.OPERATOR:
            user.is_staff = True
            user.save(update_fields=["is_staff"])
            user.groups.add(sync_operator_group())


def _take(user: User, right: Right) -> None:
    match right.grant:
        case GroupGrant.TENANT_MEMBER:
            Tenant.objects.get(pk=right.tenant_id).people.remove(user)
        case GroupGrant.TENANT_ADMIN:
            Tenant.objects.get(pk=right.tenant_id).admins.remove(user)
        case GroupGrant.OPERATOR:
            user.groups.remove(sync_operator_group())
            user.is_staff = False
            user.save(update_fields=["is_staff"])


# --- Applying ---------------------------------------------------------------------------------------------------


@transaction.atomic
def directory_rights_apply(*, user: User, groups: list[str], trigger: str, mappings=None) -> RightsChange:
    """Make the rights the directory gave `user` exactly what `groups` give now (`trigger`: sign_in or sync, for the
    audit rows). Manual rights are left alone; removals take the person's tokens and approval duties with them."""
    user = User.objects.select_for_update().get(pk=user.pk)
    wanted = rights_for(groups, active_mappings() if mappings is None else mappings)
    held = {Right.of(row): row for row in DirectoryGrant.objects.filter(user=user)}
    names = _names([*wanted, *held])
    change = RightsChange()
    projects_touched: set[int] = set()

    for right in sorted(set(wanted) - set(held)):
        directory_project = right.project_id is not None and any(r.project_id == right.project_id for r in held)
        if not directory_project and _holds(user, right):
            change.kept_manual.append(describe(right, names))
            continue
        if right.project_id is None:
            _give(user, right)
        else:
            projects_touched.add(right.project_id)
        held[right] = DirectoryGrant.objects.create(
            user=user, grant=right.grant, tenant_id=right.tenant_id, project_id=right.project_id, groups=wanted[right]
        )
        change.granted.append(describe(right, names))
        _audit(user, "directory.granted", right, names, wanted[right], trigger)

    for right in sorted(set(held) - set(wanted)):
        row = held.pop(right)
        if right.project_id is None:
            _take(user, right)
        else:
            projects_touched.add(right.project_id)
        row.delete()
        change.removed.append(describe(right, names))
        _audit(user, "directory.removed", right, names, row.groups, trigger)

    for right, row in held.items():
        if right in wanted and sorted(row.groups) != sorted(wanted[right]):
            row.groups = wanted[right]
            row.save(update_fields=["groups"])

    removed_projects = _settle_memberships(user, projects_touched, held, change, names)
    if change.removed:
        _after_removal(user, change, removed_projects, groups)
    return change


def _settle_memberships(user, project_ids, held, change, names) -> list[int]:
    """Each touched project's membership takes the strongest role the directory still gives there, or goes; the
    projects the person left."""
    left = []
    for project_id in sorted(project_ids):
        roles = [GroupGrant(right.grant).project_role for right in held if right.project_id == project_id]
        project = Project.objects.get(pk=project_id)
        if roles:
            membership_grant(project=project, user=user, role=max(roles, key=ROLE_STRENGTH.get), actor=None)
        elif project.lead_id == user.pk:
            membership_grant(project=project, user=user, role=Role.LEAD, actor=None)
            change.kept_as_lead.append(names[("project", project_id)])
            audit_record(
                actor=None,
                action="directory.kept_lead",
                target=project,
                reason=f"{user.username} no longer has a group that gives them {project.slug}, but is its accountable "
                "lead: appoint another lead, then the next sync removes them.",
                data={"user": user.username},
            )
        else:
            membership_revoke(project=project, user=user, actor=None)
            left.append(project_id)
    return left


def _audit(user, action, right, names, groups, trigger) -> None:
    audit_record(
        actor=None,
        action=action,
        target=user,
        data={"user": user.username, "right": describe(right, names), "groups": groups, "trigger": trigger},
    )


def _after_removal(user: User, change: RightsChange, left_projects: list[int], groups: list[str]) -> None:
    """The person's tokens stop working, the approvals waiting on them are routed again, each lead hears."""
    change.tokens_revoked = api_tokens_revoke_all(
        user=user,
        reason=f"The directory took rights away: {'; '.join(change.removed)}.",
        actor=None,
    )
    directory_rights_removed.send(sender=User, user=user)
    for project_id in left_projects:
        transaction.on_commit(lambda project_id=project_id: async_task(TELL_LEAD_TASK, project_id, user.pk))


def members_preview(mapping: GroupMapping, accounts) -> list[dict]:
    """Who the mapping would give its right to now, from the groups each account was last seen in, without applying:
    [{user, groups_read_at, state}], state "new" (the next sign-in or sync gives it), "given" (the directory gave it
    already) or "blocked" (an operator rule not written by an operator gives nothing)."""
    right = Right.of(mapping)
    applies = mapping_applies(mapping)
    rows = []
    for account in accounts:
        if mapping.group.casefold() not in {group.casefold() for group in account.groups}:
            continue
        given = any(Right.of(grant) == right for grant in account.user.directory_grants.all())
        rows.append(
            {
                "user": account.user,
                "groups_read_at": account.groups_read_at,
                "state": "blocked" if not applies else "given" if given else "new",
            }
        )
    return rows


def accounts_for_preview():
    return DirectoryAccount.objects.select_related("user").prefetch_related(
        Prefetch("user__directory_grants", queryset=DirectoryGrant.objects.all())
    )
