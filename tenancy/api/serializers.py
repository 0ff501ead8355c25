from decimal import Decimal

from django.core.exceptions import ObjectDoesNotExist
from rest_framework import serializers

from tenancy.models import Project, QuotaLimits, Tenant


class TenantSummarySerializer(serializers.ModelSerializer):
    class Meta:
        model = Tenant
        fields = ["id", "slug", "name"]


def limits_representation(quota: QuotaLimits) -> dict:
    """Limits per dimension as JSON (decimals as strings); null means unlimited on that dimension."""
    return {dimension: str(value) if isinstance(value, Decimal) else value
            for dimension, value in quota.limits().items()}


class ProjectSerializer(serializers.ModelSerializer):
    tenant = TenantSummarySerializer(read_only=True)
    lead = serializers.SlugRelatedField(slug_field="username", read_only=True)
    my_role = serializers.SerializerMethodField()
    quota = serializers.SerializerMethodField(help_text="Project limits per dimension; null is unlimited.")
    tenant_quota = serializers.SerializerMethodField(
        help_text="Cap on the sum of the tenant's projects, or null when the tenant has none."
    )

    class Meta:
        model = Project
        fields = ["id", "slug", "name", "description", "tenant", "lead", "cost_centre", "active", "my_role",
                  "quota", "tenant_quota"]

    def get_my_role(self, project) -> str | None:
        memberships = getattr(project, "my_memberships", [])
        return memberships[0].role if memberships else None

    def get_quota(self, project) -> dict:
        return limits_representation(project.quota)

    def get_tenant_quota(self, project) -> dict | None:
        try:
            return limits_representation(project.tenant.quota)
        except ObjectDoesNotExist:
            return None
