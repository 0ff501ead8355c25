"""Network installs at the HTTP level: a PXE profile's boot step sets a one-time `Pxe` boot and hands out the run's
iPXE script URL; the script, the cloud-init seed it points at and the callback inside all carry the run's one-time
token, which is the only credential (refused once spent, for a stopped run, or when it is not a run's)."""

import re
from urllib.parse import urlsplit

import httpx
import pytest
import yaml
from django.core.exceptions import ValidationError

from catalog.choices import BootMethod
from provisioning.choices import RunKind, StepState
from provisioning.models import ProvisioningRun, SimulatedMachine
from requests import services as request_services
from requests.choices import RequestState
from tests import factories
from tests.provisioning.conftest import add_node

pytestmark = pytest.mark.django_db

PUBLIC = "https://compute.example.org"
NETBOOT = {
    "kernel": "http://images.test/ubuntu-22.04/casper/vmlinuz",
    "initrd": "http://images.test/ubuntu-22.04/casper/initrd",
}


@pytest.fixture
def pxe(bare_metal, settings):
    """The bare-metal shop with its profile booting from the network."""
    settings.PUBLIC_BASE_URL = PUBLIC
    image = bare_metal.profile.os_image
    image.configuration = {"netboot": NETBOOT}
    image.save(update_fields=["configuration"])
    bare_metal.profile.boot_method = BootMethod.PXE
    bare_metal.profile.full_clean()
    bare_metal.profile.save(update_fields=["boot_method"])
    return bare_metal


def boot_output(request) -> dict:
    run = ProvisioningRun.objects.get(request=request, kind=RunKind.PROVISION)
    return run.steps.get(name="boot_installer").output


def path_of(url: str) -> str:
    assert url.startswith(PUBLIC)
    return urlsplit(url).path


def fetch_script(api, request) -> tuple[str, str]:
    """What the server's iPXE gets from the script URL the boot step handed out: (script, token)."""
    url = boot_output(request)["script"]
    answer = api.get(path_of(url), HTTP_ACCEPT="text/plain")
    assert answer.status_code == 200 and answer["Content-Type"].startswith("text/plain")
    return answer.content.decode(), re.search(r"/pxe/([^/]+)/boot\.ipxe$", url).group(1)


def seed_of(script: str) -> str:
    return re.search(r"ds=nocloud-net;s=(\S+)", script).group(1)


def callback_in(user_data: dict, status: str) -> tuple[str, dict]:
    """The URL and body of the callback command the installer runs when it finishes (or fails)."""
    commands = user_data["autoinstall"]["late-commands" if status == "succeeded" else "error-commands"]
    [command] = commands
    body = re.search(r"-d '([^']+)'", command).group(1)
    return command.rsplit(" ", 1)[1], yaml.safe_load(body)


def test_a_pxe_profile_boots_from_the_network_with_the_runs_script_and_install_config(pxe, api, run_on_commit):
    request = pxe.order()

    output = boot_output(request)
    assert (output["boot_method"], output["boot"]["boot_source"]) == ("pxe", "Pxe")
    machine = SimulatedMachine.objects.get(node=pxe.node.name)
    assert (machine.boot_override, machine.media_image) == ("Pxe", "")
    run = ProvisioningRun.objects.get(request=request, kind=RunKind.PROVISION)
    assert run.steps.get(name="wait_for_install").state == StepState.WAITING

    script, token = fetch_script(api, request)
    lines = script.splitlines()
    assert lines[0] == "#!ipxe" and lines[-1] == "boot"
    assert lines[2].startswith(f"kernel {NETBOOT['kernel']} ip=dhcp url={pxe.profile.os_image.reference} autoinstall")
    assert lines[3] == f"initrd {NETBOOT['initrd']}"
    seed = seed_of(script)
    assert seed == f"{PUBLIC}/api/v1/provisioning/pxe/{token}/"

    user_data = api.get(path_of(seed + "user-data"))
    assert user_data.status_code == 200 and user_data["Content-Type"].startswith("text/cloud-config")
    assert user_data.content.startswith(b"#cloud-config\n")
    config = yaml.safe_load(user_data.content)
    identity = config["autoinstall"]["identity"]
    assert (identity["hostname"], identity["username"]) == (pxe.node.name, request.requester.username)
    assert yaml.safe_load(api.get(path_of(seed + "meta-data")).content) == {
        "instance-id": f"provisioning-run-{run.pk}",
        "local-hostname": pxe.node.name,
    }
    assert callback_in(config, "failed") == (
        f"{PUBLIC}/api/v1/provisioning/installer-callback/",
        {
            "token": token,
            "status": "failed",
        },
    )
    callback, body = callback_in(config, "succeeded")
    assert body == {"token": token, "status": "succeeded"}

    assert run_on_commit(api.post, path_of(callback), body, format="json").status_code == 202
    request.refresh_from_db()
    assert request.state == RequestState.ACTIVE
    spent = api.get(path_of(boot_output(request)["script"]))
    assert (spent.status_code, spent.json()) == (
        409,
        {"code": "token_used", "message": "This installer token has already been used.", "details": {}},
    )


@pytest.mark.parametrize("token", ["nope", "x" * 300, "%00", "..", "' OR 1=1 --"])
@pytest.mark.parametrize("document", ["boot.ipxe", "user-data", "meta-data"])
def test_a_token_that_is_no_runs_is_refused_as_json_not_a_500(pxe, api, token, document):
    pxe.order()

    answer = api.get(f"/api/v1/provisioning/pxe/{token}/{document}", HTTP_ACCEPT="text/plain")

    assert answer.status_code == 404
    assert answer.json() == {"code": "unknown_token", "message": "Unknown installer token.", "details": {}}


def test_the_token_of_a_stopped_run_is_refused(pxe, api, run_on_commit):
    request = pxe.order()
    script_url = boot_output(request)["script"]

    run_on_commit(request_services.request_release, request=request, actor=request.requester, reason="not needed")

    answer = api.get(path_of(script_url))
    assert (answer.status_code, answer.json()["code"]) == (409, "token_expired")
    assert answer.json()["details"] == {"state": "cancelled"}


@pytest.mark.parametrize("who", ["anonymous", "requester", "outsider", "operator"])
def test_only_the_token_opens_a_runs_files_and_only_that_runs(pxe, api, api_as, who, run_on_commit, roles):
    add_node(pxe.profile.accelerator_model, name="bm2", cards=8, cpu_cores=112, memory_gb=2048)
    first, second = pxe.order(), pxe.order()
    client = {
        "anonymous": api,
        "requester": api_as(first.requester) if who == "requester" else None,
        "outsider": api_as(roles.outsider) if who == "outsider" else None,
        "operator": api_as(factories.operator()) if who == "operator" else None,
    }[who]
    first_script, _ = fetch_script(client, first)
    second_script, _ = fetch_script(client, second)

    first_node, second_node = (ProvisioningRun.objects.get(request=r).allocation.node.name for r in (first, second))
    assert first_node in first_script and second_node not in first_script
    assert second_node in second_script and first_node not in second_script
    # No session or API token stands in for the run's token.
    for path in ("boot.ipxe", "user-data", "meta-data"):
        assert client.get(f"/api/v1/provisioning/pxe/{path}").status_code == 404
        assert client.get(f"/api/v1/provisioning/pxe/not-a-token/{path}").json()["code"] == "unknown_token"


def test_pxe_needs_the_images_netboot_files(pxe):
    image = pxe.profile.os_image
    image.configuration = {}
    image.save(update_fields=["configuration"])

    with pytest.raises(ValidationError) as refusal:
        pxe.profile.full_clean()
    assert "boot_method" in refusal.value.message_dict
    request = pxe.order()  # a profile saved past the form: the boot step refuses, clearly
    assert request.state == RequestState.FAILED
    failure = ProvisioningRun.objects.get(request=request, kind=RunKind.PROVISION).failure
    assert (failure["step"], failure["code"]) == ("boot_installer", "netboot_not_configured")


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
    script, _ = fetch_script(api, request)
    config = yaml.safe_load(api.get(path_of(seed_of(script) + "user-data")).content)
    callback, body = callback_in(config, "succeeded")
    assert run_on_commit(api.post, path_of(callback), body, format="json").status_code == 202
    request.refresh_from_db()
    assert request.state == RequestState.ACTIVE
    run_on_commit(request_services.request_release, request=request, actor=request.requester, reason="done")
    assert httpx.get(system_url, timeout=5).json()["PowerState"] == "Off"
