"""The platform's user for a directory identity: found by the identity (OIDC `sub`, LDAP DN), else by username,
else created; its name and e-mail refreshed from the directory at every sign-in."""

from django.db import transaction
from django.utils import timezone

from tenancy.models import DirectoryAccount, ServiceAccount, User


class SignInRefused(Exception):
    """A directory sign-in that must not sign anyone in: `code` and a human sentence."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


def _linkable(user: User, source: str, subject: str) -> bool:
    """A local account of the same username becomes the directory person's (the usual roll-out: accounts made by
    hand before sign-in was the company's), unless it is a service account or another identity's already."""
    if ServiceAccount.objects.filter(user=user).exists():
        return False
    account = DirectoryAccount.objects.filter(user=user).first()
    return account is None or account.source != source or account.subject == subject


@transaction.atomic
def account_for_sign_in(
    *, source: str, subject: str, username: str, email: str, first_name: str, last_name: str, groups: list[str]
) -> DirectoryAccount:
    account = DirectoryAccount.objects.select_related("user").filter(source=source, subject=subject).first()
    user = account.user if account else User.objects.filter(username__iexact=username[:150]).first()
    if user is None:
        user = User(username=username[:150])
        user.set_unusable_password()
    elif account is None and not _linkable(user, source, subject):
        raise SignInRefused(
            "username_taken", f"The username {username!r} belongs to another account here; ask an operator."
        )
    if not user.is_active and user.pk is not None:
        raise SignInRefused("account_inactive", "This account is switched off here; ask an operator.")
    user.email = email or user.email
    user.first_name = first_name[:150] or user.first_name
    user.last_name = last_name[:150] or user.last_name
    user.last_login = timezone.now()
    user.save()
    account = account or DirectoryAccount.objects.filter(user=user).first() or DirectoryAccount(user=user)
    account.source, account.subject = source, subject
    account.groups, account.groups_read_at, account.last_sign_in_at = groups, timezone.now(), timezone.now()
    account.save()
    return account
