"""The whole bare-metal path for real: hardware validation against the static BMC that reports GPUs (sushy-static),
one-time boot and power on the fake BMC (sushy-emulator), the installer's callback, then every in-band step as an
Ansible playbook on a real test host (a podman container), which joins the real Slurm cluster as a dynamic node;
active with the record showing what each part found. Release: the node leaves slurmctld, power off, media ejected,
marked for cleaning. Faults: SSH unreachable (retried, then a failure naming step and host), a failing task."""

import hashlib
import subprocess
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from catalog.choices import SlurmMembership
from catalog.parameters import SSH_PUBLIC_KEY, default_parameter_schema
from provisioning.choices import RunKind
from provisioning.drivers.ansible import AnsibleHost
from provisioning.models import ProvisioningRun
from provisioning.netboot import node_addresses
from provisioning.steps import IN_BAND_STEPS
from provisioning.targets import run_target
from requests import services as request_services
from requests.choices import EventCode, RequestState
from tenancy.ssh_keys import ssh_key_add
from tests.provisioning.redfish_emulator import free_loopback_port
from tests.provisioning.test_redfish_inventory import hgx  # noqa: F401  (fixture)
from tests.provisioning.test_redfish_pipeline import installer_callback_from_media, redfish_get

pytestmark = pytest.mark.django_db
DRIVER_VERSION = "550.54.15"


@pytest.fixture
def server(hgx, in_band):  # noqa: F811  (the imported fixture)
    """The HGX server of the inventory tests, delivered as a real test host (8 fake GPUs) reached over SSH, its
    profile installing the stand-in driver and GPU exporter and joining the session's Slurm cluster."""
    hgx.inventory_from("hgx")
    host = in_band.hosts.start(hgx.node.name, cards=8)
    hgx.node.os_address, hgx.node.ssh_credentials_ref = host.address, "test-hosts"
    hgx.node.save(update_fields=["os_address", "ssh_credentials_ref"])
    hgx.profile.driver_version, hgx.profile.target_cluster = DRIVER_VERSION, in_band.cluster.name
    hgx.profile.gpu_exporter = "dcgm-exporter"
    hgx.profile.save(update_fields=["driver_version", "target_cluster", "gpu_exporter"])
    hgx.host, hgx.in_band = host, in_band
    yield hgx
    # The session's Slurm cluster outlives the test: a dynamic node a test left registered (one that never released
    # its server) would show up in every later test's node list.
    in_band.hosts.exec(host, "pkill", "-x", "slurmd")  # stopped first, so that it cannot register again
    in_band.cluster.run("scontrol", "delete", f"nodename={hgx.node.name}", check=False)


def deliver(server, api, run_on_commit, **parameters):
    """Order, then report the OS installed as the installer would: the in-band steps run on the callback."""
    request = server.order(**parameters)
    callback, token = installer_callback_from_media(server.node.bmc_address)
    # The installer reports from the server it installed: the node's address, as the node records it.
    [address] = node_addresses(server.node.os_address)
    answer = run_on_commit(
        api.post, urlsplit(callback).path, {"token": token, "status": "succeeded"}, format="json", REMOTE_ADDR=address
    )
    assert answer.status_code == 202
    request.refresh_from_db()
    return request


def test_a_bare_metal_order_from_the_bmcs_to_a_slurm_node_and_back(server, api, run_on_commit):
    slurm, name = server.in_band.cluster, server.node.name
    request = deliver(server, api, run_on_commit)

    assert request.state == RequestState.ACTIVE, request.events.values_list("message", flat=True)
    run = ProvisioningRun.objects.get(request=request, kind=RunKind.PROVISION)
    record = run.steps.get(name="publish_access").output
    assert record["bmc_findings"] == {
        "bmc_reachable": "passed",
        "system_health": "passed",
        "inventory_match": "passed",
    }
    assert record["driver_version"] == DRIVER_VERSION
    assert record["agent_endpoint"] == f"http://{server.host.address}:9100/metrics"
    assert record["gpu_exporter_endpoint"] == f"http://{server.host.address}:9400/metrics"
    assert run.steps.get(name="install_monitoring_agent").output["gpu_series"] == 8
    assert (record["cluster_node"], record["cluster"], record["host"]) == (name, slurm.name, server.host.address)
    assert set(record["in_band"]) == set(IN_BAND_STEPS)
    for step, summary in record["in_band"].items():
        assert summary["host"] == name and summary["failed"] == summary["unreachable"] == 0, step
        assert summary["playbook"].startswith("provisioning/playbooks/bare-metal-v1/")
    assert record["in_band"]["install_gpu_driver"]["changed"] > 0
    assert slurm.node_states()[name] == "idle"
    health = run.steps.get(name="health_check").output["checks"]
    assert health["accelerators_visible"] == "passed (8 device nodes)"
    # The profile's default: the shared cluster, whose key is on the server, and no root for the tenant.
    assert (record["slurm_membership"], record["root"]) == ("shared_cluster_no_root", False)
    assert health["tenant_root"] == "passed (none: no sudo rule, no privileged group)"
    login = run.steps.get(name="grant_access").output["user"]
    assert record["access"]["ssh"] == f"ssh {login}@{server.host.address}"

    # A step run again (a worker died after its playbook finished, before recording it) changes nothing.
    target = run_target(run)
    driver = AnsibleHost(timeout=300)
    profile = target.snapshot["bare_metal_profile"]
    again = [
        driver.install_gpu_driver(target, profile["driver_version"]),
        driver.install_monitoring_agent(target, profile["monitoring_agent"], profile["gpu_exporter"]),
        driver.register_in_cluster(target, profile["target_cluster"]),
        driver.grant_access(target, ssh_public_keys=[], root=False),
        driver.health_check(target, []),
    ]
    assert [output["ansible"]["changed"] for output in again] == [0, 0, 0, 0, 0]

    run_on_commit(request_services.request_release, request=request, actor=request.requester, reason="done")
    request.refresh_from_db()
    assert request.state == RequestState.RELEASED
    assert name not in slurm.node_states()
    teardown = ProvisioningRun.objects.get(request=request, kind=RunKind.RELEASE)
    assert teardown.steps.get(name="deregister_cluster").output["removed_now"] is True
    assert teardown.steps.get(name="mark_for_cleaning").output["host_key_forgotten"] is True
    system = redfish_get(server.node.bmc_address)
    assert system["PowerState"] == "Off"
    assert redfish_get(f"{server.node.bmc_address}/VirtualMedia/Cd")["Inserted"] is False


def test_a_tenant_cluster_order_runs_its_own_cluster_with_its_own_key_and_root_and_the_record_says_so(
    server, api, api_as, run_on_commit, settings, tmp_path, team
):
    slurm, name, hosts = server.in_band.cluster, server.node.name, server.in_band.hosts
    server.profile.slurm_membership, server.profile.target_cluster = SlurmMembership.TENANT_CLUSTER, ""
    server.profile.full_clean()
    server.profile.save(update_fields=["slurm_membership", "target_cluster"])
    server.service.parameter_schema = [*default_parameter_schema(), dict(SSH_PUBLIC_KEY)]
    server.service.save(update_fields=["parameter_schema"])
    private, laptop = tmp_path / "tenant_ed25519", tmp_path / "laptop_ed25519"
    for key in (private, laptop):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    # The key on the requester's profile is accepted beside the order's, as a container workspace accepts it.
    ssh_key_add(
        user=team.developer, name="laptop", public_key=laptop.with_suffix(".pub").read_text(), actor=team.developer
    )

    request = deliver(server, api, run_on_commit, ssh_public_key=private.with_suffix(".pub").read_text().strip())

    assert request.state == RequestState.ACTIVE, request.events.values_list("message", flat=True)
    detail = api_as(request.requester).get(f"/api/v1/requests/{request.pk}/").json()
    assert detail["slurm_membership"] == detail["approved_spec"]["bare_metal_profile"]["slurm_membership"]
    assert detail["slurm_membership"] == "tenant_cluster"
    record = detail["provisioning"]["delivered"]
    own_cluster = f"{request.project.slug}-{name}".lower()
    assert (record["slurm_membership"], record["cluster"], record["root"]) == ("tenant_cluster", own_cluster, True)
    shared_key = hashlib.sha256(Path(settings.INBAND_MUNGE_KEY_FILE).read_bytes()).hexdigest()
    host_key = hosts.exec(server.host, "sha256sum", "/etc/munge/munge.key").stdout.split()[0]
    assert host_key != shared_key
    assert name not in slurm.node_states()
    login = ProvisioningRun.objects.get(request=request).steps.get(name="grant_access").output["user"]
    as_tenant = subprocess.run(
        ["ssh", "-i", str(private), "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no",
         "-o", "UserKnownHostsFile=/dev/null", f"{login}@{server.host.address}", "sudo -n id -u"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert as_tenant.stdout.strip() == "0", as_tenant.stderr
    from_laptop = subprocess.run(
        ["ssh", "-i", str(laptop), "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no",
         "-o", "UserKnownHostsFile=/dev/null", f"{login}@{server.host.address}", "id -un"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert from_laptop.stdout.strip() == login, from_laptop.stderr

    run_on_commit(request_services.request_release, request=request, actor=request.requester, reason="done")
    request.refresh_from_db()
    assert request.state == RequestState.RELEASED
    assert hosts.exec(server.host, "test", "-e", "/etc/munge/munge.key").returncode != 0


def test_an_unreachable_server_is_retried_then_fails_naming_the_step_and_host(server, api, run_on_commit, settings):
    settings.PROVISIONING_MAX_ATTEMPTS = 2
    settings.ANSIBLE_CONNECT_TIMEOUT_SECONDS = 2
    server.node.os_address = f"127.0.0.1:{free_loopback_port()}"
    server.node.save(update_fields=["os_address"])

    request = deliver(server, api, run_on_commit)

    assert request.state == RequestState.FAILED
    run = ProvisioningRun.objects.get(request=request, kind=RunKind.PROVISION)
    failure = run.failure
    assert (failure["step"], failure["code"], failure["attempts"]) == ("install_gpu_driver", "host_unreachable", 2)
    assert f"{server.node.name} (127.0.0.1) is unreachable over SSH" in failure["message"]
    assert request.events.filter(code=EventCode.PROVISIONING_STEP_FAILED, data__step="install_gpu_driver").count() == 1


def test_a_failing_task_fails_the_step_with_the_task_and_its_message(server, api, run_on_commit, settings):
    settings.PROVISIONING_MAX_ATTEMPTS = 2
    # A file where the driver package goes: the copy task fails (retryable: it is not tagged permanent).
    server.in_band.hosts.exec(server.host, "sh", "-c", "echo broken > /var/cache/cc-packages")

    request = deliver(server, api, run_on_commit)

    assert request.state == RequestState.FAILED
    run = ProvisioningRun.objects.get(request=request, kind=RunKind.PROVISION)
    assert (run.failure["step"], run.failure["code"], run.failure["attempts"]) == (
        "install_gpu_driver",
        "playbook_task_failed",
        2,
    )
    message = run.failure["message"]
    assert message.startswith(f"Step install_gpu_driver on {server.node.name}: task 'Copy the driver package' failed: ")
    assert "/var/cache/cc-packages" in message, message
    assert run.failure["details"]["task"] == "Copy the driver package"
    assert run.failure["details"]["ansible"]["failed"] == 1
    assert request.events.filter(code=EventCode.PROVISIONING_STEP_FAILED, data__step="install_gpu_driver").count() == 1
