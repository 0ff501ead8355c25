"""API tokens: issued to a person (by signing in at the token endpoint, or by an operator) or to a project's service
account (by its lead), shown once, stored as a SHA-256 hash, scoped, expiring, revocable, audited. The one token
mechanism of the platform (docs/security.md, "API tokens"): personal tokens pages and service accounts issue through
`api_token_issue` and are checked by `api_token_authenticate`, so every rule here holds for them too. Which scope
each endpoint needs is config/scopes.py's.
"""

import json
import re
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from config.errors import Conflict, DomainError, NotFound
from config.limits import BIGINT_MAX
from config.tokens import prefixed_secret_new, prefixed_secret_prefix, secret_hash, secret_matches
from tenancy.choices import SERVICE_ACCOUNT_SCOPES, TokenScope
from tenancy.models import ApiToken, Project, User
from tenancy.services import audit_record

TOKEN_KIND = "cct"
# DRF's keys from before tokens were hashed: 40 hex digits, found by their first 12 (migration 0007).
LEGACY_KEY = re.compile(r"[0-9a-f]{40}")
LEGACY_PREFIX_LENGTH = 12
# Writing last_used_at on every call would turn each read into a write; a minute's precision is enough.
LAST_USED_PRECISION = timedelta(minutes=1)


@dataclass(frozen=True)
class IssuedApiToken:
    token: ApiToken
    secret: str  # the whole token; the only time anyone sees it


def token_lifetime(days: int | None) -> timedelta:
    """The lifetime asked for (API_TOKEN_DEFAULT_DAYS when not given), refused beyond API_TOKEN_MAX_DAYS."""
    days = settings.API_TOKEN_DEFAULT_DAYS if days is None else days
    maximum = settings.API_TOKEN_MAX_DAYS
    if not 1 <= days <= maximum:
        raise DomainError(
            f"A token lives between 1 and {maximum} days.",
            code="token_lifetime_out_of_range",
            details={"field": "expires_in_days", "requested": days, "maximum": maximum},
        )
    return timedelta(days=days)


def checked_scopes(scopes: list[str] | None, *, allowed: list[str]) -> list[str]:
    """The scopes asked for, in TokenScope's order; every allowed one when none are named (None). Unknown or
    disallowed ones are refused by name, and an empty list is refused: a token that may do nothing is a mistake."""
    if scopes is None:
        return list(allowed)
    unknown = sorted(set(scopes) - set(TokenScope.values))
    refused = sorted(set(scopes) - set(allowed) - set(unknown))
    if unknown or refused or not scopes:
        raise DomainError(
            f"Unknown scopes: {', '.join(unknown)}."
            if unknown
            else f"Not for this token: {', '.join(refused)}."
            if refused
            else "Choose at least one scope.",
            code="invalid_scope",
            details={"field": "scopes", "unknown": unknown, "refused": refused, "allowed": list(allowed)},
        )
    return [scope for scope in TokenScope.values if scope in scopes]


@transaction.atomic
def api_token_issue(
    *,
    user: User,
    name: str,
    actor: User | None,
    expires_in_days: int | None = None,
    scopes: list[str] | None = None,
    project: Project | None = None,
) -> IssuedApiToken:
    """A new token acting as `user` within `scopes` (a person's: all of them unless narrowed), bound to `project`
    when given (a service account's); the secret is returned once and never stored."""
    name = (name or "").strip()
    if not name:
        raise DomainError("Give the token a name (what uses it).", code="name_required", details={"field": "name"})
    lifetime = token_lifetime(expires_in_days)
    scopes = checked_scopes(scopes, allowed=SERVICE_ACCOUNT_SCOPES if project is not None else TokenScope.values)
    prefix, secret = prefixed_secret_new(TOKEN_KIND)
    token = ApiToken.objects.create(
        user=user,
        name=name[:80],
        prefix=prefix,
        hashed=secret_hash(secret),
        scopes=scopes,
        project=project,
        created_by=actor if actor is not None and actor.is_authenticated else None,
        expires_at=timezone.now() + lifetime,
    )
    audit_record(
        actor=actor,
        action="api_token.issued",
        target=user,
        data={
            "token": prefix,
            "name": token.name,
            "expires_at": token.expires_at.isoformat(),
            "scopes": scopes,
            **({"project": project.slug} if project is not None else {}),
        },
    )
    return IssuedApiToken(token, secret)


@transaction.atomic
def api_token_revoke(*, token: ApiToken, reason: str, actor: User | None) -> ApiToken:
    """The token stops working at once; the row stays for the audit trail."""
    token = ApiToken.objects.select_for_update().select_related("user").get(pk=token.pk)
    if token.revoked_at is not None:
        raise Conflict("This API token is already revoked.", code="token_revoked", details={"token": token.prefix})
    token.revoked_at = timezone.now()
    token.save(update_fields=["revoked_at"])
    audit_record(
        actor=actor, action="api_token.revoked", target=token.user, reason=reason, data={"token": token.prefix}
    )
    return token


def personal_tokens_working(*, user: User):
    """The person's own tokens that still work (not a service account's), newest first: the API tokens page."""
    return ApiToken.objects.filter(
        user=user, project__isnull=True, revoked_at__isnull=True, expires_at__gt=timezone.now()
    ).order_by("-created_at", "-id")


def personal_token_revoke(*, token_id: int, actor: User) -> ApiToken:
    """The person stops one of their own tokens; another person's, or a service account's, is not found (404-shaped:
    whether it exists is not theirs to learn)."""
    mine = ApiToken.objects.filter(user=actor, project__isnull=True)
    token = mine.filter(pk=token_id).first() if token_id <= BIGINT_MAX else None
    if token is None:
        raise NotFound("You have no such API token.", code="token_not_found", details={"token_id": token_id})
    return api_token_revoke(token=token, reason="Revoked by its owner on the API tokens page.", actor=actor)


def api_tokens_revoke_all(*, user: User, reason: str, actor: User | None) -> int:
    """Every working token of the person stops at once (the directory took rights away); how many."""
    working = ApiToken.objects.filter(user=user, revoked_at__isnull=True, expires_at__gt=timezone.now())
    revoked = 0
    for token in working:
        api_token_revoke(token=token, reason=reason, actor=actor)
        revoked += 1
    return revoked


def api_tokens_purge() -> int:
    """Delete tokens that stopped working (expired or revoked) more than API_TOKEN_RETENTION_DAYS ago: each sign-in
    at the token endpoint issues one, so a script signing in per run would otherwise pile them up. Their issue and
    revocation stay on the audit log. How many were deleted."""
    cutoff = timezone.now() - timedelta(days=settings.API_TOKEN_RETENTION_DAYS)
    deleted, _ = ApiToken.objects.filter(Q(expires_at__lt=cutoff) | Q(revoked_at__lt=cutoff)).delete()
    return deleted


def token_prefix(secret: str) -> str | None:
    """The public prefix a presented secret would be stored under, or None when it is shaped like no token."""
    if LEGACY_KEY.fullmatch(secret):
        return secret[:LEGACY_PREFIX_LENGTH]
    return prefixed_secret_prefix(TOKEN_KIND, secret)


class TokenRefused(Exception):
    """Why a presented token does not sign anyone in: `code` and a human `message`."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code, self.message = code, message


def api_token_authenticate(secret: str, *, address: str | None = None) -> tuple[User, ApiToken]:
    """The active user and token this secret belongs to, in one statement; its use is noted (at most once a minute)
    and audited when it is the first or comes from another address than the last. TokenRefused for an unknown,
    malformed, revoked or expired token or an inactive user."""
    prefix = token_prefix(secret)
    users = User._meta.db_table
    found = (
        list(
            User.objects.raw(
                f"SELECT u.*, t.id AS token_id, t.hashed AS token_hashed, t.expires_at AS token_expires_at, "
                f"t.revoked_at AS token_revoked_at, t.last_used_at AS token_last_used_at, "
                f"t.last_used_from AS token_last_used_from, t.scopes AS token_scopes, t.project_id AS token_project_id "
                f"FROM {users} u JOIN {ApiToken._meta.db_table} t ON t.user_id = u.id WHERE t.prefix = %s",
                [prefix],
            )
        )
        if prefix
        else []
    )
    if not found or not secret_matches(found[0].token_hashed, secret) or found[0].token_revoked_at is not None:
        raise TokenRefused("authentication_failed", "Invalid token.")
    user, now = found[0], timezone.now()
    if user.token_expires_at <= now:
        raise TokenRefused("token_expired", "This token has expired; sign in again for a new one.")
    if not user.is_active:
        raise TokenRefused("authentication_failed", "User inactive or deleted.")
    token = ApiToken(
        pk=user.token_id,
        user=user,
        prefix=prefix,
        hashed=user.token_hashed,
        expires_at=user.token_expires_at,
        last_used_at=user.token_last_used_at,
        last_used_from=user.token_last_used_from,
        scopes=_scopes_of(user.token_scopes),
        project_id=user.token_project_id,
    )
    if address and address != token.last_used_from:
        _note_use_from(token, address, now)
    elif token.last_used_at is None or token.last_used_at < now - LAST_USED_PRECISION:
        ApiToken.objects.filter(
            Q(last_used_at__isnull=True) | Q(last_used_at__lt=now - LAST_USED_PRECISION), pk=token.pk
        ).update(last_used_at=now)
    return user, token


def _scopes_of(stored) -> list[str]:
    """The raw query returns the JSON column as text on some databases and decoded on others."""
    return json.loads(stored) if isinstance(stored, str) else list(stored or [])


def _note_use_from(token: ApiToken, address: str, now) -> None:
    """A token's first use, or its use from another address than the last: noted and on the audit log (a stolen
    token shows up as a new address)."""
    with transaction.atomic():
        updated = (
            ApiToken.objects.filter(pk=token.pk)
            .exclude(last_used_from=address)
            .update(last_used_at=now, last_used_from=address)
        )
        if updated:
            audit_record(
                actor=token.user,
                action="api_token.used",
                target=token.user,
                data={"token": token.prefix, "address": address, "previous_address": token.last_used_from},
            )
