"""What the request workflow connects at start-up: the approval subjects it routes, the hooks it answers for lower
apps, the signals it listens to, its schedules and its system checks. Called once from RequestsConfig.ready()."""


def reroute_approvals(*, user, **_kwargs) -> None:
    """A user who lost a directory group's rights no longer holds approval stages: hand them on."""
    from requests.approvals import approvals_reroute_from

    approvals_reroute_from(user=user)


def connect(app_config) -> None:
    from django.core import checks
    from django.db.models.signals import post_migrate

    from config.hooks import register
    from requests import approvals
    from requests.checks import check_hooks_registered
    from requests.extensions import ExtensionApprovals
    from requests.models import QuotaChangeRequest, RequestExtension, ResourceRequest
    from requests.quota import usage_by_project
    from requests.quota_changes import QuotaChangeApprovals
    from requests.schedules import ensure_schedules, readmit_on_quota_change
    from requests.selectors import open_work_of
    from requests.services import RequestApprovals
    from tenancy import hooks
    from tenancy.signals import directory_rights_removed, quota_changed

    approvals.register_subject(ResourceRequest, RequestApprovals())
    approvals.register_subject(QuotaChangeRequest, QuotaChangeApprovals())
    approvals.register_subject(RequestExtension, ExtensionApprovals())
    register(hooks.PROJECT_USAGE, usage_by_project)
    register(hooks.OPEN_WORK, open_work_of)
    quota_changed.connect(readmit_on_quota_change, dispatch_uid="requests.readmit_on_quota_change")
    directory_rights_removed.connect(reroute_approvals, dispatch_uid="requests.reroute_approvals")
    post_migrate.connect(ensure_schedules, sender=app_config, dispatch_uid="requests.ensure_schedules")
    checks.register(check_hooks_registered)
