"""Operator console for metering: raw telemetry, daily rollups, budget alerts and Slurm's books (all read-only: they
are written by the collector, the rollup, the budget check and the books' reader), and the usage report with the same
figures as the portal page."""

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.db.models.functions import Abs
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils import timezone

from config.admin_actions import ReadOnlyAdminMixin, related_list_filter
from config.dashboard import PanelContent, Row, register_panel
from metering.forms import UsageFilterForm
from metering.models import BudgetAlert, DailyUsage, IdlePolicy, IdleWatch, SlurmBooks, TelemetrySample
from metering.views import usage_context
from tenancy.audited_admin import AuditedAdminMixin


def rounded(field: str, places: int, description: str):
    """A float column as people read it (0.68, not 0.6837000000000001)."""

    @admin.display(description=description, ordering=field)
    def show(modeladmin, obj):
        value = getattr(obj, field)
        return None if value is None else f"{round(value, places):.{places}f}"

    return show


@admin.register(TelemetrySample)
class TelemetrySampleAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ["sampled_at", "allocation", "device", "utilization", "memory_used_mb", "power"]
    fields = ["sampled_at", "allocation", "device", "utilization", "memory_used_mb", "power"]
    readonly_fields = ["utilization", "power"]
    utilization = rounded("utilization_pct", 1, "Utilization %")
    power = rounded("power_w", 1, "Power (W)")
    list_select_related = ["allocation__node", "device__node", "device__model"]
    search_fields = ["=allocation__id", "=allocation__request__id", "device__uuid"]
    show_full_result_count = False  # millions of rows: no second COUNT(*) for the "show all" link


@admin.register(DailyUsage)
class DailyUsageAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    change_list_template = "admin/metering/dailyusage/change_list.html"
    list_display = [
        "day",
        "allocation",
        "accelerator_model",
        "mean_utilization",
        "busy_cards",
        "memory_p95_gb",
        "energy",
    ]
    fields = ["day", "allocation", "accelerator_model", "samples", "mean_utilization", "busy_cards", "memory_p95_gb"]
    fields += ["energy", "updated_at"]
    readonly_fields = ["mean_utilization", "busy_cards", "memory_p95_gb", "energy"]
    busy_cards = rounded("busy_cards_p95", 2, "p95 busy cards")
    energy = rounded("energy_kwh", 2, "Energy (kWh)")
    list_filter = [("accelerator_model", related_list_filter("vendor"))]
    list_select_related = ["allocation__node", "accelerator_model__vendor"]
    search_fields = ["=allocation__id", "=allocation__request__id", "allocation__request__project__slug"]
    date_hierarchy = "day"

    @admin.display(description="Mean utilization %")
    def mean_utilization(self, usage):
        return round(usage.mean_utilization_pct, 1)

    @admin.display(description="p95 memory GiB", ordering="memory_p95_mb")
    def memory_p95_gb(self, usage):
        return round(usage.memory_p95_mb / 1024, 1)

    def get_urls(self):
        report = path("report/", self.admin_site.admin_view(self.report_view), name="metering_usage_report")
        return [report, *super().get_urls()]

    def report_view(self, request):
        if not self.has_view_permission(request):
            raise PermissionDenied
        form = UsageFilterForm(request.GET, user=request.user)
        context = {
            **self.admin_site.each_context(request),
            "title": "Usage report",
            "opts": self.model._meta,
            "form": form,
        }
        if form.is_valid():
            chosen = form.cleaned_data
            context.update(
                usage_context(user=request.user, project=chosen["project"], first=chosen["first"], last=chosen["last"])
            )
        return TemplateResponse(request, "admin/metering/usage_report.html", context)

    def changelist_view(self, request, extra_context=None):
        extra = {"report_url": reverse("admin:metering_usage_report"), **(extra_context or {})}
        return super().changelist_view(request, extra_context=extra)


@admin.register(BudgetAlert)
class BudgetAlertAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ["project", "month", "level", "card_hours", "limit", "percent", "created_at"]
    list_filter = ["level", "month", ("project", related_list_filter("tenant"))]
    list_select_related = ["project__tenant"]
    search_fields = ["project__slug", "project__name"]

    @admin.display(description="%")
    def percent(self, alert):
        return alert.percent


@admin.register(SlurmBooks)
class SlurmBooksAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    """Per request, Slurm's card-hours (sacct) against the platform's, and the difference: the largest first."""

    list_display = ["request", "project", "job_ids", "slurm", "platform", "difference", "final", "read_at"]
    fields = ["request", "job_ids", "slurm", "platform", "difference", "final", "read_at", "jobs"]
    readonly_fields = ["job_ids", "slurm", "platform", "difference"]
    slurm = rounded("slurm_card_hours", 4, "Slurm's card-hours")
    platform = rounded("platform_card_hours", 4, "Metered card-hours")
    difference = rounded("difference_card_hours", 4, "Difference")
    list_filter = ["final", ("request__project", related_list_filter("tenant"))]
    list_select_related = ["request__project__tenant", "request__service"]
    search_fields = ["=request__id", "request__project__slug"]

    def get_ordering(self, request):
        return [Abs("difference_card_hours").desc(), "request_id"]

    @admin.display(description="Project", ordering="request__project__slug")
    def project(self, books):
        return books.request.project

    @admin.display(description="Slurm jobs")
    def job_ids(self, books):
        return ", ".join(str(job["job_id"]) for job in books.jobs)


# --- The console's home: budget alerts -------------------------------------------------------------------------


@register_panel("budgets", title="Budget alerts this month", order=60)
def budgets_panel(request) -> PanelContent | None:
    """Projects that reached a share of their monthly card-hour budget this month, highest level first (two
    queries)."""
    if not request.user.has_perm("metering.view_budgetalert"):
        return None
    month = timezone.now().date().replace(day=1)
    alerts = BudgetAlert.objects.filter(month=month)
    # One row per project: its highest level reached (the alerts' percentages only grow within a month).
    latest = {}
    for alert in alerts.select_related("project__tenant").order_by("project_id", "-card_hours"):
        latest.setdefault(alert.project_id, alert)
    shown = sorted(latest.values(), key=lambda alert: -alert.percent)[:8]
    changelist = reverse("admin:metering_budgetalert_changelist")
    return PanelContent(
        count=len(latest),
        count_label=f"project{'s' if len(latest) != 1 else ''} at a budget threshold",
        tone="warn" if latest else "",
        rows=[
            Row(
                str(alert.project),
                f"{alert.percent} % of {alert.limit.normalize():f} card-hours",
                f"{changelist}?project__id__exact={alert.project_id}",
                "bad" if alert.percent >= 100 else "warn",
            )
            for alert in shown
        ],
        links=[("Budget alerts", changelist), ("Usage report", reverse("admin:metering_usage_report"))],
        empty="No project has reached a budget threshold this month.",
    )


@admin.register(IdlePolicy)
class IdlePolicyAdmin(AuditedAdminMixin, admin.ModelAdmin):
    """Operators set one idle policy per offering: the signals, the idle time, the warning lead, the action and
    the snoozes an owner may take (every change audited)."""

    list_display = ["service", "active", "signals", "idle_minutes", "warning_minutes", "action", "max_snoozes"]
    list_filter = ["active", "action"]
    list_select_related = ["service"]
    autocomplete_fields = ["service"]
    search_fields = ["service__name", "service__slug"]
    fieldsets = [
        (None, {"fields": ["service", "active", "action"]}),
        ("Signals", {"fields": ["watch_utilization", "utilization_below_pct", "watch_sessions", "watch_gateway"]}),
        ("Timing", {"fields": ["idle_minutes", "warning_minutes", "max_snoozes", "snooze_minutes"]}),
    ]

    @admin.display(description="Signals")
    def signals(self, policy):
        watched = [
            f"utilisation < {policy.utilization_below_pct:g}%" if policy.watch_utilization else "",
            "no sessions" if policy.watch_sessions else "",
            "no gateway calls" if policy.watch_gateway else "",
        ]
        return ", ".join(word for word in watched if word)


@admin.register(IdleWatch)
class IdleWatchAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    """Where each request stands with its idle policy (written by the sweep and the owners' snoozes)."""

    list_display = ["request", "idle_since", "warned_at", "acts_at", "snoozes", "snoozed_until", "idle_card_hours"]
    fields = [*list_display, "reasons", "updated_at"]
    list_select_related = ["request"]
    search_fields = ["=request__id", "request__project__slug"]

    @admin.display(description="Idle card-hours")
    def idle_card_hours(self, watch):
        return f"{watch.idle_card_seconds / 3600:.2f}"
