"""Service accounts: a project's non-person accounts for CI pipelines, made and run by the project's lead (or an
operator). Each is a user without a password, a member of its project only; it acts through API tokens bound to the
project, with the scopes the lead chose (never operator ones), expiring after API_TOKEN_DEFAULT_DAYS unless asked
otherwise, at most API_TOKEN_MAX_DAYS. Every step is audited; the secret is shown once."""

import re

from django.db import transaction
from django.db.models import Prefetch
from django.utils import timezone

from config.errors import Conflict, DomainError, NotPermitted
from tenancy.api_tokens import IssuedApiToken, api_token_issue, api_token_revoke, api_tokens_revoke_all
from tenancy.choices import Role
from tenancy.models import ApiToken, Project, ServiceAccount, User
from tenancy.services import audit_record, membership_grant
from tenancy.team import can_manage_team

NAME = re.compile(r"[a-z0-9]+(?:-[a-z0-9]+)*")


def _check_can_manage(actor: User, project: Project) -> None:
    if not can_manage_team(actor, project):
        raise NotPermitted(
            f"Only the lead of {project.name} or an operator manages its service accounts.", code="not_project_lead"
        )


@transaction.atomic
def service_account_create(*, project: Project, name: str, description: str, actor: User) -> ServiceAccount:
    """A new service account `svc-<project>-<name>`, a member of the project."""
    _check_can_manage(actor, project)
    name = (name or "").strip().lower()
    if not NAME.fullmatch(name) or len(name) > 40:
        raise DomainError(
            "Name it with lowercase letters, digits and single hyphens (at most 40), e.g. nightly-ci.",
            code="invalid_name",
            details={"field": "name"},
        )
    username = f"svc-{project.slug}-{name}"[:150]
    if User.objects.filter(username__iexact=username).exists():
        raise Conflict(f"{username} exists already.", code="name_taken", details={"field": "name"})
    user = User(username=username, first_name="Service account", last_name=name)
    user.set_unusable_password()
    user.save()
    account = ServiceAccount.objects.create(
        user=user, project=project, description=(description or "").strip()[:200], created_by=actor
    )
    membership_grant(project=project, user=user, role=Role.MEMBER, actor=actor)
    audit_record(
        actor=actor, action="service_account.created", target=project, data={"account": username, "name": name}
    )
    return account


@transaction.atomic
def service_token_issue(
    *, account: ServiceAccount, name: str, scopes: list[str], expires_in_days: int | None, actor: User
) -> IssuedApiToken:
    _check_can_manage(actor, account.project)
    if not account.user.is_active:
        raise Conflict("This service account is switched off.", code="service_account_inactive")
    if not scopes:
        raise DomainError("Choose at least one scope.", code="invalid_scope", details={"field": "scopes"})
    return api_token_issue(
        user=account.user,
        name=name,
        actor=actor,
        expires_in_days=expires_in_days,
        scopes=scopes,
        project=account.project,
    )


@transaction.atomic
def service_token_revoke(*, token: ApiToken, actor: User) -> ApiToken:
    _check_can_manage(actor, token.project)
    return api_token_revoke(token=token, reason=f"Revoked by {actor.username} on the project's team page.", actor=actor)


@transaction.atomic
def service_account_deactivate(*, account: ServiceAccount, actor: User) -> ServiceAccount:
    """The account stops: its tokens are revoked and it can never act again (the row stays for the audit trail)."""
    _check_can_manage(actor, account.project)
    user = User.objects.select_for_update().get(pk=account.user_id)
    if not user.is_active:
        raise Conflict("This service account is switched off already.", code="service_account_inactive")
    user.is_active = False
    user.save(update_fields=["is_active"])
    api_tokens_revoke_all(user=user, reason="Its service account was switched off.", actor=actor)
    audit_record(
        actor=actor,
        action="service_account.deactivated",
        target=account.project,
        data={"account": user.username, "at": timezone.now().isoformat()},
    )
    return account


def service_accounts_of(project: Project) -> list[ServiceAccount]:
    """The project's service accounts with their tokens that have not ended (newest first)."""
    working = ApiToken.objects.filter(revoked_at__isnull=True, expires_at__gt=timezone.now()).order_by("-created_at")
    return list(
        ServiceAccount.objects.filter(project=project)
        .select_related("user", "created_by")
        .prefetch_related(Prefetch("user__api_tokens", queryset=working, to_attr="working_tokens"))
        .order_by("user__username")
    )
