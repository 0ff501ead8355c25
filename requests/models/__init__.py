from requests.models.approval import (
    Approval,
    ApprovalAssignment,
    ApprovalPolicy,
    ApprovalRule,
    ApprovalRuleStage,
    ApprovalStage,
)
from requests.models.extension import RequestExtension
from requests.models.notification import NotificationDelivery, NotificationPreference
from requests.models.quota_change import QuotaChangeRequest
from requests.models.request import RequestEvent, ResourceRequest

__all__ = [
    "Approval",
    "ApprovalAssignment",
    "ApprovalPolicy",
    "ApprovalRule",
    "ApprovalRuleStage",
    "ApprovalStage",
    "NotificationDelivery",
    "NotificationPreference",
    "QuotaChangeRequest",
    "RequestEvent",
    "RequestExtension",
    "ResourceRequest",
]
