from django.db import models


class TelemetryDriver(models.TextChoices):
    SIMULATED = "simulated", "Simulated curves per workload (embedded default)"
    DCGM = "dcgm", "NVIDIA dcgm-exporter on each node (Prometheus text)"


class BudgetLevel(models.TextChoices):
    """How much of its monthly card-hour budget a project has used; each level is announced once a month."""

    WARNING = "warning", "Warning share of the monthly budget used"  # METERING_BUDGET_WARNING_PERCENT
    EXHAUSTED = "exhausted", "Monthly budget used up"


class Grouping(models.TextChoices):
    """What a usage report can be grouped by."""

    PROJECT = "project", "Project"
    TENANT = "tenant", "Tenant"
    ACCELERATOR_MODEL = "accelerator_model", "Accelerator model"
    SPEC = "spec", "Spec or server profile"
    MONTH = "month", "Month"
    REQUEST = "request", "Request"


class IdleAction(models.TextChoices):
    """What an idle policy does once the owner was warned and the work stayed idle."""

    RELEASE = "release", "Stop and release"
    SCALE_TO_ZERO = "scale_to_zero", "Scale the endpoint to zero replicas, woken by its next call (serving only)"


class IdleStep(models.TextChoices):
    """What the idle sweep does to one request this pass (metering.idle.decide.next_step)."""

    NOTHING = "nothing", "Nothing"
    WARN = "warn", "Warn the owner"
    CLEAR = "clear", "Clear the warning: busy again"
    ACT = "act", "Run the policy's action"
