"""The Redfish BMC driver against the real sushy-tools emulator (fake systems driver), plus a fault-injecting
stand-in for 500s, slow answers and resource shapes the emulator does not serve."""

import base64
import logging
import time

import httpx
import pytest

from provisioning.drivers.base import BackendUnavailable, StepError, Target
from provisioning.drivers.redfish import RedfishBmc
from tests.provisioning.redfish_emulator import AUTH_PASSWORD, AUTH_USER, free_loopback_port

POWER_DEADLINE_SECONDS = 20  # the fake driver applies a power change 1..11 s after the request


@pytest.fixture
def driver():
    bmc = RedfishBmc()
    yield bmc
    bmc.close()


def target(bmc_address: str, credentials_ref: str = "") -> Target:
    return Target(
        run_id=1,
        request_id=1,
        node="gpu-node-1",
        devices=(),
        snapshot={},
        bmc_address=bmc_address,
        bmc_credentials_ref=credentials_ref,
    )


def read_back(url: str, auth: tuple[str, str] | None = None) -> dict:
    """What the emulator now says, read without the driver."""
    response = httpx.get(url, auth=auth)
    response.raise_for_status()
    return response.json()


def raised_by(call, *args) -> StepError:
    with pytest.raises(StepError) as caught:
        call(*args)
    return caught.value


def wait_for_power_state(driver: RedfishBmc, node: Target, wanted: str) -> None:
    deadline = time.monotonic() + POWER_DEADLINE_SECONDS
    while (state := driver.power_state(node)) != wanted:
        assert time.monotonic() < deadline, f"still {state}, not {wanted}, after {POWER_DEADLINE_SECONDS}s"
        time.sleep(0.5)


# --- Against the emulator ------------------------------------------------------------------------------------------


def test_inventory_reports_what_the_bmc_knows_and_none_for_what_it_does_not(driver, sushy_emulator):
    system_url = sushy_emulator.system_url("inventory")

    inventory = driver.inventory(target(system_url))

    assert inventory == {
        "reachable": True,
        "health": "OK",
        "power_state": "Off",
        "cpu_cores": None,
        "cpu_sockets": None,
        "memory_gb": None,
        "accelerators": None,
        "processors": None,
        "manufacturer": "Sushy Emulator",
        "model": None,
        "system": system_url.removeprefix(sushy_emulator.url),
    }


def test_a_base_url_serving_several_systems_is_ambiguous(driver, sushy_emulator):
    error = raised_by(driver.inventory, target(sushy_emulator.url))

    assert (error.code, error.retryable) == ("bmc_ambiguous_system", False)
    assert len(error.details["systems"]) == len(sushy_emulator.system_ids)


def test_one_time_boot_from_cd_is_set_once(driver, sushy_emulator):
    node = target(sushy_emulator.system_url("boot"))

    assert driver.set_one_time_boot(node, "Cd") == {"boot_source": "Cd", "enabled": "Once"}

    # The emulator stores only the target; it reports BootSourceOverrideEnabled as "Continuous" whatever was sent
    # (the stand-in test below checks that "Once" is sent).
    assert read_back(sushy_emulator.system_url("boot"))["Boot"]["BootSourceOverrideTarget"] == "Cd"


def test_a_boot_source_outside_the_allowable_values_is_refused_before_asking(driver, sushy_emulator):
    # The emulator itself would answer 204 and store it.
    error = raised_by(driver.set_one_time_boot, target(sushy_emulator.system_url("boot")), "Floppy")

    assert (error.code, error.retryable) == ("boot_source_unsupported", False)
    assert "Cd" in error.details["allowed"]


def test_virtual_media_is_inserted_once_replaced_and_ejected(driver, sushy_emulator, image_server):
    node = target(sushy_emulator.system_url("media"))
    cd_url = f"{sushy_emulator.system_url('media')}/VirtualMedia/Cd"
    first, second = f"{image_server}/installer-a.iso", f"{image_server}/installer-b.iso"

    assert driver.insert_media(node, first) == {"media": "Cd", "image": first, "changed": True}
    assert (read_back(cd_url)["Image"], read_back(cd_url)["Inserted"]) == (first, True)
    assert driver.insert_media(node, first)["changed"] is False

    assert driver.insert_media(node, second)["changed"] is True
    assert read_back(cd_url)["Image"] == second

    assert driver.eject_media(node) == {"ejected": ["Cd"], "changed": True}
    assert read_back(cd_url)["Inserted"] is False
    assert driver.eject_media(node) == {"ejected": [], "changed": False}


def test_power_on_and_force_off_take_effect_after_the_bmc_delay(driver, sushy_emulator):
    node = target(sushy_emulator.system_url("power"))

    assert driver.power(node, "On") == {"action": "On", "power_state": "Off", "changed": True}
    wait_for_power_state(driver, node, "On")
    assert driver.power(node, "On")["changed"] is False

    assert driver.power(node, "ForceOff")["changed"] is True
    wait_for_power_state(driver, node, "Off")


def test_a_reset_type_the_bmc_does_not_offer_is_not_retried(driver, sushy_emulator):
    # The emulator would answer 501, which would read as a retryable BMC error.
    error = raised_by(driver.power, target(sushy_emulator.system_url("power")), "PushPowerButtonTwice")

    assert (error.code, error.retryable) == ("power_action_unsupported", False)
    assert "ForceOff" in error.details["allowed"]


def test_an_unknown_system_is_rejected_and_not_retried(driver, sushy_emulator):
    error = raised_by(driver.inventory, target(f"{sushy_emulator.url}/redfish/v1/Systems/no-such-system"))

    assert (error.code, error.retryable, error.details["status"]) == ("bmc_rejected", False, 404)
    assert "no-such-system was not found" in error.message


# --- Configuration -------------------------------------------------------------------------------------------------


def test_a_node_without_bmc_address_is_not_configured(driver):
    error = raised_by(driver.inventory, target(""))

    assert (error.code, error.retryable) == ("bmc_not_configured", False)


def test_an_address_that_is_not_an_http_url_is_refused(driver):
    error = raised_by(driver.inventory, target("ftp://bmc.example/redfish/v1/Systems/1"))

    assert (error.code, error.retryable) == ("bmc_address_invalid", False)


def test_a_bare_host_means_the_bmc_https_service(driver):
    error = raised_by(driver.power_state, target(f"127.0.0.1:{free_loopback_port()}/redfish/v1/Systems/1"))

    assert error.code == "bmc_unreachable"
    assert error.details["url"].startswith("https://127.0.0.1:")


def test_a_credentials_name_that_is_not_configured_is_refused(driver, settings, sushy_emulator):
    settings.BMC_CREDENTIALS = {}

    error = raised_by(driver.inventory, target(sushy_emulator.system_url("inventory"), "rack-7-bmc"))

    assert (error.code, error.retryable) == ("bmc_credentials_missing", False)


# --- Credentials, against the emulator with basic auth -------------------------------------------------------------


def test_the_only_system_is_found_from_the_base_url_with_the_right_credentials(
    driver, settings, sushy_emulator_with_auth
):
    settings.BMC_CREDENTIALS = {"rack-7-bmc": {"username": AUTH_USER, "password": AUTH_PASSWORD}}

    inventory = driver.inventory(target(sushy_emulator_with_auth.url, "rack-7-bmc"))

    assert inventory["system"] == f"/redfish/v1/Systems/{sushy_emulator_with_auth.system_ids['only']}"
    assert AUTH_PASSWORD not in repr(inventory)


@pytest.mark.parametrize("password", [None, "wrong-Pa55word-1234"])
def test_missing_or_wrong_credentials_fail_without_revealing_them(
    driver, settings, sushy_emulator_with_auth, caplog, password
):
    caplog.set_level(logging.DEBUG)
    settings.BMC_CREDENTIALS = {"rack-7-bmc": {"username": AUTH_USER, "password": password}} if password else {}
    node = target(sushy_emulator_with_auth.system_url("only"), "rack-7-bmc" if password else "")

    error = raised_by(driver.inventory, node)

    assert (error.code, error.retryable, error.details["status"]) == ("bmc_auth_failed", False, 401)
    if password:
        encoded = base64.b64encode(f"{AUTH_USER}:{password}".encode()).decode()
        for secret in (password, encoded):
            assert secret not in f"{error} {error.message} {error.details!r} {caplog.text}"


# --- Faults, against the fault-injecting stand-in ------------------------------------------------------------------


def test_a_closed_port_is_unreachable_and_retried(driver):
    error = raised_by(driver.inventory, target(f"http://127.0.0.1:{free_loopback_port()}/redfish/v1/Systems/1"))

    assert (error.code, error.retryable) == ("bmc_unreachable", True)


@pytest.mark.parametrize(("status", "retryable"), [(500, True), (503, True), (501, False)])
def test_a_server_error_carries_the_redfish_message_and_is_retried_unless_not_implemented(
    driver, redfish_stand_in, status, retryable
):
    redfish_stand_in.answer(
        "/redfish/v1/Systems/1", {"error": {"code": "Base.1.0.GeneralError", "message": "BMC busy"}}, status=status
    )

    error = raised_by(driver.inventory, target(f"{redfish_stand_in.url}/redfish/v1/Systems/1"))

    assert (error.code, error.retryable) == ("bmc_error", retryable)
    assert isinstance(error, BackendUnavailable) == retryable  # a BMC failing while it answers is an outage of it
    answer = {"status": status, "method": "GET", "path": "/redfish/v1/Systems/1", "message": "BMC busy"}
    assert {key: error.details[key] for key in answer} == answer
    assert "BMC busy" in error.message


def test_an_answer_slower_than_the_timeout_is_unreachable_and_retried(driver, settings, redfish_stand_in):
    settings.REDFISH_TIMEOUT_SECONDS = 0.3
    redfish_stand_in.answer("/redfish/v1/Systems/1", {"PowerState": "On"}, held=True)

    error = raised_by(driver.power_state, target(f"{redfish_stand_in.url}/redfish/v1/Systems/1"))

    # The answer is held until the test ends: only the client's own timeout can have ended the call.
    assert (error.code, error.retryable) == ("bmc_unreachable", True)
    assert len(redfish_stand_in.received) == 1


def test_credentials_are_sent_as_basic_auth(driver, settings, redfish_stand_in):
    settings.BMC_CREDENTIALS = {"rack-7-bmc": {"username": "root", "password": "calvin-Pa55"}}
    redfish_stand_in.answer("/redfish/v1/Systems/1", {"PowerState": "Off"})

    driver.power_state(target(f"{redfish_stand_in.url}/redfish/v1/Systems/1", "rack-7-bmc"))

    assert (
        redfish_stand_in.received[0]["headers"]["Authorization"]
        == "Basic " + base64.b64encode(b"root:calvin-Pa55").decode()
    )


def test_accelerators_are_counted_and_manager_virtual_media_is_used(driver, redfish_stand_in, image_server):
    """Shapes real BMCs have and the emulator does not serve: a Processors collection, virtual media linked from the
    manager only, no AllowableValues for the boot source."""
    system, manager, cd = "/redfish/v1/Systems/1", "/redfish/v1/Managers/bmc", "/redfish/v1/Managers/bmc/VirtualMedia/1"
    redfish_stand_in.answer(system, {
        "@odata.id": system, "PowerState": "Off", "Status": {"Health": "OK"},
        "ProcessorSummary": {"Count": 2, "CoreCount": 64}, "MemorySummary": {"TotalSystemMemoryGiB": 1024},
        "Processors": {"@odata.id": f"{system}/Processors"},
        "Links": {"ManagedBy": [{"@odata.id": manager}]},
    })  # fmt: skip
    processors = {"CPU1": "CPU", "CPU2": "CPU", "GPU1": "GPU", "GPU2": "GPU", "NPU1": "Accelerator"}
    redfish_stand_in.answer(
        f"{system}/Processors", {"Members": [{"@odata.id": f"{system}/Processors/{name}"} for name in processors]}
    )
    for name, kind in processors.items():
        redfish_stand_in.answer(f"{system}/Processors/{name}", {"Id": name, "ProcessorType": kind})
    redfish_stand_in.answer(manager, {"VirtualMedia": {"@odata.id": f"{manager}/VirtualMedia"}})
    redfish_stand_in.answer(f"{manager}/VirtualMedia", {"Members": [{"@odata.id": cd}]})
    redfish_stand_in.answer(cd, {
        "Id": "1", "MediaTypes": ["CD", "DVD"], "Inserted": False, "Image": None,
        "Actions": {"#VirtualMedia.InsertMedia": {"target": f"{cd}/Actions/VirtualMedia.InsertMedia"}},
    })  # fmt: skip
    redfish_stand_in.answer(f"{cd}/Actions/VirtualMedia.InsertMedia", {})
    node = target(f"{redfish_stand_in.url}{system}")

    inventory = driver.inventory(node)
    driver.insert_media(node, f"{image_server}/installer-a.iso")
    driver.set_one_time_boot(node, "Cd")

    assert (inventory["cpu_cores"], inventory["cpu_sockets"], inventory["memory_gb"]) == (64, 2, 1024)
    assert inventory["accelerators"] == 3
    changes = [(call["method"], call["path"], call["body"]) for call in redfish_stand_in.received if call["body"]]
    assert changes == [
        ("POST", f"{cd}/Actions/VirtualMedia.InsertMedia", {
            "Image": f"{image_server}/installer-a.iso", "Inserted": True, "WriteProtected": True,
        }),
        ("PATCH", system, {"Boot": {"BootSourceOverrideTarget": "Cd", "BootSourceOverrideEnabled": "Once"}}),
    ]  # fmt: skip


# --- Links stay on the BMC's origin, against two real servers: the BMC and what its links point to --------------

SYSTEM, MANAGER = "/redfish/v1/Systems/1", "/redfish/v1/Managers/bmc"
CD = f"{MANAGER}/VirtualMedia/Cd"
BASIC_ROOT = "Basic " + base64.b64encode(b"root:calvin-Pa55").decode()


def serve_a_server(bmc, links: dict[str, str]) -> None:
    """A BMC with one system: processors, virtual media linked from its manager, a Reset action. `links` replaces
    the link of one place (`systems`, `processors`, `processor`, `manager`, `media_collection`, `media`, `insert`,
    `eject`, `reset`) with what the test gives, the others point where they should."""
    link = {
        "systems": SYSTEM,
        "processors": f"{SYSTEM}/Processors",
        "processor": f"{SYSTEM}/Processors/GPU1",
        "manager": MANAGER,
        "media_collection": f"{MANAGER}/VirtualMedia",
        "media": CD,
        "insert": f"{CD}/Actions/VirtualMedia.InsertMedia",
        "eject": f"{CD}/Actions/VirtualMedia.EjectMedia",
        "reset": f"{SYSTEM}/Actions/ComputerSystem.Reset",
        **links,
    }
    bmc.answer("/redfish/v1/Systems", {"Members": [{"@odata.id": link["systems"]}]})
    bmc.answer(SYSTEM, {
        "@odata.id": SYSTEM, "PowerState": "Off", "Status": {"Health": "OK"},
        "Processors": {"@odata.id": link["processors"]},
        "Links": {"ManagedBy": [{"@odata.id": link["manager"]}]},
        "Actions": {"#ComputerSystem.Reset": {"target": link["reset"], "ResetType@Redfish.AllowableValues": ["On"]}},
    })  # fmt: skip
    bmc.answer(f"{SYSTEM}/Processors", {"Members": [{"@odata.id": link["processor"]}]})
    bmc.answer(f"{SYSTEM}/Processors/GPU1", {"Id": "GPU1", "ProcessorType": "GPU", "SerialNumber": "1654"})
    bmc.answer(MANAGER, {"VirtualMedia": {"@odata.id": link["media_collection"]}})
    bmc.answer(f"{MANAGER}/VirtualMedia", {"Members": [{"@odata.id": link["media"]}]})
    bmc.answer(CD, {
        "Id": "Cd", "MediaTypes": ["CD"], "Inserted": True, "Image": "http://images.test/old.iso",
        "Actions": {
            "#VirtualMedia.InsertMedia": {"target": link["insert"]},
            "#VirtualMedia.EjectMedia": {"target": link["eject"]},
        },
    })  # fmt: skip
    for action in ("InsertMedia", "EjectMedia"):
        bmc.answer(f"{CD}/Actions/VirtualMedia.{action}", {})
    bmc.answer(f"{SYSTEM}/Actions/ComputerSystem.Reset", {})


# Where each link is followed, and the driver call that follows it.
LINK_PLACES = {
    "systems": lambda driver, node: driver.power_state(node),
    "processors": lambda driver, node: driver.inventory(node),
    "processor": lambda driver, node: driver.inventory(node),
    "manager": lambda driver, node: driver.eject_media(node),
    "media_collection": lambda driver, node: driver.eject_media(node),
    "media": lambda driver, node: driver.eject_media(node),
    "insert": lambda driver, node: driver.insert_media(node, "http://images.test/new.iso"),
    "eject": lambda driver, node: driver.eject_media(node),
    "reset": lambda driver, node: driver.power(node, "On"),
}


@pytest.mark.parametrize("place", LINK_PLACES)
@pytest.mark.parametrize("form", ["absolute", "scheme-relative"])
def test_a_link_to_another_origin_fails_the_call_naming_it_and_nothing_reaches_that_origin(
    driver, settings, redfish_stand_in, elsewhere, place, form
):
    settings.BMC_CREDENTIALS = {"rack-7-bmc": {"username": "root", "password": "calvin-Pa55"}}
    foreign = f"{elsewhere.url}/latest/meta-data/iam/"
    if form == "scheme-relative":
        foreign = foreign.removeprefix("http:")
    serve_a_server(redfish_stand_in, {place: foreign})
    elsewhere.answer("/latest/meta-data/iam/", {"Members": [], "PowerState": "On"})
    # The base URL: the system is found from the Systems collection, whose member is one of the links.
    node = target(redfish_stand_in.url, "rack-7-bmc")

    error = raised_by(LINK_PLACES[place], driver, node)

    assert (error.code, error.retryable) == ("bmc_link_off_origin", False)
    assert error.details == {"link": foreign, "origin": redfish_stand_in.url}
    assert foreign in error.message
    assert elsewhere.received == []
    # The BMC itself got its credentials, and only it.
    assert {call["headers"]["Authorization"] for call in redfish_stand_in.received} == {BASIC_ROOT}


def test_the_metadata_service_address_of_the_finding_is_refused_before_any_connection(driver, redfish_stand_in):
    serve_a_server(redfish_stand_in, {"processors": "http://169.254.169.254/latest/meta-data/iam/"})

    error = raised_by(driver.inventory, target(f"{redfish_stand_in.url}{SYSTEM}"))

    assert error.code == "bmc_link_off_origin"
    assert "http://169.254.169.254/latest/meta-data/iam/" in error.message


def test_absolute_links_on_the_bmcs_own_origin_are_followed_with_its_credentials(
    driver, settings, redfish_stand_in, elsewhere
):
    settings.BMC_CREDENTIALS = {"rack-7-bmc": {"username": "root", "password": "calvin-Pa55"}}
    own = redfish_stand_in.url
    serve_a_server(redfish_stand_in, {
        "systems": f"{own}{SYSTEM}", "processors": f"{own}{SYSTEM}/Processors",
        "processor": f"{own}{SYSTEM}/Processors/GPU1", "manager": f"{own}{MANAGER}",
        "media": f"{own}{CD}", "eject": f"{own}{CD}/Actions/VirtualMedia.EjectMedia",
    })  # fmt: skip
    node = target(own, "rack-7-bmc")

    assert driver.inventory(node)["accelerators"] == 1
    assert driver.eject_media(node) == {"ejected": ["Cd"], "changed": True}

    assert ("POST", f"{CD}/Actions/VirtualMedia.EjectMedia") in [
        (call["method"], call["path"]) for call in redfish_stand_in.received
    ]
    assert {call["headers"]["Authorization"] for call in redfish_stand_in.received} == {BASIC_ROOT}
    assert elsewhere.received == []


def test_a_redirect_is_followed_on_the_bmcs_origin_only(driver, settings, redfish_stand_in, elsewhere):
    settings.BMC_CREDENTIALS = {"rack-7-bmc": {"username": "root", "password": "calvin-Pa55"}}
    redfish_stand_in.answer("/redfish/v1/Systems/moved", {}, status=308, headers={"Location": SYSTEM})
    redfish_stand_in.answer(SYSTEM, {"PowerState": "On"})
    redfish_stand_in.answer("/redfish/v1/Systems/away", {}, status=302, headers={"Location": f"{elsewhere.url}/x"})
    elsewhere.answer("/x", {"PowerState": "Off"})

    assert driver.power_state(target(f"{redfish_stand_in.url}/redfish/v1/Systems/moved", "rack-7-bmc")) == "On"
    error = raised_by(driver.power_state, target(f"{redfish_stand_in.url}/redfish/v1/Systems/away", "rack-7-bmc"))

    assert (error.code, error.details["link"]) == ("bmc_link_off_origin", f"{elsewhere.url}/x")
    assert elsewhere.received == []
    assert [call["path"] for call in redfish_stand_in.received] == [
        "/redfish/v1/Systems/moved",
        SYSTEM,
        "/redfish/v1/Systems/away",
    ]
    assert {call["headers"]["Authorization"] for call in redfish_stand_in.received} == {BASIC_ROOT}


def test_endless_redirects_on_the_bmc_fail_clearly(driver, redfish_stand_in):
    redfish_stand_in.answer(SYSTEM, {}, status=307, headers={"Location": SYSTEM})

    error = raised_by(driver.power_state, target(f"{redfish_stand_in.url}{SYSTEM}"))

    assert (error.code, error.retryable) == ("bmc_bad_response", False)
    assert len(redfish_stand_in.received) == 6


@pytest.mark.parametrize("link", [None, 7, "", {"@odata.id": "/x"}])
def test_a_link_that_is_not_a_url_is_a_bad_response(driver, redfish_stand_in, link):
    serve_a_server(redfish_stand_in, {"processors": link})

    error = raised_by(driver.inventory, target(f"{redfish_stand_in.url}{SYSTEM}"))

    assert (error.code, error.retryable) == ("bmc_bad_response", False)


def test_the_installer_query_of_an_image_url_stays_out_of_the_summary_the_log_and_a_refusal(
    driver, redfish_stand_in, caplog
):
    caplog.set_level(logging.DEBUG)
    serve_a_server(redfish_stand_in, {})
    secret_query = "callback=https%3A%2F%2Fcc.example%2Fcb%2F&token=tok-SECRET-123"
    image = f"http://images.test/new.iso?{secret_query}"
    node = target(f"{redfish_stand_in.url}{SYSTEM}")

    assert driver.insert_media(node, image) == {"media": "Cd", "image": "http://images.test/new.iso", "changed": True}
    inserted = [call["body"] for call in redfish_stand_in.received if call["path"].endswith("InsertMedia")]
    assert inserted == [{"Image": image, "Inserted": True, "WriteProtected": True}]  # the BMC gets it whole
    redfish_stand_in.answer(CD, {
        "Id": "Cd", "MediaTypes": ["CD"], "Inserted": False,
        "Actions": {"#VirtualMedia.InsertMedia": {"target": f"{CD}/Actions/VirtualMedia.InsertMedia"}},
    })  # fmt: skip
    redfish_stand_in.answer(
        f"{CD}/Actions/VirtualMedia.InsertMedia", {"error": {"message": f"Cannot fetch {image}"}}, status=400
    )
    error = raised_by(driver.insert_media, node, image)

    assert error.code == "bmc_rejected" and "http://images.test/new.iso?<redacted>" in error.message
    assert "tok-SECRET-123" not in f"{error.message} {error.details!r} {caplog.text}"
