"""The OIDC sign-in's pages: mozilla-django-oidc's views, with the IdP's endpoints from discovery, a refusal said on
the sign-in page, and signing out that ends the IdP session where the IdP supports it."""

from django.conf import settings
from django.contrib import messages
from django.http import Http404
from django.shortcuts import redirect, resolve_url
from mozilla_django_oidc import views as oidc_views

from tenancy.directory import oidc


def _enabled() -> None:
    if not settings.OIDC_ENABLED:
        raise Http404("Company sign-in is not configured.")


class SignInStart(oidc_views.OIDCAuthenticationRequestView):
    """Redirects to the IdP's authorization endpoint with state, nonce and the PKCE S256 challenge."""

    def get(self, request):
        _enabled()
        try:
            self.OIDC_OP_AUTH_ENDPOINT = oidc.provider().authorization_endpoint
        except oidc.ProviderUnavailable:
            messages.error(request, f"{settings.OIDC_PROVIDER_NAME} is not answering; try again in a minute.")
            return redirect("login")
        return super().get(request)


class SignInCallback(oidc_views.OIDCAuthenticationCallbackView):
    """The IdP sends the browser back here with a code; a refused sign-in lands on the sign-in page saying why."""

    def get(self, request):
        _enabled()
        return super().get(request)

    @property
    def failure_url(self):
        return resolve_url(self.get_settings("LOGIN_REDIRECT_URL_FAILURE", "login"))

    def login_failure(self):
        refusal = getattr(self.request, "sign_in_refusal", "") or self.request.GET.get("error_description", "")
        messages.error(
            self.request,
            f"Signing in with {settings.OIDC_PROVIDER_NAME} did not work" + (f": {refusal}" if refusal else "."),
        )
        return super().login_failure()


class SignOut(oidc_views.OIDCLogoutView):
    """Sign out here, then at the IdP when the person signed in with it (RP-initiated logout)."""
