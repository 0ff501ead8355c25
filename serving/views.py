"""API keys of a project, from the request page of one of its deployments and from the API. Page actions confirm
first (GET asks, POST acts) and answer with a redirect to the request page, so a reload repeats nothing; a new or
rotated key travels to that page's next render in the server-side session and is shown there once."""

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import Http404
from django.shortcuts import get_object_or_404, redirect
from django.urls import reverse
from django.views.decorators.http import require_http_methods
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.response import Response
from rest_framework.views import APIView

from config.api import ErrorSerializer
from config.errors import DomainError
from requests import selectors as request_selectors
from requests.views import confirmation, show_once_on_request_page
from serving import keys
from serving.deployments import endpoint_url, example_curl
from serving.models import ApiKey, ServingDeployment
from tenancy.selectors import project_list_visible_to

GRACE_CHOICES = [
    (0, "None: the old key stops now"),
    (1, "1 hour"),
    (24, "24 hours"),
    (72, "3 days"),
    (168, "7 days"),
]


class RotateForm(forms.Form):
    grace_hours = forms.TypedChoiceField(
        label="The old key keeps working for",
        choices=GRACE_CHOICES,
        coerce=int,
        required=False,
        empty_value=keys.ROTATION_GRACE_HOURS_DEFAULT,
        initial=keys.ROTATION_GRACE_HOURS_DEFAULT,
    )


class RevokeForm(forms.Form):
    """Nothing to choose: the confirm step only asks."""


def _visible_key(user, pk: int) -> ApiKey:
    return get_object_or_404(
        ApiKey.objects.filter(project__in=project_list_visible_to(user=user)).select_related("project"), pk=pk
    )


def _page_request_id(request) -> int:
    """The request page a key action came from (`?request=` on the confirm step, or a hidden field)."""
    value = request.POST.get("request") or request.GET.get("request", "")
    if not value.isdigit():
        raise Http404("No request page to return to.")
    return int(value)


def _back_to_request_page(request, resource_request, act, done: str):
    """Run the key action; keep a new key for the request page's next render; redirect there."""
    try:
        issued = act()
    except DomainError as error:
        messages.error(request, error.message)
        return redirect("portal:request-detail", pk=resource_request.pk)
    messages.success(request, done)
    if isinstance(issued, keys.IssuedKey):
        show_once_on_request_page(
            request,
            resource_request.pk,
            new_key=issued.secret,
            new_key_name=issued.key.name,
            new_key_curl=_curl_with(request, resource_request, issued.secret),
        )
        return redirect(reverse("portal:request-detail", args=[resource_request.pk]) + "#new-key")
    return redirect("portal:request-detail", pk=resource_request.pk)


def _curl_with(request, resource_request, secret: str) -> str:
    deployment = ServingDeployment.objects.filter(request=resource_request).first()
    if deployment is None:
        return ""
    return example_curl(endpoint_url(deployment, request.build_absolute_uri("/")), deployment.model_name, secret)


@login_required
@require_http_methods(["GET", "POST"])
def key_create(request, pk):
    resource_request = request_selectors.request_get(user=request.user, pk=pk)
    if request.method == "GET":  # a reload after the redirect, or a bookmarked form URL: nothing to create
        return redirect(reverse("portal:request-detail", args=[pk]) + "#api-keys")
    return _back_to_request_page(
        request,
        resource_request,
        lambda: keys.api_key_create(
            project=resource_request.project, name=request.POST.get("name", ""), actor=request.user
        ),
        "Key created: copy it now, it is not shown again.",
    )


def _rotate_consequences(key: ApiKey) -> list[str]:
    return [
        f"A new key named “{key.name}” is created and shown once, with a ready curl.",
        f"The old key cc_{key.prefix}_… keeps working for the grace period you pick, then the gateway refuses it.",
    ]


def _revoke_consequences(key: ApiKey) -> list[str]:
    serving = ServingDeployment.objects.filter(project=key.project, stopped_at__isnull=True).count()
    return [
        f"cc_{key.prefix}_… (“{key.name}”) stops working at once on every endpoint of {key.project.name} "
        f"({serving} serving now).",
        "Whatever still sends it gets 401. A revoked key cannot be restored; create a new one instead.",
    ]


def _key_change(*, form_class, title, consequences, confirm_label, change, done: str):
    """A page action on one key (rotate or revoke): confirm, act, return to the request page it came from."""

    @login_required
    @require_http_methods(["GET", "POST"])
    def view(request, pk):
        key = _visible_key(request.user, pk)
        resource_request = request_selectors.request_get(user=request.user, pk=_page_request_id(request))
        if not keys.can_manage_keys(request.user, key.project):
            raise PermissionDenied("Only members who may order for the project manage its API keys.")
        form = form_class(request.POST or None) if request.method == "POST" else form_class()
        if request.method == "POST" and form.is_valid():
            return _back_to_request_page(
                request, resource_request, lambda: change(key, request.user, form.cleaned_data), done
            )
        return confirmation(
            request,
            title=title(key),
            consequences=consequences(key),
            form=form,
            confirm_label=confirm_label,
            back_url=reverse("portal:request-detail", args=[resource_request.pk]) + "#api-keys",
            status=400 if request.method == "POST" else 200,
        )

    return view


key_rotate = _key_change(
    form_class=RotateForm,
    title=lambda key: f"Rotate the key “{key.name}”?",
    consequences=_rotate_consequences,
    confirm_label="Rotate",
    change=lambda key, actor, data: keys.api_key_rotate(key=key, actor=actor, grace_hours=data["grace_hours"]),
    done="Key rotated: copy the new one now, it is not shown again.",
)
key_revoke = _key_change(
    form_class=RevokeForm,
    title=lambda key: f"Revoke the key “{key.name}”?",
    consequences=_revoke_consequences,
    confirm_label="Revoke",
    change=lambda key, actor, _data: keys.api_key_revoke(key=key, actor=actor),
    done="Key revoked.",
)


# --- API ----------------------------------------------------------------------------------------------------


class KeySerializer(serializers.Serializer):
    id = serializers.IntegerField(read_only=True)
    name = serializers.CharField(max_length=80)
    prefix = serializers.CharField(read_only=True)
    created_at = serializers.DateTimeField(read_only=True)
    last_used_at = serializers.DateTimeField(read_only=True, allow_null=True)
    revoked_at = serializers.DateTimeField(read_only=True, allow_null=True)
    expires_at = serializers.DateTimeField(
        read_only=True, allow_null=True, help_text="Set when rotated: the end of the old key's grace period."
    )
    active = serializers.BooleanField(read_only=True)


class IssuedKeySerializer(KeySerializer):
    key = serializers.CharField(read_only=True, help_text="The whole key. Shown this once; store it now.")


def _issued(issued: keys.IssuedKey) -> dict:
    return {**KeySerializer(issued.key).data, "key": issued.secret}


class ProjectKeysView(APIView):
    """A project's API keys (members who can see the project); POST creates one (members who may order)."""

    @extend_schema(responses={200: KeySerializer(many=True), 404: ErrorSerializer})
    def get(self, request, project_id: int):
        project = get_object_or_404(project_list_visible_to(user=request.user), pk=project_id)
        return Response(KeySerializer(ApiKey.objects.filter(project=project).order_by("-created_at"), many=True).data)

    @extend_schema(
        request=KeySerializer,
        responses={201: IssuedKeySerializer, 400: ErrorSerializer, 403: ErrorSerializer, 404: ErrorSerializer},
    )
    def post(self, request, project_id: int):
        project = get_object_or_404(project_list_visible_to(user=request.user), pk=project_id)
        body = KeySerializer(data=request.data)
        body.is_valid(raise_exception=True)
        issued = keys.api_key_create(project=project, name=body.validated_data["name"], actor=request.user)
        return Response(_issued(issued), status=status.HTTP_201_CREATED)


class RotateSerializer(serializers.Serializer):
    grace_hours = serializers.IntegerField(
        min_value=0,
        max_value=keys.ROTATION_GRACE_HOURS_MAX,
        default=keys.ROTATION_GRACE_HOURS_DEFAULT,
        help_text="How long the old key keeps working (0: it stops at once).",
    )


class KeyRotateView(APIView):
    """A new key with the same name; the old one keeps working for `grace_hours` (default 24), then stops."""

    @extend_schema(
        request=RotateSerializer,
        responses={
            201: IssuedKeySerializer,
            400: ErrorSerializer,
            403: ErrorSerializer,
            404: ErrorSerializer,
            409: ErrorSerializer,
        },
    )
    def post(self, request, pk: int):
        body = RotateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        key = _visible_key(request.user, pk)
        issued = keys.api_key_rotate(key=key, actor=request.user, grace_hours=body.validated_data["grace_hours"])
        return Response(_issued(issued), status=status.HTTP_201_CREATED)


class KeyRevokeView(APIView):
    @extend_schema(
        request=None, responses={200: KeySerializer, 403: ErrorSerializer, 404: ErrorSerializer, 409: ErrorSerializer}
    )
    def post(self, request, pk: int):
        return Response(KeySerializer(keys.api_key_revoke(key=_visible_key(request.user, pk), actor=request.user)).data)
