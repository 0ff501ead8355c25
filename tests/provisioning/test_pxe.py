"""Network installs at the HTTP level: a PXE profile's boot step sets a one-time `Pxe` boot; the site's DHCP hands
every server the platform's one script URL, and the platform answers the server waiting to install, known by its
address, with its run's iPXE script and cloud-init seed. The installer's token is inside the install config only:
never in a URL, a step output, the timeline, the API or the page, and no viewer of the request can fetch it."""

import importlib
import logging
import re
from urllib.parse import urlsplit

import httpx
import pytest
import yaml
from django.apps import apps as django_apps
from django.core.exceptions import ValidationError
from django.urls import reverse
from django.utils import timezone

from catalog.choices import BootMethod
from config.tokens import secret_hash
from provisioning.choices import RunKind, StepState
from provisioning.models import ProvisioningRun, SimulatedMachine
from requests import services as request_services
from requests.choices import RequestState
from tests.provisioning.conftest import add_node

pytestmark = pytest.mark.django_db

PUBLIC = "https://compute.example.org"
NETBOOT = {
    "kernel": "http://images.test/ubuntu-22.04/casper/vmlinuz",
    "initrd": "http://images.test/ubuntu-22.04/casper/initrd",
}
SERVER = "192.0.2.10"  # the node's address: where its firmware and installer call from
SCRIPT = "/api/v1/provisioning/pxe/boot.ipxe"


@pytest.fixture
def pxe(bare_metal, settings):
    """The bare-metal shop with its profile booting from the network, its server recorded at SERVER."""
    settings.PUBLIC_BASE_URL = PUBLIC
    image = bare_metal.profile.os_image
    image.configuration = {"netboot": NETBOOT}
    image.save(update_fields=["configuration"])
    bare_metal.profile.boot_method = BootMethod.PXE
    bare_metal.profile.full_clean()
    bare_metal.profile.save(update_fields=["boot_method"])
    bare_metal.node.os_address = SERVER
    bare_metal.node.save(update_fields=["os_address"])
    return bare_metal


def provision_run(request) -> ProvisioningRun:
    return ProvisioningRun.objects.get(request=request, kind=RunKind.PROVISION)


def boot_output(request) -> dict:
    return provision_run(request).steps.get(name="boot_installer").output


def path_of(url: str) -> str:
    assert url.startswith(PUBLIC)
    return urlsplit(url).path


def fetch(client, path: str, address: str = SERVER):
    return client.get(path, HTTP_ACCEPT="text/plain", REMOTE_ADDR=address)


def seed_of(script: str) -> str:
    return re.search(r"ds=nocloud-net;s=(\S+)", script).group(1)


def callback_in(user_data: dict, status: str) -> tuple[str, dict]:
    """The URL and body of the callback command the installer runs when it finishes (or fails)."""
    commands = user_data["autoinstall"]["late-commands" if status == "succeeded" else "error-commands"]
    [command] = commands
    body = re.search(r"-d '([^']+)'", command).group(1)
    return command.rsplit(" ", 1)[1], yaml.safe_load(body)


def install_config(api, address: str = SERVER) -> dict:
    """What the server's installer gets: the script, then the seed it points at, from the server's address."""
    script = fetch(api, SCRIPT, address)
    assert script.status_code == 200, script.content
    answer = fetch(api, path_of(seed_of(script.content.decode()) + "user-data"), address)
    assert answer.status_code == 200 and answer["Content-Type"].startswith("text/cloud-config")
    assert answer["Cache-Control"] == "no-store"
    return yaml.safe_load(answer.content)


def test_a_pxe_profile_boots_from_the_network_with_the_runs_script_and_install_config(pxe, api, run_on_commit, caplog):
    caplog.set_level(logging.DEBUG)
    request = pxe.order()

    output = boot_output(request)
    output.pop("seconds")
    assert output == {
        "boot_method": "pxe",
        "script": f"{PUBLIC}{SCRIPT}",
        "served_to": [SERVER],
        "boot": {"boot_source": "Pxe", "enabled": "Once"},
    }
    machine = SimulatedMachine.objects.get(node=pxe.node.name)
    assert (machine.boot_override, machine.media_image) == ("Pxe", "")
    run = provision_run(request)
    assert run.steps.get(name="wait_for_install").state == StepState.WAITING

    answer = fetch(api, path_of(output["script"]))
    assert answer.status_code == 200 and answer["Content-Type"].startswith("text/plain")
    lines = answer.content.decode().splitlines()
    assert lines[0] == "#!ipxe" and lines[-1] == "boot"
    assert lines[2].startswith(f"kernel {NETBOOT['kernel']} ip=dhcp url={pxe.profile.os_image.reference} autoinstall")
    assert lines[3] == f"initrd {NETBOOT['initrd']}"
    seed = seed_of(answer.content.decode())
    assert seed == f"{PUBLIC}/api/v1/provisioning/pxe/"

    config = install_config(api)
    identity = config["autoinstall"]["identity"]
    assert (identity["hostname"], identity["username"]) == (pxe.node.name, request.requester.username)
    assert yaml.safe_load(fetch(api, path_of(seed + "meta-data")).content) == {
        "instance-id": f"provisioning-run-{run.pk}",
        "local-hostname": pxe.node.name,
    }
    callback, body = callback_in(config, "succeeded")
    token = body["token"]
    assert callback_in(config, "failed") == (
        f"{PUBLIC}/api/v1/provisioning/installer-callback/",
        {"token": token, "status": "failed"},
    )
    assert body == {"token": token, "status": "succeeded"} and len(token) == 64
    # The token is in the install config only: no URL the server fetched, no output, no log line holds it.
    assert token not in f"{output} {answer.content} {seed} {caplog.text}"

    reported = run_on_commit(api.post, path_of(callback), body, format="json", REMOTE_ADDR=SERVER)
    assert reported.status_code == 202
    request.refresh_from_db()
    assert request.state == RequestState.ACTIVE
    over = fetch(api, SCRIPT)
    assert (over.status_code, over.json()["code"]) == (404, "no_install_waiting")
    assert token not in caplog.text


@pytest.mark.parametrize("address", ["192.0.2.99", "127.0.0.1", "::1", "not-an-address", ""])
@pytest.mark.parametrize("document", ["boot.ipxe", "user-data", "meta-data"])
def test_another_address_gets_no_install_files_as_json_not_a_500(pxe, api, address, document):
    pxe.order()

    answer = fetch(api, f"/api/v1/provisioning/pxe/{document}", address)

    assert answer.status_code == 404
    assert answer.json()["code"] == "no_install_waiting"
    assert answer.json()["message"] == "No server at this address is waiting to install its OS over the network."


def test_the_node_is_known_by_its_address_in_any_spelling(pxe, api):
    pxe.node.os_address = f"{SERVER}:2222"  # SSH on another port: the address is the same
    pxe.node.save(update_fields=["os_address"])
    pxe.order()

    assert fetch(api, SCRIPT, f"::ffff:{SERVER}").status_code == 200


def test_a_stopped_run_serves_no_files(pxe, api, run_on_commit):
    request = pxe.order()
    assert fetch(api, SCRIPT).status_code == 200

    run_on_commit(request_services.request_release, request=request, actor=request.requester, reason="not needed")

    answer = fetch(api, SCRIPT)
    assert (answer.status_code, answer.json()["code"]) == (404, "no_install_waiting")


def test_each_server_gets_its_own_runs_files_and_two_at_one_address_are_refused(pxe, api):
    second_node = add_node(
        pxe.profile.accelerator_model, name="bm2", cards=8, cpu_cores=112, memory_gb=2048, os_address="192.0.2.11"
    )
    first, second = pxe.order(), pxe.order()
    nodes = {provision_run(r).allocation.node.name: r for r in (first, second)}
    assert set(nodes) == {"bm1", "bm2"}

    first_script = fetch(api, SCRIPT, SERVER).content.decode()
    second_script = fetch(api, SCRIPT, "192.0.2.11").content.decode()
    assert "on bm1" in first_script and "bm2" not in first_script
    assert "on bm2" in second_script and "bm1" not in second_script
    assert install_config(api, SERVER)["autoinstall"]["identity"]["hostname"] == "bm1"

    second_node.os_address = SERVER
    second_node.save(update_fields=["os_address"])
    ambiguous = fetch(api, SCRIPT, SERVER)
    assert (ambiguous.status_code, ambiguous.json()["code"]) == (409, "address_ambiguous")


@pytest.mark.parametrize("viewer", ["developer", "developer2", "approver", "lead", "operator"])
def test_no_viewer_of_the_request_can_read_or_fetch_the_installer_token(pxe, api, api_as, client, viewer):
    """The requester, a teammate, the approver, the lead and an operator: the API and the page show the boot step,
    neither shows the token, and the install files are not theirs to fetch from where they are."""
    request = pxe.order()
    token = callback_in(install_config(api), "succeeded")[1]["token"]
    user = getattr(pxe.team, viewer)

    detail = api_as(user).get(f"/api/v1/requests/{request.pk}/")
    assert detail.status_code == 200
    boot = next(s for r in detail.json()["provisioning"]["runs"] for s in r["steps"] if s["name"] == "boot_installer")
    assert boot["output"]["script"] == f"{PUBLIC}{SCRIPT}"
    client.force_login(user)
    page = client.get(reverse("portal:request-detail", args=[request.pk]))
    assert page.status_code == 200
    events = list(request.events.values_list("message", "data"))
    assert token not in f"{detail.content} {page.content} {events}"
    for document in ("boot.ipxe", "user-data", "meta-data"):
        own = api_as(user).get(f"/api/v1/provisioning/pxe/{document}", REMOTE_ADDR="198.51.100.7")
        assert own.status_code == 404 and token not in own.content.decode()


def test_pxe_needs_the_images_netboot_files(pxe):
    image = pxe.profile.os_image
    image.configuration = {}
    image.save(update_fields=["configuration"])

    with pytest.raises(ValidationError) as refusal:
        pxe.profile.full_clean()
    assert "boot_method" in refusal.value.message_dict
    request = pxe.order()  # a profile saved past the form: the boot step refuses, clearly
    assert request.state == RequestState.FAILED
    failure = provision_run(request).failure
    assert (failure["step"], failure["code"]) == ("boot_installer", "netboot_not_configured")


def test_pxe_needs_the_nodes_address(pxe):
    pxe.node.os_address = ""
    pxe.node.save(update_fields=["os_address"])

    request = pxe.order()

    assert request.state == RequestState.FAILED
    failure = provision_run(request).failure
    assert (failure["step"], failure["code"], failure["attempts"]) == ("boot_installer", "node_address_unknown", 1)
    assert SimulatedMachine.objects.get(node=pxe.node.name).boot_override == ""  # nothing was asked of the BMC


def test_a_pxe_order_on_the_redfish_emulator_sets_a_one_time_pxe_boot_and_inserts_no_media(
    pxe, on_redfish, sushy_emulator, api, run_on_commit
):
    system_url = sushy_emulator.system_url("pxe")
    pxe.node.bmc_address = system_url
    pxe.node.save(update_fields=["bmc_address"])
    image = pxe.profile.os_image
    image.configuration = {"netboot": NETBOOT}  # on_redfish pointed the image at the image server
    image.save(update_fields=["configuration"])

    request = pxe.order()

    system = httpx.get(system_url, timeout=5).json()
    assert system["Boot"]["BootSourceOverrideTarget"] == "Pxe" and system["PowerState"] == "On"
    assert httpx.get(f"{system_url}/VirtualMedia/Cd", timeout=5).json()["Inserted"] is False
    callback, body = callback_in(install_config(api), "succeeded")
    assert run_on_commit(api.post, path_of(callback), body, format="json", REMOTE_ADDR=SERVER).status_code == 202
    request.refresh_from_db()
    assert request.state == RequestState.ACTIVE
    run_on_commit(request_services.request_release, request=request, actor=request.requester, reason="done")
    assert httpx.get(system_url, timeout=5).json()["PowerState"] == "Off"


def test_the_migration_takes_leaked_tokens_out_of_earlier_outputs_and_revokes_them(pxe, api):
    """Before, the boot step recorded the script URL with the token in its path, for every viewer to read."""
    add_node(pxe.profile.accelerator_model, name="bm2", cards=8, cpu_cores=112, memory_gb=2048, os_address="192.0.2.11")
    waiting, done = pxe.order(), pxe.order()
    leaked = {}
    for request, token in ((waiting, "leaked-waiting"), (done, "leaked-done")):
        run = provision_run(request)
        run.steps.filter(name="boot_installer").update(
            output={"boot_method": "pxe", "script": f"{PUBLIC}/api/v1/provisioning/pxe/{token}/boot.ipxe"}
        )
        ProvisioningRun.objects.filter(pk=run.pk).update(installer_token_hash=secret_hash(token))
        leaked[request.pk] = token
    ProvisioningRun.objects.filter(request=done).update(installer_reported_at=timezone.now())
    migration = importlib.import_module("provisioning.migrations.0009_installer_token_out_of_step_outputs")

    migration.forget_exposed_tokens(django_apps, None)

    for request in (waiting, done):
        assert boot_output(request)["script"] == f"{PUBLIC}{SCRIPT}"
    assert provision_run(waiting).installer_token_hash == ""  # whoever read it cannot report for it
    assert provision_run(done).installer_token_hash == secret_hash("leaked-done")  # spent anyway: kept as it was
    answer = api.post(
        "/api/v1/provisioning/installer-callback/",
        {"token": leaked[waiting.pk], "status": "succeeded"},
        format="json",
        REMOTE_ADDR=SERVER,
    )
    assert answer.json()["code"] == "unknown_token"
