"""Sign-in lockout (django-axes, settings AXES_* and SIGN_IN_*): what a locked-out client is answered.

django-axes counts failed sign-ins per account and per client address (config.client_address) in the database, so
every web process shares the count, operators see and clear lockouts in the console (tenancy.admin), and the
lockout holds across restarts. Its backend refuses a locked-out account before the password is checked, and its
middleware turns the refused request into `lockout_response`: the API's 429 error shape on /api/, the sign-in page
with the reason elsewhere.
"""

from django.conf import settings
from django.contrib.auth.forms import AuthenticationForm
from django.http import JsonResponse
from django.shortcuts import render

from config.errors import error_body

LOCKED_CODE = "sign_in_locked"


def lockout_message() -> str:
    minutes = settings.SIGN_IN_LOCKOUT_MINUTES
    wait = f"Try again in {minutes} minutes" if minutes else "Ask an operator to clear the lockout"
    return f"Too many failed sign-ins for this account or from this address. {wait}; each further try starts it over."


def lockout_details() -> dict:
    minutes = settings.SIGN_IN_LOCKOUT_MINUTES
    return {
        "failure_limit": settings.SIGN_IN_FAILURE_LIMIT,
        "retry_after_seconds": minutes * 60 if minutes else None,
    }


def lockout_response(request, original_response=None, credentials=None):
    """AXES_LOCKOUT_CALLABLE: 429, in the API's error shape for API calls, else the sign-in page saying why."""
    headers = {"Retry-After": str(settings.SIGN_IN_LOCKOUT_MINUTES * 60)} if settings.SIGN_IN_LOCKOUT_MINUTES else {}
    if request.path.startswith("/api/"):
        return JsonResponse(error_body(LOCKED_CODE, lockout_message(), lockout_details()), status=429, headers=headers)
    form = AuthenticationForm(request)
    from tenancy.sign_in_backends import sign_in_options

    context = {"form": form, "locked_out": lockout_message(), "next": request.POST.get("next", ""), **sign_in_options()}
    response = render(request, "registration/login.html", context, status=429)
    for name, value in headers.items():
        response[name] = value
    return response
