from decimal import Decimal

from django.core.exceptions import ObjectDoesNotExist
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from config.api import ModelSerializer
from config.hooks import ask
from tenancy import hooks
from tenancy.choices import TokenScope, priorities_up_to
from tenancy.models import Project, QuotaLimits, Tenant


class TenantSummarySerializer(ModelSerializer):
    class Meta:
        model = Tenant
        fields = ["id", "slug", "name"]


def numbers_representation(values: dict) -> dict:
    """Numbers per dimension as JSON: decimals as strings, so no precision is lost."""
    return {dimension: str(value) if isinstance(value, Decimal) else value for dimension, value in values.items()}


def limits_representation(quota: QuotaLimits) -> dict:
    """Limits per dimension as JSON; null means unlimited on that dimension."""
    return numbers_representation(quota.limits())


def _usage_of(projects: list[Project]) -> dict | None:
    return ask(hooks.PROJECT_USAGE, [project.pk for project in projects])


class ProjectListSerializer(serializers.ListSerializer):
    """Asks the usage provider once for the whole page rather than once per project."""

    def to_representation(self, data):
        projects = list(data)
        self.context["usage"] = _usage_of(projects)
        return super().to_representation(projects)


class ProjectSerializer(ModelSerializer):
    tenant = TenantSummarySerializer(read_only=True)
    lead = serializers.SlugRelatedField(slug_field="username", read_only=True)
    my_role = serializers.SerializerMethodField()
    quota = serializers.SerializerMethodField(help_text="Project limits per dimension; null is unlimited.")
    priority_entitlement = serializers.SerializerMethodField(
        help_text="Highest priority class the project may order without approval, and the classes up to it."
    )
    tenant_quota = serializers.SerializerMethodField(
        help_text="Cap on the sum of the tenant's projects, or null when the tenant has none."
    )
    usage = serializers.SerializerMethodField(
        help_text="Current usage per dimension, or null when no installed app tracks usage."
    )

    class Meta:
        model = Project
        fields = [
            "id",
            "slug",
            "name",
            "description",
            "tenant",
            "lead",
            "cost_centre",
            "active",
            "my_role",
            "quota",
            "priority_entitlement",
            "tenant_quota",
            "usage",
        ]
        list_serializer_class = ProjectListSerializer

    def get_my_role(self, project) -> str | None:
        memberships = getattr(project, "my_memberships", [])
        return memberships[0].role if memberships else None

    def get_quota(self, project) -> dict:
        return limits_representation(project.quota)

    @extend_schema_field(
        {
            "type": "object",
            "properties": {
                "max_priority": {"type": "string"},
                "allowed": {"type": "array", "items": {"type": "string"}},
            },
        }
    )
    def get_priority_entitlement(self, project) -> dict:
        return {"max_priority": project.quota.max_priority, "allowed": priorities_up_to(project.quota.max_priority)}

    def get_tenant_quota(self, project) -> dict | None:
        try:
            return limits_representation(project.tenant.quota)
        except ObjectDoesNotExist:
            return None

    @extend_schema_field({"type": "object", "nullable": True, "additionalProperties": {}})
    def get_usage(self, project) -> dict | None:
        usage = self.context["usage"] if "usage" in self.context else _usage_of([project])
        return None if usage is None else numbers_representation(usage[project.pk])


class TokenRequestSerializer(serializers.Serializer):
    username = serializers.CharField(max_length=150)
    password = serializers.CharField(max_length=128, trim_whitespace=False, style={"input_type": "password"})
    name = serializers.CharField(
        max_length=80, required=False, default="API sign-in", help_text="What will use the token, e.g. `laptop CLI`."
    )
    expires_in_days = serializers.IntegerField(
        required=False, min_value=1, help_text="Lifetime in days (default API_TOKEN_DEFAULT_DAYS, at most the max)."
    )
    scopes = serializers.ListField(
        child=serializers.CharField(max_length=40),
        required=False,
        max_length=len(TokenScope.values),
        help_text="What the token may do (default: everything its holder may): "
        + ", ".join(f"`{scope}`" for scope in TokenScope.values)
        + ". A call outside them is refused 403 `token_scope`.",
    )


class IssuedTokenSerializer(serializers.Serializer):
    token = serializers.CharField(
        help_text="The secret: shown this once, stored only as a hash. Send it as `Authorization: Token <token>`."
    )
    prefix = serializers.CharField(help_text="Its public part, to tell your tokens apart.")
    name = serializers.CharField()
    expires_at = serializers.DateTimeField()
    scopes = serializers.ListField(child=serializers.CharField())


class SshKeySerializer(serializers.Serializer):
    id = serializers.IntegerField(read_only=True)
    name = serializers.CharField(max_length=200, help_text="Which machine holds the private key, e.g. work laptop.")
    public_key = serializers.CharField(
        max_length=20000, trim_whitespace=True, help_text="One OpenSSH public key line (the .pub file's)."
    )
    key_type = serializers.CharField(read_only=True)
    fingerprint = serializers.CharField(read_only=True, help_text="SHA256:..., as ssh-keygen -l prints it.")
    created_at = serializers.DateTimeField(read_only=True)


class DeviceAuthorizationRequestSerializer(serializers.Serializer):
    """RFC 8628 3.1's device authorization request (form-encoded or JSON), with this platform's token options."""

    client_id = serializers.CharField(max_length=80, required=False, help_text="The client, e.g. `cc` (informative).")
    scope = serializers.CharField(
        max_length=400,
        required=False,
        help_text="Space-separated scopes the token asks for (default: the reading ones and requests:write).",
    )
    name = serializers.CharField(max_length=80, required=False, default="cc", help_text="The token's name.")
    expires_in_days = serializers.IntegerField(
        required=False, min_value=1, help_text="Lifetime in days (default API_TOKEN_DEFAULT_DAYS, at most the max)."
    )


class DeviceAuthorizationSerializer(serializers.Serializer):
    """RFC 8628 3.2's answer: the device code is the client's to poll with, the user code the person's to type."""

    device_code = serializers.CharField()
    user_code = serializers.CharField()
    verification_uri = serializers.URLField()
    verification_uri_complete = serializers.URLField()
    expires_in = serializers.IntegerField(help_text="Seconds the codes work.")
    interval = serializers.IntegerField(help_text="Seconds to wait between polls.")


class DeviceTokenRequestSerializer(serializers.Serializer):
    grant_type = serializers.CharField(max_length=80, help_text="`urn:ietf:params:oauth:grant-type:device_code`")
    device_code = serializers.CharField(max_length=200)
    client_id = serializers.CharField(max_length=80, required=False)


class DeviceTokenSerializer(IssuedTokenSerializer):
    """RFC 6749 5.1's token answer, with the platform's own fields of an issued token beside it."""

    access_token = serializers.CharField(help_text="The same secret as `token`.")
    token_type = serializers.CharField(help_text="`Token`: send it as `Authorization: Token <access_token>`.")
    expires_in = serializers.IntegerField()
    scope = serializers.CharField(help_text="The token's scopes, space-separated.")
