"""Provisioning runs: the ordered steps that build (or tear down) the environment of one allocation."""

from django.db import models
from django.db.models import Q
from django.utils import timezone
from django_fsm import ConcurrentTransitionMixin, FSMField, transition

from provisioning.choices import Pipeline, RunKind, RunState, StepState, Wait

# A step in one of these has not finished: it may still be claimed, and cancelled with its run.
UNFINISHED_STEP_STATES = [StepState.PENDING, StepState.RUNNING, StepState.WAITING]


class ProvisioningRun(ConcurrentTransitionMixin, models.Model):
    request = models.ForeignKey("requests.ResourceRequest", on_delete=models.PROTECT, related_name="provisioning_runs")
    allocation = models.ForeignKey("scheduling.Allocation", on_delete=models.PROTECT, related_name="provisioning_runs")
    kind = models.CharField(max_length=10, choices=RunKind.choices)
    pipeline = models.CharField(max_length=16, choices=Pipeline.choices)
    driver = models.CharField(max_length=20, help_text="Out-of-band driver for bare metal; the host agent otherwise.")
    state = FSMField(max_length=10, choices=RunState.choices, default=RunState.RUNNING, protected=True)
    reason = models.CharField(max_length=300, blank=True, help_text="Why a teardown run runs (release, expiry...).")
    current_position = models.PositiveSmallIntegerField(default=0, help_text="The step that runs next.")
    retry_of = models.ForeignKey("self", null=True, blank=True, on_delete=models.PROTECT, related_name="retries")
    failure = models.JSONField(default=dict, blank=True, help_text="{step, code, message, details} of a failed run.")
    delivered = models.JSONField(
        default=dict, blank=True, help_text="What the requester got: node, devices, addresses, image, access details."
    )
    installer_token_hash = models.CharField(max_length=64, blank=True)
    # With the secret key, what the installer's token is derived from (installer_tokens.installer_token): the
    # PXE install config hands it to the server again on each fetch; alone it reveals nothing.
    installer_token_nonce = models.CharField(max_length=32, blank=True)
    installer_reported_at = models.DateTimeField(null=True, blank=True)
    installer_report = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["allocation", "kind"],
                condition=~Q(kind=RunKind.PROVISION),
                name="one_teardown_run_per_allocation_and_kind",
            ),
            models.UniqueConstraint(
                fields=["allocation"], condition=Q(kind=RunKind.PROVISION), name="one_provision_run_per_allocation"
            ),
            models.UniqueConstraint(
                fields=["installer_token_hash"], condition=~Q(installer_token_hash=""), name="installer_token_unique"
            ),
        ]
        indexes = [models.Index(fields=["state"], condition=Q(state=RunState.RUNNING), name="running_runs_idx")]
        permissions = [
            ("retry_provisioningrun", "Can retry a failed provisioning run"),
            ("force_release_provisioningrun", "Can return the capacity of a teardown the backend never confirmed"),
        ]

    def __str__(self):
        return f"{self.get_kind_display()} #{self.pk} of request #{self.request_id}"

    # Transitions change only the run's own fields; provisioning.services saves and writes the timeline.
    @transition(field=state, source=RunState.RUNNING, target=RunState.SUCCEEDED)
    def succeed(self, *, delivered: dict | None = None):
        """The last step succeeded; a provisioning run's last step says what the requester got."""
        self.finished_at = timezone.now()
        if delivered is not None:
            self.delivered = delivered

    @transition(field=state, source=RunState.RUNNING, target=RunState.FAILED)
    def fail(self, *, failure: dict):
        self.finished_at, self.failure = timezone.now(), failure

    @transition(field=state, source=RunState.RUNNING, target=RunState.CANCELLED)
    def cancel(self):
        """A release overtook the provisioning, or the request is to be placed again: the run stops where it is."""
        self.finished_at = timezone.now()


class ProvisioningStep(ConcurrentTransitionMixin, models.Model):
    run = models.ForeignKey(ProvisioningRun, on_delete=models.CASCADE, related_name="steps")
    position = models.PositiveSmallIntegerField()
    name = models.CharField(max_length=40)
    state = FSMField(max_length=10, choices=StepState.choices, default=StepState.PENDING, protected=True)
    waiting_for = models.CharField(max_length=8, choices=Wait.choices, blank=True, default=Wait.NONE)
    attempts = models.PositiveSmallIntegerField(default=0)
    max_attempts = models.PositiveSmallIntegerField()
    timeout_seconds = models.PositiveIntegerField()
    lease_owner = models.UUIDField(null=True, blank=True, help_text="The worker executing the step now.")
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    retry_at = models.DateTimeField(null=True, blank=True)
    deadline_at = models.DateTimeField(null=True, blank=True, help_text="The step fails when still unfinished.")
    outage_since = models.DateTimeField(
        null=True, blank=True, help_text="Since when its backend has not answered (the outage it waits out)."
    )
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    log = models.TextField(blank=True, help_text="The latest lines of the step's log.")
    output = models.JSONField(default=dict, blank=True)
    error = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["run", "position"]
        constraints = [
            models.UniqueConstraint(fields=["run", "position"], name="one_step_per_run_position"),
            models.CheckConstraint(
                condition=~Q(state=StepState.RUNNING) | Q(lease_owner__isnull=False), name="running_step_has_lease"
            ),
        ]
        indexes = [
            models.Index(
                fields=["state", "retry_at"],
                name="step_due_idx",
                condition=Q(state__in=UNFINISHED_STEP_STATES),
            )
        ]

    def __str__(self):
        return f"{self.name} ({self.state})"

    # Transitions of the step engine (provisioning/engine.py), which holds the step's row lock and saves. A step
    # leaves RUNNING only through the worker holding its lease (or a takeover once the lease expired).
    @transition(field=state, source=UNFINISHED_STEP_STATES, target=StepState.RUNNING)
    def claim(self, *, owner, now):
        """A worker takes the step under its lease; from RUNNING only when the previous worker's lease expired.
        Resuming after an outside event, or asking a backend again after an outage, is the same attempt; anything
        else is a new one."""
        self.attempts += 0 if self.waiting_for in (Wait.EVENT, Wait.OUTAGE) else 1
        self.lease_owner, self.waiting_for, self.retry_at = owner, Wait.NONE, None
        self.started_at = self.started_at or now

    @transition(field=state, source=StepState.RUNNING, target=StepState.SUCCEEDED)
    def succeed(self, *, output: dict):
        self._end_attempt()
        self.finished_at, self.output, self.error = timezone.now(), output, {}

    @transition(field=state, source=StepState.RUNNING, target=StepState.WAITING)
    def wait(self, *, until, waiting_for: str):
        """Back off before the next attempt (Wait.RETRY), or wait for an outside event (Wait.EVENT)."""
        self._end_attempt()
        self.waiting_for, self.retry_at = waiting_for, until

    @transition(field=state, source=StepState.RUNNING, target=StepState.FAILED)
    def fail(self, *, error: dict):
        self._end_attempt()
        self.finished_at, self.error = timezone.now(), error

    @transition(field=state, source=UNFINISHED_STEP_STATES, target=StepState.CANCELLED)
    def cancel(self):
        """The run stopped: a step not yet done will not run (a running attempt's result is discarded)."""
        self._end_attempt()
        self.finished_at = timezone.now()

    def _end_attempt(self) -> None:
        self.lease_owner = self.lease_expires_at = None

    @property
    def duration_seconds(self) -> float | None:
        if self.started_at is None or self.finished_at is None:
            return None
        return round((self.finished_at - self.started_at).total_seconds(), 3)


class SimulatedMachine(models.Model):
    """The state the `simulated` BMC driver keeps per node, in the database so every worker sees the same
    machine: power (with a pending transition that lands after a delay, like a real BMC), boot override, media."""

    node = models.CharField(max_length=120, unique=True)
    power_state = models.CharField(max_length=12, default="Off")
    pending_power = models.CharField(max_length=12, blank=True)
    power_lands_at = models.DateTimeField(null=True, blank=True)
    boot_override = models.CharField(max_length=12, blank=True)
    media_image = models.URLField(max_length=1000, blank=True)

    def __str__(self):
        return f"{self.node}: {self.power_state}"


class ConnectSecret(models.Model):
    """What opens a delivered workload to its requester (a workspace's Jupyter token): the requester's alone. Stored
    encrypted (config/encryption.py), never in a step's output, the delivered record or the timeline; shown to the
    requester on the request's Connect panel and API detail, changed by them (rotation), shown to an operator only
    through an audited reveal, and deleted when the workload is torn down (provisioning/connect.py)."""

    request = models.ForeignKey("requests.ResourceRequest", on_delete=models.CASCADE, related_name="connect_secrets")
    allocation = models.ForeignKey("scheduling.Allocation", on_delete=models.CASCADE, related_name="connect_secrets")
    name = models.CharField(max_length=40, help_text="The access entry it opens, e.g. jupyter.")
    ciphertext = models.TextField(editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    rotated_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.UniqueConstraint(fields=["allocation", "name"], name="one_connect_secret_per_allocation_and_name")
        ]
        permissions = [("reveal_connectsecret", "Can reveal a connect secret (audited, with a reason)")]

    def __str__(self):
        return f"{self.name} of request #{self.request_id}"
