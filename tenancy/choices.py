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


class TokenScope(models.TextChoices):
    """What an API token may do (config/scopes.py maps every API endpoint to one). A token acts with its holder's
    rights, and only within its scopes: a call outside them is refused 403 `token_scope`."""

    CATALOG_READ = "catalog:read", "Read the catalog"
    PROJECTS_READ = "projects:read", "Read projects, quotas and usage of them"
    REQUESTS_READ = "requests:read", "Read requests, the queue and approval tasks"
    REQUESTS_WRITE = "requests:write", "Order, cancel, release and extend requests; ask for quota"
    APPROVALS_WRITE = "approvals:write", "Approve or reject"
    SERVING_CALL = "serving:call", "Create, rotate and revoke the project's gateway keys that call its models"
    USAGE_READ = "usage:read", "Read usage, budgets and recommendations"
    INVENTORY_READ = "inventory:read", "Read the inventory and capacity"
    OPERATIONS_WRITE = "operations:write", "Operator actions: inventory, health reports, provisioning retries"


# A service account orders and reads for its project; operator scopes are never given to one.
SERVICE_ACCOUNT_SCOPES = [
    scope for scope in TokenScope.values if scope not in (TokenScope.OPERATIONS_WRITE, TokenScope.APPROVALS_WRITE)
]

# What a person's token gets when its maker names no scopes (the API tokens page's first choice, `cc login`'s device
# sign-in): reading everything a developer reads, and ordering.
PERSONAL_DEFAULT_SCOPES = [
    scope for scope in TokenScope.values if scope.endswith(":read") or scope == TokenScope.REQUESTS_WRITE
]


class DeviceAuthorizationState(models.TextChoices):
    """Where a device sign-in (RFC 8628) stands: the person has not answered yet, approved or denied it, or the CLI
    took its token (the codes work no more)."""

    PENDING = "pending", "Waiting for the person"
    APPROVED = "approved", "Approved; the token is not taken yet"
    DENIED = "denied", "Denied"
    USED = "used", "Token issued"


class DirectorySource(models.TextChoices):
    OIDC = "oidc", "OpenID Connect"
    LDAP = "ldap", "LDAP / Active Directory"


class GroupGrant(models.TextChoices):
    """What a directory group mapping gives the people in the group."""

    TENANT_MEMBER = "tenant_member", "Member of the tenant"
    TENANT_ADMIN = "tenant_admin", "Administrator of the tenant"
    PROJECT_MEMBER = "project_member", "Project member"
    PROJECT_APPROVER = "project_approver", "Project approver"
    PROJECT_LEAD = "project_lead", "Project lead"
    OPERATOR = "operator", "Operator (staff and the Operators group)"

    @property
    def project_role(self) -> str | None:
        return {
            GroupGrant.PROJECT_MEMBER: Role.MEMBER,
            GroupGrant.PROJECT_APPROVER: Role.APPROVER,
            GroupGrant.PROJECT_LEAD: Role.LEAD,
        }.get(self)


# When several mappings give one person roles on one project, the strongest wins.
ROLE_STRENGTH = {Role.MEMBER: 1, Role.APPROVER: 2, Role.LEAD: 3}
