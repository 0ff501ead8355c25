"""The OS installer's callback is bound to its run: taken only with the run's installer token, from the node's own
address when the platform knows it, and only while that run waits for its installer. A forged, misplaced, early or
late report is refused with {code, message, details} and changes nothing; the real report moves the run on."""

from datetime import timedelta
from urllib.parse import parse_qs, urlsplit

import pytest
import time_machine
from django.urls import reverse
from django.utils import timezone

from provisioning import engine
from provisioning.choices import RunKind, RunState, StepState
from provisioning.models import ProvisioningRun, SimulatedMachine
from requests import services as request_services
from requests.choices import RequestState

pytestmark = pytest.mark.django_db

CALLBACK = reverse("provisioning-installer-callback")
SERVER = "192.0.2.20"


@pytest.fixture
def installer(bare_metal, monkeypatch):
    """The bare-metal shop on the simulated BMC, which boots no installer of its own here: the test reports as the
    installer would, with the token the virtual media URL gave it."""
    monkeypatch.setattr("provisioning.drivers.simulated.SimulatedBmc._boot_installer", lambda self, machine: None)
    return bare_metal


def token_on_the_media(node) -> str:
    """What the installer booted from the virtual media knows: its token, from the media URL's query."""
    image = SimulatedMachine.objects.get(node=node.name).media_image
    return parse_qs(urlsplit(image).query)["token"][0]


def report(api, token: str, status: str = "succeeded", address: str = SERVER, run_on_commit=None):
    post = run_on_commit or (lambda call, *args, **kwargs: call(*args, **kwargs))
    return post(api.post, CALLBACK, {"token": token, "status": status}, format="json", REMOTE_ADDR=address)


def recorded(request) -> tuple:
    """Everything a report could change: the run, its steps, the request and its timeline."""
    request.refresh_from_db()
    run = ProvisioningRun.objects.get(request=request, kind=RunKind.PROVISION)
    steps = list(run.steps.order_by("position").values_list("name", "state", "attempts", "retry_at"))
    return (run.state, run.installer_reported_at, run.installer_report, steps, request.state, request.events.count())


def assert_refused(answer, status: int, code: str) -> None:
    assert (answer.status_code, answer.json()["code"]) == (status, code), answer.content
    assert set(answer.json()) == {"code", "message", "details"} and answer.json()["message"]


def test_the_installer_reports_with_its_token_from_its_node_and_the_run_goes_on(installer, api, run_on_commit):
    installer.node.os_address = SERVER
    installer.node.save(update_fields=["os_address"])
    request = installer.order()
    assert recorded(request)[4] == RequestState.PROVISIONING

    answer = report(api, token_on_the_media(installer.node), run_on_commit=run_on_commit)

    assert answer.status_code == 202
    request.refresh_from_db()
    assert request.state == RequestState.ACTIVE


@pytest.mark.parametrize("forged", ["nope", "", "0" * 64, "x" * 200, "' OR 1=1 --"])
def test_a_forged_token_is_refused_and_changes_nothing(installer, api, forged):
    request = installer.order()
    before = recorded(request)

    answer = report(api, forged)

    assert answer.status_code in (400, 404)  # blank is a malformed body, anything else no run's token
    assert answer.json()["code"] == ("validation_error" if not forged else "unknown_token")
    assert recorded(request) == before


def test_the_token_from_another_address_is_refused_when_the_nodes_is_known(installer, api, run_on_commit):
    installer.node.os_address = f"{SERVER}:22"
    installer.node.save(update_fields=["os_address"])
    request = installer.order()
    token = token_on_the_media(installer.node)
    before = recorded(request)

    for elsewhere in ("198.51.100.7", "127.0.0.1"):
        refused = report(api, token, address=elsewhere)
        assert_refused(refused, 403, "not_from_node")
        assert refused.json()["details"] == {"address": elsewhere}
    # A forwarded-for header is nobody's word for where the call came from.
    spoofed = api.post(CALLBACK, {"token": token, "status": "succeeded"}, format="json", HTTP_X_FORWARDED_FOR=SERVER)
    assert_refused(spoofed, 403, "not_from_node")
    assert recorded(request) == before

    assert report(api, token, run_on_commit=run_on_commit).status_code == 202


def test_with_no_address_recorded_the_token_alone_reports(installer, api, run_on_commit):
    request = installer.order()

    answer = report(api, token_on_the_media(installer.node), address="203.0.113.9", run_on_commit=run_on_commit)
    assert answer.status_code == 202
    request.refresh_from_db()
    assert request.state == RequestState.ACTIVE


def test_an_early_report_before_the_installer_booted_is_refused(installer, api, settings):
    """The boot step inserted the media (the token is issued) but the one-time boot failed and waits to be retried:
    no installer can have run."""
    settings.PROVISIONING_BACKOFF_SECONDS = 600
    settings.PROVISIONING_FAULTS = [
        {"op": "set_one_time_boot", "attempts": [1], "code": "bmc_busy", "message": "The BMC is busy."}
    ]
    request = installer.order()
    run = ProvisioningRun.objects.get(request=request)
    assert run.steps.get(name="boot_installer").state == StepState.WAITING
    before = recorded(request)

    answer = report(api, token_on_the_media(installer.node))

    assert_refused(answer, 409, "install_not_started")
    assert answer.json()["details"] == {"boot_installer": StepState.WAITING}
    assert recorded(request) == before


def test_a_report_after_the_run_was_released_is_refused(installer, api, run_on_commit):
    request = installer.order()
    token = token_on_the_media(installer.node)
    run_on_commit(request_services.request_release, request=request, actor=request.requester, reason="not needed")
    before = recorded(request)

    answer = report(api, token)

    assert_refused(answer, 409, "token_expired")
    assert answer.json()["details"] == {"state": RunState.CANCELLED}
    assert recorded(request) == before


def test_a_second_report_is_refused(installer, api, run_on_commit):
    request = installer.order()
    token = token_on_the_media(installer.node)
    assert report(api, token, status="failed", run_on_commit=run_on_commit).status_code == 202
    before = recorded(request)
    assert before[4] == RequestState.FAILED

    assert_refused(report(api, token), 409, "token_used")
    assert recorded(request) == before


def test_a_report_after_the_wait_timed_out_is_refused(installer, api, run_on_commit):
    request = installer.order()
    token = token_on_the_media(installer.node)
    waiting = ProvisioningRun.objects.get(request=request).steps.get(name="wait_for_install")
    with time_machine.travel(waiting.deadline_at + timedelta(seconds=1), tick=False):
        run_on_commit(engine.steps_resume_due, now=timezone.now())
    waiting.refresh_from_db()
    assert (waiting.state, waiting.error["code"]) == (StepState.FAILED, "step_timeout")
    before = recorded(request)

    answer = report(api, token)

    assert_refused(answer, 409, "token_expired")
    assert recorded(request) == before
