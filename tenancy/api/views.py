from django.contrib.auth import authenticate, user_logged_in
from django.db.models import Prefetch
from drf_spectacular.utils import extend_schema
from rest_framework import exceptions, mixins, permissions, status, viewsets
from rest_framework.response import Response
from rest_framework.views import APIView

from config.api import ErrorSerializer
from config.errors import DomainError
from config.signin import LOCKED_CODE, lockout_details, lockout_message
from config.throttling import SignInThrottle
from tenancy import ssh_keys
from tenancy.api.serializers import IssuedTokenSerializer, ProjectSerializer, SshKeySerializer, TokenRequestSerializer
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
