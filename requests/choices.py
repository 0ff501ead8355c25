from django.db import models

# Priority classes belong to tenancy (a project's quota names its entitlement); re-exported for the workflow.
from tenancy.choices import PRIORITY_RANK as PRIORITY_RANK
from tenancy.choices import PriorityClass as PriorityClass


class RequestState(models.TextChoices):
    SUBMITTED = "submitted", "Submitted"
    WAITING_FOR_QUOTA = "waiting_for_quota", "Waiting for quota"
    PENDING_APPROVAL = "pending_approval", "Pending approval"
    APPROVED = "approved", "Approved"
    QUEUED = "queued", "Queued"
    ALLOCATED = "allocated", "Allocated"
    PROVISIONING = "provisioning", "Provisioning"
    ACTIVE = "active", "Active"
    RELEASING = "releasing", "Releasing"
    RELEASED = "released", "Released"
    REJECTED = "rejected", "Rejected"
    CANCELLED = "cancelled", "Cancelled"
    FAILED = "failed", "Failed"


# No transition leaves these. FAILED is not one of them: an operator may retry provisioning from a failed
# step (failed -> provisioning, `retry_provisioning`).
TERMINAL_STATES = frozenset({RequestState.RELEASED, RequestState.REJECTED, RequestState.CANCELLED})
# States whose demand counts against quota: admitted and not yet given back.
COMMITTED_STATES = frozenset(
    {
        RequestState.PENDING_APPROVAL,
        RequestState.APPROVED,
        RequestState.QUEUED,
        RequestState.ALLOCATED,
        RequestState.PROVISIONING,
        RequestState.ACTIVE,
        RequestState.RELEASING,
    }
)
# Open orders, as the order caps count them (requests.order_caps): not yet ended. A failed request waits for an
# operator's retry, not its requester, so it does not hold a requester's place.
OPEN_STATES = frozenset(set(RequestState) - TERMINAL_STATES - {RequestState.FAILED})
# States of a request holding devices and metering: what it metered so far is in the quota ledger already.
RUNNING_STATES = frozenset({RequestState.ALLOCATED, RequestState.PROVISIONING, RequestState.ACTIVE})
CANCELLABLE_STATES = frozenset(
    {
        RequestState.SUBMITTED,
        RequestState.WAITING_FOR_QUOTA,
        RequestState.PENDING_APPROVAL,
        RequestState.APPROVED,
        RequestState.QUEUED,
    }
)


class OverQuota(models.TextChoices):
    """What the requester wants when a submission does not fit the quota."""

    REJECT = "reject", "Refuse it and tell me which limit"
    WAIT = "wait", "Keep it waiting until quota frees up"
    EXCEPTION = "exception", "Ask for a quota exception through approval"


class IfUnplaceable(models.TextChoices):
    """What the requester wants when no node of the inventory could ever hold the order."""

    WARN = "warn", "Submit it anyway and warn me"
    REFUSE = "refuse", "Refuse it and tell me what is too big"


class EventCode(models.TextChoices):
    SUBMITTED = "submitted", "Submitted"
    ADMITTED = "admitted", "Admitted within quota"
    QUOTA_EXCEEDED = "quota_exceeded", "Over quota"
    QUOTA_EXCEPTION = "quota_exception", "Quota exception requested"
    PRIORITY_EXCEPTION = "priority_exception", "Priority exception requested"
    READMITTED = "readmitted", "Re-admitted"
    ROUTED = "approval_routed", "Routed for approval"
    AUTO_APPROVED = "auto_approved", "Approved automatically"
    STAGE_VOTE = "stage_vote", "Approval recorded"
    STAGE_APPROVED = "stage_approved", "Approval stage passed"
    APPROVED = "approved", "Approved"
    REJECTED = "rejected", "Rejected"
    REMINDER = "approval_reminder", "Approval reminder"
    QUEUED = "queued", "Queued for scheduling"
    QUEUE_REASON = "queue_reason", "Waiting in the queue"
    EXTENSION_REQUESTED = "extension_requested", "Extension requested"
    EXTENDED = "extended", "Extended"
    EXTENSION_REJECTED = "extension_rejected", "Extension rejected"
    WORKLOAD_EXTENDED = "workload_extended", "Backend's end moved with the extension"
    EXPIRY_WARNING = "expiry_warning", "Expiry warning"
    IDLE_WARNING = "idle_warning", "Idle warning"
    IDLE_SNOOZED = "idle_snoozed", "Idle stop snoozed"
    IDLE_CLEARED = "idle_cleared", "Busy again: idle warning cleared"
    IDLE_STOPPED = "idle_stopped", "Stopped for being idle"
    SCALING_UP = "scaling_up", "Woken: asking for capacity again"
    REPLICA_NOT_STOPPED = "replica_not_stopped", "Scaling to zero: a server did not stop"
    CANCELLED = "cancelled", "Cancelled"
    WAITING_EXPIRED = "waiting_expired", "Stopped waiting for quota"
    ALLOCATED = "allocated", "Allocated"
    PROVISIONING = "provisioning", "Provisioning"
    ACTIVE = "active", "Active"
    RELEASING = "releasing", "Releasing"
    RELEASED = "released", "Released"
    FAILED = "failed", "Failed"
    PREEMPTED = "preempted", "Preempted"
    PREEMPTION_SCHEDULED = "preemption_scheduled", "Preemption scheduled"
    PREEMPTION_CALLED_OFF = "preemption_called_off", "Preemption called off"
    DEVICE_ISOLATED = "device_isolated", "Device isolated"
    DEVICES_REBOUND = "devices_rebound", "Devices rebound to the backend's choice"
    NODE_CORDONED = "node_cordoned", "Node cordoned"
    RESERVATION_REPLANNED = "reservation_replanned", "Reservation re-planned"
    PLANNED_NODE_FAILED = "planned_node_failed", "Planned node failed"
    PROVISIONING_STEP_FAILED = "provisioning_step_failed", "Provisioning step failed"
    PROVISIONING_RETRIED = "provisioning_retried", "Provisioning retried"
    PROVISIONING_RECOVERED = "provisioning_recovered", "Provisioning started late by the sweeper"
    PROVISIONING_NOT_STARTED = "provisioning_not_started", "Provisioning could not start"
    BACKEND_WAIT = "backend_wait", "Waiting for the backend to answer"
    TEARDOWN_STUCK = "teardown_stuck", "Teardown needs an operator"
    TEARDOWN_FORCED = "teardown_forced", "Capacity returned by an operator"
    CLEANED_UP = "cleaned_up", "Cleaned up"
    CONNECT_SECRET_ROTATED = "connect_secret_rotated", "Connect secret changed"
    CONNECT_SECRET_REVEALED = "connect_secret_revealed", "Connect secret revealed to an operator"


class ApprovalSubject(models.TextChoices):
    """What an approval policy applies to; the approval engine is generic over these."""

    RESOURCE_REQUEST = "resource_request", "Resource requests"
    QUOTA_CHANGE = "quota_change", "Quota change requests"
    ISOLATION_CLEARANCE = "isolation_clearance", "Device isolation clearances"


class ApproverSource(models.TextChoices):
    USERS = "users", "Named users"
    GROUP = "group", "Members of a group"
    PROJECT_ROLE = "project_role", "Project role (approver or lead)"
    MANAGER = "manager", "The requester's manager"
    TENANT_ADMINS = "tenant_admins", "Tenant administrators"
    OPERATORS = "operators", "Operators"


class ApprovalMode(models.TextChoices):
    ANY = "any", "Any one approver"
    ALL = "all", "All approvers"


class ApprovalState(models.TextChoices):
    PENDING = "pending", "Pending"
    APPROVED = "approved", "Approved"
    REJECTED = "rejected", "Rejected"
    CANCELLED = "cancelled", "Cancelled"


class StageState(models.TextChoices):
    WAITING = "waiting", "Waiting for an earlier stage"
    PENDING = "pending", "Pending"
    APPROVED = "approved", "Approved"
    REJECTED = "rejected", "Rejected"
    CANCELLED = "cancelled", "Cancelled"


class Decision(models.TextChoices):
    APPROVE = "approve", "Approve"
    REJECT = "reject", "Reject"


class ChangeState(models.TextChoices):
    """States of a change request (a quota change, an extension, an isolation clearance)."""

    PENDING_APPROVAL = "pending_approval", "Pending approval"
    APPLIED = "applied", "Approved and applied"
    REJECTED = "rejected", "Rejected"
    CANCELLED = "cancelled", "Cancelled"


class NotificationKind(models.TextChoices):
    """What a person can be told by mail; each may be turned off on the notifications page (all on by default)."""

    REQUEST_APPROVED = "request_approved", "My request was approved"
    REQUEST_REJECTED = "request_rejected", "My request was rejected"
    REQUEST_ACTIVE = "request_active", "My request is ready, with how to connect"
    REQUEST_FAILED = "request_failed", "My request failed"
    REQUEST_REQUEUED = "request_requeued", "My request was preempted or requeued"
    REQUEST_EXPIRING = "request_expiring", "My request is about to expire"
    REQUEST_IDLE = "request_idle", "My request is idle and will be stopped"
    REQUEST_IDLE_STOPPED = "request_idle_stopped", "My request was stopped for being idle"
    REQUEST_RELEASED = "request_released", "My request was released"
    REQUEST_WAITING_EXPIRED = "request_waiting_expired", "My request waited too long for quota and was cancelled"
    RESERVATION_AT_RISK = (
        "reservation_at_risk",
        "A node planned for my reservation failed and none of its domain is free",
    )
    APPROVAL_DIGEST = "approval_digest", "A digest of what waits for my approval"
    BUDGET_WARNING = "budget_warning", "A project I lead used its warning share or all of its monthly budget"
    OPERATOR_RUN_FAILED = "operator_run_failed", "A provisioning run failed (operators)"
    OPERATOR_ISOLATION = "operator_isolation", "A device was isolated (operators)"


class NotificationAudience(models.TextChoices):
    REQUESTER = "requester", "About my requests"
    APPROVER = "approver", "As an approver"
    OPERATOR = "operator", "As an operator"


NOTIFICATION_AUDIENCE = {
    NotificationKind.REQUEST_APPROVED: NotificationAudience.REQUESTER,
    NotificationKind.REQUEST_REJECTED: NotificationAudience.REQUESTER,
    NotificationKind.REQUEST_ACTIVE: NotificationAudience.REQUESTER,
    NotificationKind.REQUEST_FAILED: NotificationAudience.REQUESTER,
    NotificationKind.REQUEST_REQUEUED: NotificationAudience.REQUESTER,
    NotificationKind.REQUEST_EXPIRING: NotificationAudience.REQUESTER,
    NotificationKind.REQUEST_IDLE: NotificationAudience.REQUESTER,
    NotificationKind.REQUEST_IDLE_STOPPED: NotificationAudience.REQUESTER,
    NotificationKind.REQUEST_RELEASED: NotificationAudience.REQUESTER,
    NotificationKind.REQUEST_WAITING_EXPIRED: NotificationAudience.REQUESTER,
    NotificationKind.RESERVATION_AT_RISK: NotificationAudience.REQUESTER,
    NotificationKind.APPROVAL_DIGEST: NotificationAudience.APPROVER,
    NotificationKind.BUDGET_WARNING: NotificationAudience.APPROVER,  # a lead approves, so hears as an approver
    NotificationKind.OPERATOR_RUN_FAILED: NotificationAudience.OPERATOR,
    NotificationKind.OPERATOR_ISOLATION: NotificationAudience.OPERATOR,
}
