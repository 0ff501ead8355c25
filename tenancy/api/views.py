from django.contrib.auth import authenticate, user_logged_in
from django.db.models import Prefetch
from drf_spectacular.utils import extend_schema
from rest_framework import exceptions, mixins, permissions, status, viewsets
from rest_framework.response import Response
from rest_framework.views import APIView

from config.api import ErrorSerializer
from config.client_address import client_address
from config.errors import DomainError, error_body
from config.signin import LOCKED_CODE, lockout_details, lockout_message
from config.throttling import DeviceSignInThrottle, SignInThrottle
from tenancy import device_flow, ssh_keys
from tenancy.api.serializers import (
    DeviceAuthorizationRequestSerializer,
    DeviceAuthorizationSerializer,
    DeviceTokenRequestSerializer,
    DeviceTokenSerializer,
    IssuedTokenSerializer,
    ProjectSerializer,
    SshKeySerializer,
    TokenRequestSerializer,
)
from tenancy.api_tokens import api_token_issue, checked_scopes
from tenancy.choices import TokenScope
from tenancy.models import Membership, Project, SshKey
from tenancy.selectors import project_list_visible_to


class SignInLocked(DomainError):
    status_code = 429
    code = LOCKED_CODE


class ProjectViewSet(viewsets.ReadOnlyModelViewSet):
    """Projects the caller may view, with the caller's role and the project's and tenant's quota limits."""

    serializer_class = ProjectSerializer
    filterset_fields = ["active", "tenant__slug"]
    search_fields = ["name", "slug", "cost_centre"]
    ordering_fields = ["name", "id"]

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):  # schema generation has no user
            return Project.objects.none()
        mine = Membership.objects.filter(user=self.request.user)
        return project_list_visible_to(user=self.request.user).prefetch_related(
            Prefetch("memberships", queryset=mine, to_attr="my_memberships")
        )


class TokenObtainView(APIView):
    """`POST /api/v1/auth/token/` {username, password[, name, expires_in_days]}: a new API token for that person.

    Sign-in failures count towards the lockout of the account and of the client address (django-axes, as on the
    sign-in page): a locked-out caller is answered 429 `sign_in_locked`, even with the right password."""

    authentication_classes: list = []
    permission_classes = [permissions.AllowAny]
    throttle_classes = [SignInThrottle]

    @extend_schema(
        request=TokenRequestSerializer,
        responses={200: IssuedTokenSerializer, 400: ErrorSerializer, 422: ErrorSerializer, 429: ErrorSerializer},
    )
    def post(self, request):
        body = TokenRequestSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        checked_scopes(body.validated_data.get("scopes"), allowed=TokenScope.values)  # refused before any sign-in
        # Django's own request: django-axes marks it when the account or address is locked out.
        http_request = request._request
        user = authenticate(
            http_request, username=body.validated_data["username"], password=body.validated_data["password"]
        )
        if getattr(http_request, "axes_locked_out", False):
            raise SignInLocked(lockout_message(), details=lockout_details())
        if user is None:
            raise exceptions.ValidationError(
                {"non_field_errors": ["Unable to sign in with the username and password given."]}, code="authorization"
            )
        issued = api_token_issue(
            user=user,
            name=body.validated_data["name"],
            actor=user,
            expires_in_days=body.validated_data.get("expires_in_days"),
            scopes=body.validated_data.get("scopes"),
        )
        user_logged_in.send(sender=type(user), request=http_request, user=user)  # last_login, the sign-in log
        token = issued.token
        return Response(
            IssuedTokenSerializer(
                {
                    "token": issued.secret,
                    "prefix": token.prefix,
                    "name": token.name,
                    "expires_at": token.expires_at,
                    "scopes": token.scopes,
                }
            ).data
        )


class SshKeyViewSet(mixins.ListModelMixin, viewsets.GenericViewSet):
    """The caller's own SSH public keys: every container workspace they order starts with all of them. Added keys are
    checked (422 ssh_key_invalid: a private key or not one public key line; 409 ssh_key_exists); nobody sees or
    removes another person's."""

    serializer_class = SshKeySerializer
    filter_backends: list = []
    pagination_class = None  # a handful per person
    lookup_value_regex = r"\d+"
    # Keys are what one orders workspaces with: read with the requests, changed with the right to order.
    token_scope = {"GET": TokenScope.REQUESTS_READ, "*": TokenScope.REQUESTS_WRITE}

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):  # schema generation has no user
            return SshKey.objects.none()
        return ssh_keys.ssh_keys_of(user=self.request.user)

    @extend_schema(responses={201: SshKeySerializer, 400: ErrorSerializer, 409: ErrorSerializer, 422: ErrorSerializer})
    def create(self, request):
        body = SshKeySerializer(data=request.data)
        body.is_valid(raise_exception=True)
        key = ssh_keys.ssh_key_add(user=request.user, actor=request.user, **body.validated_data)
        return Response(SshKeySerializer(key).data, status=status.HTTP_201_CREATED)

    @extend_schema(responses={204: None, 404: ErrorSerializer})
    def destroy(self, request, pk=None):
        ssh_keys.ssh_key_remove(user=request.user, key_id=int(pk), actor=request.user)
        return Response(status=status.HTTP_204_NO_CONTENT)


class DeviceAuthorizationView(APIView):
    """`POST /api/v1/auth/device/` (RFC 8628 3.1): `cc login` asks for a device sign-in on a server with company
    sign-in (404 `device_flow_off` elsewhere); the person approves it on `verification_uri` (/device/)."""

    authentication_classes: list = []
    permission_classes = [permissions.AllowAny]
    throttle_classes = [DeviceSignInThrottle]

    @extend_schema(
        request=DeviceAuthorizationRequestSerializer,
        responses={200: DeviceAuthorizationSerializer, 404: ErrorSerializer, 422: ErrorSerializer},
    )
    def post(self, request):
        body = DeviceAuthorizationRequestSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        scope = body.validated_data.get("scope")
        started = device_flow.device_authorization_start(
            token_name=body.validated_data["name"],
            scopes=scope.split() if scope is not None else None,
            expires_in_days=body.validated_data.get("expires_in_days"),
            address=client_address(request._request),
        )
        authorization, user_code = started.authorization, device_flow.user_code_shown(started.user_code)
        verification_uri = request.build_absolute_uri(device_flow.VERIFICATION_PATH)
        answer = {
            "device_code": started.device_code,
            "user_code": user_code,
            "verification_uri": verification_uri,
            "verification_uri_complete": f"{verification_uri}?user_code={user_code}",
            "expires_in": round((authorization.expires_at - authorization.created_at).total_seconds()),
            "interval": authorization.interval_seconds,
        }
        return Response(DeviceAuthorizationSerializer(answer).data, headers={"Cache-Control": "no-store"})


class DeviceTokenView(APIView):
    """`POST /api/v1/auth/device/token/` (RFC 8628 3.4): the CLI's poll. 200 with a personal API token once the
    person approved; else 400 with RFC 8628's `error` (authorization_pending, slow_down, access_denied,
    expired_token) or RFC 6749's (invalid_request, invalid_grant, unsupported_grant_type), also as the platform's
    {code, message, details}."""

    authentication_classes: list = []
    permission_classes = [permissions.AllowAny]
    throttle_classes = [DeviceSignInThrottle]

    @extend_schema(request=DeviceTokenRequestSerializer, responses={200: DeviceTokenSerializer, 400: ErrorSerializer})
    def post(self, request):
        body = DeviceTokenRequestSerializer(data=request.data)
        if not body.is_valid():
            return _oauth_error("invalid_request", _first_problem(body.errors), body.errors)
        if body.validated_data["grant_type"] != device_flow.DEVICE_GRANT_TYPE:
            return _oauth_error("unsupported_grant_type", f"Only {device_flow.DEVICE_GRANT_TYPE} is served here.")
        try:
            issued = device_flow.device_token_exchange(device_code=body.validated_data["device_code"])
        except device_flow.DeviceGrantRefused as refused:
            return _oauth_error(refused.code, refused.message, refused.details)
        token = issued.token
        answer = {
            "access_token": issued.secret,
            "token": issued.secret,
            "token_type": "Token",
            "expires_in": round((token.expires_at - token.created_at).total_seconds()),
            "scope": " ".join(token.scopes),
            "scopes": token.scopes,
            "prefix": token.prefix,
            "name": token.name,
            "expires_at": token.expires_at,
        }
        return Response(DeviceTokenSerializer(answer).data, headers={"Cache-Control": "no-store"})


def _first_problem(errors: dict) -> str:
    field, problems = next(iter(errors.items()))
    return f"{field}: {problems[0]}"


def _oauth_error(code: str, message: str, details: dict | None = None) -> Response:
    """RFC 6749 5.2's error body (`error`, `error_description`) beside the platform's {code, message, details}."""
    body = {**error_body(code, message, details), "error": code, "error_description": message}
    return Response(body, status=400, headers={"Cache-Control": "no-store"})
