"""Issue 37 item 3, the role matrix: the secret that opens a delivered workload (the Jupyter token of a workspace,
here on the simulated backend, which publishes a Jupyter port and takes a token like the container backend) reaches
its requester and no one else, on every field that could carry it: the request's API detail and list, its page and
the polled status area, the timeline, mails. Only the requester changes it; an operator sees it only through the
console's reveal, with a reason, audited and noted on the timeline. Before, the token was part of the Jupyter URL
every viewer of the request got (API `provisioning.delivered`, step outputs, the ACTIVE event, the Connect panel).

The container backend's own test (test_connect_secrets_container.py) shows the notebook taking only that token."""

import importlib
import json
from io import StringIO

import pytest
from django.apps import apps as django_apps
from django.contrib.auth.models import Permission
from django.core import mail
from django.core.management import call_command
from django.urls import reverse
from rest_framework.test import APIClient

from provisioning.connect import connect_secrets_shown
from provisioning.drivers.base import StepError
from provisioning.drivers.simulated import SimulatedHost
from provisioning.models import ConnectSecret, ProvisioningRun
from requests import services as request_services
from requests.choices import EventCode, RequestState
from tenancy.models import AuditEvent
from tests import factories
from tests.queries import queries_for

pytestmark = pytest.mark.django_db

VIEWERS = ["teammate", "approver", "lead", "operator"]


@pytest.fixture
def workspace(compute):
    """An active compute request on the simulated backend, its token, and everyone who might look at it."""
    request = compute.order()
    assert request.state == RequestState.ACTIVE
    team = compute.team
    people = {
        "requester": request.requester,
        "teammate": team.developer2,
        "approver": team.approver,
        "lead": team.lead,
        "operator": team.operator,
        "outsider": factories.member(factories.project()),
    }
    token = connect_secrets_shown(request, request.requester)["jupyter"]["secret"]
    return request, people, token


def _detail(request) -> str:
    return f"/api/v1/requests/{request.pk}/"


def _rotate_api(request) -> str:
    return f"/api/v1/requests/{request.pk}/connect-secrets/jupyter/rotate/"


def _stored(request) -> str:
    return connect_secrets_shown(request, request.requester)["jupyter"]["secret"]


def test_the_requester_gets_the_token_with_the_jupyter_url_in_the_api_and_on_the_page(workspace, api_as, client):
    request, _people, token = workspace
    notebook = ProvisioningRun.objects.get(request=request).delivered["access"]["jupyter"]

    shown = api_as(request.requester).get(_detail(request)).json()["connect_secrets"]
    client.force_login(request.requester)
    page = client.get(reverse("portal:request-detail", args=[request.pk]))

    assert shown == {
        "jupyter": {
            "label": "Jupyter token",
            "secret": token,
            "access": f"{notebook}?token={token}",
            "rotated_at": None,
        }
    }
    assert "token" not in notebook
    connect = page.content.decode().split('id="connect"')[1].split("</section>")[0]
    assert f"{notebook}?token={token}" in connect and 'id="rotate-jupyter"' in connect
    assert "no-store" in page["Cache-Control"]


@pytest.mark.parametrize("who", VIEWERS)
def test_nobody_else_gets_it_from_the_api_the_pages_or_the_timeline(workspace, api_as, client, who):
    request, people, token = workspace
    viewer = people[who]

    detail = api_as(viewer).get(_detail(request))
    listing = api_as(viewer).get("/api/v1/requests/")
    client.force_login(viewer)
    page = client.get(reverse("portal:request-detail", args=[request.pk]))
    status = client.get(reverse("portal:request-status", args=[request.pk]))

    assert [detail.status_code, listing.status_code, page.status_code, status.status_code] == [200] * 4
    assert detail.json()["connect_secrets"] is None
    assert detail.json()["provisioning"]["delivered"]["access"]["jupyter"]  # the access itself, without the token
    for answer in (detail, listing, page, status):
        assert token not in answer.content.decode()
    assert 'data-secret-withheld="jupyter"' in page.content.decode()
    assert 'id="rotate-jupyter"' not in page.content.decode()


def test_an_outsider_and_anonymous_get_nothing(workspace, api_as, client):
    request, people, _token = workspace
    assert api_as(people["outsider"]).get(_detail(request)).status_code == 404
    assert APIClient().get(_detail(request)).status_code == 401
    client.force_login(people["outsider"])
    assert client.get(reverse("portal:request-detail", args=[request.pk])).status_code == 404


def test_no_step_output_record_event_or_mail_holds_it(workspace):
    request, _people, token = workspace
    kept = {
        "runs": list(ProvisioningRun.objects.filter(request=request).values("delivered", "failure")),
        "steps": list(request.provisioning_runs.values("steps__output", "steps__log")),
        "timeline": list(request.events.values("message", "data")),
        "audit": list(AuditEvent.objects.values("reason", "data")),
    }
    assert token not in json.dumps(kept, default=str)
    assert token not in ConnectSecret.objects.get(request=request).ciphertext
    assert all(token not in message.body + str(message.alternatives) for message in mail.outbox)


# --- Rotation ---------------------------------------------------------------------------------------------------


def test_the_requester_rotates_it_over_the_api(workspace, api_as):
    request, _people, token = workspace

    answer = api_as(request.requester).post(_rotate_api(request))

    assert answer.status_code == 200, answer.content
    assert answer.json()["secret"] == _stored(request) != token
    event = request.events.get(code=EventCode.CONNECT_SECRET_ROTATED)
    assert token not in json.dumps(event.data) and answer.json()["secret"] not in json.dumps(event.data)


@pytest.mark.parametrize("who", VIEWERS)
def test_nobody_else_rotates_it(workspace, api_as, client, who):
    request, people, token = workspace

    answer = api_as(people[who]).post(_rotate_api(request))
    client.force_login(people[who])
    page = client.post(reverse("connect-secret-rotate", args=[request.pk, "jupyter"]))

    assert (answer.status_code, answer.json()["code"]) == (403, "not_requester")
    assert page.status_code == 403
    assert _stored(request) == token


def test_outsiders_and_anonymous_cannot_rotate_it(workspace, api_as, client):
    request, people, token = workspace
    assert api_as(people["outsider"]).post(_rotate_api(request)).status_code == 404
    assert APIClient().post(_rotate_api(request)).status_code == 401
    client.force_login(people["outsider"])
    assert client.post(reverse("connect-secret-rotate", args=[request.pk, "jupyter"])).status_code == 404
    assert _stored(request) == token


def test_the_requester_rotates_it_from_the_page_after_confirming(workspace, client):
    request, _people, token = workspace
    client.force_login(request.requester)
    url = reverse("connect-secret-rotate", args=[request.pk, "jupyter"])

    asked = client.get(url)
    assert asked.status_code == 200 and b"Change the Jupyter token?" in asked.content and _stored(request) == token
    done = client.post(url, follow=True)

    new = _stored(request)
    assert new != token
    assert new in done.content.decode() and token not in done.content.decode()
    assert b"every sign-in made with it, no longer works" in done.content


def test_rotation_is_refused_without_a_workload_or_a_secret(workspace, api_as, run_on_commit):
    request, _people, _token = workspace
    unknown = api_as(request.requester).post(f"/api/v1/requests/{request.pk}/connect-secrets/ssh/rotate/")
    assert (unknown.status_code, unknown.json()["code"]) == (404, "no_such_secret")

    run_on_commit(request_services.request_release, request=request, actor=request.requester, reason="done")
    released = api_as(request.requester).post(_rotate_api(request))

    assert (released.status_code, released.json()["code"]) == (409, "not_active")
    assert not ConnectSecret.objects.filter(request=request).exists()  # forgotten with the workload


def test_a_workload_that_does_not_take_the_new_token_keeps_the_old_one(workspace, api_as, settings):
    request, _people, token = workspace
    settings.PROVISIONING_FAULTS = [{"op": "connect_secret_set", "code": "podman_unreachable", "message": "down"}]

    answer = api_as(request.requester).post(_rotate_api(request))

    assert (answer.status_code, answer.json()["code"]) == (409, "rotation_failed")
    assert answer.json()["details"] == {"backend_code": "podman_unreachable"}
    assert _stored(request) == token
    assert not request.events.filter(code=EventCode.CONNECT_SECRET_ROTATED).exists()


# --- Operators: the audited reveal --------------------------------------------------------------------------------


def _reveal_url(secret: ConnectSecret) -> str:
    return reverse("admin:provisioning_connectsecret_reveal", args=[secret.pk])


def test_the_console_lists_secrets_without_their_values_in_constant_queries(workspace, compute, console):
    request, _people, token = workspace
    few = queries_for(console, "/admin/provisioning/connectsecret/")
    compute.order()
    assert queries_for(console, "/admin/provisioning/connectsecret/") == few
    secret = ConnectSecret.objects.get(request=request)
    change = console.get(reverse("admin:provisioning_connectsecret_change", args=[secret.pk]))
    assert change.status_code == 200 and 'id="act-reveal"' in change.content.decode()
    for page in (console.get("/admin/provisioning/connectsecret/"), change):
        assert token not in page.content.decode() and secret.ciphertext not in page.content.decode()


def test_an_operator_reveals_it_only_with_a_reason_which_is_audited_and_on_the_timeline(
    workspace, console, operator, api_as
):
    request, _people, token = workspace
    secret = ConnectSecret.objects.get(request=request)

    asked = console.get(_reveal_url(secret))
    without_reason = console.post(_reveal_url(secret), {"reason": ""})
    assert asked.status_code == 200 and token not in asked.content.decode()
    assert without_reason.status_code == 400 and token not in without_reason.content.decode()
    assert not AuditEvent.objects.filter(action="connect_secret.revealed").exists()

    revealed = console.post(_reveal_url(secret), {"reason": "Ticket 4711: the notebook hangs"})

    assert revealed.status_code == 200 and token in revealed.content.decode()
    assert "no-store" in revealed["Cache-Control"]
    audit = AuditEvent.objects.get(action="connect_secret.revealed")
    assert (audit.actor, audit.reason, audit.data) == (
        operator,
        "Ticket 4711: the notebook hangs",
        {"name": "jupyter"},
    )
    timeline = api_as(request.requester).get(_detail(request)).json()["timeline"]
    [note] = [event for event in timeline if event["code"] == "connect_secret_revealed"]
    assert note["actor"] == operator.username and "Ticket 4711" in note["message"]
    assert token not in json.dumps(timeline) and token not in json.dumps(audit.data) + audit.reason


@pytest.mark.parametrize("who", ["requester", "lead", "approver"])
def test_people_who_are_not_operators_cannot_open_the_reveal(workspace, client, who):
    request, people, _token = workspace
    client.force_login(people[who])

    answer = client.post(_reveal_url(ConnectSecret.objects.get(request=request)), {"reason": "curious"})

    assert answer.status_code == 302 and "/admin/login/" in answer["Location"]
    assert not AuditEvent.objects.filter(action="connect_secret.revealed").exists()


def test_staff_without_the_reveal_permission_is_refused(workspace, client):
    request, _people, token = workspace
    staff = factories.UserFactory(is_staff=True)
    staff.user_permissions.add(Permission.objects.get(codename="view_connectsecret"))
    client.force_login(staff)

    answer = client.post(_reveal_url(ConnectSecret.objects.get(request=request)), {"reason": "curious"})

    assert answer.status_code == 403 and token not in answer.content.decode()


def test_after_a_key_rotation_reencrypt_secrets_moves_them_to_the_new_key(workspace, settings):
    request, _people, token = workspace
    settings.SECRET_KEY_FALLBACKS, settings.SECRET_KEY = [settings.SECRET_KEY], "a-new-secret-key"
    out = StringIO()

    call_command("reencrypt_secrets", stdout=out)
    settings.SECRET_KEY_FALLBACKS = []

    assert "Re-encrypted 1 connect secrets" in out.getvalue()
    assert _stored(request) == token
    [audited] = AuditEvent.objects.filter(action="connect_secrets.reencrypted")
    assert audited.data == {"count": 1, "unreadable": []} and token not in str(audited.data)


def test_the_migration_takes_tokens_out_of_old_outputs_records_and_events(workspace):
    """What a workspace delivered before: the token in its start step's output, its record and its ACTIVE event."""
    request, _people, _token = workspace
    ConnectSecret.objects.filter(request=request).delete()
    run = ProvisioningRun.objects.get(request=request)
    step = run.steps.get(name="start_workload")
    event = request.events.get(code=EventCode.ACTIVE)
    with_token = "http://node-1:40001/?token=old-token"
    run.delivered["access"]["jupyter"] = with_token
    step.output["access"] = {"jupyter": with_token}
    event.data["delivered"]["access"]["jupyter"] = with_token
    run.save(update_fields=["delivered"])
    step.save(update_fields=["output"])
    event.save(update_fields=["data"])
    migration = importlib.import_module("provisioning.migrations.0008_connect_secrets_out_of_outputs")

    migration.forward(django_apps, None)

    run.refresh_from_db()
    step.refresh_from_db()
    event.refresh_from_db()
    for access in (run.delivered["access"], step.output["access"], event.data["delivered"]["access"]):
        assert access["jupyter"] == "http://node-1:40001/"
    assert _stored(request) == "old-token"
    assert "old-token" not in json.dumps([run.delivered, step.output, event.data])


def test_a_start_that_could_not_install_the_token_is_retried_with_the_same_one(compute, monkeypatch):
    installed = []

    def busy_once(driver, target, name, value):
        installed.append(value)
        if len(installed) == 1:
            raise StepError("podman_failed", "podman exec failed: the container is still starting")

    monkeypatch.setattr(SimulatedHost, "connect_secret_set", busy_once)

    request = compute.order()

    assert request.state == RequestState.ACTIVE
    step = ProvisioningRun.objects.get(request=request).steps.get(name="start_workload")
    assert step.attempts == 2 and step.output["connect_secrets"] == ["jupyter"]
    assert installed == [_stored(request)] * 2
