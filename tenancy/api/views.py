from django.contrib.auth import authenticate, user_logged_in
from django.db.models import Prefetch
from drf_spectacular.utils import extend_schema
from rest_framework import exceptions, permissions, viewsets
from rest_framework.response import Response
from rest_framework.views import APIView

from config.api import ErrorSerializer
from config.errors import DomainError
from config.signin import LOCKED_CODE, lockout_details, lockout_message
from config.throttling import SignInThrottle
from tenancy.api.serializers import IssuedTokenSerializer, ProjectSerializer, TokenRequestSerializer
from tenancy.api_tokens import api_token_issue, checked_scopes
from tenancy.choices import TokenScope
from tenancy.models import Membership, Project
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
