"""LDAP / Active Directory sign-in (django-auth-ldap): bind with the person's password, find them by the user search,
read their groups by the group search (nested groups included, by the configured group type), and apply the
group mappings like any sign-in. The periodic sync reads the same groups with the service bind (`current_groups`).
Settings AUTH_LDAP_* are built from the LDAP_* environment in config/settings.py."""

import ldap
from django.db import transaction
from django_auth_ldap.backend import LDAPBackend, _LDAPUser

from tenancy.choices import DirectorySource
from tenancy.directory.accounts import SignInRefused, account_for_sign_in
from tenancy.directory.rights import directory_rights_apply
from tenancy.models import ServiceAccount


class DirectoryUnavailable(Exception):
    """The directory did not answer (down, restarting, the service bind refused): nothing can be concluded."""


def groups_of(ldap_user) -> list[str]:
    """Group names (common names) and DNs: a mapping may name either."""
    return sorted({*ldap_user.group_names, *(dn.lower() for dn in ldap_user.group_dns)})


class DirectoryLDAPBackend(LDAPBackend):
    """django-auth-ldap's backend, the person's directory account kept and their group mappings applied at every
    sign-in. It grants no permissions of its own (AUTH_LDAP_FIND_GROUP_PERMS stays off): rights come from mappings."""

    def get_or_build_user(self, username, ldap_user):
        user, built = super().get_or_build_user(username, ldap_user)
        if not built and ServiceAccount.objects.filter(user=user).exists():
            raise _LDAPUser.AuthenticationFailed("a service account never signs in with a password")
        return user, built

    def authenticate_ldap_user(self, ldap_user, password):
        user = super().authenticate_ldap_user(ldap_user, password)
        if user is None:
            return None
        try:
            return self._signed_in(user, ldap_user)
        except SignInRefused:
            return None

    @transaction.atomic
    def _signed_in(self, user, ldap_user):
        account = account_for_sign_in(
            source=DirectorySource.LDAP,
            subject=ldap_user.dn,
            username=user.username,
            email=user.email,
            first_name=user.first_name,
            last_name=user.last_name,
            groups=groups_of(ldap_user),
        )
        directory_rights_apply(user=account.user, groups=account.groups, trigger="sign_in")
        return account.user


def current_groups(account) -> list[str] | None:
    """The person's groups in the directory now (the service bind), None when the directory no longer has them.
    DirectoryUnavailable when the directory does not answer."""
    ldap_user = _LDAPUser(DirectoryLDAPBackend(), username=account.user.username)
    try:
        # Bind with AUTH_LDAP_BIND_DN first: django-auth-ldap's search logs a failure and finds nobody, which must
        # not read as "the person left" when the directory is only down.
        ldap_user._bind()
        if ldap_user.dn is None:
            return None
        return groups_of(ldap_user)
    except ldap.LDAPError as failure:
        raise DirectoryUnavailable(f"The directory did not answer: {failure}") from failure
