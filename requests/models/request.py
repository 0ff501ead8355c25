"""A request for compute, its state machine and its timeline."""

import hashlib
import json
from datetime import timedelta

from django.conf import settings
from django.core.validators import MinValueValidator
from django.db import models
from django.db.models import Q
from django_fsm import ConcurrentTransitionMixin, FSMField, transition

from catalog.choices import SlurmMembership
from config.jsonvalues import as_stored
from requests.choices import (
    CANCELLABLE_STATES,
    COMMITTED_STATES,
    TERMINAL_STATES,
    EventCode,
    PriorityClass,
    RequestState,
)

S = RequestState
# What a request counts against its quota (requests.quota sums them over the committed ones).
DEMAND_FIELDS = ("gpu_equivalents", "accelerator_memory_gb", "cpu_cores", "memory_gb", "card_hours")


def snapshot_hash(snapshot: dict) -> str:
    """The hash of the snapshot as the database gives it back, so a reloaded snapshot hashes the same."""
    canonical = json.dumps(as_stored(snapshot), sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


class SnapshotTampered(Exception):
    """Raised when code tries to change a request's approved snapshot after approval."""


class ResourceRequest(ConcurrentTransitionMixin, models.Model):
    tenant = models.ForeignKey("tenancy.Tenant", on_delete=models.PROTECT, related_name="requests")
    project = models.ForeignKey("tenancy.Project", on_delete=models.PROTECT, related_name="requests")
    requester = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="requests")
    service = models.ForeignKey("catalog.Service", on_delete=models.PROTECT, related_name="requests")
    spec = models.ForeignKey(
        "catalog.ResourceSpec", null=True, blank=True, on_delete=models.PROTECT, related_name="requests"
    )
    image = models.ForeignKey("catalog.Image", null=True, blank=True, on_delete=models.PROTECT, related_name="requests")
    bare_metal_profile = models.ForeignKey(
        "catalog.BareMetalProfile", null=True, blank=True, on_delete=models.PROTECT, related_name="requests"
    )
    serving_model = models.ForeignKey(
        "catalog.ServingModel", null=True, blank=True, on_delete=models.PROTECT, related_name="requests"
    )
    serving_template = models.ForeignKey(
        "catalog.ServingTemplate", null=True, blank=True, on_delete=models.PROTECT, related_name="requests"
    )
    duration_hours = models.PositiveIntegerField(validators=[MinValueValidator(1)])
    # An advance reservation: the window [reserved_start, reserved_start + duration_hours) the order is for (empty:
    # as soon as it can run). Admission counts it in its window and its month, the cycle starts it at its start.
    reserved_start = models.DateTimeField(null=True, blank=True, db_index=True)
    priority = models.CharField(max_length=12, choices=PriorityClass.choices, default=PriorityClass.STANDARD)
    justification = models.TextField(blank=True)
    parameters = models.JSONField(default=dict, blank=True, help_text="Free-form order fields, e.g. environment.")
    state = FSMField(default=S.SUBMITTED, choices=RequestState.choices, protected=True, db_index=True)

    # Demand, fixed at submission: what admission counts against the quota.
    gpu_equivalents = models.DecimalField("GPU equivalents", max_digits=10, decimal_places=4)
    accelerator_count = models.PositiveIntegerField()
    accelerator_memory_gb = models.PositiveIntegerField("accelerator memory (GiB)")
    cpu_cores = models.PositiveIntegerField("CPU cores")
    memory_gb = models.PositiveIntegerField("memory (GiB)")
    card_hours = models.DecimalField(max_digits=14, decimal_places=4)
    hourly_cost = models.DecimalField(max_digits=12, decimal_places=2)
    cost_estimate = models.DecimalField(max_digits=14, decimal_places=2)

    quota_exception = models.BooleanField(default=False, help_text="Admitted over quota through approval.")
    quota_reasons = models.JSONField(default=list, blank=True, help_text="Why the request is or was over quota.")
    approved_spec = models.JSONField(null=True, blank=True, editable=False)
    approved_spec_hash = models.CharField(max_length=64, blank=True, editable=False)
    approved_at = models.DateTimeField(null=True, blank=True)
    # Written by each scheduling cycle while the request waits in the queue.
    queue_position = models.PositiveIntegerField(null=True, blank=True)
    queue_reason = models.JSONField(default=dict, blank=True, help_text="code, message and numbers of the wait.")
    queue_updated_at = models.DateTimeField(null=True, blank=True)
    serving_replicas = models.PositiveSmallIntegerField(
        null=True,
        blank=True,
        help_text="Replicas a serving endpoint woken from zero asks for (fewer than its order's); empty: the order's.",
    )
    queue_estimate = models.JSONField(
        default=dict,
        blank=True,
        help_text="Expected start (earliest, likely, latest) as the last cycle forecast it, or why there is none.",
    )
    # One per rendered order form (the portal) or per API call (its Idempotency-Key header): the same key from the
    # same requester is the same submission sent again, answered with the request it made.
    idempotency_key = models.CharField(max_length=255, blank=True, default="")
    # What was ordered, as a hash (requests.orders.order_fingerprint): the same order sent again by another form,
    # and the approval inbox's likely duplicates, are found by it.
    order_fingerprint = models.CharField(max_length=64, blank=True, default="", db_index=True)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [
            models.Index(fields=["project", "state"], name="request_project_state_idx"),
            # The order preview reads the requests queued since the last cycle: a few, however long the queue (and
            # counts those of its priority classes from the index alone when a backlog builds up between cycles).
            models.Index(
                fields=["created_at", "id"],
                include=["priority"],
                condition=Q(state=RequestState.QUEUED, queue_position__isnull=True),
                name="request_queued_unseen_idx",
            ),
            # The queue page in queue order (requests.selectors.queue_visible_to): an operator's first page reads
            # 50 entries here instead of every queued row's heap page and a sort, whose cost grows with the
            # queue. Cycles rewrite changed positions, which they already did as non-HOT updates
            # (queue_position is in the unseen index's condition), so this adds one entry per row they write.
            models.Index(
                fields=["queue_position", "created_at", "id"],
                condition=Q(state=RequestState.QUEUED),
                name="request_queue_order_idx",
            ),
            # Admission and the quota panels sum the demand of a project's committed requests: from this index
            # alone (an index-only scan), not from a heap page per request (a busy project has thousands).
            models.Index(
                fields=["project"],
                include=["id", "state", "reserved_start", *DEMAND_FIELDS],
                condition=Q(state__in=sorted(COMMITTED_STATES)),
                name="request_committed_demand_idx",
            ),
        ]
        constraints = [
            models.CheckConstraint(condition=Q(state__in=RequestState.values), name="request_state_valid"),
            models.UniqueConstraint(
                fields=["requester", "idempotency_key"],
                condition=~Q(idempotency_key=""),
                name="request_idempotency_key_once",
            ),
            models.CheckConstraint(
                condition=Q(approved_spec__isnull=True, approved_spec_hash="")
                | Q(approved_spec__isnull=False, approved_at__isnull=False) & ~Q(approved_spec_hash=""),
                name="request_snapshot_complete",
            ),
        ]

    def __str__(self):
        return f"#{self.pk} {self.service.name} for {self.project.slug}"

    def save(self, *args, **kwargs):
        loaded = getattr(self, "_loaded_spec_hash", "")
        if loaded and (self.approved_spec is None or snapshot_hash(self.approved_spec) != loaded):
            raise SnapshotTampered(f"Request {self.pk}: the approved snapshot is frozen; order a new request.")
        super().save(*args, **kwargs)
        self._loaded_spec_hash = self.approved_spec_hash

    @classmethod
    def from_db(cls, db, field_names, values):
        instance = super().from_db(db, field_names, values)
        instance._loaded_spec_hash = instance.__dict__.get("approved_spec_hash", "")
        return instance

    @property
    def reserved_end(self):
        """The end of a reservation's window (None for an order without one)."""
        if self.reserved_start is None:
            return None
        return self.reserved_start + timedelta(hours=self.duration_hours)

    @property
    def is_terminal(self) -> bool:
        return self.state in TERMINAL_STATES

    @property
    def is_cancellable(self) -> bool:
        return self.state in CANCELLABLE_STATES

    @property
    def snapshot_intact(self) -> bool:
        return self.approved_spec is not None and snapshot_hash(self.approved_spec) == self.approved_spec_hash

    @property
    def slurm_membership(self) -> str | None:
        """How a bare-metal server joins Slurm (and whether its tenant gets root): the approved snapshot's once it is
        frozen (a snapshot from before profiles said so joined the shared cluster without root), else its profile's.
        None for other orders."""
        if self.bare_metal_profile_id is None:
            return None
        if self.approved_spec:
            frozen = self.approved_spec.get("bare_metal_profile") or {}
            return frozen.get("slurm_membership", SlurmMembership.SHARED_CLUSTER_NO_ROOT)
        return self.bare_metal_profile.slurm_membership

    @property
    def slurm_membership_label(self) -> str | None:
        membership = self.slurm_membership
        return None if membership is None else SlurmMembership(membership).label

    # Transitions change only the state; services save, write the timeline and start side effects.
    @transition(field=state, source=S.SUBMITTED, target=S.WAITING_FOR_QUOTA)
    def wait_for_quota(self):
        pass

    @transition(field=state, source=[S.SUBMITTED, S.WAITING_FOR_QUOTA], target=S.PENDING_APPROVAL)
    def route_for_approval(self):
        pass

    @transition(field=state, source=[S.SUBMITTED, S.WAITING_FOR_QUOTA, S.PENDING_APPROVAL], target=S.APPROVED)
    def approve(self):
        pass

    @transition(field=state, source=S.PENDING_APPROVAL, target=S.REJECTED)
    def reject(self):
        pass

    @transition(field=state, source=S.APPROVED, target=S.QUEUED)
    def enqueue(self):
        pass

    @transition(field=state, source=list(CANCELLABLE_STATES), target=S.CANCELLED)
    def cancel(self):
        pass

    @transition(field=state, source=S.QUEUED, target=S.ALLOCATED)
    def allocate(self):
        pass

    @transition(field=state, source=S.ALLOCATED, target=S.PROVISIONING)
    def start_provisioning(self):
        pass

    @transition(field=state, source=S.PROVISIONING, target=S.ACTIVE)
    def activate(self):
        pass

    @transition(field=state, source=[S.ALLOCATED, S.PROVISIONING, S.ACTIVE], target=S.QUEUED)
    def preempt(self):
        pass

    # A serving endpoint scaled to zero (active, holding nothing) asks for capacity again when a call wakes it.
    @transition(field=state, source=S.ACTIVE, target=S.QUEUED)
    def ask_for_capacity(self):
        pass

    @transition(field=state, source=[S.ALLOCATED, S.PROVISIONING, S.ACTIVE], target=S.RELEASING)
    def start_release(self):
        pass

    @transition(field=state, source=S.RELEASING, target=S.RELEASED)
    def finish_release(self):
        pass

    @transition(field=state, source=[S.ALLOCATED, S.PROVISIONING, S.ACTIVE, S.RELEASING], target=S.FAILED)
    def fail(self):
        pass

    @transition(field=state, source=S.FAILED, target=S.PROVISIONING)
    def retry_provisioning(self):
        """An operator retries a failed provisioning run on the same devices."""


class RequestEvent(models.Model):
    """One entry on a request's timeline: a state change or a note, with its reason as data."""

    request = models.ForeignKey(ResourceRequest, on_delete=models.CASCADE, related_name="events")
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    from_state = models.CharField(max_length=20, choices=RequestState.choices, blank=True)
    to_state = models.CharField(max_length=20, choices=RequestState.choices, blank=True)
    code = models.CharField(max_length=40, choices=EventCode.choices)
    message = models.TextField()
    data = models.JSONField(default=dict, blank=True)
    intervention = models.BooleanField(
        default=False,
        help_text="A manual operator intervention (forced transition, retry, manual reclamation, "
        "admin edit): what the zero-touch delivery KPI counts.",
    )
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering = ["created_at", "id"]

    def __str__(self):
        return f"#{self.request_id} {self.code}: {self.message}"

    @property
    def is_transition(self) -> bool:
        return bool(self.to_state) and self.from_state != self.to_state
