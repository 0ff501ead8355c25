"""Production settings (config/settings.py, docs/security.md): with only what a deployment must set, Django's deploy
checks pass at the strictest level; /metrics needs its token outside DEBUG, and the process refuses to start
without one; every page carries a Content-Security-Policy that allows no inline script, and no template has one."""

import os
import re
import secrets
import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings as django_settings

pytestmark = pytest.mark.integration  # starts processes of its own

REPO = Path(__file__).resolve().parents[2]
# What the test settings (config/settings_test.py) and the browser tests (DJANGO_ALLOW_ASYNC_UNSAFE) put into this
# process's environment, and what a deployment sets.
OURS = ("DJANGO_", "DEBUG", "DEMO", "SECRET_KEY", "METRICS_TOKEN", "ALLOWED_HOSTS", "CSP_")


def production_env(**overrides) -> dict:
    """The environment of a production process: DEBUG off, a strong secret key, the metrics token, its host name;
    every hardening setting left at its default."""
    base = {key: value for key, value in os.environ.items() if not key.startswith(("SECURE_", *OURS))}
    return {
        **base,
        "DJANGO_SETTINGS_MODULE": "config.settings",
        "DEBUG": "0",
        "SECRET_KEY": secrets.token_urlsafe(50),
        "METRICS_TOKEN": secrets.token_urlsafe(32),
        "ALLOWED_HOSTS": "compute.example.org",
        **overrides,
    }


def manage(env: dict, *arguments: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "manage.py", *arguments], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )


def test_check_deploy_passes_at_warning_level_under_production_settings():
    done = manage(production_env(), "check", "--deploy", "--fail-level", "WARNING")
    assert done.returncode == 0, done.stdout + done.stderr


def test_check_deploy_fails_when_a_hardening_setting_is_turned_off():
    done = manage(production_env(SECURE_SSL_REDIRECT="0"), "check", "--deploy", "--fail-level", "WARNING")
    assert done.returncode != 0 and "security.W008" in done.stdout + done.stderr


def test_the_process_refuses_to_start_without_a_metrics_token_outside_debug():
    refused = manage(production_env(METRICS_TOKEN=""), "check")
    assert refused.returncode != 0
    assert "METRICS_TOKEN must be set when DEBUG is off" in refused.stderr
    assert manage(production_env(METRICS_TOKEN="", DEBUG="1"), "check").returncode == 0  # the demo needs none
    assert manage(production_env(METRICS_TOKEN="", DEMO="1"), "check").returncode == 0  # as `make run` starts it


@pytest.mark.django_db
def test_metrics_answer_only_the_token_outside_debug_and_anyone_in_the_demo(client, settings):
    bearer = {"HTTP_AUTHORIZATION": f"Bearer {settings.METRICS_TOKEN}"}
    assert client.get("/metrics").status_code == 401
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer wrong").status_code == 401
    assert client.get("/metrics", **bearer).status_code == 200
    settings.METRICS_TOKEN = ""
    assert client.get("/metrics").status_code == 401  # no token configured outside DEBUG: nobody
    settings.DEBUG = True
    assert client.get("/metrics").status_code == 200


@pytest.mark.django_db
def test_pages_carry_a_content_security_policy_that_allows_no_inline_script(client):
    policy = client.get("/accounts/login/")["Content-Security-Policy"]
    directives = dict(part.strip().split(" ", 1) for part in policy.split(";") if part.strip())
    assert directives["script-src"] == "'self'"
    assert directives["object-src"] == "'none'" and directives["frame-ancestors"] == "'none'"


@pytest.mark.django_db
def test_the_api_documentation_page_loads_its_scripts_from_files(client, roles):
    client.force_login(roles.developer)
    page = client.get("/api/docs/").content.decode()
    scripts = re.findall(r"<script\b[^>]*>", page)
    assert scripts and all("src=" in tag for tag in scripts), scripts


def _templates() -> list[Path]:
    roots = [Path(config["DIRS"][0]) for config in django_settings.TEMPLATES] + [
        path for path in REPO.glob("*/templates") if path.is_dir()
    ]
    return sorted({template for root in roots for template in root.rglob("*.html")})


INLINE_SCRIPT = re.compile(r"<script\b(?![^>]*\bsrc=)(?![^>]*type=\"application/(?:ld\+)?json\")[^>]*>", re.I)
INLINE_HANDLER = re.compile(r"<[^>]*\son[a-z]+\s*=", re.I)


def test_no_template_has_an_inline_script_or_event_handler():
    templates = _templates()
    assert len(templates) > 30
    offenders = [
        f"{template.relative_to(REPO)}: {match.group(0)[:80]}"
        for template in templates
        for pattern in (INLINE_SCRIPT, INLINE_HANDLER, re.compile(r"javascript:", re.I))
        for match in pattern.finditer(template.read_text())
    ]
    assert offenders == []
