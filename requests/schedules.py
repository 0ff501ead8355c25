"""Background work wiring: periodic schedules and reactions to other apps' signals."""

from django_q.tasks import async_task

from config import schedules

REMINDER_TASK = "requests.tasks.remind_pending_approvals"


def ensure_schedules(**_kwargs) -> None:
    """Create the hourly approval-reminder schedule once; operators may retime it in the admin."""
    schedules.ensure(("Approval reminders", REMINDER_TASK, schedules.HOURLY))


def readmit_on_quota_change(*, project_ids: list[int], **_kwargs) -> None:
    for project_id in project_ids:
        async_task("requests.tasks.readmit_waiting", project_id)
