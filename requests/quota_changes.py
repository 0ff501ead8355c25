"""Quota change requests: a project lead asks, the approval engine decides, quota_set applies."""

from decimal import Decimal, InvalidOperation

from django.db import transaction

from config.errors import DomainError, NotPermitted
from requests import approvals
from requests.choices import ApprovalSubject
from requests.models import QuotaChangeRequest
from tenancy.choices import ProjectPermission, QuotaDimension
from tenancy.models import Project, ProjectQuota, User
from tenancy.selectors import user_has_project_permission
from tenancy.services import audit_record, quota_set

_INTEGER_DIMENSIONS = {
    QuotaDimension.ACCELERATOR_MEMORY_GB,
    QuotaDimension.CPU_CORES,
    QuotaDimension.MEMORY_GB,
    QuotaDimension.CONCURRENT_TASKS,
}


def _parsed_limits(raw: dict) -> dict[str, Decimal | int | None]:
    unknown = set(raw) - set(QuotaDimension.values)
    if not raw or unknown:
        raise DomainError(
            "Name at least one quota dimension, and only known ones.",
            code="unknown_quota_dimension",
            details={"unknown": sorted(unknown), "allowed": QuotaDimension.values},
        )
    parsed = {}
    for dimension, value in raw.items():
        try:
            number = None if value is None else Decimal(str(value))
        except InvalidOperation:
            number = Decimal(-1)
        if number is not None and (number < 0 or (dimension in _INTEGER_DIMENSIONS and number != int(number))):
            kind = "whole number" if dimension in _INTEGER_DIMENSIONS else "number"
            raise DomainError(
                f"{dimension} must be a non-negative {kind}, or null for no limit.",
                code="invalid_quota_value",
                details={"dimension": dimension, "value": value},
            )
        parsed[dimension] = None if number is None else int(number) if dimension in _INTEGER_DIMENSIONS else number
    return parsed


def _json(limits: dict) -> dict:
    return {key: None if value is None else str(value) for key, value in limits.items()}


@transaction.atomic
def quota_change_request_submit(
    *, project: Project, limits: dict, justification: str, actor: User
) -> QuotaChangeRequest:
    if not user_has_project_permission(user=actor, project=project, permission=ProjectPermission.MANAGE):
        raise NotPermitted("Only the project lead can ask for a quota change.", code="not_project_lead")
    if not justification.strip():
        raise DomainError("Say why the project needs it.", code="justification_required")
    parsed = _parsed_limits(limits)
    current = ProjectQuota.objects.get(project=project).limits()
    if all(current[dimension] == value for dimension, value in parsed.items()):
        raise DomainError("The requested limits are the current ones.", code="no_change")
    change = QuotaChangeRequest.objects.create(
        project=project,
        requested_by=actor,
        limits=_json(parsed),
        previous_limits=_json({dimension: current[dimension] for dimension in parsed}),
        justification=justification.strip(),
    )
    facts = approvals.Facts(
        subject=ApprovalSubject.QUOTA_CHANGE,
        project=project,
        requester=actor,
        summary=f"Quota change for {project}: "
        + ", ".join(
            f"{label} {before or 'no limit'} → {after or 'no limit'}"
            for label, before, after in change.changes_in_words
        ),
    )
    audit_record(
        actor=actor,
        action="quota_change.requested",
        target=change,
        reason=change.justification,
        data={"limits": change.limits},
    )
    approvals.approval_start(subject=change, facts=facts)
    return change


class QuotaChangeApprovals:
    """How the approval engine reports back to quota change requests."""

    subject = ApprovalSubject.QUOTA_CHANGE

    def default_route(self, facts: approvals.Facts) -> approvals.DefaultRoute:
        """Changing a quota is never approved automatically: operators decide unless a rule names approvers."""
        return approvals.operators_decide(
            "Default: operators decide quota matters", reason="operators decide every quota change"
        )

    def on_approved(self, change: QuotaChangeRequest, *, actor: User | None) -> None:
        change = QuotaChangeRequest.objects.select_for_update().get(pk=change.pk)
        change.decide(approved=True)
        change.save()
        quota_set(
            quota=change.project.quota,
            limits=_parsed_limits(change.limits),
            actor=actor,
            reason=f"Quota change #{change.pk} approved: {change.justification}",
        )

    def on_rejected(self, change: QuotaChangeRequest, *, actor: User, comment: str) -> None:
        change = QuotaChangeRequest.objects.select_for_update().get(pk=change.pk)
        change.decide(approved=False)
        change.save()
        audit_record(actor=actor, action="quota_change.rejected", target=change, reason=comment)

    def note(self, change: QuotaChangeRequest, *, code: str, message: str, actor: User | None, data: dict) -> None:
        audit_record(actor=actor, action=f"quota_change.{code}", target=change, reason=message, data=data)
