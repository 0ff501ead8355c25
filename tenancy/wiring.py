"""What tenancy connects at start-up: the directory's audit receivers, the operator group kept in step with the
apps' operator permissions, and tenancy's periodic schedules. Called once from TenancyConfig.ready()."""

PURGE_TOKENS_TASK = "tenancy.tasks.purge_api_tokens"
SYNC_DIRECTORY_TASK = "tenancy.tasks.sync_directory"
PURGE_DEVICE_SIGN_INS_TASK = "tenancy.tasks.purge_device_authorizations"


def ensure_schedules(**_kwargs) -> None:
    """The daily purges of API tokens that ended long ago and of expired device sign-ins, and the directory sync
    (every DIRECTORY_SYNC_MINUTES), created once; operators may retime them in the admin."""
    from django.conf import settings
    from django_q.models import Schedule

    from config import schedules

    schedules.ensure(
        ("Purge ended API tokens", PURGE_TOKENS_TASK, (Schedule.DAILY, None)),
        ("Purge expired device sign-ins", PURGE_DEVICE_SIGN_INS_TASK, (Schedule.DAILY, None)),
        ("Sync directory groups", SYNC_DIRECTORY_TASK, (Schedule.MINUTES, settings.DIRECTORY_SYNC_MINUTES)),
    )


def connect(app_config) -> None:
    from django.db.models.signals import post_migrate

    from tenancy.directory import audit
    from tenancy.operators import sync_operator_group

    audit.connect()
    post_migrate.connect(sync_operator_group, dispatch_uid="tenancy.sync_operator_group")
    post_migrate.connect(ensure_schedules, sender=app_config, dispatch_uid="tenancy.ensure_schedules")
