"""How API callers prove who they are (settings REST_FRAMEWORK; the agents' node tokens are scheduling's). Its own
module: DRF reads the setting while importing its views, which config.api imports."""

from rest_framework import authentication, exceptions

from config.client_address import client_address
from config.scopes import check_token_scope
from tenancy.api_tokens import TokenRefused, api_token_authenticate


class TokenAuthentication(authentication.TokenAuthentication):
    """`Authorization: Token <secret>` with the platform's API tokens (tenancy.api_tokens: hashed, scoped, expiring,
    revocable), the token's user read by one plain SQL statement: the ORM's lookup of the token and its user
    cost several times the CPU of the plain statement, a sizeable share of every small call. A call outside the
    token's scopes is refused here, before any view runs, so no endpoint can forget it (config.scopes)."""

    def authenticate(self, request):
        self.address = client_address(request._request)
        authenticated = super().authenticate(request)
        if authenticated is not None:
            check_token_scope(request, authenticated[1])
        return authenticated

    def authenticate_credentials(self, key):
        try:
            return api_token_authenticate(key, address=getattr(self, "address", None))
        except TokenRefused as refused:
            raise exceptions.AuthenticationFailed(refused.message, code=refused.code) from None
