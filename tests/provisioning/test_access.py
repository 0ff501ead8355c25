"""Who sees and does what: the request's provisioning in the API and on its page, the retry endpoint, the
installer callback, the operator console (role matrix and constant query counts), and /metrics."""

import pytest
from django.conf import settings
from django.urls import reverse
from prometheus_client.parser import text_string_to_metric_families

from provisioning.choices import RunKind
from provisioning.models import ProvisioningRun
from requests import services as request_services
from requests.choices import RequestState
from tenancy.choices import Role
from tests import factories
from tests.queries import queries_for

pytestmark = pytest.mark.django_db


@pytest.fixture
def delivered(compute):
    """An active request with its delivered resource, plus an outsider, an approver and an operator."""
    request = compute.order()
    assert request.state == RequestState.ACTIVE
    return request


def detail_url(request) -> str:
    return f"/api/v1/requests/{request.pk}/"


def test_request_api_shows_steps_and_the_delivered_resource(delivered, api_as):
    body = api_as(delivered.requester).get(detail_url(delivered)).json()
    provisioning = body["provisioning"]
    run = provisioning["runs"][0]
    assert (run["kind"], run["state"], run["pipeline"]) == ("provision", "succeeded", "compute")
    assert [step["name"] for step in run["steps"]] == [
        "prepare_image",
        "start_workload",
        "readiness_check",
        "publish_access",
    ]
    assert {"label", "state", "attempts", "duration_seconds", "log", "output", "error"} <= set(run["steps"][0])
    assert provisioning["delivered"]["access"]["ssh"].startswith("ssh -p ")
    assert provisioning["delivered"]["devices"][0]["uuid"] == "GPU-n1-0"


@pytest.mark.parametrize(
    ("who", "status"), [("requester", 200), ("approver", 200), ("operator", 200), ("outsider", 404)]
)
def test_request_api_and_page_follow_the_role_matrix(delivered, compute, api_as, client, who, status):
    users = {
        "requester": delivered.requester,
        "approver": compute.team.approver,
        "operator": compute.team.operator,
        "outsider": factories.member(factories.project()),
    }
    assert api_as(users[who]).get(detail_url(delivered)).status_code == status
    client.force_login(users[who])
    panel = client.get(reverse("portal:request-status", args=[delivered.pk]))
    assert panel.status_code == status
    if status == 200:
        assert b'data-step="publish_access" data-state="succeeded"' in panel.content
        page = client.get(reverse("portal:request-detail", args=[delivered.pk])).content.decode()
        assert 'id="delivered"' in page and "ssh -p" in page.split('id="connect"')[1]


def test_anonymous_gets_nothing(delivered, api, client):
    assert api.get(detail_url(delivered)).status_code == 401
    assert client.get(reverse("portal:request-status", args=[delivered.pk])).status_code == 302
    retry = api.post(reverse("provisioning-run-retry", args=[1]), {"reason": "x"}, format="json")
    assert retry.status_code == 401


def test_status_polls_slowly_once_active_and_stops_when_final(delivered, client, run_on_commit):
    client.force_login(delivered.requester)
    url = reverse("portal:request-status", args=[delivered.pk])
    assert b'hx-trigger="every 15s"' in client.get(url).content
    run_on_commit(request_services.request_release, request=delivered, actor=delivered.requester, reason="done")
    delivered.refresh_from_db()
    assert delivered.state == RequestState.RELEASED
    assert b"hx-trigger" not in client.get(url).content


@pytest.fixture
def failed_run(compute, settings):
    settings.PROVISIONING_FAULTS = [{"op": "start_workload", "code": "boom", "message": "Boom.", "retryable": False}]
    request = compute.order()
    settings.PROVISIONING_FAULTS = []
    return ProvisioningRun.objects.get(request=request, kind=RunKind.PROVISION)


@pytest.mark.parametrize(
    ("who", "status", "code"),
    [
        ("requester", 403, "permission_denied"),
        ("approver", 403, "permission_denied"),
        ("lead", 403, "permission_denied"),
        ("operator", 201, None),
    ],
)
def test_retry_api_is_for_operators(failed_run, compute, api_as, who, status, code, django_capture_on_commit_callbacks):
    users = {
        "requester": failed_run.request.requester,
        "approver": compute.team.approver,
        "lead": compute.team.lead,
        "operator": compute.team.operator,
    }
    with django_capture_on_commit_callbacks(execute=True):
        answer = api_as(users[who]).post(
            reverse("provisioning-run-retry", args=[failed_run.pk]), {"reason": "fixed"}, format="json"
        )
    assert answer.status_code == status, answer.content
    if code:
        assert answer.json()["code"] == code
        failed_run.request.refresh_from_db()
        assert failed_run.request.state == RequestState.FAILED
    else:
        assert answer.json()["retry_of"] == failed_run.pk


def test_retry_api_refusals_use_the_error_shape(failed_run, compute, api_as):
    operator = api_as(compute.team.operator)
    assert (
        operator.post(reverse("provisioning-run-retry", args=[failed_run.pk]), {}, format="json").json()["code"]
        == "validation_error"
    )
    assert (
        operator.post(reverse("provisioning-run-retry", args=[999999]), {"reason": "x"}, format="json").status_code
        == 404
    )
    cleanup = ProvisioningRun.objects.get(request=failed_run.request, kind=RunKind.CLEANUP)
    refused = operator.post(reverse("provisioning-run-retry", args=[cleanup.pk]), {"reason": "x"}, format="json")
    assert refused.status_code == 409 and refused.json()["code"] == "not_retryable"


def test_console_lists_runs_in_constant_queries_and_filters_by_step(compute, console):
    compute.order()
    few = queries_for(console, "/admin/provisioning/provisioningrun/")
    compute.order()
    assert queries_for(console, "/admin/provisioning/provisioningrun/") == few
    filtered = console.get(
        "/admin/provisioning/provisioningrun/", {"state": "succeeded", "driver": "simulated", "step": "publish_access"}
    )
    assert filtered.status_code == 200
    step_page = console.get("/admin/provisioning/provisioningstep/")
    assert step_page.status_code == 200


def test_console_retry_action_asks_for_a_reason_and_retries(failed_run, console, django_capture_on_commit_callbacks):
    url = "/admin/provisioning/provisioningrun/"
    form = console.post(url, {"action": "retry_runs", "_selected_action": [failed_run.pk]})
    assert b"reason" in form.content
    with django_capture_on_commit_callbacks(execute=True):
        console.post(
            url,
            {"action": "retry_runs", "_selected_action": [failed_run.pk], "apply": "1", "reason": "registry is back"},
        )
    failed_run.request.refresh_from_db()
    assert failed_run.request.state == RequestState.ACTIVE


def test_developers_cannot_open_the_console_runs(compute, client):
    developer = factories.member(compute.team.project, Role.LEAD)
    client.force_login(developer)
    assert client.get("/admin/provisioning/provisioningrun/").status_code == 302


def test_metrics_export_runs_and_step_durations(delivered, client):
    families = {
        family.name: family
        for family in text_string_to_metric_families(
            client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {settings.METRICS_TOKEN}").content.decode()
        )
    }
    runs = {tuple(sample.labels.values()): sample.value for sample in families["compute_provisioning_runs"].samples}
    assert runs[("provision", "compute", "succeeded")] == 1
    steps = {sample.labels["step"] for sample in families["compute_provisioning_steps"].samples}
    assert {"prepare_image", "start_workload", "readiness_check", "publish_access"} <= steps
