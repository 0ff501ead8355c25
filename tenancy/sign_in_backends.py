"""Local passwords: Django's model backend, limited to the accounts allowed to use one.

With LOCAL_PASSWORD_SIGN_IN on (the default, and the demo) every account with a password signs in with it; off,
only the break-glass accounts named in LOCAL_PASSWORD_ACCOUNTS do, and everyone else signs in through the company
directory. Permissions are answered exactly as by Django's model backend (tenancy.selectors.grants_of mirrors it).
"""

from django.conf import settings
from django.contrib.auth.backends import ModelBackend


def local_password_allowed(username: str) -> bool:
    return settings.LOCAL_PASSWORD_SIGN_IN or username.casefold() in {
        name.casefold() for name in settings.LOCAL_PASSWORD_ACCOUNTS
    }


class LocalPasswordBackend(ModelBackend):
    def user_can_authenticate(self, user):
        return super().user_can_authenticate(user) and local_password_allowed(user.get_username())


def sign_in_options() -> dict:
    """What the sign-in page offers: the company IdP's button, and the password form (for everyone, or folded away
    for the break-glass accounts when only they may use a password)."""
    password_for_all = settings.LOCAL_PASSWORD_SIGN_IN or settings.LDAP_ENABLED
    return {
        "company_sign_in": settings.OIDC_PROVIDER_NAME if settings.OIDC_ENABLED else "",
        "password_sign_in": password_for_all or bool(settings.LOCAL_PASSWORD_ACCOUNTS),
        "password_break_glass_only": not password_for_all,
    }
