import sys

from django.apps import AppConfig


class RequestsConfig(AppConfig):
    name = "requests"
    label = "requests"
    verbose_name = "Resource requests"

    def ready(self):
        _hide_from_drf_compat()


def _hide_from_drf_compat():
    """Our app shadows the PyPI `requests` package; stop DRF's test client from mistaking it for the library.

    rest_framework.compat does `import requests` and, when it finds something, rest_framework.test builds
    its RequestsClient on `requests.Session`, which our app does not have.
    """
    import rest_framework.compat

    if getattr(rest_framework.compat, "requests", None) is sys.modules.get(__name__.rpartition(".")[0]):
        rest_framework.compat.requests = None
