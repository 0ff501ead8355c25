"""Our top-level `requests` app shadows the PyPI `requests` package; DRF's test client must not trip on it."""

import importlib

import rest_framework.compat


def test_drf_test_client_imports():
    module = importlib.import_module("rest_framework.test")
    assert module.APIClient is not None


def test_compat_does_not_mistake_our_app_for_the_http_library():
    import requests

    assert requests.__file__.endswith("requests/__init__.py") and "site-packages" not in requests.__file__
    assert rest_framework.compat.requests is None
