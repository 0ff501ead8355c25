from django.db import models


class DeviceHealth(models.TextChoices):
    """Health as signals report it; isolation (no new placements) is a separate, operator-visible flag."""

    HEALTHY = "healthy", "Healthy"
    DEGRADED = "degraded", "Degraded"
    UNHEALTHY = "unhealthy", "Unhealthy"


class MigMode(models.TextChoices):
    """A MIG-capable card's mode, as an operator asks for it (`Device.mig_mode_wanted`)."""

    MIG = "mig", "MIG (GPU instances)"
    WHOLE = "whole", "Whole card"


class ExecutionBackend(models.TextChoices):
    """What runs work on a node: chosen by the node the scheduler picked, never by the developer."""

    SIMULATED = "simulated", "Simulated host (demo)"
    SLURM = "slurm", "Slurm cluster (slurmrestd)"
    CONTAINER = "container", "Container runtime (podman)"


class AllocationState(models.TextChoices):
    ACTIVE = "active", "Active"
    RELEASED = "released", "Released"


class HealthSource(models.TextChoices):
    DCGM = "dcgm", "NVIDIA dcgm-exporter metric"
    BMC = "bmc", "BMC / Redfish health state"
    AGENT = "agent", "Structured agent event"
    SLURM = "slurm", "Slurm node state (inventory import)"


class HealthAction(models.TextChoices):
    DEGRADE = "degrade", "Mark degraded"
    ISOLATE = "isolate", "Isolate (no new placements)"


class Comparison(models.TextChoices):
    GT = "gt", ">"
    GTE = "gte", "≥"
    EQ = "eq", "="
    IN = "in", "one of"
