"""django-q2 entry points: take ids, call one service."""

from datetime import timedelta

from django.conf import settings

from config.retry import retry_if_locked
from requests import approvals, services


@retry_if_locked
def readmit_waiting(project_id: int) -> int:
    return len(services.request_readmit_waiting(project_id=project_id))


@retry_if_locked
def remind_pending_approvals() -> int:
    return approvals.approvals_remind_stale(older_than=timedelta(hours=settings.APPROVAL_REMINDER_HOURS))
