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
    ACCELERATOR_MEMORY_GB = "accelerator_memory_gb", "Accelerator memory (GB)"
    CPU_CORES = "cpu_cores", "CPU cores"
    MEMORY_GB = "memory_gb", "Memory (GB)"
    CONCURRENT_TASKS = "concurrent_tasks", "Concurrent tasks"
    MONTHLY_CARD_HOURS = "monthly_card_hours", "Card-hours per month"
