import sys

from django.apps import AppConfig
from django.db.models.signals import post_migrate

_OPERATED = [
    "resourcerequest",
    "requestextension",
    "requestevent",
    "approvalpolicy",
    "approvalrule",
    "approvalrulestage",
    "approval",
    "approvalstage",
    "approvalassignment",
    "quotachangerequest",
]


class RequestsConfig(AppConfig):
    name = "requests"
    label = "requests"
    verbose_name = "Requests and approvals"
    operator_permissions = [f"requests.view_{model}" for model in _OPERATED] + [
        "requests.change_resourcerequest",
        *[
            f"requests.{verb}_{model}"
            for model in ("approvalpolicy", "approvalrule", "approvalrulestage")
            for verb in ("add", "change", "delete")
        ],
    ]

    def ready(self):
        _hide_from_drf_compat()
        from django.core import checks

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
        directory_rights_removed.connect(_reroute_approvals, dispatch_uid="requests.reroute_approvals")
        post_migrate.connect(ensure_schedules, sender=self, dispatch_uid="requests.ensure_schedules")
        checks.register(check_hooks_registered)


def _reroute_approvals(*, user, **_kwargs) -> None:
    from requests.approvals import approvals_reroute_from

    approvals_reroute_from(user=user)


def _hide_from_drf_compat():
    """Our app shadows the PyPI `requests` package; stop DRF's test client from mistaking it for the library.

    rest_framework.compat does `import requests` and, when it finds something, rest_framework.test builds
    its RequestsClient on `requests.Session`, which our app does not have.
    """
    import rest_framework.compat

    if getattr(rest_framework.compat, "requests", None) is sys.modules.get(__name__.rpartition(".")[0]):
        rest_framework.compat.requests = None
