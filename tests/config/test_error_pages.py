"""The product's own 403, 404 and 500 pages for people (JSON for the API), and the demo as `make run` starts it
showing them too: it runs without DEBUG, so a bad URL never shows Django's debug page listing the URLconf."""

import os
import shlex
import subprocess
import sys

import httpx
import pytest
from django.db import connection

from requests import selectors
from tests.config.conftest import REPO, _free_port, _wait_until_up

pytestmark = [pytest.mark.django_db, pytest.mark.integration]  # integration: starts processes


def test_a_bad_url_is_the_product_s_404_page(client):
    response = client.get("/no/such/page/")

    assert response.status_code == 404
    body = response.content.decode()
    assert 'id="problem"' in body and "We can't find that page" in body
    assert "Compute Catalog" in body and "URLconf" not in body and "Resolver404" not in body


def test_a_404_raised_by_a_view_says_its_sentence(client, roles):
    client.force_login(roles.developer)

    response = client.get("/requests/999999/")

    assert response.status_code == 404
    assert "No such request." in response.content.decode()
    assert "Find it among your requests" in response.content.decode()


def test_the_api_keeps_its_json_404(client):
    response = client.get("/api/v1/no-such/")

    assert response.status_code == 404 and response.json()["code"] == "not_found"


def test_a_failure_is_the_product_s_500_page(client, roles, monkeypatch):
    client.raise_request_exception = False
    client.force_login(roles.developer)

    def broken(**kwargs):
        raise RuntimeError("the database went away")

    monkeypatch.setattr(selectors, "request_list_visible_to", broken)
    response = client.get("/requests/")

    assert response.status_code == 500
    body = response.content.decode()
    assert 'data-status="500"' in body and "Something went wrong on our side" in body
    assert "the database went away" not in body and "Traceback" not in body


def _demo_env() -> dict:
    """The environment `make run` gives the web server (the Makefile's DEMO_ENV), on this run's database."""
    printed = subprocess.run(
        ["make", "--no-print-directory", "-s", "--eval=demo-env: ; @echo $(DEMO_ENV)", "demo-env"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    demo = dict(item.split("=", 1) for item in shlex.split(printed))
    database = connection.settings_dict
    host, port = database["HOST"] or "127.0.0.1", database["PORT"] or 5432
    url = f"postgres://{database['USER']}@{host}:{port}/{database['NAME']}"
    inherited = {key: value for key, value in os.environ.items() if key not in ("DEBUG", "DEMO", "SECRET_KEY")}
    return {**inherited, **demo, "DJANGO_SETTINGS_MODULE": "config.settings", "DATABASE_URL": url}


def test_the_demo_shows_the_product_s_404_page_and_still_serves_its_static_files(tmp_path):
    env = _demo_env()
    assert "DEBUG" not in env or env["DEBUG"] in ("", "0")
    port, log = _free_port(), tmp_path / "runserver.log"
    server = subprocess.Popen(
        [sys.executable, "manage.py", "runserver", f"127.0.0.1:{port}", "--noreload"],
        cwd=REPO,
        env=env,
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
    )
    try:
        _wait_until_up(f"http://127.0.0.1:{port}/accounts/login/", server, log)
        missing = httpx.get(f"http://127.0.0.1:{port}/no/such/page/")
        stylesheet = httpx.get(f"http://127.0.0.1:{port}/static/css/portal.css")
        admin_css = httpx.get(f"http://127.0.0.1:{port}/static/admin/css/base.css")
    finally:
        server.terminate()
        server.wait(timeout=30)

    assert missing.status_code == 404
    assert "We can't find that page" in missing.text
    assert "URLconf" not in missing.text and "DEBUG = True" not in missing.text
    assert stylesheet.status_code == 200 and ".page-problem" in stylesheet.text
    assert admin_css.status_code == 200  # the console's static files too, without collectstatic
