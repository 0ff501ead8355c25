"""Project API keys for the gateway: created (shown once), rotated, revoked by project members; checked by the
gateway in constant time. Only a SHA-256 hash and a public prefix are stored."""

from dataclasses import dataclass
from datetime import timedelta

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from config.errors import Conflict, DomainError, NotPermitted
from config.tokens import prefixed_secret_new, prefixed_secret_prefix, secret_hash, secret_matches
from serving.models import ApiKey
from tenancy.choices import ProjectPermission
from tenancy.models import Project, User
from tenancy.selectors import user_has_project_permission
from tenancy.services import audit_record

KEY_PREFIX = "cc"
# How long a rotated key keeps working, so that its users can switch over without an outage.
ROTATION_GRACE_HOURS_DEFAULT = 24
ROTATION_GRACE_HOURS_MAX = 24 * 30


@dataclass(frozen=True)
class IssuedKey:
    key: ApiKey
    secret: str  # the whole key; the only time anyone sees it


def can_manage_keys(user: User, project: Project) -> bool:
    return user_has_project_permission(user=user, project=project, permission=ProjectPermission.REQUEST)


def _issue(project: Project, name: str, actor: User) -> IssuedKey:
    prefix, secret = prefixed_secret_new(KEY_PREFIX)
    key = ApiKey.objects.create(project=project, name=name, prefix=prefix, hashed=secret_hash(secret), created_by=actor)
    return IssuedKey(key, secret)


@transaction.atomic
def api_key_create(*, project: Project, name: str, actor: User) -> IssuedKey:
    if not can_manage_keys(actor, project):
        raise NotPermitted("Only members who may order for the project manage its API keys.")
    if not name.strip():
        raise DomainError("Give the key a name (what uses it).", code="name_required")
    issued = _issue(project, name.strip()[:80], actor)
    audit_record(actor=actor, action="api_key.created", target=issued.key, data={"project": project.slug})
    return issued


def _locked_active(key: ApiKey, actor: User) -> ApiKey:
    key = ApiKey.objects.select_for_update().select_related("project").get(pk=key.pk)
    if not can_manage_keys(actor, key.project):
        raise NotPermitted("Only members who may order for the project manage its API keys.")
    if key.revoked_at is not None:
        raise Conflict("This key is already revoked.", code="key_revoked", details={"key": key.prefix})
    return key


def _locked_unrotated(key: ApiKey, actor: User) -> ApiKey:
    key = _locked_active(key, actor)
    if key.replaced_by_id is not None:
        raise Conflict(
            "This key was already rotated; rotate its replacement instead.",
            code="key_rotated",
            details={"key": key.prefix, "expires_at": key.expires_at.isoformat() if key.expires_at else None},
        )
    return key


@transaction.atomic
def api_key_revoke(*, key: ApiKey, actor: User) -> ApiKey:
    key = _locked_active(key, actor)
    key.revoked_at = timezone.now()
    key.save(update_fields=["revoked_at"])
    audit_record(actor=actor, action="api_key.revoked", target=key, data={"project": key.project.slug})
    return key


@transaction.atomic
def api_key_rotate(*, key: ApiKey, actor: User, grace_hours: int = ROTATION_GRACE_HOURS_DEFAULT) -> IssuedKey:
    """A new key with the same name; the old one keeps working for `grace_hours` (0: stops at once), then the
    gateway refuses it. Revoking it meanwhile ends the grace period."""
    if not 0 <= grace_hours <= ROTATION_GRACE_HOURS_MAX:
        raise DomainError(
            f"The grace period is 0 to {ROTATION_GRACE_HOURS_MAX} hours.",
            code="grace_out_of_range",
            details={"field": "grace_hours", "max": ROTATION_GRACE_HOURS_MAX},
        )
    key = _locked_unrotated(key, actor)
    issued = _issue(key.project, key.name, actor)
    key.expires_at, key.replaced_by = timezone.now() + timedelta(hours=grace_hours), issued.key
    key.save(update_fields=["expires_at", "replaced_by"])
    audit_record(
        actor=actor,
        action="api_key.rotated",
        target=key,
        data={"new_key": issued.key.prefix, "grace_hours": grace_hours, "expires_at": key.expires_at.isoformat()},
    )
    return issued


def api_key_authenticate(secret: str) -> ApiKey | None:
    """The active key this secret belongs to, or None (unknown, malformed, revoked, past its rotation grace)."""
    prefix = prefixed_secret_prefix(KEY_PREFIX, secret)
    if prefix is None:
        return None
    unexpired = Q(expires_at__isnull=True) | Q(expires_at__gt=timezone.now())
    key = ApiKey.objects.filter(unexpired, prefix=prefix, revoked_at__isnull=True).first()
    if key is None or not secret_matches(key.hashed, secret):
        return None
    return key


def api_keys_used(last_use: dict[str, float]) -> int:
    """The gateways' note of when keys were last used ({prefix: epoch seconds}), at most once a minute a key."""
    from datetime import UTC, datetime

    for prefix, at in last_use.items():
        ApiKey.objects.filter(prefix=prefix).update(last_used_at=datetime.fromtimestamp(at, tz=UTC))
    return len(last_use)
