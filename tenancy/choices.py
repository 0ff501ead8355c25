from django.db import models


class Role(models.TextChoices):
    MEMBER = "member", "Member"
    APPROVER = "approver", "Approver"
    LEAD = "lead", "Lead"


class ProjectPermission(models.TextChoices):
    """Object permissions on a Project; guardian stores them, membership services assign them."""

    VIEW = "view_project", "View the project, its quota and its requests"
    REQUEST = "request_on_project", "Order compute for the project"
    APPROVE = "approve_on_project", "Approve the project's requests"
    MANAGE = "manage_project", "Manage the project's members and ask for quota changes"


ROLE_PERMISSIONS: dict[str, frozenset[str]] = {
    Role.MEMBER: frozenset({ProjectPermission.VIEW, ProjectPermission.REQUEST}),
    Role.APPROVER: frozenset({ProjectPermission.VIEW, ProjectPermission.APPROVE}),
    Role.LEAD: frozenset(ProjectPermission.values),
}


class QuotaDimension(models.TextChoices):
    """The six quota dimensions; each value is also the field name on the quota models."""

    GPUS = "gpus", "GPUs (whole-card equivalents)"
    ACCELERATOR_MEMORY_GB = "accelerator_memory_gb", "Accelerator memory (GiB)"
    CPU_CORES = "cpu_cores", "CPU cores"
    MEMORY_GB = "memory_gb", "Memory (GiB)"
    CONCURRENT_TASKS = "concurrent_tasks", "Concurrent tasks"
    MONTHLY_CARD_HOURS = "monthly_card_hours", "Card-hours per month"


class OrderCap(models.TextChoices):
    """Caps on a project's orders (settings ORDER_MAX_<VALUE> give the defaults, a project's quota may override
    each in its field `max_<value>`): open orders (not yet ended) and orders waiting for quota, per requester and
    for the whole project."""

    OPEN_PER_REQUESTER = "open_per_requester", "Open orders per requester"
    OPEN_PER_PROJECT = "open_per_project", "Open orders of the project"
    WAITING_PER_REQUESTER = "waiting_per_requester", "Orders waiting for quota per requester"
    WAITING_PER_PROJECT = "waiting_per_project", "Orders waiting for quota in the project"

    @property
    def field(self) -> str:
        return f"max_{self.value}"

    @property
    def setting(self) -> str:
        return f"ORDER_MAX_{self.value.upper()}"


class PriorityClass(models.TextChoices):
    """Scheduling priority; the rank orders the queue (higher first). A project's quota names the highest class
    it may order without approval (its entitlement)."""

    BATCH = "batch", "Batch (preemptible)"
    STANDARD = "standard", "Standard"
    HIGH = "high", "High"
    CRITICAL = "critical", "Critical"


PRIORITY_RANK = {
    PriorityClass.BATCH: 10,
    PriorityClass.STANDARD: 50,
    PriorityClass.HIGH: 80,
    PriorityClass.CRITICAL: 100,
}


def priorities_up_to(entitlement: str) -> list[str]:
    """The classes a project entitled to `entitlement` may order without approval, lowest first."""
    return [str(priority) for priority in PriorityClass if PRIORITY_RANK[priority] <= PRIORITY_RANK[entitlement]]
