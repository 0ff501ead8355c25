"""Operator console for the request workflow: requests, approvals, approval policies, quota change requests.

Requests, approvals and quota change requests are read-only here: their state changes only through services,
which the actions below call. Approval policies, rules and stages are configuration that operators edit.
"""

import json

from django import forms
from django.conf import settings
from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.db.models import Count, Prefetch
from django.db.models.fields.json import KeyTextTransform
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html, format_html_join
from django.utils.timesince import timesince

from catalog.models import BareMetalProfile, Image, ResourceSpec, Service, ServingModel
from config.admin_actions import (
    ObjectAction,
    ObjectActionsMixin,
    ReadOnlyAdminMixin,
    action_with_reason,
    related_list_filter,
)
from config.dashboard import PanelContent, Row, register_panel
from config.errors import DomainError
from requests import approvals, services
from requests.choices import ApprovalState, ApproverSource, Decision, OverQuota, RequestState, StageState
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
from requests.orders import Order
from requests.policy_words import rule_in_words
from requests.selectors import approval_inbox, approval_of
from tenancy.audited_admin import AuditedAdminMixin
from tenancy.choices import PriorityClass
from tenancy.models import Project, User
from tenancy.operators import OPERATOR_GROUP

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
    "reservation",
    "reserved_within_hours",
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


def _my_open_task(user, resource_request) -> ApprovalAssignment | None:
    """The user's undecided task on the request's current approval stage, if any (one query)."""
    return (
        approval_inbox(user=user)
        .filter(stage__approval__subject_type__model="resourcerequest", stage__approval__subject_id=resource_request.pk)
        .first()
    )


def _approve_my_stage(resource_request, comment, actor):
    task = _my_open_task(actor, resource_request)
    if task is None:
        raise DomainError("Nothing on this request waits for your decision.", code="not_your_approval")
    return approvals.approval_decide(assignment=task, decision=Decision.APPROVE, comment=comment, actor=actor)


REQUEST_BUTTONS = [
    ObjectAction(
        name="approve",
        label="Approve stage",
        available=lambda request, obj: (
            obj.state == RequestState.PENDING_APPROVAL and _my_open_task(request.user, obj) is not None
        ),
        act=_approve_my_stage,
        done="your stage approved",
        consequences=lambda obj: [
            "Records your approval of the stage waiting for you; the next stage opens, or the request is queued."
        ],
        reason_required=False,
    ),
    ObjectAction(
        name="reject",
        label="Reject",
        available=lambda request, obj: (
            obj.state == RequestState.PENDING_APPROVAL and request.user.has_perm("requests.change_resourcerequest")
        ),
        act=lambda obj, reason, actor: services.request_reject_by_operator(request=obj, actor=actor, reason=reason),
        done="rejected",
        consequences=lambda obj: ["Ends the request outside its approval route; the requester sees your reason."],
        danger=True,
    ),
    ObjectAction(
        name="cancel",
        label="Cancel request",
        available=lambda request, obj: obj.is_cancellable and request.user.has_perm("requests.change_resourcerequest"),
        act=lambda obj, reason, actor: services.request_cancel(request=obj, actor=actor, reason=reason),
        done="cancelled",
        consequences=lambda obj: [
            f"Withdraws the request (now {obj.get_state_display().lower()}); nothing was allocated to it yet.",
            "The requester is told on the request's timeline. This cannot be undone.",
        ],
        danger=True,
    ),
]


@admin.register(ResourceRequest)
class ResourceRequestAdmin(ObjectActionsMixin, ApprovalOfSubjectMixin, ReadOnlyAdminMixin, admin.ModelAdmin):
    """Requests are never edited here; operators steer them with the cancel and reject actions, and with the
    buttons on a request's page (approve the stage waiting for them, reject, cancel)."""

    object_actions = REQUEST_BUTTONS

    list_display = [
        "id",
        "service",
        "project",
        "tenant",
        "requester",
        "state_badge",
        "priority",
        "cost",
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

    @admin.display(description="Est. cost", ordering="cost_estimate")
    def cost(self, resource_request):
        return f"{resource_request.cost_estimate:.2f} {settings.CATALOG_CURRENCY}"

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


def _rules_with_words(queryset):
    """Rules with what their sentence names loaded (constant queries however many rules)."""
    stages = ApprovalRuleStage.objects.select_related("group").prefetch_related("users").order_by("order", "id")
    return queryset.select_related(
        "policy", "vendor", "accelerator_model", "spec", "tenant", "project__tenant"
    ).prefetch_related(Prefetch("stages", queryset=stages))


class ApprovalRuleInline(admin.TabularInline):
    """A policy's rules as sentences, in the order they are tried; conditions and stages are edited together on
    each rule's page (its change link, or "Add a rule"), so this page stays readable. A rule added here by name
    alone matches every order until it gets conditions; its sentence says so."""

    model = ApprovalRule
    fields = ["order", "name", "in_words"]
    readonly_fields = ["in_words"]
    show_change_link = True
    extra = 0

    def get_queryset(self, request):
        return _rules_with_words(super().get_queryset(request))

    @admin.display(description="Reads as")
    def in_words(self, rule):
        return rule_in_words(rule)


class DryRunForm(forms.Form):
    """An order to test the policies with: what a developer would pick on the order form."""

    project = forms.ModelChoiceField(queryset=Project.objects.select_related("tenant").order_by("tenant__name", "name"))
    requester = forms.ModelChoiceField(
        queryset=User.objects.filter(is_active=True).order_by("username"),
        required=False,
        help_text="Who orders; empty: the project's lead.",
    )
    service = forms.ModelChoiceField(queryset=Service.objects.filter(active=True).order_by("name"))
    spec = forms.ModelChoiceField(queryset=ResourceSpec.objects.order_by("name"), required=False)
    image = forms.ModelChoiceField(queryset=Image.objects.order_by("name"), required=False)
    bare_metal_profile = forms.ModelChoiceField(queryset=BareMetalProfile.objects.order_by("name"), required=False)
    serving_model = forms.ModelChoiceField(queryset=ServingModel.objects.order_by("name"), required=False)
    duration_hours = forms.IntegerField(min_value=1, initial=8)
    priority = forms.ChoiceField(choices=PriorityClass.choices, initial=PriorityClass.STANDARD)
    over_quota = forms.ChoiceField(
        choices=OverQuota.choices,
        initial=OverQuota.REJECT,
        label="If over quota",
        help_text="A quota exception routes differently (rules with 'quota exception: yes').",
    )
    parameters = forms.JSONField(
        required=False, initial=dict, help_text='Form fields, e.g. {"environment": "production"}'
    )
    justification = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 2}))

    def order(self) -> Order:
        data = self.cleaned_data
        return Order(
            service=data["service"],
            project=data["project"],
            duration_hours=data["duration_hours"],
            spec=data["spec"],
            image=data["image"],
            bare_metal_profile=data["bare_metal_profile"],
            serving_model=data["serving_model"],
            priority=data["priority"],
            justification=data["justification"],
            parameters=data["parameters"] or {},
        )

    def orderer(self) -> User:
        return self.cleaned_data["requester"] or self.cleaned_data["project"].lead


@admin.register(ApprovalPolicy)
class ApprovalPolicyAdmin(AuditedAdminMixin, admin.ModelAdmin):
    """Policies are tried in order; within a policy the first matching rule decides the route. "Test with an order"
    shows which rule an order would match and the stages that follow, from the order preview itself."""

    list_display = ["name", "subject", "order", "active", "rule_count"]
    list_filter = ["subject", "active"]
    ordering = ApprovalPolicy._meta.ordering  # the Count annotation drops Meta.ordering; autocomplete paginates
    search_fields = ["name", "description"]
    inlines = [ApprovalRuleInline]
    change_list_template = "admin/requests/approvalpolicy/change_list.html"
    change_form_template = "admin/requests/approvalpolicy/change_form.html"

    def get_queryset(self, request):
        return super().get_queryset(request).annotate(rule_count=Count("rules"))

    @admin.display(ordering="rule_count", description="Rules")
    def rule_count(self, policy):
        return policy.rule_count

    def get_urls(self):
        test = path("test/", self.admin_site.admin_view(self.dry_run_view), name="requests_approvalpolicy_test")
        return [test, *super().get_urls()]

    def dry_run_view(self, request):
        """Preview an order as its requester would (nothing is stored): the matching rule, the stages and who is in
        each, with cost and quota beside it."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        form = DryRunForm(request.GET or None)
        context = {
            **self.admin_site.each_context(request),
            "title": "Test the approval policies with an order",
            "opts": self.model._meta,
            "form": form,
        }
        if form.is_valid():
            try:
                preview = services.request_preview(
                    order=form.order(), requester=form.orderer(), over_quota=form.cleaned_data["over_quota"]
                )
            except DomainError as refusal:
                context["refusal"] = refusal
            else:
                route = preview["approval_route"]
                rule = (
                    _rules_with_words(ApprovalRule.objects.filter(pk=route["rule"])).first() if route["rule"] else None
                )
                context.update(
                    {"preview": preview, "route": route, "rule": rule, "rule_words": rule and rule_in_words(rule)}
                )
        return TemplateResponse(request, "admin/requests/approvalpolicy/dry_run.html", context)

    def changelist_view(self, request, extra_context=None):
        extra = {"dry_run_url": reverse("admin:requests_approvalpolicy_test"), **(extra_context or {})}
        return super().changelist_view(request, extra_context=extra)

    def change_view(self, request, object_id, form_url="", extra_context=None):
        extra = {
            "dry_run_url": reverse("admin:requests_approvalpolicy_test"),
            "add_rule_url": f"{reverse('admin:requests_approvalrule_add')}?policy={object_id}",
            **(extra_context or {}),
        }
        return super().change_view(request, object_id, form_url, extra)


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
    readonly_fields = ["in_words"]
    fieldsets = [
        (None, {"fields": ["policy", "order", "name", "in_words"]}),
        ("Conditions (all must hold; empty means any)", {"fields": RULE_CONDITIONS}),
    ]
    inlines = [ApprovalRuleStageInline]

    def get_queryset(self, request):
        return super().get_queryset(request).annotate(stage_count=Count("stages"))

    @admin.display(description="Reads as")
    def in_words(self, rule):
        return rule_in_words(rule) if rule.pk else "Save the rule to read it as a sentence."

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


# --- The console's home: approvals waiting for operators, the queue by reason ----------------------------------


def _age(moment) -> str:
    return f"waiting {timesince(moment, depth=1)}"


@register_panel("approvals", title="Approvals waiting for operators", order=10)
def approvals_panel(request) -> PanelContent | None:
    """Open approvals whose current stage waits on an operator (three queries)."""
    if not request.user.has_perm("requests.view_approval"):
        return None
    waiting = Approval.objects.filter(
        state=ApprovalState.PENDING,
        stages__state=StageState.PENDING,
        stages__assignments__decision="",
        stages__assignments__approver__groups__name=OPERATOR_GROUP,
    ).distinct()
    oldest = list(waiting.select_related("project__tenant").order_by("created_at", "id")[:5])
    mine = approval_inbox(user=request.user).count()
    return PanelContent(
        count=waiting.count(),
        count_label=f"waiting for operators; {mine} for you",
        tone="warn" if oldest else "",
        rows=[
            Row(approval.summary, _age(approval.created_at), _admin_change_url(Approval, approval.pk))
            for approval in oldest
        ],
        links=[("Open your approval inbox", reverse("portal:approval-inbox"))],
        empty="Nothing waits for an operator's decision.",
    )


def _reason_label(code: str) -> str:
    return code.replace("_", " ").capitalize() if code else "Not seen by a scheduling cycle yet"


@register_panel("queue", title="Queue by reason", order=20)
def queue_panel(request) -> PanelContent | None:
    """Queued requests per wait reason, with requests waiting for quota or approval (two queries)."""
    if not request.user.has_perm("requests.view_resourcerequest"):
        return None
    changelist = reverse("admin:requests_resourcerequest_changelist")
    by_reason = (
        ResourceRequest.objects.filter(state=RequestState.QUEUED)
        .values(code=KeyTextTransform("code", "queue_reason"))
        .annotate(n=Count("id"))
        .order_by("-n", "code")
    )
    waiting = dict(
        ResourceRequest.objects.filter(state__in=[RequestState.WAITING_FOR_QUOTA, RequestState.PENDING_APPROVAL])
        .values_list("state")
        .annotate(n=Count("id"))
        .order_by()
    )
    rows = [Row(_reason_label(row["code"] or ""), str(row["n"])) for row in by_reason]
    queued = sum(int(row.value) for row in rows)
    for state in (RequestState.WAITING_FOR_QUOTA, RequestState.PENDING_APPROVAL):
        rows.append(Row(state.label, str(waiting.get(state, 0)), f"{changelist}?state__exact={state}", "warn"))
    return PanelContent(
        count=queued,
        count_label="queued for the scheduler",
        rows=rows,
        links=[("Queued requests", f"{changelist}?state__exact={RequestState.QUEUED}")],
    )
