"""django-q2 entry points: take ids, call one service."""

from datetime import timedelta

from django.conf import settings

from config.retry import retry_if_locked
from requests import approvals, notifications, services


@retry_if_locked
def readmit_waiting(project_id: int) -> int:
    return len(services.request_readmit_waiting(project_id=project_id))


def expire_waiting() -> int:
    return services.requests_expire_waiting()


@retry_if_locked
def remind_pending_approvals() -> int:
    return approvals.approvals_remind_stale(older_than=timedelta(hours=settings.APPROVAL_REMINDER_HOURS))


def notify_request_events(event_ids: list[int]) -> int:
    return notifications.request_events_notify(event_ids=event_ids)


def send_approval_digests() -> int:
    return notifications.approval_digests_send()
