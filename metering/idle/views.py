"""The owner's snooze from the request page: GET asks for a reason (a page, or the page's dialog through htmx),
POST snoozes; the outcome or the refusal is a message on the request page."""

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.shortcuts import redirect
from django.urls import reverse
from django.views.decorators.http import require_http_methods

from config.errors import DomainError
from metering.idle.selectors import idle_status
from metering.idle.services import MAX_REASON_LENGTH, idle_snooze
from requests.selectors import request_get
from requests.services import can_release
from requests.views import confirmation


class SnoozeForm(forms.Form):
    reason = forms.CharField(
        max_length=MAX_REASON_LENGTH,
        widget=forms.Textarea(attrs={"rows": 2}),
        help_text="Why it should keep running (on the timeline, for the project lead and operators to see).",
    )


@login_required
@require_http_methods(["GET", "POST"])
def snooze(request, pk):
    target = request_get(user=request.user, pk=pk)
    if not can_release(request.user, target):
        raise PermissionDenied("You may see this request but not snooze its idle stop.")
    form = SnoozeForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            idle_snooze(request=target, actor=request.user, reason=form.cleaned_data["reason"])
        except DomainError as error:
            messages.error(request, error.message)
        else:
            messages.success(request, f"Request #{pk}: idle stop snoozed.")
        return redirect("portal:request-detail", pk=pk)
    status = idle_status(target, request.user)
    what = "scales to zero replicas" if status and status["scales_to_zero"] else "stops"
    stops = f" It {what} at {status['acts_at']:%H:%M} UTC otherwise." if status and status["acts_at"] else ""
    return confirmation(
        request,
        title=f"Keep request #{pk} running?",
        consequences=[f"The idle stop moves later by the offering's snooze time; say why.{stops}"],
        form=form,
        confirm_label="Snooze",
        back_url=reverse("portal:request-detail", args=[pk]),
        danger=False,
        status=400 if form.is_bound else 200,
    )
