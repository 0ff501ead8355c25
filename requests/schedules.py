"""Background work wiring: periodic schedules and reactions to other apps' signals."""

from django.conf import settings
from django_q.models import Schedule
from django_q.tasks import async_task

from config import schedules

DIGEST_TASK = "requests.tasks.send_approval_digests"

REMINDER_TASK = "requests.tasks.remind_pending_approvals"

WAITING_EXPIRY_TASK = "requests.tasks.expire_waiting"


def ensure_schedules(**_kwargs) -> None:
    """Create the hourly approval-reminder schedule, the approvers' digest and the sweep that ends orders waiting
    too long for quota once; operators may retime them in the admin."""
    schedules.ensure(
        ("Approval reminders", REMINDER_TASK, schedules.HOURLY),
        ("Expire orders waiting for quota", WAITING_EXPIRY_TASK, schedules.EVERY_FIVE_MINUTES),
        ("Approval digest mails", DIGEST_TASK, (Schedule.MINUTES, settings.NOTIFY_APPROVAL_DIGEST_MINUTES)),
    )


def readmit_on_quota_change(*, project_ids: list[int], **_kwargs) -> None:
    for project_id in project_ids:
        async_task("requests.tasks.readmit_waiting", project_id)
