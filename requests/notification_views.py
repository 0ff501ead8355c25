"""The notifications page: which mails a person gets (a split of views.py, which passed its size)."""

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods

from requests import notifications


@login_required
@require_http_methods(["GET", "POST"])
def notification_preferences(request):
    """Everyone's own page: a switch per kind of mail they may get; saving answers with a redirect."""
    groups = notifications.kinds_for(request.user)
    shown = [kind for _, kinds in groups for kind, _ in kinds]
    if request.method == "POST":
        notifications.notification_preferences_set(
            user=request.user, enabled=request.POST.getlist("enabled"), shown=shown
        )
        messages.success(request, "Notification settings saved.")
        return redirect("portal:notifications")
    current = notifications.preferences_of(request.user)
    return render(
        request,
        "requests/notifications.html",
        {
            "groups": [
                (audience, [(kind, label, current[kind]) for kind, label in kinds]) for audience, kinds in groups
            ],
            "email": request.user.email,
        },
    )
