"""Every write to tenancy: tenants, projects, memberships (and the object permissions they imply), quotas."""

from decimal import Decimal
from typing import Any

from django.contrib.auth.models import Permission
from django.contrib.contenttypes.models import ContentType
from django.db import models, transaction
from guardian.models import UserObjectPermission

from config.errors import Conflict, DomainError
from tenancy.choices import ROLE_PERMISSIONS, OrderCap, PriorityClass, ProjectPermission, QuotaDimension, Role
from tenancy.models import AuditEvent, Membership, Project, ProjectQuota, Tenant, TenantQuota, User
from tenancy.signals import quota_changed


def _jsonable(value: Any) -> Any:
    return str(value) if isinstance(value, Decimal) else value


def audit_row(
    *,
    actor: User | None,
    action: str,
    target: models.Model | None,
    reason: str = "",
    data: dict | None = None,
    target_repr: str | None = None,
) -> AuditEvent:
    """One audit row, not yet saved (`audit_records` writes many at once). `target_repr` spares reading what the
    target's str() would read (a batch of requests)."""
    return AuditEvent(
        actor=actor if actor is not None and actor.is_authenticated else None,
        action=action,
        target_type=ContentType.objects.get_for_model(target, for_concrete_model=False) if target is not None else None,
        target_id=str(target.pk) if target is not None else "",
        target_repr=(str(target) if target_repr is None else target_repr)[:200] if target is not None else "",
        reason=reason,
        data={key: _jsonable(value) for key, value in (data or {}).items()},
    )


def audit_record(
    *, actor: User | None, action: str, target: models.Model | None, reason: str = "", data: dict | None = None
) -> AuditEvent:
    """Append one audit row; call it inside the transaction that made the change. `target` is None only for what
    concerns no stored object (a failed sign-in with an unknown username)."""
    row = audit_row(actor=actor, action=action, target=target, reason=reason, data=data)
    row.save()
    return row


def audit_records(*, rows: list[AuditEvent]) -> list[AuditEvent]:
    """Append many audit rows (built by `audit_row`) in one INSERT, inside the transaction that made the changes."""
    return AuditEvent.objects.bulk_create(rows) if rows else []


@transaction.atomic
def configuration_save(
    *, entry: models.Model, changed_fields: list[str], actor: User | None, reason: str = ""
) -> models.Model:
    """Validate and save a configuration row an operator added or edited (a catalog entry, an approval rule, a
    health rule...), with an audit row naming the fields that changed."""
    created = entry.pk is None
    entry.full_clean()
    entry.save()
    action = f"{entry._meta.model_name}.{'created' if created else 'updated'}"
    audit_record(actor=actor, action=action, target=entry, reason=reason, data={"fields": sorted(changed_fields)})
    return entry


@transaction.atomic
def configuration_delete(*, entry: models.Model, actor: User | None, reason: str = "") -> None:
    """Delete a configuration row (the admin refuses protected ones first); the audit row keeps what it was."""
    audit_record(actor=actor, action=f"{entry._meta.model_name}.deleted", target=entry, reason=reason)
    entry.delete()


@transaction.atomic
def tenant_create(*, name: str, slug: str, actor: User | None, description: str = "") -> Tenant:
    tenant = Tenant(name=name, slug=slug, description=description)
    tenant.full_clean()
    tenant.save()
    audit_record(actor=actor, action="tenant.created", target=tenant)
    return tenant


@transaction.atomic
def tenant_update(*, tenant: Tenant, changed_fields: list[str], actor: User | None) -> Tenant:
    """Save an operator's edit of a tenant (its name, its active flag...), with an audit row naming the fields."""
    tenant.full_clean()
    tenant.save()
    audit_record(actor=actor, action="tenant.updated", target=tenant, data={"fields": sorted(changed_fields)})
    return tenant


@transaction.atomic
def project_create(
    *,
    tenant: Tenant,
    name: str,
    slug: str,
    lead: User,
    cost_centre: str,
    actor: User | None,
    description: str = "",
    quota: dict[str, Any] | None = None,
    max_priority: str = PriorityClass.STANDARD,
) -> Project:
    """Create a project with its quota row (limits and priority entitlement) and its lead's membership."""
    project = Project(tenant=tenant, name=name, slug=slug, lead=lead, cost_centre=cost_centre, description=description)
    project.full_clean()
    project.save()
    ProjectQuota.objects.create(
        project=project,
        updated_by=_user_or_none(actor),
        max_priority=_checked_priority(max_priority),
        **_checked_limits(quota or {}),
    )
    audit_record(actor=actor, action="project.created", target=project, data={"lead": lead.username})
    membership_grant(project=project, user=lead, role=Role.LEAD, actor=actor)
    return project


_PROJECT_EDITABLE = {"tenant", "name", "slug", "description", "lead", "cost_centre", "active"}


@transaction.atomic
def project_update(*, project: Project, actor: User | None, reason: str = "", **changes: Any) -> Project:
    """Change project fields; a new lead takes the lead role and the previous lead becomes a member."""
    unknown = set(changes) - _PROJECT_EDITABLE
    if unknown:
        raise DomainError(
            f"Cannot change {', '.join(sorted(unknown))} of a project.",
            code="invalid_field",
            details={"fields": sorted(unknown)},
        )
    project = Project.objects.select_for_update().get(pk=project.pk)
    previous_lead = project.lead
    before = {field: getattr(project, field) for field in changes}
    for field, value in changes.items():
        setattr(project, field, value)
    project.full_clean()
    project.save()
    changed = {
        field: [_describe(before[field]), _describe(value)]
        for field, value in changes.items()
        if before[field] != value
    }
    if changed:
        audit_record(actor=actor, action="project.updated", target=project, reason=reason, data=changed)
    if project.lead != previous_lead:
        membership_grant(project=project, user=project.lead, role=Role.LEAD, actor=actor)
        membership_grant(project=project, user=previous_lead, role=Role.MEMBER, actor=actor)
    return project


def _describe(value: Any) -> Any:
    return str(value) if isinstance(value, models.Model | Decimal) else value


def _user_or_none(actor: User | None) -> User | None:
    return actor if actor is not None and actor.is_authenticated else None


def _sync_project_permissions(*, user: User, project: Project, role: str | None) -> None:
    """Make the user's object permissions on the project exactly those of the role (none for no role): django-guardian's
    rows, written in one statement each way (its assign_perm reads and writes once per permission)."""
    wanted = ROLE_PERMISSIONS.get(role, frozenset())
    project_type = ContentType.objects.get_for_model(Project)
    rows = UserObjectPermission.objects.filter(user=user, content_type=project_type, object_pk=str(project.pk))
    held = set(rows.values_list("permission__codename", flat=True)) & set(ProjectPermission.values)
    UserObjectPermission.objects.bulk_create(
        [
            UserObjectPermission(user=user, permission=permission, content_type=project_type, object_pk=str(project.pk))
            for permission in Permission.objects.filter(content_type=project_type, codename__in=wanted - held)
        ]
    )
    if held - wanted:
        rows.filter(permission__codename__in=held - wanted).delete()


@transaction.atomic
def membership_grant(*, project: Project, user: User, role: str, actor: User | None) -> Membership:
    """Give the user a role on the project (or change it) and exactly that role's object permissions."""
    if role not in Role.values:
        raise DomainError(f"Unknown role {role!r}.", code="invalid_role", details={"allowed": Role.values})
    if project.lead_id == user.pk and role != Role.LEAD:
        raise Conflict(f"{user.username} leads {project.slug}; appoint another lead first.", code="lead_role_required")
    membership, created = Membership.objects.select_for_update().get_or_create(
        user=user, project=project, defaults={"role": role, "granted_by": _user_or_none(actor)}
    )
    previous_role = None if created else membership.role
    if previous_role != role:
        membership.role = role
        membership.granted_by = _user_or_none(actor)
        membership.save()
        audit_record(
            actor=actor,
            action="membership.granted",
            target=project,
            data={"user": user.username, "role": role, "previous_role": previous_role},
        )
    _sync_project_permissions(user=user, project=project, role=role)
    return membership


@transaction.atomic
def membership_revoke(*, project: Project, user: User, actor: User | None) -> None:
    """Remove the user from the project together with every object permission the membership gave."""
    if project.lead_id == user.pk:
        raise Conflict(f"{user.username} leads {project.slug}; appoint another lead first.", code="lead_role_required")
    deleted, _ = Membership.objects.filter(user=user, project=project).delete()
    _sync_project_permissions(user=user, project=project, role=None)
    if deleted:
        audit_record(actor=actor, action="membership.revoked", target=project, data={"user": user.username})


def _checked_limits(limits: dict[str, Any]) -> dict[str, Any]:
    unknown = set(limits) - set(QuotaDimension.values)
    if unknown:
        raise DomainError(
            f"Unknown quota dimension(s): {', '.join(sorted(unknown))}.",
            code="unknown_quota_dimension",
            details={"allowed": QuotaDimension.values},
        )
    negative = {dim: value for dim, value in limits.items() if value is not None and value < 0}
    if negative:
        raise DomainError(
            "Quota limits cannot be negative.",
            code="negative_quota",
            details={dim: str(value) for dim, value in negative.items()},
        )
    return limits


@transaction.atomic
def quota_set(
    *, quota: ProjectQuota | TenantQuota, limits: dict[str, Any], actor: User | None, reason: str = ""
) -> ProjectQuota | TenantQuota:
    """Change quota limits (None lifts a limit); records before and after for every changed dimension."""
    _checked_limits(limits)
    quota = type(quota).objects.select_for_update().get(pk=quota.pk)
    changed = {
        dim: [_jsonable(getattr(quota, dim)), _jsonable(value)]
        for dim, value in limits.items()
        if getattr(quota, dim) != value
    }
    if not changed:
        return quota
    for dimension, value in limits.items():
        setattr(quota, dimension, value)
    quota.updated_by = _user_or_none(actor)
    quota.full_clean()
    quota.save()
    audit_record(actor=actor, action="quota.changed", target=quota, reason=reason, data=changed)
    affected = (
        [quota.project_id]
        if isinstance(quota, ProjectQuota)
        else list(quota.tenant.projects.values_list("pk", flat=True))
    )
    transaction.on_commit(lambda: quota_changed.send(sender=type(quota), project_ids=affected))
    return quota


def _checked_priority(max_priority: str) -> str:
    if max_priority not in PriorityClass.values:
        raise DomainError(
            f"Unknown priority class {max_priority!r}.",
            code="invalid_priority",
            details={"allowed": PriorityClass.values},
        )
    return max_priority


@transaction.atomic
def quota_set_priority_entitlement(
    *, quota: ProjectQuota, max_priority: str, actor: User | None, reason: str = ""
) -> ProjectQuota:
    """Change the highest priority class the project may order without approval; records before and after."""
    _checked_priority(max_priority)
    quota = ProjectQuota.objects.select_for_update().get(pk=quota.pk)
    if quota.max_priority == max_priority:
        return quota
    before = quota.max_priority
    quota.max_priority, quota.updated_by = max_priority, _user_or_none(actor)
    quota.save(update_fields=["max_priority", "updated_by", "updated_at"])
    audit_record(
        actor=actor,
        action="quota.priority_entitlement_changed",
        target=quota,
        reason=reason,
        data={"max_priority": [before, max_priority]},
    )
    return quota


@transaction.atomic
def quota_set_order_caps(
    *, quota: ProjectQuota, caps: dict[str, int | None], actor: User | None, reason: str = ""
) -> ProjectQuota:
    """Override the platform's order caps for this project (None: back to the default, 0: no cap); records before
    and after."""
    unknown = set(caps) - set(OrderCap.values)
    if unknown:
        raise DomainError(f"Unknown order caps: {', '.join(sorted(unknown))}.", code="invalid_order_cap")
    quota = ProjectQuota.objects.select_for_update().get(pk=quota.pk)
    changed = {cap: [getattr(quota, OrderCap(cap).field), value] for cap, value in caps.items()}
    changed = {cap: values for cap, values in changed.items() if values[0] != values[1]}
    if not changed:
        return quota
    for cap, (_, value) in changed.items():
        setattr(quota, OrderCap(cap).field, value)
    quota.updated_by = _user_or_none(actor)
    quota.full_clean()
    quota.save()
    audit_record(actor=actor, action="quota.order_caps_changed", target=quota, reason=reason, data=changed)
    return quota


@transaction.atomic
def tenant_quota_ensure(*, tenant: Tenant, actor: User | None) -> TenantQuota:
    """The tenant's quota row, created unlimited when the tenant has none yet."""
    quota, created = TenantQuota.objects.get_or_create(tenant=tenant, defaults={"updated_by": _user_or_none(actor)})
    if created:
        audit_record(actor=actor, action="quota.created", target=quota)
    return quota


def manager_chain_check(*, user: User, manager: User | None) -> None:
    """Refuse a manager whose own chain of managers leads back to the user."""
    cursor = manager
    while cursor is not None:
        if cursor.pk == user.pk:
            raise Conflict(
                "A manager chain cannot loop back to the user.",
                code="manager_cycle",
                details={"user": user.username, "manager": manager.username},
            )
        cursor = cursor.manager


@transaction.atomic
def user_save(*, user: User, changed_fields: list[str], actor: User | None) -> User:
    """Save an operator's edit of an account in the console (staff and active flags, names, e-mail), with an audit row
    naming the fields that changed (never their values); a new line manager goes through `user_set_manager`, which
    checks the chain and records from whom to whom."""
    created = user.pk is None
    manager = user.manager
    if "manager" in changed_fields and not created:
        user.manager = User.objects.get(pk=user.pk).manager  # user_set_manager changes and records it
    user.save()
    fields = sorted(field for field in changed_fields if field != "manager")
    if created or fields:
        action = "user.created" if created else "user.updated"
        audit_record(actor=actor, action=action, target=user, data={"fields": fields})
    if "manager" in changed_fields:
        user_set_manager(user=user, manager=manager, actor=actor)
    return user


@transaction.atomic
def user_set_manager(*, user: User, manager: User | None, actor: User | None) -> User:
    """Set the user's line manager, refusing a chain that would loop back to the user."""
    manager_chain_check(user=user, manager=manager)
    previous = User.objects.get(pk=user.pk).manager
    user.manager = manager
    user.save(update_fields=["manager"])
    audit_record(
        actor=actor,
        action="user.manager_changed",
        target=user,
        data={"from": previous.username if previous else None, "to": manager.username if manager else None},
    )
    return user
