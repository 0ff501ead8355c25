"""How API callers prove who they are (settings REST_FRAMEWORK; the agents' node tokens are scheduling's). Its own
module: DRF reads the setting while importing its views, which config.api imports."""

from django.contrib.auth import get_user_model
from django.utils.translation import gettext_lazy as _
from rest_framework import authentication, exceptions


class TokenAuthentication(authentication.TokenAuthentication):
    """DRF's token authentication with the token's user read by one plain SQL statement: the ORM's lookup of the
    token and its user (0.6 ms of CPU against 0.2) was a sizeable share of every small call."""

    def authenticate_credentials(self, key):
        users, tokens = get_user_model(), self.get_model()
        found = list(
            users.objects.raw(
                f"SELECT u.* FROM {users._meta.db_table} u JOIN {tokens._meta.db_table} t "
                f"ON t.user_id = u.{users._meta.pk.column} WHERE t.key = %s",
                [key],
            )
        )
        if not found:
            raise exceptions.AuthenticationFailed(_("Invalid token."))
        if not found[0].is_active:
            raise exceptions.AuthenticationFailed(_("User inactive or deleted."))
        return found[0], tokens(key=key, user=found[0])
