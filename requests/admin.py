"""Operator console for the request workflow: requests, approvals, approval policies, quota change requests.

Requests, approvals and quota change requests are read-only here: their state changes only through services,
which the actions below call. Approval policies, rules and stages are configuration that operators edit.
"""

import json

from django import forms
from django.contrib import admin
from django.db.models import Count, Prefetch
from django.urls import reverse
from django.utils.html import format_html, format_html_join

from config.admin_actions import ReadOnlyAdminMixin, action_with_reason, related_list_filter
from requests import services
from requests.choices import ApproverSource, RequestState
from requests.models import (
    Approval,
    ApprovalAssignment,
    ApprovalPolicy,
    ApprovalRule,
    ApprovalRuleStage,
    ApprovalStage,
    QuotaChangeRequest,
    RequestEvent,
    ResourceRequest,
)
from requests.selectors import approval_of
from tenancy.audited_admin import AuditedAdminMixin

S = RequestState
_STATE_COLOURS = {
    S.WAITING_FOR_QUOTA: "#b7791f",
    S.PENDING_APPROVAL: "#b7791f",
    S.ACTIVE: "#2f855a",
    S.REJECTED: "#c53030",
    S.FAILED: "#c53030",
    S.CANCELLED: "#718096",
    S.RELEASED: "#718096",
}
_OTHER_STATE_COLOUR = "#2b6cb0"
RULE_CONDITIONS = [
    "service_kind",
    "vendor",
    "accelerator_model",
    "spec",
    "tenant",
    "project",
    "min_accelerator_count",
    "min_cost_estimate",
    "parameter_name",
    "parameter_value",
    "quota_exception",
    "min_priority",
]
RULE_CONDITION_LOOKUPS = ["vendor", "accelerator_model", "spec", "tenant", "project"]


# Project choices are labelled "<tenant> / <project>": load the tenants with them.
ProjectListFilter = related_list_filter("tenant")


def pretty_json(field: str, description: str):
    """A read-only display of a JSON field, indented for reading."""

    @admin.display(description=description)
    def show(modeladmin, obj):
        value = getattr(obj, field)
        if value is None:
            return None
        return format_html("<pre>{}</pre>", json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False))

    return show


def _admin_change_url(model, pk) -> str:
    return reverse(f"admin:{model._meta.app_label}_{model._meta.model_name}_change", args=[pk])


def _decisions(stage: ApprovalStage) -> str:
    return format_html_join(
        "",
        "<div>{}: {}{}</div>",
        (
            (
                assignment.approver,
                assignment.get_decision_display() or "no decision yet",
                f" — {assignment.comment}" if assignment.comment else "",
            )
            for assignment in stage.assignments.all()
        ),
    )


class ApprovalOfSubjectMixin:
    """Shows the subject's approval: its route, every stage and every approver's decision (three queries)."""

    @admin.display(description="Approval")
    def approval_decisions(self, subject):
        approval = approval_of(subject)
        if approval is None:
            return "No approval on record."
        stages = format_html_join(
            "",
            "<tr><td>{}. {}</td><td>{}</td><td>{}</td></tr>",
            (
                (stage.order, stage.name, stage.get_state_display(), _decisions(stage))
                for stage in approval.stages.all()
            ),
        )
        return format_html(
            '<p><a href="{}">{}</a> — {}</p><table>{}</table>',
            _admin_change_url(Approval, approval.pk),
            approval.route_name,
            approval.get_state_display(),
            stages,
        )


# --- Resource requests -------------------------------------------------------------------------------------


class RequestEventInline(ReadOnlyAdminMixin, admin.TabularInline):
    """The request's timeline, oldest first."""

    model = RequestEvent
    verbose_name_plural = "timeline"
    fields = ["created_at", "code", "from_state", "to_state", "actor", "message", "data"]
    readonly_fields = fields
    ordering = ["created_at", "id"]
    extra = 0

    def get_queryset(self, request):
        return super().get_queryset(request).select_related("actor")


@admin.register(ResourceRequest)
class ResourceRequestAdmin(ApprovalOfSubjectMixin, ReadOnlyAdminMixin, admin.ModelAdmin):
    """Requests are never edited here; operators steer them with the cancel and reject actions."""

    list_display = [
        "id",
        "service",
        "project",
        "tenant",
        "requester",
        "state_badge",
        "priority",
        "cost_estimate",
        "quota_exception",
        "created_at",
    ]
    list_filter = [
        "state",
        "project__tenant",
        ("project", ProjectListFilter),
        "service",
        "service__kind",
        "priority",
        "quota_exception",
    ]
    list_select_related = ["service", "project__tenant", "tenant", "requester"]
    search_fields = ["=id", "requester__username", "project__slug", "service__name"]
    date_hierarchy = "created_at"
    inlines = [RequestEventInline]
    readonly_fields = [
        "state_badge",
        "parameters_json",
        "quota_reasons_json",
        "approved_spec_json",
        "approval_decisions",
    ]
    fieldsets = [
        (
            None,
            {
                "fields": [
                    "state_badge",
                    "tenant",
                    "project",
                    "requester",
                    "service",
                    "priority",
                    "duration_hours",
                    "justification",
                    "parameters_json",
                    "created_at",
                    "updated_at",
                ]
            },
        ),
        ("Offering", {"fields": ["spec", "image", "bare_metal_profile", "serving_model", "serving_template"]}),
        (
            "Demand and cost",
            {
                "fields": [
                    "gpu_equivalents",
                    "accelerator_count",
                    "accelerator_memory_gb",
                    "cpu_cores",
                    "memory_gb",
                    "card_hours",
                    "hourly_cost",
                    "cost_estimate",
                ]
            },
        ),
        ("Quota", {"fields": ["quota_exception", "quota_reasons_json"]}),
        ("Approval", {"fields": ["approval_decisions", "approved_at", "approved_spec_hash", "approved_spec_json"]}),
    ]

    parameters_json = pretty_json("parameters", "Parameters")
    quota_reasons_json = pretty_json("quota_reasons", "Quota reasons")
    approved_spec_json = pretty_json("approved_spec", "Approved spec")

    @admin.display(description="State", ordering="state")
    def state_badge(self, resource_request):
        colour = _STATE_COLOURS.get(resource_request.state, _OTHER_STATE_COLOUR)
        return format_html(
            '<span style="background:{};color:#fff;padding:1px 6px;border-radius:8px">{}</span>',
            colour,
            resource_request.get_state_display(),
        )

    def has_steer_permission(self, request):
        """The model's change permission means "may steer requests through services", not "may edit fields"."""
        return request.user.has_perm("requests.change_resourcerequest")

    cancel_requests = action_with_reason(
        name="cancel_requests",
        description="Cancel selected requests",
        verb="Cancelled",
        permission="steer",
        change=lambda resource_request, reason, actor: services.request_cancel(
            request=resource_request, actor=actor, reason=reason
        ),
    )
    reject_requests = action_with_reason(
        name="reject_requests",
        description="Reject selected requests",
        verb="Rejected",
        permission="steer",
        change=lambda resource_request, reason, actor: services.request_reject_by_operator(
            request=resource_request, actor=actor, reason=reason
        ),
    )
    actions = ["cancel_requests", "reject_requests"]


# --- Approvals ---------------------------------------------------------------------------------------------


class ApprovalStageInline(ReadOnlyAdminMixin, admin.TabularInline):
    model = ApprovalStage
    fields = ["order", "name", "source", "mode", "state", "note", "decided_at", "decisions"]
    readonly_fields = fields
    extra = 0

    def get_queryset(self, request):
        assignments = ApprovalAssignment.objects.select_related("approver")
        return super().get_queryset(request).prefetch_related(Prefetch("assignments", queryset=assignments))

    @admin.display(description="Decisions")
    def decisions(self, stage):
        return _decisions(stage)


@admin.register(Approval)
class ApprovalAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ["summary", "project", "requester", "route_name", "state", "created_at", "decided_at"]
    list_filter = [
        "state",
        ("subject_type", admin.RelatedOnlyFieldListFilter),
        "project__tenant",
        ("project", ProjectListFilter),
    ]
    list_select_related = ["project__tenant", "requester"]
    search_fields = ["summary", "route_name", "requester__username", "project__slug"]
    date_hierarchy = "created_at"
    fields = [
        "summary",
        "subject_link",
        "project",
        "requester",
        "route_name",
        "rule",
        "state",
        "created_at",
        "decided_at",
        "reminded_at",
    ]
    readonly_fields = ["subject_link"]
    inlines = [ApprovalStageInline]

    @admin.display(description="Subject")
    def subject_link(self, approval):
        subject_type = approval.subject_type
        url = _admin_change_url(subject_type.model_class(), approval.subject_id)
        return format_html('<a href="{}">{} #{}</a>', url, subject_type.name, approval.subject_id)


# --- Approval policies -------------------------------------------------------------------------------------


class ApprovalRuleInline(admin.TabularInline):
    model = ApprovalRule
    fields = ["order", "name", *RULE_CONDITIONS]
    autocomplete_fields = RULE_CONDITION_LOOKUPS
    show_change_link = True
    extra = 0

    def get_queryset(self, request):
        return super().get_queryset(request).select_related("policy")


@admin.register(ApprovalPolicy)
class ApprovalPolicyAdmin(AuditedAdminMixin, admin.ModelAdmin):
    """Policies are tried in order; within a policy the first matching rule decides the route."""

    list_display = ["name", "subject", "order", "active", "rule_count"]
    list_filter = ["subject", "active"]
    ordering = ApprovalPolicy._meta.ordering  # the Count annotation drops Meta.ordering; autocomplete paginates
    search_fields = ["name", "description"]
    inlines = [ApprovalRuleInline]

    def get_queryset(self, request):
        return super().get_queryset(request).annotate(rule_count=Count("rules"))

    @admin.display(ordering="rule_count", description="Rules")
    def rule_count(self, policy):
        return policy.rule_count


_FIELD_NAMING_APPROVERS = {
    ApproverSource.USERS: "users",
    ApproverSource.GROUP: "group",
    ApproverSource.PROJECT_ROLE: "project_role",
}


class ApprovalRuleStageForm(forms.ModelForm):
    """Admin form (the admin supplies model and fields): each approver source names who it means."""

    def clean(self):
        cleaned = super().clean()
        source = cleaned.get("source")
        needed = _FIELD_NAMING_APPROVERS.get(source)
        if needed and not cleaned.get(needed):
            self.add_error(needed, f"A '{ApproverSource(source).label}' stage needs this.")
        return cleaned


class ApprovalRuleStageInline(admin.TabularInline):
    model = ApprovalRuleStage
    form = ApprovalRuleStageForm
    fields = ["order", "name", "source", "mode", "users", "group", "project_role"]
    autocomplete_fields = ["users"]
    extra = 0


@admin.register(ApprovalRule)
class ApprovalRuleAdmin(AuditedAdminMixin, admin.ModelAdmin):
    """A rule's conditions and, inline, its approval stages (rules themselves are listed on their policy)."""

    list_display = ["name", "policy", "order", "stage_count"]
    list_filter = ["policy__subject", "policy"]
    list_select_related = ["policy"]
    search_fields = ["name", "policy__name"]
    autocomplete_fields = ["policy", *RULE_CONDITION_LOOKUPS]
    fieldsets = [(None, {"fields": ["policy", "order", "name"]}), ("Conditions", {"fields": RULE_CONDITIONS})]
    inlines = [ApprovalRuleStageInline]

    def get_queryset(self, request):
        return super().get_queryset(request).annotate(stage_count=Count("stages"))

    @admin.display(ordering="stage_count", description="Stages")
    def stage_count(self, rule):
        return rule.stage_count


# --- Quota change requests ---------------------------------------------------------------------------------


@admin.register(QuotaChangeRequest)
class QuotaChangeRequestAdmin(ApprovalOfSubjectMixin, ReadOnlyAdminMixin, admin.ModelAdmin):
    """Decided through the approval engine; shown here for the record."""

    list_display = ["id", "project", "requested_by", "previous_limits", "limits", "state", "created_at", "decided_at"]
    list_filter = ["state", "project__tenant", ("project", ProjectListFilter)]
    list_select_related = ["project__tenant", "requested_by"]
    search_fields = ["=id", "project__slug", "requested_by__username", "justification"]
    date_hierarchy = "created_at"
    fields = [
        "project",
        "requested_by",
        "state",
        "previous_limits_json",
        "limits_json",
        "justification",
        "created_at",
        "decided_at",
        "approval_decisions",
    ]
    readonly_fields = ["previous_limits_json", "limits_json", "approval_decisions"]

    previous_limits_json = pretty_json("previous_limits", "Previous limits")
    limits_json = pretty_json("limits", "Requested limits")
