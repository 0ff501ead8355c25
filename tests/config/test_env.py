"""Typed environment readers: defaults for unset or blank values, a clear error for a malformed one."""

import pytest
from django.core.exceptions import ImproperlyConfigured

from config.env import env_bool, env_float, env_int, env_json

pytestmark = pytest.mark.integration  # starts processes of its own


@pytest.mark.parametrize(
    ("reader", "raw", "expected"),
    [(env_int, "42", 42), (env_float, "0.25", 0.25), (env_json, '{"a": [1]}', {"a": [1]}), (env_bool, "yes", True)],
)
def test_readers_parse_their_type(monkeypatch, reader, raw, expected):
    monkeypatch.setenv("SOME_SETTING", raw)
    assert reader("SOME_SETTING", None) == expected


@pytest.mark.parametrize("reader", [env_int, env_float, env_json])
def test_unset_or_blank_gives_the_default(monkeypatch, reader):
    monkeypatch.delenv("SOME_SETTING", raising=False)
    assert reader("SOME_SETTING", "default") == "default"
    monkeypatch.setenv("SOME_SETTING", "  ")
    assert reader("SOME_SETTING", "default") == "default"


@pytest.mark.parametrize(
    ("reader", "kind"), [(env_int, "an integer"), (env_float, "a number"), (env_json, "JSON"), (env_bool, "a boolean")]
)
def test_malformed_values_name_the_setting(monkeypatch, reader, kind):
    monkeypatch.setenv("SOME_SETTING", "{not")
    with pytest.raises(ImproperlyConfigured, match=f"SOME_SETTING must be {kind}"):
        reader("SOME_SETTING", None)


def _mail_settings(env: dict) -> dict:
    """config.settings as a fresh process reads it from `env`: the mail part."""
    import json
    import os
    import subprocess
    import sys

    script = (
        "import json, config.settings as s; print(json.dumps({k: getattr(s, k) for k in "
        "('EMAIL_BACKEND', 'EMAIL_HOST', 'EMAIL_PORT', 'EMAIL_HOST_USER', 'EMAIL_HOST_PASSWORD', 'EMAIL_USE_TLS', "
        "'DEFAULT_FROM_EMAIL')}))"
    )
    base = {key: value for key, value in os.environ.items() if not key.startswith("EMAIL_")}
    done = subprocess.run(
        [sys.executable, "-c", script],
        env={**base, "SECRET_KEY": "x", "METRICS_TOKEN": "x", **env},
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_mail_goes_to_the_console_in_the_demo_and_over_smtp_when_a_host_is_set():
    assert _mail_settings({})["EMAIL_BACKEND"] == "django.core.mail.backends.console.EmailBackend"
    production = _mail_settings(
        {
            "EMAIL_HOST": "smtp.example.org",
            "EMAIL_PORT": "587",
            "EMAIL_USER": "catalog",
            "EMAIL_PASSWORD": "s3cret",
            "EMAIL_USE_TLS": "1",
            "DEFAULT_FROM_EMAIL": "Compute <compute@example.org>",
        }
    )
    assert production == {
        "EMAIL_BACKEND": "django.core.mail.backends.smtp.EmailBackend",
        "EMAIL_HOST": "smtp.example.org",
        "EMAIL_PORT": 587,
        "EMAIL_HOST_USER": "catalog",
        "EMAIL_HOST_PASSWORD": "s3cret",
        "EMAIL_USE_TLS": True,
        "DEFAULT_FROM_EMAIL": "Compute <compute@example.org>",
    }
