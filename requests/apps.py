import sys

from django.apps import AppConfig

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
        from requests import wiring

        wiring.connect(self)


def _hide_from_drf_compat():
    """Our app shadows the PyPI `requests` package; stop DRF's test client from mistaking it for the library.

    rest_framework.compat does `import requests` and, when it finds something, rest_framework.test builds
    its RequestsClient on `requests.Session`, which our app does not have.
    """
    import rest_framework.compat

    if getattr(rest_framework.compat, "requests", None) is sys.modules.get(__name__.rpartition(".")[0]):
        rest_framework.compat.requests = None
