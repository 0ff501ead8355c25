"""Operator console for model serving: deployments with their replicas' health, and the projects' API keys (never
their secrets). Read-only: deployments follow their requests' provisioning, keys are their projects' members'."""

from django.contrib import admin
from django.db.models import Count, Q

from config.admin_actions import ReadOnlyAdminMixin
from serving.models import ApiKey, ServingDeployment, ServingReplica


class ReplicaInline(ReadOnlyAdminMixin, admin.TabularInline):
    model = ServingReplica
    fields = ["name", "url", "pid", "devices", "healthy", "checked_at", "last_error"]
    readonly_fields = fields
    extra = 0


@admin.register(ServingDeployment)
class ServingDeploymentAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = [
        "slug",
        "request",
        "project",
        "model_name",
        "state",
        "rate_limit_per_minute",
        "monthly_token_budget",
        "healthy_replicas",
        "created_at",
    ]
    list_filter = ["state"]
    list_select_related = ["request__service", "request__project", "project__tenant"]
    search_fields = ["slug", "model_name", "=request__id", "project__slug"]
    inlines = [ReplicaInline]

    def get_queryset(self, request):
        return (
            super()
            .get_queryset(request)
            .annotate(healthy=Count("replicas", filter=Q(replicas__healthy=True)), replica_count=Count("replicas"))
        )

    @admin.display(description="Healthy replicas")
    def healthy_replicas(self, deployment):
        return f"{deployment.healthy}/{deployment.replica_count}"


@admin.register(ApiKey)
class ApiKeyAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    """Keys are managed by the project's members; operators see them (never the secret, which is not stored)."""

    list_display = ["name", "prefix", "project", "created_by", "created_at", "last_used_at", "revoked_at"]
    list_filter = [("revoked_at", admin.EmptyFieldListFilter)]
    list_select_related = ["project__tenant", "created_by"]
    search_fields = ["name", "prefix", "project__slug"]
    exclude = ["hashed"]
