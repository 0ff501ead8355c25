"""Portal actions of provisioning on a request page: the requester changes a secret of their running workload
(a workspace's Jupyter token). GET asks for confirmation (a dialog, or a page of its own without JavaScript), POST
acts and answers with a redirect to the request page, whose Connect panel shows the new one to the requester."""

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.shortcuts import redirect
from django.urls import reverse
from django.views.decorators.http import require_http_methods

from config.errors import DomainError
from provisioning.connect import connect_secret_rotate, label_of
from requests import selectors as request_selectors
from requests.views import confirmation


class RotateSecretForm(forms.Form):
    """Nothing to choose: the confirm step only asks."""


@login_required
@require_http_methods(["GET", "POST"])
def connect_secret_rotate_page(request, pk: int, name: str):
    resource_request = request_selectors.request_get(user=request.user, pk=pk)
    if request.user.pk != resource_request.requester_id:
        raise PermissionDenied("Only the requester changes the secrets of their workload.")
    label = label_of(name)
    if request.method == "POST":
        try:
            connect_secret_rotate(resource_request=resource_request, name=name, actor=request.user)
        except DomainError as error:
            messages.error(request, error.message)
        else:
            messages.success(request, f"New {label}: the old one, and every sign-in made with it, no longer works.")
        return redirect(reverse("portal:request-detail", args=[pk]) + "#connect")
    return confirmation(
        request,
        title=f"Change the {label}?",
        consequences=[
            f"The running workload takes a new {label} at once; the Connect panel shows it to you.",
            f"The old {label} stops working, and so does every browser signed in with it (your notebooks and "
            "kernels keep running).",
        ],
        form=RotateSecretForm(),
        confirm_label="Change it",
        back_url=reverse("portal:request-detail", args=[pk]) + "#connect",
        danger=False,
    )
