"""A lead manages their project's team: add people of their tenant, invite anyone else, change roles, remove people.

Every change goes through `membership_grant` / `membership_revoke` (the only code that assigns object permissions,
each audited); these services add who may do it (the project's lead, operators) and the invitation: a mail with a
one-time link (only its hash is stored) that expires. Nobody outside the tenant is added without saying yes: the
invited person accepts with the account they have (signed in) or creates one, and the membership follows in the
same transaction.
"""

from datetime import timedelta

from django.conf import settings
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.core.validators import validate_email
from django.db import IntegrityError, transaction
from django.db.models import Q
from django.urls import reverse
from django.utils import timezone
from django_q.tasks import async_task

from config.errors import Conflict, DomainError, NotPermitted
from config.mail import Mail, absolute_url, mails_send
from config.tokens import prefixed_secret_new, prefixed_secret_prefix, secret_hash, secret_matches
from tenancy.choices import ProjectPermission, Role
from tenancy.models import DirectoryGrant, Invitation, Membership, Project, ServiceAccount, User
from tenancy.selectors import user_has_project_permission
from tenancy.services import audit_record, membership_grant, membership_revoke

INVITATION_SECRET_KIND = "inv"
SEND_TASK = "tenancy.tasks.send_invitation"
# A lead gives members and approvers; the lead role moves with the project's lead (project_update).
TEAM_ROLES = (Role.MEMBER, Role.APPROVER)


def can_manage_team(user: User, project: Project) -> bool:
    """The project's lead (manage_project) and operators (who edit memberships in the console)."""
    if not user.is_authenticated or not user.is_active:
        return False
    return user.has_perm("tenancy.change_membership") or user_has_project_permission(
        user=user, project=project, permission=ProjectPermission.MANAGE
    )


def _check_can_manage(actor: User, project: Project) -> None:
    if not can_manage_team(actor, project):
        raise NotPermitted(
            f"Only the lead of {project.name} or an operator can change its team.", code="not_project_lead"
        )


def _check_role(role: str) -> str:
    if role not in TEAM_ROLES:
        raise DomainError(
            "Choose member or approver; the lead role goes with the project's lead.",
            code="invalid_role",
            details={"field": "role", "allowed": list(TEAM_ROLES)},
        )
    return role


def _people_of(tenant_id: int):
    """Who belongs to a tenant: members of any of its projects, its administrators, and its people (whom directory
    groups make members of the tenant)."""
    return User.objects.filter(
        Q(memberships__project__tenant_id=tenant_id) | Q(administered_tenants__id=tenant_id) | Q(tenants__id=tenant_id),
        is_active=True,
    ).distinct()


def _user_for(identifier: str, *, among) -> User | None:
    """The one active person among `among` whose username or e-mail this is, else None."""
    identifier = identifier.strip()
    if not identifier:
        return None
    matches = list(among.filter(Q(username__iexact=identifier) | Q(email__iexact=identifier))[:2])
    return matches[0] if len(matches) == 1 else None


def _may_add_anyone(actor: User) -> bool:
    """Operators edit any membership in the console anyway; a lead adds only people of the project's tenant."""
    return actor.has_perm("tenancy.change_membership")


@transaction.atomic
def team_member_add(*, project: Project, identifier: str, role: str, actor: User) -> Membership | Invitation:
    """Add a person of the project's tenant, named by username or e-mail; anyone else, named by e-mail, is invited
    and joins only by accepting. What the lead is told never depends on whether an account exists outside the
    tenant: another tenant's usernames and e-mails are neither confirmed nor denied."""
    _check_can_manage(actor, project)
    _check_role(role)
    among = User.objects.filter(is_active=True) if _may_add_anyone(actor) else _people_of(project.tenant_id)
    user = _user_for(identifier, among=among)
    if user is not None:
        if Membership.objects.filter(project=project, user=user).exists():
            raise Conflict(
                f"{user.username} is already in {project.name}; change their role instead.",
                code="already_member",
                details={"field": "identifier", "user": user.username},
            )
        return membership_grant(project=project, user=user, role=role, actor=actor)
    try:
        validate_email(identifier.strip())
    except ValidationError as invalid:
        raise DomainError(
            f"No one in {project.tenant.name} is called {identifier.strip()!r}; give an e-mail address to invite "
            "someone else.",
            code="unknown_user",
            details={"field": "identifier"},
        ) from invalid
    return invitation_create(project=project, email=identifier, role=role, actor=actor)


def _check_not_from_directory(project: Project, user: User) -> None:
    """A place the company directory gave follows the person's groups: changed there, not here (it would come back
    at the next sync, or go when the person leaves the group)."""
    groups = DirectoryGrant.objects.filter(project=project, user=user).values_list("groups", flat=True)
    if groups:
        names = sorted({group for given in groups for group in given})
        raise Conflict(
            f"{user.username} is in {project.name} through the directory group {', '.join(names)}; change the group "
            "or ask an operator to change its mapping.",
            code="granted_by_directory",
            details={"user": user.username, "groups": names},
        )


@transaction.atomic
def team_role_change(*, project: Project, user: User, role: str, actor: User) -> Membership:
    _check_can_manage(actor, project)
    _check_role(role)
    _check_not_from_directory(project, user)
    if ServiceAccount.objects.filter(user=user).exists():
        raise Conflict(
            "A service account orders for its project as a member; it never approves.",
            code="service_account_role",
            details={"user": user.username},
        )
    if not Membership.objects.filter(project=project, user=user).exists():
        raise Conflict(f"{user.username} is not in {project.name}.", code="not_member", details={"user": user.username})
    return membership_grant(project=project, user=user, role=role, actor=actor)


@transaction.atomic
def team_member_remove(*, project: Project, user: User, actor: User) -> None:
    _check_can_manage(actor, project)
    _check_not_from_directory(project, user)
    membership_revoke(project=project, user=user, actor=actor)


# --- Invitations --------------------------------------------------------------------------------------------


@transaction.atomic
def invitation_create(*, project: Project, email: str, role: str, actor: User) -> Invitation:
    """An open invitation, mailed after commit (its link is made when it is sent)."""
    _check_can_manage(actor, project)
    _check_role(role)
    email = email.strip().lower()
    try:
        with transaction.atomic():
            invitation = Invitation.objects.create(
                project=project,
                email=email,
                role=role,
                invited_by=actor,
                expires_at=timezone.now() + timedelta(days=settings.TEAM_INVITATION_DAYS),
            )
    except IntegrityError as duplicate:
        raise Conflict(
            f"{email} is already invited to {project.name}.",
            code="already_invited",
            details={"field": "identifier", "email": email},
        ) from duplicate
    audit_record(actor=actor, action="invitation.created", target=project, data={"email": email, "role": role})
    invitation_id = invitation.pk
    transaction.on_commit(lambda: async_task(SEND_TASK, invitation_id))
    return invitation


@transaction.atomic
def invitation_revoke(*, invitation: Invitation, actor: User) -> Invitation:
    invitation = Invitation.objects.select_for_update().select_related("project").get(pk=invitation.pk)
    _check_can_manage(actor, invitation.project)
    if not invitation.is_open:
        raise Conflict("This invitation was already accepted or withdrawn.", code="invitation_closed")
    invitation.revoked_at = timezone.now()
    invitation.save(update_fields=["revoked_at"])
    audit_record(actor=actor, action="invitation.revoked", target=invitation.project, data={"email": invitation.email})
    return invitation


def invitation_send(*, invitation_id: int) -> int:
    """Mail the invitation with a fresh one-time link (a link sent before stops working); 0 when it is closed."""
    with transaction.atomic():
        invitation = (
            Invitation.objects.select_for_update(of=("self",))
            .select_related("project", "invited_by")
            .filter(pk=invitation_id)
            .first()
        )
        if invitation is None or not invitation.is_open or invitation.expires_at <= timezone.now():
            return 0
        prefix, secret = prefixed_secret_new(INVITATION_SECRET_KIND)
        invitation.token_prefix, invitation.token_hash, invitation.sent_at = prefix, secret_hash(secret), timezone.now()
        invitation.save(update_fields=["token_prefix", "token_hash", "sent_at"])
        inviter = invitation.invited_by
        return mails_send(
            [
                Mail(
                    to=invitation.email,
                    subject=f"Join {invitation.project.name} on Compute Catalog",
                    template="tenancy/mail/invitation",
                    context={
                        "invitation": invitation,
                        "inviter": inviter.get_full_name() or inviter.username if inviter else "An operator",
                        "accept_url": absolute_url(reverse("team:invitation-accept", args=[secret])),
                    },
                )
            ]
        )


def invitation_for_token(token: str, *, lock: bool = False) -> Invitation | None:
    """The open, unexpired invitation this secret belongs to, or None."""
    prefix = prefixed_secret_prefix(INVITATION_SECRET_KIND, token)
    if prefix is None:
        return None
    candidates = Invitation.objects.filter(
        token_prefix=prefix, accepted_at__isnull=True, revoked_at__isnull=True, expires_at__gt=timezone.now()
    ).select_related("project", "invited_by")
    if lock:
        candidates = candidates.select_for_update(of=("self",))
    return next((row for row in candidates if row.token_hash and secret_matches(row.token_hash, token)), None)


def _check_invitation(token: str) -> Invitation:
    invitation = invitation_for_token(token, lock=True)
    if invitation is None:
        raise DomainError(
            "This invitation link has expired, was used already or was withdrawn; ask the lead for a new one.",
            code="invitation_invalid",
        )
    return invitation


def _join(invitation: Invitation, user: User) -> Membership:
    invitation.accepted_at, invitation.accepted_by = timezone.now(), user
    invitation.save(update_fields=["accepted_at", "accepted_by"])
    audit_record(
        actor=user,
        action="invitation.accepted",
        target=invitation.project,
        data={
            "email": invitation.email,
            "user": user.username,
            "invited_by": getattr(invitation.invited_by, "username", None),
        },
    )
    return membership_grant(project=invitation.project, user=user, role=invitation.role, actor=invitation.invited_by)


@transaction.atomic
def invitation_accept(*, token: str, username: str, password: str, first_name: str = "", last_name: str = "") -> User:
    """Create the invited person's account and membership; the link works once."""
    invitation = _check_invitation(token)
    username = username.strip()
    if User.objects.filter(username__iexact=username).exists():
        raise Conflict(f"{username!r} is taken; choose another.", code="username_taken", details={"field": "username"})
    user = User(username=username, email=invitation.email, first_name=first_name.strip(), last_name=last_name.strip())
    try:
        user.full_clean(exclude=["password"])
        validate_password(password, user)
    except ValidationError as invalid:
        field = "password" if not hasattr(invalid, "error_dict") else next(iter(invalid.error_dict))
        raise DomainError(" ".join(invalid.messages), code="validation_error", details={"field": field}) from invalid
    user.set_password(password)
    user.save()
    _join(invitation, user)
    return user


@transaction.atomic
def invitation_accept_as(*, token: str, user: User) -> Membership:
    """The signed-in holder of the link joins with the account they have; the link works once."""
    invitation = _check_invitation(token)
    if Membership.objects.filter(project=invitation.project, user=user).exists():
        raise Conflict(
            f"You are already in {invitation.project.name}.", code="already_member", details={"user": user.username}
        )
    return _join(invitation, user)
