"""Operator console for provisioning: runs with their steps, filters by state, driver and step, and retry; connect
secrets (never their values) with an audited reveal. Serving deployments and keys are in serving/admin.py."""

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import F, OuterRef, Q, Subquery
from django.http import Http404, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.cache import add_never_cache_headers

from config.admin_actions import (
    ObjectAction,
    ObjectActionsMixin,
    ReadOnlyAdminMixin,
    ReasonForm,
    action_with_reason,
)
from config.dashboard import PanelContent, Row, register_panel
from config.errors import DomainError
from provisioning import services
from provisioning.choices import FORCEABLE_KINDS, RunKind, RunState
from provisioning.connect import connect_secret_reveal, label_of
from provisioning.models import ConnectSecret, ProvisioningRun, ProvisioningStep
from requests.choices import RequestState
from scheduling.choices import AllocationState


class StepInline(ReadOnlyAdminMixin, admin.TabularInline):
    model = ProvisioningStep
    fields = [
        "position",
        "name",
        "state",
        "attempts",
        "max_attempts",
        "started_at",
        "finished_at",
        "duration",
        "error",
        "log",
    ]
    readonly_fields = fields
    ordering = ["position"]
    extra = 0

    @admin.display(description="Seconds")
    def duration(self, step):
        return step.duration_seconds


class StepFilter(admin.SimpleListFilter):
    """The run's current step (where it is, or where it failed)."""

    title = "step"
    parameter_name = "step"

    def lookups(self, request, model_admin):
        names = ProvisioningStep.objects.values_list("name", flat=True).distinct().order_by("name")
        return [(name, name) for name in names]

    def queryset(self, request, queryset):
        if self.value():
            return queryset.filter(current_step=self.value())
        return queryset


def _retry(run: ProvisioningRun, reason: str, actor) -> ProvisioningRun:
    return services.run_retry(run=run, actor=actor, reason=reason)


def _retryable(request, run: ProvisioningRun) -> bool:
    return (
        services.can_retry(request.user)
        and run.kind == RunKind.PROVISION
        and run.state == RunState.FAILED
        and run.request.state == RequestState.FAILED
        and not run.retries.exists()
    )


def _force(run: ProvisioningRun, reason: str, actor) -> ProvisioningRun:
    return services.teardown_force(run=run, actor=actor, reason=reason)


def _forceable(request, run: ProvisioningRun) -> bool:
    return (
        services.can_force_release(request.user)
        and services.teardown_forceable(run)
        and run.allocation.state == AllocationState.ACTIVE
    )


RUN_BUTTONS = [
    ObjectAction(
        name="retry",
        label="Retry from the failed step",
        available=_retryable,
        act=_retry,
        done="retried",
        consequences=lambda run: [
            f"Starts a new run on the same devices from step '{run.failure.get('step', '?')}' (or the first earlier "
            "step whose effect the cleanup undid); the request goes back to provisioning.",
            "Counts as a manual intervention; the reason goes on the request's timeline.",
        ],
    ),
    ObjectAction(
        name="force_release",
        label="Workload is gone: return the devices",
        available=_forceable,
        act=_force,
        done="returned its devices",
        consequences=lambda run: [
            "Only when you know the workload no longer runs (the backend never confirmed it): the teardown stops "
            "where it is and the devices go back to the pool, where the scheduler may place other work at once.",
            "A release ends `released`; the reason goes on the request's timeline and the audit trail.",
        ],
    ),
]


@admin.register(ProvisioningRun)
class ProvisioningRunAdmin(ObjectActionsMixin, ReadOnlyAdminMixin, admin.ModelAdmin):
    object_actions = RUN_BUTTONS
    list_display = [
        "id",
        "request",
        "kind",
        "pipeline",
        "driver",
        "state",
        "current_step",
        "failed_because",
        "created_at",
        "finished_at",
    ]
    list_filter = ["state", "driver", "kind", "pipeline", StepFilter]
    list_select_related = ["request__service", "request__project"]
    search_fields = ["=request__id", "allocation__node__name"]
    date_hierarchy = "created_at"
    inlines = [StepInline]
    readonly_fields = [
        "request",
        "allocation",
        "kind",
        "pipeline",
        "driver",
        "state",
        "reason",
        "current_position",
        "retry_of",
        "failure",
        "delivered",
        "installer_reported_at",
        "installer_report",
        "created_at",
        "finished_at",
    ]
    exclude = ["installer_token_hash", "installer_token_nonce"]
    actions = [
        action_with_reason(
            name="retry_runs",
            description="Retry selected failed runs from the failed step",
            verb="Retried",
            permission="retry",
            change=_retry,
        ),
        action_with_reason(
            name="force_release_runs",
            description="Workload is gone: return the devices of selected teardowns",
            verb="Returned the devices of",
            permission="force_release",
            change=_force,
        ),
    ]

    def has_retry_permission(self, request):
        return services.can_retry(request.user)

    def has_force_release_permission(self, request):
        return services.can_force_release(request.user)

    def get_queryset(self, request):
        current = ProvisioningStep.objects.filter(run=OuterRef("pk"), position=OuterRef("current_position"))
        return super().get_queryset(request).annotate(current_step=Subquery(current.values("name")[:1]))

    @admin.display(description="Current step", ordering="current_step")
    def current_step(self, run):
        return run.current_step or "—"

    @admin.display(description="Failure")
    def failed_because(self, run):
        return f"{run.failure['step']}: {run.failure['code']}" if run.failure else ""


@admin.register(ProvisioningStep)
class ProvisioningStepAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ["id", "run", "position", "name", "state", "attempts", "started_at", "finished_at"]
    list_filter = ["state", "name"]
    list_select_related = ["run"]
    search_fields = ["=run__id", "=run__request__id", "name"]
    ordering = [F("run_id").desc(), "position"]


@admin.register(ConnectSecret)
class ConnectSecretAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    """Which running workloads are opened with a secret of their requester's (never its value). An operator who must
    act as the requester reveals one, with a reason: an audit row and a note on the request's timeline, which the
    requester sees (provisioning/connect.py)."""

    list_display = ["__str__", "request", "name", "created_at", "rotated_at"]
    list_select_related = ["request__service", "request__project"]
    search_fields = ["=request__id", "name"]
    fields = ["request", "allocation", "name", "created_at", "rotated_at"]
    readonly_fields = fields
    change_form_template = "admin/change_form_with_actions.html"

    def get_urls(self):
        reveal = path(
            "<path:object_id>/reveal/",
            self.admin_site.admin_view(self.reveal_view),
            name="provisioning_connectsecret_reveal",
        )
        return [reveal, *super().get_urls()]

    def change_view(self, request, object_id, form_url="", extra_context=None):
        buttons = (
            [
                {
                    "label": "Reveal…",
                    "url": reverse("admin:provisioning_connectsecret_reveal", args=[object_id]),
                    "name": "reveal",
                    "danger": True,
                }
            ]
            if request.user.has_perm("provisioning.reveal_connectsecret")
            else []
        )
        return super().change_view(request, object_id, form_url, {"object_actions": buttons, **(extra_context or {})})

    def reveal_view(self, request, object_id):
        secret = self.get_object(request, object_id)
        if secret is None:
            raise Http404("No such connect secret.")
        if not request.user.has_perm("provisioning.reveal_connectsecret"):
            raise PermissionDenied("Revealing a connect secret needs the reveal permission.")
        back = reverse("admin:provisioning_connectsecret_change", args=[secret.pk])
        form = ReasonForm(request.POST or None)
        context = {**self.admin_site.each_context(request), "opts": self.model._meta, "object": secret}
        if request.method == "POST" and form.is_valid():
            try:
                value = connect_secret_reveal(secret=secret, actor=request.user, reason=form.cleaned_data["reason"])
            except DomainError as refusal:
                self.message_user(request, f"{secret}: {refusal.message}", messages.ERROR)
                return HttpResponseRedirect(back)
            revealed = TemplateResponse(
                request,
                "admin/provisioning/connectsecret/revealed.html",
                {**context, "title": f"Revealed: {secret}", "value": value, "label": label_of(secret.name)},
            )
            add_never_cache_headers(revealed)
            return revealed
        return TemplateResponse(
            request,
            "admin/object_action_confirm.html",
            {
                **context,
                "title": f"Reveal: {secret}",
                "action": {"label": f"Reveal the {label_of(secret.name)}", "reason_required": True},
                "consequences": [
                    f"Shows the {label_of(secret.name)} of request #{secret.request_id}, which opens its workload as "
                    "its requester.",
                    "Your name and reason go on the console's audit trail and on the request's timeline, which the "
                    "requester sees.",
                ],
                "form": form,
                "back_url": back,
            },
            status=400 if form.is_bound else 200,
        )


@register_panel("failed_runs", title="Failed provisioning runs", order=30)
def failed_runs_panel(request) -> PanelContent | None:
    """Provisioning runs that failed and wait for an operator: a provisioning (the request still failed, no retry
    yet), or a teardown the backend refused whose devices are still held (to force once the workload is gone). Two
    queries."""
    if not request.user.has_perm("provisioning.view_provisioningrun"):
        return None
    waiting = ProvisioningRun.objects.filter(
        Q(kind=RunKind.PROVISION, request__state=RequestState.FAILED, retries__isnull=True)
        | Q(kind__in=FORCEABLE_KINDS, allocation__state=AllocationState.ACTIVE),
        state=RunState.FAILED,
    )
    latest = list(waiting.order_by("-finished_at", "-id")[:5])
    changelist = reverse("admin:provisioning_provisioningrun_changelist")
    return PanelContent(
        count=waiting.count(),
        count_label="failed, waiting for a retry, a release or a forced return",
        tone="bad" if latest else "",
        rows=[
            Row(
                f"Run #{run.pk} of request #{run.request_id}",
                run.failure.get("step", ""),
                reverse("admin:provisioning_provisioningrun_change", args=[run.pk]),
                "bad",
                run.failure.get("message", ""),
            )
            for run in latest
        ],
        links=[("Failed runs", f"{changelist}?state__exact={RunState.FAILED}")],
        empty="No failed run waits for an operator.",
    )
