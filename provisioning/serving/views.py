"""API keys of a project, from the request page of one of its deployments and from the API. A new or rotated key
is shown once, on the page that answers the POST (never stored in a cookie or a redirect)."""

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404
from django.shortcuts import get_object_or_404, render
from django.views.decorators.http import require_POST
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.response import Response
from rest_framework.views import APIView

from config.api import ErrorSerializer
from config.errors import DomainError
from provisioning.models import ApiKey
from provisioning.serving import keys
from requests import selectors as request_selectors
from requests.views import request_detail_context
from tenancy.selectors import project_list_visible_to


def _visible_key(user, pk: int) -> ApiKey:
    return get_object_or_404(ApiKey.objects.filter(project__in=project_list_visible_to(user=user)), pk=pk)


def _page_request_id(request) -> int:
    """The request page a rotate/revoke form came from (hidden field)."""
    value = request.POST.get("request", "")
    if not value.isdigit():
        raise Http404("No request page to return to.")
    return int(value)


def _answer_on_request_page(request, request_id: int, act):
    """Run the key action, then show the request page with the outcome (and the new key, once)."""
    resource_request = request_selectors.request_get(user=request.user, pk=request_id)
    new_key = None
    try:
        issued = act(resource_request)
    except DomainError as error:
        messages.error(request, error.message)
    else:
        new_key = issued.secret if isinstance(issued, keys.IssuedKey) else None
        messages.success(request, "Key created: copy it now, it is not shown again." if new_key else "Key revoked.")
    return render(
        request,
        "requests/request_detail.html",
        {**request_detail_context(request, resource_request), "new_key": new_key},
    )


@login_required
@require_POST
def key_create(request, pk):
    return _answer_on_request_page(
        request,
        pk,
        lambda resource_request: keys.api_key_create(
            project=resource_request.project, name=request.POST.get("name", ""), actor=request.user
        ),
    )


def _key_change(change):
    """A page action on one key (rotate or revoke), answered on the request page the form came from."""

    @login_required
    @require_POST
    def view(request, pk):
        key = _visible_key(request.user, pk)
        return _answer_on_request_page(
            request, _page_request_id(request), lambda _request: change(key=key, actor=request.user)
        )

    return view


key_rotate = _key_change(keys.api_key_rotate)
key_revoke = _key_change(keys.api_key_revoke)


# --- API ----------------------------------------------------------------------------------------------------


class KeySerializer(serializers.Serializer):
    id = serializers.IntegerField(read_only=True)
    name = serializers.CharField(max_length=80)
    prefix = serializers.CharField(read_only=True)
    created_at = serializers.DateTimeField(read_only=True)
    last_used_at = serializers.DateTimeField(read_only=True, allow_null=True)
    revoked_at = serializers.DateTimeField(read_only=True, allow_null=True)
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


class KeyRotateView(APIView):
    """A new key with the same name; the old one stops working at once."""

    @extend_schema(
        request=None,
        responses={201: IssuedKeySerializer, 403: ErrorSerializer, 404: ErrorSerializer, 409: ErrorSerializer},
    )
    def post(self, request, pk: int):
        issued = keys.api_key_rotate(key=_visible_key(request.user, pk), actor=request.user)
        return Response(_issued(issued), status=status.HTTP_201_CREATED)


class KeyRevokeView(APIView):
    @extend_schema(
        request=None, responses={200: KeySerializer, 403: ErrorSerializer, 404: ErrorSerializer, 409: ErrorSerializer}
    )
    def post(self, request, pk: int):
        return Response(KeySerializer(keys.api_key_revoke(key=_visible_key(request.user, pk), actor=request.user)).data)
