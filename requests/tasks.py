"""django-q2 entry points: take ids, call one service."""

from datetime import timedelta

from django.conf import settings

from requests import approvals, services


def readmit_waiting(project_id: int) -> int:
    return len(services.request_readmit_waiting(project_id=project_id))


def remind_pending_approvals() -> int:
    return approvals.approvals_remind_stale(older_than=timedelta(hours=settings.APPROVAL_REMINDER_HOURS))
