"""Operator console for inventory: cordons, isolation and clearances go through scheduling services (audited).

Cordon state, health, isolation and allocated shares are read-only in every form; they change only through the
actions here, health ingestion and the scheduler. Every changelist runs a constant number of queries.
"""

from django import forms
from django.conf import settings
from django.contrib import admin
from django.contrib.admin.widgets import FilteredSelectMultiple
from django.core.exceptions import PermissionDenied
from django.db.models import Count, Q
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils import timezone
from django.utils.html import format_html

from config.admin_actions import ReadOnlyAdminMixin, action_with_reason, related_list_filter
from config.dashboard import PanelContent, Row, register_panel
from config.errors import DomainError
from config.words import joined_without_repeat
from scheduling import selectors, services
from scheduling.choices import DeviceHealth
from scheduling.engine import MILLI
from scheduling.inventory import agents
from scheduling.mig import services as mig_services
from scheduling.models import (
    DEVICE_STATE_FIELDS,
    NODE_STATE_FIELDS,
    AgentToken,
    Allocation,
    AllocationDevice,
    BackendStatus,
    Block,
    Device,
    HealthEvent,
    HealthRule,
    IsolationClearance,
    MaintenanceWindow,
    MigInstance,
    Node,
    PreemptionRule,
    Rack,
    Site,
)
from tenancy.audited_admin import AuditedAdminMixin


class AuditedInventoryMixin(AuditedAdminMixin):
    """Adds and edits go through the inventory service, which also refuses fields only actions may change."""

    def entry_save(self, entry, changed_fields, actor):
        return services.inventory_entry_save(entry=entry, changed_fields=changed_fields, actor=actor)


class ReadOnlyAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    """History: operators look, nobody edits here."""


def _badge(ok: bool, good: str, bad: str):
    colour = "#2e7d32" if ok else "#c62828"
    return format_html(
        '<span style="color:#fff;background:{};padding:1px 6px;border-radius:8px">{}</span>',
        colour,
        good if ok else bad,
    )


@admin.register(Site)
class SiteAdmin(AuditedInventoryMixin, admin.ModelAdmin):
    list_display = ["name", "rack_count"]
    search_fields = ["name"]

    def get_queryset(self, request):
        return super().get_queryset(request).annotate(rack_count=Count("racks"))

    @admin.display(description="Racks", ordering="rack_count")
    def rack_count(self, site):
        return site.rack_count


@admin.register(Block)
class BlockAdmin(AuditedInventoryMixin, admin.ModelAdmin):
    list_display = ["name", "site", "rack_count"]
    list_filter = ["site"]
    list_select_related = ["site"]
    search_fields = ["name", "site__name"]

    def get_queryset(self, request):
        return super().get_queryset(request).annotate(rack_count=Count("racks"))

    @admin.display(description="Racks", ordering="rack_count")
    def rack_count(self, block):
        return block.rack_count


@admin.register(Rack)
class RackAdmin(AuditedInventoryMixin, admin.ModelAdmin):
    list_display = ["name", "site", "block", "node_count"]
    list_filter = ["site", "block"]
    list_select_related = ["site", "block"]
    search_fields = ["name", "site__name", "block__name"]

    def get_queryset(self, request):
        return super().get_queryset(request).annotate(node_count=Count("nodes"))

    @admin.display(description="Nodes", ordering="node_count")
    def node_count(self, rack):
        return rack.node_count


class DeviceInline(admin.TabularInline):
    model = Device
    fields = [
        "index",
        "uuid",
        "serial_number",
        "model",
        "memory_gb",
        "health",
        "isolated",
        "allocated_milli",
        "mig_mode",
        "mig_layout",
    ]
    readonly_fields = fields
    extra = 0
    can_delete = False
    show_change_link = True

    def has_add_permission(self, request, obj=None):
        return False

    def get_queryset(self, request):
        return (
            super()
            .get_queryset(request)
            .select_related("model__vendor", "node")
            .prefetch_related("mig_instances__profile")
        )

    @admin.display(description="MIG layout")
    def mig_layout(self, device):
        return mig_layout_text(device)


def _running_requests(*, outcome: str, **where) -> list[dict]:
    return [{**row, "outcome": outcome} for row in selectors.running_requests_on(**where)]


def _isolation_outcome() -> str:
    if settings.SCHEDULER_REQUEUE_ON_ISOLATION:
        return "is stopped and goes back to the queue for healthy hardware"
    return "keeps its allocation; new placements avoid the card"


@admin.register(Node)
class NodeAdmin(AuditedInventoryMixin, admin.ModelAdmin):
    change_list_template = "admin/scheduling/node/change_list.html"
    list_display = [
        "name",
        "rack",
        "topology_domain",
        "execution_backend",
        "cpu_cores",
        "memory_gib",
        "device_count",
        "allocated_free",
        "schedulable_badge",
    ]
    list_filter = [
        "schedulable",
        "execution_backend",
        ("rack__site", related_list_filter()),
        ("rack", related_list_filter("site")),
        "topology_domain",
    ]
    search_fields = ["name", "serial_number", "topology_domain", "bmc_address"]
    readonly_fields = [*NODE_STATE_FIELDS, "created_at", "updated_at"]
    fieldsets = [
        (
            None,
            {
                "fields": [
                    "name",
                    "serial_number",
                    "rack",
                    "topology_domain",
                    "execution_backend",
                    "cpu_milli",
                    "memory_mib",
                ]
            },
        ),
        ("BMC", {"fields": ["bmc_address", "bmc_credentials_ref", "bmc_inventory_address"]}),
        ("In-band (the installed server, for the Ansible driver)", {"fields": ["os_address", "ssh_credentials_ref"]}),
        (
            "Serving runtimes (reported by `manage.py report_serving_runtimes`, or set here)",
            {"fields": ["serving_runtimes"]},
        ),
        (
            "Cordon (use the Cordon / Uncordon actions)",
            {"fields": ["schedulable", "cordon_reason", "cordoned_at", "cordoned_by"]},
        ),
        ("MIG layout (use the Pin / Unpin MIG layout actions)", {"fields": ["mig_layout_pinned", "mig_pin_reason"]}),
        ("History", {"fields": ["created_at", "updated_at"]}),
    ]
    inlines = [DeviceInline]
    actions = [
        action_with_reason(
            name="cordon_nodes",
            description="Cordon selected nodes (no new placements)",
            verb="Cordoned",
            permission="change",
            change=lambda node, reason, actor: services.node_cordon(node=node, reason=reason, actor=actor),
            affected=lambda nodes: _running_requests(
                node_ids=[node.pk for node in nodes], outcome="keeps running; new placements avoid the node"
            ),
        ),
        action_with_reason(
            name="uncordon_nodes",
            description="Uncordon selected nodes",
            verb="Uncordoned",
            permission="change",
            change=lambda node, reason, actor: services.node_uncordon(node=node, reason=reason, actor=actor),
        ),
        action_with_reason(
            name="pin_mig_layout",
            description="Pin the MIG layout of selected nodes (no repartitioning)",
            verb="Pinned the MIG layout of",
            permission="change",
            change=lambda node, reason, actor: mig_services.node_mig_pin(node=node, reason=reason, actor=actor),
        ),
        action_with_reason(
            name="unpin_mig_layout",
            description="Unpin the MIG layout of selected nodes",
            verb="Unpinned the MIG layout of",
            permission="change",
            change=lambda node, reason, actor: mig_services.node_mig_unpin(node=node, reason=reason, actor=actor),
        ),
    ]

    def get_queryset(self, request):
        return selectors.nodes_with_capacity().select_related("cordoned_by")

    def get_urls(self):
        capacity = path("capacity/", self.admin_site.admin_view(self.capacity_view), name="scheduling_capacity")
        calendar = path(
            "reservations/", self.admin_site.admin_view(self.reservations_view), name="scheduling_reservations"
        )
        return [capacity, calendar, *super().get_urls()]

    def reservations_view(self, request):
        """The calendar of advance reservations per accelerator spec and site (scheduling.selectors)."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        context = {
            **self.admin_site.each_context(request),
            "title": "Advance reservations by accelerator and site",
            "opts": self.model._meta,
            "groups": selectors.reservation_calendar(now=timezone.now()),
        }
        return TemplateResponse(request, "admin/scheduling/reservations.html", context)

    def capacity_view(self, request):
        if not self.has_view_permission(request):
            raise PermissionDenied
        context = {
            **self.admin_site.each_context(request),
            "title": "Capacity by accelerator model",
            "opts": self.model._meta,
            "models": [
                {
                    **row,
                    "display_name": joined_without_repeat(row["vendor"], row["name"]),
                    "free_words": free_cards_in_words(row),
                }
                for row in selectors.capacity_by_model()
            ],
            "sites": selectors.capacity_by_domain(),
        }
        return TemplateResponse(request, "admin/scheduling/capacity.html", context)

    def changelist_view(self, request, extra_context=None):
        extra = {
            "capacity_url": reverse("admin:scheduling_capacity"),
            "reservations_url": reverse("admin:scheduling_reservations"),
            **(extra_context or {}),
        }
        return super().changelist_view(request, extra_context=extra)

    @admin.display(description="CPU cores", ordering="cpu_milli")
    def cpu_cores(self, node):
        return f"{node.cpu_milli / 1000:g}"

    @admin.display(description="Memory GiB", ordering="memory_mib")
    def memory_gib(self, node):
        return f"{node.memory_mib / 1024:g}"

    @admin.display(description="Devices", ordering="device_count")
    def device_count(self, node):
        return node.device_count

    @admin.display(description="Allocated / free cards")
    def allocated_free(self, node):
        free = node.free_milli if node.schedulable else 0
        return f"{node.allocated_milli / MILLI:g} / {free / MILLI:g}"

    @admin.display(description="Schedulable", ordering="schedulable")
    def schedulable_badge(self, node):
        return _badge(node.schedulable, "schedulable", "cordoned")


def _mig_mode_action(mig_mode: bool, drain: bool):
    """Switch MIG-capable cards to MIG or whole mode: refused while work runs on a card (the allocations named), or,
    with ``drain``, once that work has ended (no new work meanwhile)."""
    mode = "MIG" if mig_mode else "whole-card"
    if drain:
        outcome = f"keeps running; the card takes no new work and switches to {mode} mode when it ends"
    else:
        outcome = "keeps running; the switch is refused while it runs (use the drain action)"
    return action_with_reason(
        name=f"switch_to_{'mig' if mig_mode else 'whole'}_mode{'_after_drain' if drain else ''}",
        description=f"Switch selected cards to {mode} mode{' once their running work ends (drain)' if drain else ''}",
        verb=f"Switched (or set to switch after a drain) to {mode} mode" if drain else f"Switched to {mode} mode",
        permission="change",
        change=lambda device, reason, actor: mig_services.device_mig_mode_switch(
            device=device, mig_mode=mig_mode, reason=reason, actor=actor, drain=drain
        ),
        affected=lambda devices: _running_requests(device_ids=[device.pk for device in devices], outcome=outcome),
    )


def _request_clearance(device, reason, actor):
    services.isolation_clearance_request(device=device, reason=reason, actor=actor)


def mig_layout_text(device) -> str:
    """'3g.40gb@0+4 (GI 1, MIG-…), 4g.40gb@4…' from prefetched instances; '' in whole mode."""
    if not device.mig_mode:
        return ""
    parts = []
    for instance in device.mig_instances.all():
        ids = f"GI {instance.gi_id}" if instance.gi_id is not None else "GI ?"
        held = f", held by allocation {instance.allocation_id}" if instance.allocation_id else ", free"
        parts.append(f"{instance.profile.name}@{instance.start}+{instance.size} ({ids}{held}) {instance.uuid}".strip())
    return "; ".join(parts) or "MIG mode, no instances"


class MigInstanceInline(admin.TabularInline):
    model = MigInstance
    fields = ["profile", "start", "size", "gi_id", "ci_id", "uuid", "allocation", "created_by_scheduler"]
    readonly_fields = fields
    extra = 0
    can_delete = False

    def has_add_permission(self, request, obj=None):
        return False


@admin.register(Device)
class DeviceAdmin(AuditedInventoryMixin, admin.ModelAdmin):
    list_display = ["__str__", "uuid", "serial_number", "model", "memory_gb", "health", "isolated", "allocated_milli"]
    list_filter = [("model", related_list_filter("vendor")), "health", "isolated", ("node", related_list_filter())]
    list_select_related = ["node", "model__vendor"]
    search_fields = ["uuid", "serial_number", "node__name", "node__serial_number"]
    readonly_fields = [*DEVICE_STATE_FIELDS, "updated_at"]
    fieldsets = [
        (None, {"fields": ["node", "index", "uuid", "serial_number", "model", "memory_gb"]}),
        (
            "Health and isolation (use the Mark healthy / Isolate / clearance actions)",
            {
                "fields": [
                    "health",
                    "health_detail",
                    "degraded_by",
                    "clear_since",
                    "isolated",
                    "isolation_reason",
                    "isolated_at",
                ]
            },
        ),
        (
            "Scheduling (use the Switch … mode actions)",
            {"fields": ["allocated_milli", "mig_mode", "mig_mode_wanted", "updated_at"]},
        ),
    ]
    inlines = [MigInstanceInline]
    actions = [
        action_with_reason(
            name="isolate_devices",
            description="Isolate selected devices (no new placements)",
            verb="Isolated",
            permission="change",
            change=lambda device, reason, actor: services.device_isolate(device=device, reason=reason, actor=actor),
            affected=lambda devices: _running_requests(
                device_ids=[device.pk for device in devices], outcome=_isolation_outcome()
            ),
        ),
        action_with_reason(
            name="mark_healthy",
            description="Mark selected degraded devices healthy",
            verb="Marked healthy",
            permission="change",
            change=lambda device, reason, actor: services.device_mark_healthy(
                device=device, reason=reason, actor=actor
            ),
        ),
        action_with_reason(
            name="request_isolation_clearance",
            description="Request isolation clearance (a second holder approves)",
            verb="Requested clearance of",
            permission="clear_isolation",
            change=_request_clearance,
        ),
        *(_mig_mode_action(mig_mode, drain) for mig_mode in (True, False) for drain in (False, True)),
    ]

    def has_clear_isolation_permission(self, request):
        return request.user.has_perm(services.CLEAR_ISOLATION)

    def get_queryset(self, request):
        return super().get_queryset(request).select_related("node", "model__vendor")


@admin.register(Allocation)
class AllocationAdmin(ReadOnlyAdmin):
    list_display = [
        "id",
        "request",
        "replica",
        "node",
        "state",
        "device_count",
        "cpu_milli",
        "priority",
        "started_at",
        "expires_at",
        "preempt_at",
        "released_at",
        "slurm_job_id",
    ]
    list_filter = ["state", "preemptible"]
    list_select_related = ["node", "request__service", "request__project"]
    search_fields = ["node__name", "=request__id", "=slurm_job_id"]
    date_hierarchy = "started_at"

    def get_queryset(self, request):
        return (
            super()
            .get_queryset(request)
            .select_related("node", "request__service", "request__project")
            .annotate(device_count=Count("devices"))
        )

    @admin.display(description="Devices", ordering="device_count")
    def device_count(self, allocation):
        return allocation.device_count


@admin.register(AllocationDevice)
class AllocationDeviceAdmin(ReadOnlyAdmin):
    list_display = ["allocation", "device", "milli"]
    list_select_related = ["allocation__node", "device__node", "device__model__vendor"]
    search_fields = ["device__uuid", "device__node__name"]


@admin.register(IsolationClearance)
class IsolationClearanceAdmin(ReadOnlyAdmin):
    list_display = ["device", "state", "requested_by", "approved_by", "reason", "created_at", "decided_at"]
    list_filter = ["state"]
    list_select_related = ["device__node", "device__model__vendor", "requested_by", "approved_by"]
    search_fields = ["device__uuid", "device__node__name", "requested_by__username", "reason"]


@admin.register(HealthRule)
class HealthRuleAdmin(AuditedInventoryMixin, admin.ModelAdmin):
    list_display = [
        "name",
        "source",
        "signal",
        "comparison",
        "threshold",
        "action",
        "recovery_threshold",
        "recover_after_minutes",
        "active",
    ]
    list_filter = ["source", "action", "active"]
    list_editable = ["active"]
    search_fields = ["name", "signal"]


@admin.register(HealthEvent)
class HealthEventAdmin(ReadOnlyAdmin):
    list_display = ["received_at", "device", "source", "signal", "value", "action", "rule"]
    list_filter = ["source", "action"]
    list_select_related = ["device__node", "device__model__vendor", "rule"]
    search_fields = ["device__uuid", "device__node__name", "signal"]
    date_hierarchy = "received_at"


@admin.register(MaintenanceWindow)
class MaintenanceWindowAdmin(AuditedInventoryMixin, admin.ModelAdmin):
    """Nodes taken out for a window: the scheduler keeps work that would still run at its start off them and runs
    nothing there until its end, saying so to the waiting orders."""

    list_display = ["starts_at", "ends_at", "reason", "node_names"]
    filter_horizontal = ["nodes"]
    date_hierarchy = "starts_at"

    def get_queryset(self, request):
        return super().get_queryset(request).prefetch_related("nodes")

    @admin.display(description="Nodes")
    def node_names(self, window):
        return ", ".join(node.name for node in window.nodes.all())


@admin.register(PreemptionRule)
class PreemptionRuleAdmin(AuditedInventoryMixin, admin.ModelAdmin):
    """Which priority class may preempt which, with the victims' grace period; the scheduler reads active rules.
    A rule crosses tenants only when `cross_tenant` is ticked here (on its change page, never from the list)."""

    list_display = ["preemptor", "victim", "grace_period_seconds", "cross_tenant", "active"]
    list_filter = ["preemptor", "victim", "cross_tenant", "active"]
    list_editable = ["grace_period_seconds", "active"]


class AgentTokenIssueForm(forms.Form):
    name = forms.CharField(max_length=80, help_text="What uses it, e.g. the agent's host name.")
    site = forms.ModelChoiceField(
        Site.objects.all(),
        required=False,
        help_text="Without nodes chosen: every node of this site, including later ones.",
    )
    nodes = forms.ModelMultipleChoiceField(
        Node.objects.all(),
        required=False,
        widget=FilteredSelectMultiple("nodes", is_stacked=False),
        help_text="The nodes the agent speaks for (in the site, if one is set).",
    )


@admin.register(AgentToken)
class AgentTokenAdmin(admin.ModelAdmin):
    """Operators issue node agents' tokens here (the secret is shown once) and revoke them; nothing else is
    editable. Issuing and revoking are audited."""

    list_display = ["name", "prefix", "speaks_for", "created_by", "created_at", "last_used_at", "revoked_at"]
    list_filter = [("revoked_at", admin.EmptyFieldListFilter), "site"]
    list_select_related = ["site", "created_by"]
    search_fields = ["name", "prefix", "nodes__name", "site__name"]
    exclude = ["hashed"]
    actions = [
        action_with_reason(
            name="revoke_agent_tokens",
            description="Revoke selected agent tokens",
            verb="Revoked",
            permission="revoke",
            change=lambda token, reason, actor: agents.agent_token_revoke(token=token, reason=reason, actor=actor),
        )
    ]

    def get_queryset(self, request):
        return super().get_queryset(request).prefetch_related("nodes")

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False  # revoked tokens stay for the audit trail

    def has_revoke_permission(self, request):
        return request.user.has_perm("scheduling.change_agenttoken")

    @admin.display(description="Speaks for")
    def speaks_for(self, token):
        if token.whole_site:
            return f"every node of {token.site.name}"
        return ", ".join(sorted(node.name for node in token.nodes.all())) or "nothing"

    def add_view(self, request, form_url="", extra_context=None):
        """Issue through the service and show the secret once, on a page of its own (never in a message or log)."""
        if not self.has_add_permission(request):
            raise PermissionDenied
        form = AgentTokenIssueForm(request.POST or None)
        if request.method == "POST" and form.is_valid():
            try:
                issued = agents.agent_token_issue(actor=request.user, **form.cleaned_data)
            except DomainError as refusal:
                form.add_error(None, refusal.message)
            else:
                return self._page(
                    request, "issued", f"Agent token {issued.token} issued", token=issued.token, secret=issued.secret
                )
        return self._page(request, "issue", "Issue an agent token", form=form, media=self.media + form.media)

    def _page(self, request, template: str, title: str, **context):
        context = {**self.admin_site.each_context(request), "title": title, "opts": self.model._meta, **context}
        return TemplateResponse(request, f"admin/scheduling/agenttoken/{template}.html", context)


# --- The console's home: isolated and degraded devices, capacity with queued demand -----------------------------


@admin.register(BackendStatus)
class BackendStatusAdmin(ReadOnlyAdmin):
    """Whether each execution backend answers as a whole; the platform sets and clears it (scheduling/backends.py)."""

    list_display = ["backend", "answering", "unavailable_since", "cause_message", "recovered_at"]
    readonly_fields = ["backend", "unavailable_since", "cause", "recovered_at", "watched_until"]

    @admin.display(description="Answering")
    def answering(self, status):
        return _badge(not status.unavailable, "answering", "unavailable")

    @admin.display(description="Last cause")
    def cause_message(self, status):
        return status.cause.get("message", "")


@register_panel("backends", title="Execution backends", order=5)
def backends_panel(request) -> PanelContent | None:
    """Backends that do not answer as a whole (a Slurm controller down): new orders for their nodes wait, nothing
    fails and no node is cordoned for it (one query)."""
    if not request.user.has_perm("scheduling.view_backendstatus"):
        return None
    statuses = list(BackendStatus.objects.order_by("backend"))
    unavailable = [status for status in statuses if status.unavailable]
    return PanelContent(
        count=len(unavailable),
        count_label="unavailable: new orders for their nodes wait",
        tone="bad" if unavailable else "",
        rows=[
            Row(
                status.get_backend_display(),
                "unavailable",
                reverse("admin:scheduling_backendstatus_change", args=[status.pk]),
                "bad",
                f"{status.message} Last answer: {status.cause.get('message', '')}",
            )
            for status in unavailable
        ],
        links=[("Backend statuses", reverse("admin:scheduling_backendstatus_changelist"))],
        empty="Every execution backend answers.",
    )


@register_panel("devices", title="Isolated and degraded devices", order=40)
def devices_panel(request) -> PanelContent | None:
    """Devices out of service or degraded, the first ten listed (two queries)."""
    if not request.user.has_perm("scheduling.view_device"):
        return None
    troubled = Device.objects.filter(Q(isolated=True) | ~Q(health=DeviceHealth.HEALTHY))
    counts = troubled.aggregate(
        isolated=Count("id", filter=Q(isolated=True)),
        degraded=Count("id", filter=Q(health=DeviceHealth.DEGRADED)),
        unhealthy=Count("id", filter=Q(health=DeviceHealth.UNHEALTHY)),
        total=Count("id"),
    )
    shown = troubled.select_related("node", "model").order_by("-isolated", "node__name", "index")[:10]
    changelist = reverse("admin:scheduling_device_changelist")
    return PanelContent(
        count=counts["total"],
        count_label=f"{counts['isolated']} isolated, {counts['degraded']} degraded, {counts['unhealthy']} unhealthy",
        tone="bad" if counts["isolated"] or counts["unhealthy"] else ("warn" if counts["total"] else ""),
        rows=[
            Row(
                f"{device.node.name} #{device.index} ({device.model.name})",
                "isolated" if device.isolated else device.get_health_display().lower(),
                reverse("admin:scheduling_device_change", args=[device.pk]),
                "bad" if device.isolated or device.health == DeviceHealth.UNHEALTHY else "warn",
                device.isolation_reason or device.health_detail,
            )
            for device in shown
        ],
        links=[
            ("Isolated devices", f"{changelist}?isolated__exact=1"),
            ("Degraded devices", f"{changelist}?health__exact={DeviceHealth.DEGRADED}"),
        ],
        empty="Every device is healthy and in service.",
    )


def free_cards_in_words(row: dict) -> str:
    """Free cards as a person counts them: "15", or "15 + 1 partly" when a card has a share or slice in use
    (never "15.858")."""
    partly = f" + {row['partly_free']} partly" if row["partly_free"] else ""
    return f"{row['free_whole']}{partly}"


@register_panel("capacity", title="Capacity per accelerator model", order=50)
def capacity_panel(request) -> PanelContent | None:
    """Cards per model (total, healthy, free) beside the cards queued requests wait for (three queries)."""
    if not request.user.has_perm("scheduling.view_node"):
        return None
    demand = selectors.queued_demand_by_model()
    rows = selectors.capacity_by_model()
    known = {row["model_id"] for row in rows}
    table = [
        [
            joined_without_repeat(row["vendor"], row["name"]),
            str(row["total"]),
            str(row["healthy"]),
            free_cards_in_words(row),
            _queued(demand.get(row["model_id"])),
        ]
        for row in rows
    ]
    table += [
        [entry["name"], "0", "0", "0", _queued(entry)] for model_id, entry in demand.items() if model_id not in known
    ]
    return PanelContent(
        columns=["Model", "Devices", "Healthy", "Free cards", "Queued demand"],
        table=table,
        links=[
            ("Capacity page", reverse("admin:scheduling_capacity")),
            ("Usage report", reverse("admin:metering_usage_report")),
        ],
        empty="No devices in the inventory yet.",
    )


def _queued(entry: dict | None) -> str:
    if not entry:
        return "—"
    cards = f"{entry['cards']:.3f}".rstrip("0").rstrip(".")
    requests = entry["requests"]
    return f"{cards} card{'s' if cards != '1' else ''} ({requests} request{'s' if requests != 1 else ''})"
