"""Telemetry samples, their daily rollups, budget alerts, and duration histograms kept for /metrics.

Card-hours and cost are not stored here: they are computed from the allocations' bound intervals whenever they are
read (selectors), so they are exact to the second, running allocations included. The monthly quota ledger
(tenancy.MonthlyUsage) is the one stored copy, refreshed by services.ledger_refresh.
"""

from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models import F, Q

from catalog.choices import ServiceKind
from metering.choices import BudgetLevel, IdleAction


class TelemetrySample(models.Model):
    """One reading of one device bound to a running allocation. Raw samples age out after
    METERING_SAMPLE_RETENTION_DAYS; the daily rollups keep what reports and rightsizing need."""

    # The unique constraint's index starts with the allocation: no separate index on the foreign key.
    allocation = models.ForeignKey("scheduling.Allocation", on_delete=models.CASCADE, related_name="+", db_index=False)
    device = models.ForeignKey("scheduling.Device", on_delete=models.CASCADE, related_name="+", db_index=False)
    sampled_at = models.DateTimeField()
    utilization_pct = models.FloatField("utilization (%)", validators=[MinValueValidator(0), MaxValueValidator(100)])
    memory_used_mb = models.PositiveIntegerField("memory used (MiB)")
    power_w = models.FloatField("power (W)", validators=[MinValueValidator(0)])

    class Meta:
        ordering = ["-sampled_at", "allocation", "device"]
        indexes = [models.Index(fields=["sampled_at"], name="telemetry_sampled_at_idx")]
        constraints = [
            models.UniqueConstraint(fields=["allocation", "device", "sampled_at"], name="one_sample_per_binding_time"),
            models.CheckConstraint(
                condition=Q(utilization_pct__gte=0) & Q(utilization_pct__lte=100),
                name="sample_utilization_is_a_percentage",
            ),
            models.CheckConstraint(condition=Q(power_w__gte=0), name="sample_power_non_negative"),
        ]

    def __str__(self):
        return f"Allocation #{self.allocation_id} device #{self.device_id} at {self.sampled_at:%Y-%m-%d %H:%M}"


class DailyUsage(models.Model):
    """One allocation's telemetry over one UTC day, across all its devices.

    At each sampling instant the allocation's devices are added up (busy cards = sum of utilization / 100, memory
    in use = sum over its devices); the 95th percentiles are taken over the day's instants (nearest rank).
    """

    allocation = models.ForeignKey("scheduling.Allocation", on_delete=models.CASCADE, related_name="+", db_index=False)
    day = models.DateField()
    accelerator_model = models.ForeignKey("catalog.AcceleratorModel", on_delete=models.PROTECT, related_name="+")
    samples = models.PositiveIntegerField(help_text="Sampling instants.")
    device_samples = models.PositiveIntegerField(help_text="Device readings (instants x devices).")
    utilization_sum = models.FloatField(help_text="Sum of every device reading's utilization in percent.")
    busy_cards_p95 = models.FloatField(
        "p95 busy cards", help_text="95th percentile of the cards kept busy (sum of utilization / 100)."
    )
    memory_sum_mb = models.FloatField(
        "memory sum (MiB)", help_text="Sum over the instants of the memory in use on all devices."
    )
    memory_p95_mb = models.FloatField(
        "p95 memory (MiB)", help_text="95th percentile of the memory in use on all devices."
    )
    memory_max_mb = models.FloatField("peak memory (MiB)")
    energy_kwh = models.FloatField("energy (kWh)", help_text="Power integrated over time (trapezoids between samples).")
    updated_at = models.DateTimeField()

    class Meta:
        ordering = ["-day", "allocation"]
        verbose_name_plural = "daily usage"
        indexes = [models.Index(fields=["day"], name="daily_usage_day_idx")]
        constraints = [
            models.UniqueConstraint(fields=["allocation", "day"], name="one_usage_row_per_allocation_day"),
            models.CheckConstraint(
                condition=Q(samples__gte=1) & Q(device_samples__gte=models.F("samples")), name="daily_usage_has_samples"
            ),
        ]

    def __str__(self):
        return f"Allocation #{self.allocation_id} on {self.day:%Y-%m-%d}"

    @property
    def mean_utilization_pct(self) -> float:
        return self.utilization_sum / self.device_samples

    @property
    def mean_memory_mb(self) -> float:
        return self.memory_sum_mb / self.samples


class BudgetAlert(models.Model):
    """A project reached a share of its monthly card-hour budget (once per project, month and level)."""

    project = models.ForeignKey("tenancy.Project", on_delete=models.CASCADE, related_name="budget_alerts")
    month = models.DateField(help_text="First day of the month.")
    level = models.CharField(max_length=10, choices=BudgetLevel.choices)
    card_hours = models.DecimalField(max_digits=14, decimal_places=4, help_text="Metered when the level was reached.")
    limit = models.DecimalField(max_digits=12, decimal_places=2)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.UniqueConstraint(fields=["project", "month", "level"], name="one_alert_per_project_month_level"),
            models.CheckConstraint(condition=Q(month__day=1), name="budget_alert_month_is_first_day"),
            models.CheckConstraint(condition=Q(level__in=BudgetLevel.values), name="budget_alert_level_valid"),
        ]

    def __str__(self):
        return f"{self.project.slug} {self.month:%Y-%m}: {self.get_level_display()}"

    @property
    def percent(self) -> int:
        return round(self.card_hours / self.limit * 100) if self.limit else 0


class HistogramBucket(models.Model):
    """One cumulative bucket of a duration histogram kept in the database, so that whichever process serves the
    scrape reports every worker's observations. Only the +Inf bucket keeps a sum: the histogram's."""

    metric = models.CharField(max_length=80)
    le = models.FloatField(help_text="Upper bound in seconds (infinity for +Inf).")
    count = models.BigIntegerField(default=0)
    sum_seconds = models.FloatField(default=0)

    class Meta:
        ordering = ["metric", "le"]
        constraints = [models.UniqueConstraint(fields=["metric", "le"], name="one_bucket_per_metric_bound")]

    def __str__(self):
        return f"{self.metric} le={self.le}"


class TokenUsage(models.Model):
    """Tokens a served model answered with, per deployment (its request), API key and day: what the gateway meters.

    The key is kept by its public prefix (keys belong to provisioning, a higher layer)."""

    request = models.ForeignKey("requests.ResourceRequest", on_delete=models.PROTECT, related_name="token_usage")
    project = models.ForeignKey("tenancy.Project", on_delete=models.PROTECT, related_name="token_usage")
    model = models.CharField(max_length=160)
    key_prefix = models.CharField(max_length=12)
    day = models.DateField()
    requests = models.PositiveBigIntegerField(default=0)
    prompt_tokens = models.PositiveBigIntegerField(default=0)
    completion_tokens = models.PositiveBigIntegerField(default=0)
    last_call_at = models.DateTimeField(
        null=True, blank=True, help_text="The gateway's last flush of calls to it (within a second of the last call)."
    )

    class Meta:
        ordering = ["-day", "request"]
        constraints = [
            models.UniqueConstraint(fields=["request", "key_prefix", "day"], name="one_token_row_per_request_key_day")
        ]
        indexes = [models.Index(fields=["project", "day"], name="token_usage_project_day_idx")]

    def __str__(self):
        return f"#{self.request_id} {self.key_prefix} {self.day}: {self.prompt_tokens}+{self.completion_tokens}"


class IdlePolicy(models.Model):
    """When an offering's running work counts as idle, what happens then, and how long the owner is warned before."""

    service = models.OneToOneField(
        "catalog.Service", on_delete=models.CASCADE, related_name="idle_policy", help_text="The offering it governs."
    )
    active = models.BooleanField(default=True)
    watch_utilization = models.BooleanField(
        "accelerator utilisation", default=True, help_text="Idle only while every card reads below the threshold."
    )
    utilization_below_pct = models.FloatField(
        "utilisation threshold (%)",
        default=5,
        validators=[MinValueValidator(0), MaxValueValidator(100)],
        help_text="A reading at or above this counts as busy.",
    )
    watch_sessions = models.BooleanField(
        "no SSH/Jupyter sessions", default=True, help_text="Idle only while no session is open on the workload."
    )
    watch_gateway = models.BooleanField(
        "no gateway calls", default=True, help_text="Idle only while the endpoint gets no calls (serving offerings)."
    )
    idle_minutes = models.PositiveIntegerField(
        "idle time (minutes)", default=120, validators=[MinValueValidator(10)], help_text="Idle this long: act."
    )
    warning_minutes = models.PositiveIntegerField(
        "warning lead (minutes)", default=30, validators=[MinValueValidator(1)], help_text="Warn this long before."
    )
    action = models.CharField(max_length=16, choices=IdleAction.choices, default=IdleAction.RELEASE)
    max_snoozes = models.PositiveSmallIntegerField(default=2, help_text="Snoozes an owner may take per request.")
    snooze_minutes = models.PositiveIntegerField(
        "snooze (minutes)", default=120, validators=[MinValueValidator(10)], help_text="How long a snooze postpones."
    )

    class Meta:
        verbose_name_plural = "idle policies"
        constraints = [
            models.CheckConstraint(condition=Q(warning_minutes__lt=F("idle_minutes")), name="idle_warning_within_time"),
            models.CheckConstraint(condition=Q(action__in=IdleAction.values), name="idle_action_valid"),
            models.CheckConstraint(
                condition=Q(utilization_below_pct__gte=0) & Q(utilization_below_pct__lte=100),
                name="idle_threshold_is_a_percentage",
            ),
        ]

    def __str__(self):
        return f"Idle policy of {self.service}"

    def clean(self):
        if None not in (self.warning_minutes, self.idle_minutes) and self.warning_minutes >= self.idle_minutes:
            raise ValidationError({"warning_minutes": "The warning must come before the idle time is reached."})
        if not (self.watch_utilization or self.watch_sessions or self.watch_gateway):
            raise ValidationError("Watch at least one signal.")
        if self.action == IdleAction.SCALE_TO_ZERO:
            self._check_scales_to_zero()

    def _check_scales_to_zero(self):
        """Only an endpoint has replicas to scale and a next call to wake it, and only its calls say it is used."""
        if self.service_id is not None and self.service.kind != ServiceKind.MODEL_SERVING:
            raise ValidationError(
                {"action": "Only a model-serving offering scales to zero; stop and release other work."}
            )
        if not self.watch_gateway:
            raise ValidationError({"watch_gateway": "Scaling to zero needs the gateway calls watched."})


class IdleWatch(models.Model):
    """Where one running request stands with its offering's idle policy: warned when, snoozed how often, acting
    when. Written only by metering.idle.services."""

    request = models.OneToOneField("requests.ResourceRequest", on_delete=models.CASCADE, related_name="idle_watch")
    idle_since = models.DateTimeField(null=True, blank=True)
    warned_at = models.DateTimeField(null=True, blank=True)
    acts_at = models.DateTimeField(null=True, blank=True, help_text="When the action runs unless it turns busy.")
    snoozes = models.PositiveSmallIntegerField(default=0)
    snoozed_at = models.DateTimeField(null=True, blank=True)
    snoozed_until = models.DateTimeField(null=True, blank=True)
    reasons = models.JSONField(default=list, blank=True, help_text="The readings behind the last decision.")
    idle_card_seconds = models.FloatField(
        default=0, help_text="Card-seconds of the idle episodes that ended (busy again or acted on)."
    )
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name_plural = "idle watches"

    def __str__(self):
        return f"Idle watch of request #{self.request_id}"


class SlurmBooks(models.Model):
    """What Slurm's own books (slurmdbd, read with sacct) say a request's Slurm jobs held, against the card-hours the
    platform metered for the same allocations. Written only by metering.books.services."""

    request = models.OneToOneField("requests.ResourceRequest", on_delete=models.CASCADE, related_name="slurm_books")
    jobs = models.JSONField(default=list, help_text="Each job as the books have it (id, state, GPUs, elapsed, times).")
    slurm_card_hours = models.FloatField(help_text="GPUs x elapsed of its jobs, as Slurm's books have them.")
    platform_card_hours = models.FloatField(help_text="What the platform metered for the allocations those jobs ran.")
    difference_card_hours = models.FloatField(help_text="Slurm's card-hours minus the platform's.")
    final = models.BooleanField(
        default=False, help_text="Every job has ended in the books and every allocation is released: not read again."
    )
    read_at = models.DateTimeField()

    class Meta:
        verbose_name = "Slurm's books of a request"
        verbose_name_plural = "Slurm's books"
        ordering = ["-read_at", "request"]
        indexes = [models.Index(fields=["final"], condition=Q(final=False), name="slurm_books_open_idx")]

    def __str__(self):
        return f"Slurm's books of request #{self.request_id}"
