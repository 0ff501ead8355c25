"""What a signed-out browser gets from a portal page that needs sign-in, so that an expired session never breaks a
live page or loses what was typed.

`login_required` answers a signed-out browser with a redirect to the sign-in page. For an htmx partial update (the
order preview, a request page's polling) the browser would follow it and the sign-in page would be swapped into the
page, autofocus and all. Such a request gets a 401 `session_ended` instead, naming the sign-in page that returns to
the page the person is on; portal.js turns it into "Your session ended — sign in again" and keeps the page's form.

A form posted while signed out is sent on to the sign-in page with `resume=1` in its `next`: portal.js kept what
the form held when it was sent and puts it back on the page the sign-in returns to (RESUME_PARAMETER).
"""

from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from django.conf import settings
from django.contrib.auth import REDIRECT_FIELD_NAME
from django.contrib.auth.views import redirect_to_login
from django.http import JsonResponse
from django.shortcuts import resolve_url
from django.utils.http import url_has_allowed_host_and_scheme

from config.errors import error_body

# The query parameter that tells a page's script to put back the form it kept before the sign-in.
RESUME_PARAMETER = "resume"
SESSION_ENDED_MESSAGE = "Your session ended — sign in again."


def with_resume(url: str) -> str:
    """The URL with resume=1 added to its query (kept once)."""
    parts = urlsplit(url)
    query = [(key, value) for key, value in parse_qsl(parts.query, keep_blank_values=True) if key != RESUME_PARAMETER]
    return urlunsplit(parts._replace(query=urlencode([*query, (RESUME_PARAMETER, "1")])))


def page_to_return_to(request, url: str | None) -> str:
    """The path and query of `url` when it is a page of this site, else the home page."""
    if url and url_has_allowed_host_and_scheme(url, allowed_hosts={request.get_host()}, require_https=False):
        parts = urlsplit(url)
        return urlunsplit(("", "", parts.path or "/", parts.query, ""))
    return "/"


def sign_in_url(back_to: str) -> str:
    """The sign-in page, sending the person back to `back_to` with its kept form put back."""
    return redirect_to_login(with_resume(back_to))["Location"]


def session_ended(request) -> JsonResponse:
    """The answer to an htmx request of a signed-out browser: 401, the API's error shape, the sign-in URL."""
    back_to = page_to_return_to(request, request.headers.get("HX-Current-URL"))
    response = JsonResponse(
        error_body("session_ended", SESSION_ENDED_MESSAGE, {"sign_in_url": sign_in_url(back_to)}),
        status=401,
    )
    response["WWW-Authenticate"] = 'Session realm="portal"'  # a 401 names how to authenticate: sign in, get a cookie
    return response


def _is_sign_in_redirect(response) -> bool:
    """A redirect to the sign-in page that asks to come back (`next`): what login_required answers. A redirect
    there without `next` (signing out) is not one."""
    if response.status_code not in (301, 302, 303, 307, 308) or not response.has_header("Location"):
        return False
    location = urlsplit(response["Location"])
    return location.path == resolve_url(settings.LOGIN_URL) and REDIRECT_FIELD_NAME in dict(parse_qsl(location.query))


class SessionEndedMiddleware:
    """Turns login_required's redirect into what a live page can use (see the module's docstring). Sits after
    AuthenticationMiddleware."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        response = self.get_response(request)
        # The redirect first: asking for the user of any other answer could read the session from the database,
        # which may be what the answer is about (a lost connection answered with a 503).
        if not _is_sign_in_redirect(response) or request.user.is_authenticated:
            return response
        if request.headers.get("HX-Request"):
            return session_ended(request)
        if request.method == "POST":
            return redirect_to_login(with_resume(request.get_full_path()))
        return response
