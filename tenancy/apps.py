from django.apps import AppConfig
from django.db.models.signals import post_migrate


def _crud(app_label: str, model: str, *verbs: str) -> list[str]:
    return [f"{app_label}.{verb}_{model}" for verb in verbs]


class TenancyConfig(AppConfig):
    name = "tenancy"
    verbose_name = "Tenancy, projects and quotas"
    operator_permissions = [
        "tenancy.view_user",
        *_crud("tenancy", "tenant", "view", "add", "change"),
        *_crud("tenancy", "project", "view", "add", "change"),
        *_crud("tenancy", "membership", "view", "add", "change", "delete"),
        *_crud("tenancy", "projectquota", "view", "change"),
        *_crud("tenancy", "tenantquota", "view", "add", "change"),
        "tenancy.view_auditevent",
        "tenancy.view_invitation",
        *_crud("tenancy", "apitoken", "view", "change"),  # change: revoke
        "tenancy.view_serviceaccount",
        "tenancy.view_directoryaccount",
        "tenancy.view_directorygrant",
        *_crud("tenancy", "groupmapping", "view", "add", "change", "delete"),
        # Sign-in lockouts (django-axes): see failures and sign-ins, clear a lockout (audited, tenancy.sign_in).
        *_crud("axes", "accessattempt", "view", "delete"),
        "axes.view_accesslog",
        "axes.view_accessfailurelog",
    ]

    def ready(self):
        from tenancy.directory import audit
        from tenancy.operators import sync_operator_group

        audit.connect()
        post_migrate.connect(sync_operator_group, dispatch_uid="tenancy.sync_operator_group")
        post_migrate.connect(_ensure_schedules, sender=self, dispatch_uid="tenancy.ensure_schedules")


PURGE_TOKENS_TASK = "tenancy.tasks.purge_api_tokens"
SYNC_DIRECTORY_TASK = "tenancy.tasks.sync_directory"


def _ensure_schedules(**_kwargs) -> None:
    """The daily purge of API tokens that ended long ago and the directory sync (every DIRECTORY_SYNC_MINUTES),
    created once; operators may retime them in the admin."""
    from django.conf import settings
    from django_q.models import Schedule

    from config import schedules

    schedules.ensure(
        ("Purge ended API tokens", PURGE_TOKENS_TASK, (Schedule.DAILY, None)),
        ("Sync directory groups", SYNC_DIRECTORY_TASK, (Schedule.MINUTES, settings.DIRECTORY_SYNC_MINUTES)),
    )
