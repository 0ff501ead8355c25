"""The bare-metal pipeline on the `redfish` driver against the real sushy-tools emulator: validation, virtual
media, one-time boot, power transitions (polled honestly: the emulator lands them 1-11 s later), the installer's
callback with its one-time token, release; and BMC faults that are waited out, then fail clearly."""

from urllib.parse import parse_qs, urlsplit

import httpx
import pytest
from django.urls import reverse

from provisioning import services
from provisioning.choices import RunKind, RunState, StepState
from provisioning.models import ProvisioningRun
from provisioning.selectors import provisioning_details
from requests import services as request_services
from requests.choices import EventCode, RequestState
from scheduling.choices import AllocationState
from scheduling.models import Allocation
from tenancy.models import AuditEvent
from tests.provisioning.redfish_emulator import free_loopback_port

pytestmark = pytest.mark.django_db


def redfish_get(url: str) -> dict:
    return httpx.get(url, timeout=5).json()


def installer_callback_from_media(system_url: str) -> tuple[str, str]:
    """What the installer booted from the virtual media knows: where to report, and its token."""
    media = redfish_get(f"{system_url}/VirtualMedia/Cd")
    assert media["Inserted"] is True
    query = parse_qs(urlsplit(media["Image"]).query)
    return query["callback"][0], query["token"][0]


def test_bare_metal_on_the_emulator_from_order_to_release(on_redfish, sushy_emulator, api, run_on_commit):
    system_url = sushy_emulator.system_url("pipeline")
    on_redfish.node.bmc_address = system_url
    on_redfish.node.save(update_fields=["bmc_address"])

    request = on_redfish.order()
    run = ProvisioningRun.objects.get(request=request)
    assert request.state == RequestState.PROVISIONING and run.driver == "redfish"
    waiting = run.steps.get(name="wait_for_install")
    assert (waiting.state, waiting.waiting_for) == (StepState.WAITING, "event")
    system = redfish_get(system_url)
    assert system["PowerState"] == "On" and system["Boot"]["BootSourceOverrideTarget"] == "Cd"
    assert "not reported by the BMC" in run.steps.get(name="validate_hardware").output["checks"]["inventory_match"]

    callback, token = installer_callback_from_media(system_url)
    assert urlsplit(callback).path == reverse("provisioning-installer-callback")
    answer = run_on_commit(api.post, urlsplit(callback).path, {"token": token, "status": "succeeded"}, format="json")
    assert answer.status_code == 202
    request.refresh_from_db()
    assert request.state == RequestState.ACTIVE
    assert (
        api.post(urlsplit(callback).path, {"token": token, "status": "succeeded"}, format="json").json()["code"]
        == "token_used"
    )

    run_on_commit(request_services.request_release, request=request, actor=request.requester, reason="done")
    request.refresh_from_db()
    assert request.state == RequestState.RELEASED
    system = redfish_get(system_url)
    assert system["PowerState"] == "Off"
    assert redfish_get(f"{system_url}/VirtualMedia/Cd")["Inserted"] is False
    assert Allocation.objects.get(request=request).state == AllocationState.RELEASED


def _failing_bmc(kind: str, stand_in, settings) -> str:
    if kind == "unreachable":
        return f"http://127.0.0.1:{free_loopback_port()}/redfish/v1/Systems/gone"
    path = "/redfish/v1/Systems/broken"
    if kind == "http_500":
        stand_in.answer(path, {"error": {"message": "Internal BMC fault"}}, status=500)
    else:  # slow: answers after the client has given up
        settings.REDFISH_TIMEOUT_SECONDS = 0.3
        stand_in.answer(path, {"PowerState": "Off"}, held=True)
    return f"{stand_in.url}{path}"


@pytest.mark.parametrize(
    ("kind", "code"), [("unreachable", "bmc_unreachable"), ("http_500", "bmc_error"), ("slow", "bmc_unreachable")]
)
def test_a_bmc_that_does_not_answer_is_waited_out_then_fails_clearly_and_its_cleanup_holds_the_devices(
    kind, code, on_redfish, redfish_stand_in, settings, operator
):
    """A BMC out of reach is an outage of that node's BMC: waited out (no attempt counted) for the outage budget,
    then the validation fails, a finding about that node (isolated). The cleanup cannot power the server off either:
    it waits for the BMC, and the devices stay held, until an operator confirms the server is off."""
    settings.PROVISIONING_OUTAGE_BUDGET_SECONDS = 0.5
    settings.PROVISIONING_CHAIN_SECONDS = 2.0  # the cleanup's worker hands its wait over instead of waiting on
    on_redfish.node.bmc_address = _failing_bmc(kind, redfish_stand_in, settings)
    on_redfish.node.save(update_fields=["bmc_address"])

    request = on_redfish.order()
    assert request.state == RequestState.FAILED
    run = ProvisioningRun.objects.get(request=request, kind=RunKind.PROVISION)
    assert (run.failure["step"], run.failure["code"], run.failure["attempts"]) == ("validate_hardware", code, 1)
    assert "did not answer for" in run.failure["message"] and "outage budget" in run.failure["message"]
    assert not request.events.filter(code=EventCode.PROVISIONING_STEP_FAILED).exists()  # an outage is no attempt
    waited = request.events.filter(code=EventCode.BACKEND_WAIT).first()
    assert waited.message.startswith("Waiting for the BMC at ") and waited.message.endswith(", retrying.")
    on_redfish.node.refresh_from_db()
    assert not on_redfish.node.schedulable and "validate_hardware" in on_redfish.node.cordon_reason
    if kind == "http_500":
        assert "Internal BMC fault" in run.failure["message"]

    cleanup = ProvisioningRun.objects.get(request=request, kind=RunKind.CLEANUP)
    step = cleanup.steps.get(position=cleanup.current_position)
    assert (cleanup.state, step.state, step.waiting_for) == (RunState.RUNNING, StepState.WAITING, "outage")
    assert Allocation.objects.get(request=request).state == AllocationState.ACTIVE  # the server may still run
    waiting = provisioning_details(request)["waiting"]
    assert waiting["code"] == "backend_unavailable"
    assert waiting["message"].startswith("Cleaning up — waiting for the BMC to confirm the server is off: the BMC at")

    services.teardown_force(run=cleanup, actor=operator, reason="powered off at the rack")

    assert Allocation.objects.get(request=request).state == AllocationState.RELEASED
    cleanup.refresh_from_db()
    assert cleanup.state == RunState.CANCELLED
    assert request.events.get(code=EventCode.TEARDOWN_FORCED).actor == operator
    assert AuditEvent.objects.get(action="provisioning.teardown_forced").reason == "powered off at the rack"


def test_a_bmc_linking_outside_its_origin_fails_validation_at_once_naming_the_link_and_isolates_the_node(
    on_redfish, redfish_stand_in, elsewhere, settings
):
    settings.BMC_CREDENTIALS = {"rack-7-bmc": {"username": "root", "password": "calvin-Pa55"}}
    system, foreign = "/redfish/v1/Systems/1", f"{elsewhere.url}/latest/meta-data/iam/"
    redfish_stand_in.answer(system, {"PowerState": "Off", "Processors": {"@odata.id": foreign}})
    elsewhere.answer("/latest/meta-data/iam/", {"Members": []})
    on_redfish.node.bmc_address, on_redfish.node.bmc_credentials_ref = f"{redfish_stand_in.url}{system}", "rack-7-bmc"
    on_redfish.node.save(update_fields=["bmc_address", "bmc_credentials_ref"])

    request = on_redfish.order()

    assert request.state == RequestState.FAILED
    run = ProvisioningRun.objects.get(request=request, kind=RunKind.PROVISION)
    assert (run.failure["step"], run.failure["code"], run.failure["attempts"]) == (
        "validate_hardware",
        "bmc_link_off_origin",
        1,
    )
    assert foreign in run.failure["message"]
    on_redfish.node.refresh_from_db()
    assert not on_redfish.node.schedulable and foreign in on_redfish.node.cordon_reason
    assert elsewhere.received == []
    timeline = " ".join(request.events.values_list("message", flat=True))
    assert foreign in timeline and "calvin-Pa55" not in timeline
