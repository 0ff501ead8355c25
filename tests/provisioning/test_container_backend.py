"""The container backend against a real podman (runc) on this machine: the catalog's GPU workspace ordered onto a
container-backed node runs as a container built from its Containerfile, with the allocated (fake) device nodes
bound; SSH into it works; release removes it; a container that exits by itself is reclaimed."""

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest

from catalog.demo import seed_catalog, workspace_schema
from devcluster.podman_runtime import ssh
from provisioning import engine
from provisioning.choices import RunKind, RunState
from provisioning.connect import connect_secrets_shown
from provisioning.drivers.base import StepError
from provisioning.drivers.container import ContainerWorkloads, Podman, prepare_built_image
from provisioning.models import ProvisioningRun, ProvisioningStep
from provisioning.reconcile import workloads_reconcile
from provisioning.selectors import provisioning_details
from requests import services as request_services
from requests.choices import RequestState
from requests.orders import Order
from scheduling import cycle
from scheduling.choices import ExecutionBackend
from scheduling.models import Allocation, Device
from tenancy.ssh_keys import ssh_key_add
from tests import factories
from tests.devcluster_fixtures import podman_service  # noqa: F401  (fixture)
from tests.provisioning.conftest import add_node

pytestmark = pytest.mark.django_db


@pytest.fixture
def workspace(podman_service, team, run_on_commit, settings):  # noqa: F811
    """The catalog's GPU workspace (the demo's parameters and 1x H100 spec) with an image built from this
    repository's Containerfile, and a container-backed 4-card node whose podman is this machine's. The test's
    containers are removed at the end."""
    settings.CONTAINER_PODMAN_URL = podman_service.url
    settings.CONTAINER_ACCESS_HOST = settings.CONTAINER_PUBLISH_IP = "127.0.0.1"
    settings.CONTAINER_DEVICE_PATH = podman_service.device_path
    settings.CONTAINER_INSTANCE = podman_service.instance
    settings.PROVISIONING_MAX_ATTEMPTS = 2
    spec = seed_catalog()["specs"]["h100-1x"]
    image = factories.ImageFactory(
        name="debian-workspace", version="12", reference="containerfile:workspace", os="Debian 12"
    )
    service = factories.ServiceFactory(
        slug="gpu-workspace", parameter_schema=workspace_schema(), specs=[spec], images=[image]
    )
    node = add_node(spec.accelerator_models.get(), name="podman-1", execution_backend=ExecutionBackend.CONTAINER)

    def order(**parameters):
        request = run_on_commit(
            request_services.request_submit,
            requester=team.developer,
            order=Order(
                service=service,
                project=team.project,
                duration_hours=4,
                spec=spec,
                image=image,
                parameters={"ssh_public_key": podman_service.key.public, **parameters},
            ),
        )
        assert request.state == RequestState.QUEUED
        run_on_commit(cycle.run_cycle)
        request.refresh_from_db()
        return request

    podman = Podman(podman_service.url)
    yield SimpleNamespace(order=order, node=node, podman=podman, runtime=podman_service, team=team)
    for container in podman.containers():
        podman.run("rm", "--force", "--time", "0", container["Id"])


def _delivered(request) -> dict:
    return ProvisioningRun.objects.get(request=request, kind=RunKind.PROVISION).delivered


def _container(workspace, request) -> dict | None:
    return workspace.podman.inspect(_delivered(request)["workload"])


def _end_on_signal(workspace, name: str, signal: str) -> None:
    """The workspace's main process (sshd, PID 1) ends, as if by itself: the runtime signals it from outside, since a
    `podman exec kill` inside dies with the container, and its session may answer an error without output; the end
    is waited for, so the reconciler reads an exited container."""
    workspace.podman.run("kill", "--signal", signal, name)
    workspace.podman.run("wait", name, timeout=30)


def test_a_workspace_ordered_without_a_key_lets_in_the_keys_on_the_requesters_profile(workspace):
    """Issue 40 item 2: no key pasted into the order; the requester's profile keys are in the workspace, and the
    connect details the API gives (delivered.ide: what `cc ssh` runs) reach it."""
    developer = workspace.team.developer
    ssh_key_add(user=developer, name="test runner", public_key=workspace.runtime.key.public, actor=developer)
    request = workspace.order(ssh_public_key="")
    assert request.state == RequestState.ACTIVE, list(
        ProvisioningStep.objects.filter(run__request=request).values_list("name", "error")
    )
    ide = provisioning_details(request)["delivered"]["ide"]
    session = ssh(workspace.runtime, {"ssh": " ".join(ide["ssh_argv"])}, "whoami")
    assert session.returncode == 0, session.stderr
    assert session.stdout.strip() == ide["ssh_argv"][-1].split("@")[0]


def test_a_workspace_reaches_active_and_ssh_sees_the_bound_devices(workspace, run_on_commit):
    request = workspace.order(jupyter=True)
    assert request.state == RequestState.ACTIVE, list(
        ProvisioningStep.objects.filter(run__request=request).values_list("name", "error")
    )
    delivered = _delivered(request)
    [bound] = Allocation.objects.get(request=request).devices.values_list("device__index", "device__uuid")
    run = ProvisioningRun.objects.get(request=request, kind=RunKind.PROVISION)
    prepared = run.steps.get(name="prepare_image").output
    assert delivered["image_digest"] == prepared["digest"] and prepared["digest"].startswith("sha256:")
    assert run.steps.get(name="readiness_check").output["ssh"].startswith("SSH-2.0-OpenSSH")

    session = ssh(
        workspace.runtime, delivered["access"], "stat -c '%F %t,%T' /dev/nvidia*; echo $NVIDIA_VISIBLE_DEVICES"
    )
    assert session.returncode == 0, session.stderr
    assert session.stdout.splitlines() == ["character special file 1,3", bound[1]]
    assert delivered["access"]["ssh"].startswith(f"ssh -p {delivered['ports']['ssh']} ")
    container = _container(workspace, request)
    assert container["HostConfig"]["Devices"][0]["PathInContainer"] == f"/dev/nvidia{bound[0]}"
    assert (container["HostConfig"]["NanoCpus"], container["HostConfig"]["Memory"]) == (16 * 10**9, 128 * 2**30)
    assert container["Config"]["Labels"]["compute-catalog.request"] == str(request.pk)
    token = connect_secrets_shown(request, request.requester)["jupyter"]["secret"]
    notebook = httpx.get(f"{delivered['access']['jupyter']}api/status", params={"token": token}, timeout=10)
    assert notebook.status_code == 200 and "started" in notebook.json()

    run_on_commit(request_services.request_release, request=request, actor=request.requester, reason="done")
    request.refresh_from_db()
    assert request.state == RequestState.RELEASED
    assert workspace.podman.inspect(delivered["workload"]) is None
    assert set(Device.objects.values_list("allocated_milli", flat=True)) == {0}


def test_a_retried_start_finds_the_container_it_already_started(workspace):
    request = workspace.order(jupyter=False)
    step = ProvisioningStep.objects.get(run__request=request, run__kind=RunKind.PROVISION, name="start_workload")
    again = ContainerWorkloads().start_workload(engine._contexts([step])[0].target, request.approved_spec["image"])
    assert again["container_id"] == step.output["container_id"]
    assert [container["Id"][:12] for container in workspace.podman.containers()] == [again["container_id"]]
    assert "jupyter" not in again["ports"]


def test_a_container_that_exits_by_itself_fails_the_request_with_its_code_and_frees_the_devices(
    workspace, run_on_commit
):
    request = workspace.order(jupyter=False)
    name = _delivered(request)["workload"]
    _end_on_signal(workspace, name, "QUIT")  # sshd ends with 255 on SIGQUIT
    assert run_on_commit(workloads_reconcile) == {request.pk: "failed"}
    request.refresh_from_db()
    assert request.state == RequestState.FAILED
    failure = request.events.get(code="failed").data["failure"]
    assert failure["code"] == "workload_failed" and failure["details"]["exit_code"] == 255
    assert ProvisioningRun.objects.get(request=request, kind=RunKind.CLEANUP).state == RunState.SUCCEEDED
    assert workspace.podman.inspect(name) is None
    assert set(Device.objects.values_list("allocated_milli", flat=True)) == {0}
    assert run_on_commit(workloads_reconcile) == {}  # nothing left to reconcile


def test_a_container_that_ends_with_code_0_releases_the_request(workspace, run_on_commit):
    request = workspace.order(jupyter=False)
    name = _delivered(request)["workload"]
    _end_on_signal(workspace, name, "TERM")  # sshd ends cleanly, with 0, on SIGTERM
    assert workspace.podman.inspect(name)["State"]["ExitCode"] == 0
    assert run_on_commit(workloads_reconcile) == {request.pk: "released"}
    request.refresh_from_db()
    assert request.state == RequestState.RELEASED
    assert "exited by itself with code 0" in request.events.get(code="releasing").message
    assert workspace.podman.inspect(name) is None


def test_a_secret_for_a_container_that_has_ended_is_refused_with_its_exit_code(workspace):
    """`podman exec` into an ended container answers an error (without output when the container ends during the
    exec): the driver reads the ended container with `inspect` and says so, for good."""
    request = workspace.order(jupyter=False)
    step = ProvisioningStep.objects.get(run__request=request, run__kind=RunKind.PROVISION, name="start_workload")
    _end_on_signal(workspace, _delivered(request)["workload"], "QUIT")
    with pytest.raises(StepError) as refused:
        ContainerWorkloads().connect_secret_set(engine._contexts([step])[0].target, "jupyter", "a-new-token")
    assert refused.value.code == "container_exited" and not refused.value.retryable
    assert refused.value.details["exit_code"] == 255
    assert "before it took the new jupyter secret" in refused.value.message


def test_a_workspace_without_an_ssh_key_fails_with_a_clear_reason(workspace):
    request = workspace.order(jupyter=False, ssh_public_key="")
    request.refresh_from_db()
    assert request.state == RequestState.FAILED
    assert request.events.get(code="failed").data["failure"]["code"] == "ssh_public_key_missing"
    assert workspace.podman.containers() == []


def test_an_image_is_built_once_and_the_node_s_copy_verified_by_digest(podman_service, settings, tmp_path):  # noqa: F811
    """busybox-static images from their own Containerfiles: built once, found (not rebuilt) after, and refused when
    the node's image under that tag is no longer the one built."""
    settings.CONTAINER_IMAGE_DIR, settings.CONTAINER_IMAGE_CACHE = str(tmp_path / "images"), str(tmp_path / "cache")
    for name, extra in (("busybox", ""), ("other", "COPY Containerfile /\n")):
        context = tmp_path / "images" / name
        context.mkdir(parents=True)
        shutil.copy(shutil.which("busybox"), context / "busybox")
        (context / "Containerfile").write_text(f"FROM scratch\nCOPY busybox /bin/busybox\n{extra}")
    podman = Podman(podman_service.url)
    built, other = (prepare_built_image(podman, f"containerfile:{name}") for name in ("busybox", "other"))
    try:
        assert built["built"] and built["digest"].startswith("sha256:") and other["digest"] != built["digest"]
        assert prepare_built_image(podman, "containerfile:busybox") == {**built, "built": False}
        podman.run("tag", other["image"], built["image"])  # someone put another image under the tag
        with pytest.raises(StepError) as refused:
            prepare_built_image(podman, "containerfile:busybox")
        assert refused.value.code == "image_digest_mismatch" and not refused.value.retryable
    finally:
        podman.run(
            "rmi", "--force", "--ignore", built["image"], other["image"], built["digest"].removeprefix("sha256:")
        )


@pytest.fixture
def cdi_spec(workspace, settings):
    """A CDI spec for the node's cards (a kind of this test run's own, in /var/run/cdi where podman 4.3 looks;
    removed at the end), and the node marked as having one."""
    kind = f"{workspace.runtime.instance}.test/gpu"
    devices = [
        {
            "name": device.uuid,
            "containerEdits": {
                "deviceNodes": [
                    {
                        "path": f"/dev/nvidia{device.index}",
                        "hostPath": workspace.runtime.device_path.format(node=workspace.node.name, index=device.index),
                    }
                ]
            },
        }
        for device in workspace.node.devices.all()
    ]
    spec = Path("/var/run/cdi") / f"{workspace.runtime.instance}.json"
    spec.parent.mkdir(exist_ok=True)
    spec.write_text(json.dumps({"cdiVersion": "0.5.0", "kind": kind, "devices": devices}))
    settings.CONTAINER_CDI_KINDS = {workspace.node.name: kind}
    yield kind
    spec.unlink()


def test_on_a_node_with_a_cdi_spec_the_devices_are_bound_by_cdi_name(workspace, cdi_spec):
    request = workspace.order(jupyter=False)
    assert request.state == RequestState.ACTIVE
    [(index, uuid)] = Allocation.objects.get(request=request).devices.values_list("device__index", "device__uuid")
    session = ssh(workspace.runtime, _delivered(request)["access"], f"stat -c '%F %t,%T' /dev/nvidia{index}")
    assert session.stdout.splitlines() == ["character special file 1,3"], session.stderr
    assert f"{cdi_spec}={uuid}" in _container(workspace, request)["Config"]["CreateCommand"]
