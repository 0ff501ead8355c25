"""Provisioning pipelines end to end on the simulated drivers: allocation -> steps -> active -> release."""

import subprocess

import pytest
from django.test import override_settings

from catalog.choices import SlurmMembership
from provisioning.choices import RunKind, RunState, StepState
from provisioning.drivers.base import login_name
from provisioning.models import ProvisioningRun
from requests import services as request_services
from requests.choices import EventCode, RequestState
from scheduling.choices import AllocationState
from scheduling.models import Allocation, Device
from tenancy.ssh_keys import ssh_key_add

pytestmark = pytest.mark.django_db

COMPUTE_STEPS = ["prepare_image", "start_workload", "readiness_check", "publish_access"]
BARE_METAL_STEPS = [
    "validate_hardware",
    "boot_installer",
    "power_cycle",
    "wait_power_on",
    "wait_for_install",
    "install_gpu_driver",
    "install_monitoring_agent",
    "register_cluster",
    "grant_access",
    "health_check",
    "publish_access",
]


def steps_of(run: ProvisioningRun) -> list[tuple[str, str, int]]:
    return list(run.steps.order_by("position").values_list("name", "state", "attempts"))


def test_compute_order_reaches_active_with_every_step_and_the_delivered_resource(compute):
    request = compute.order()
    assert request.state == RequestState.ACTIVE
    run = ProvisioningRun.objects.get(request=request)
    assert (run.kind, run.state, run.driver) == (RunKind.PROVISION, RunState.SUCCEEDED, "simulated")
    assert steps_of(run) == [(name, StepState.SUCCEEDED, 1) for name in COMPUTE_STEPS]
    delivered = run.delivered
    assert delivered["node"] == "n1" and delivered["host"] == "n1.compute.internal"
    assert [device["uuid"] for device in delivered["devices"]] == ["GPU-n1-0", "GPU-n1-1"]
    ssh = f"ssh -p {delivered['ports']['ssh']} {request.requester.username}@n1.compute.internal"
    assert delivered["access"]["ssh"] == ssh
    assert delivered["image"] == f"{compute.shop.image.name}:{compute.shop.image.version}"
    codes = list(request.events.values_list("code", flat=True))
    assert codes[-3:] == [EventCode.ALLOCATED, EventCode.PROVISIONING, EventCode.ACTIVE]
    assert not request.events.filter(intervention=True).exists()


@pytest.mark.parametrize(
    ("membership", "cluster", "root"),
    [
        (SlurmMembership.SHARED_CLUSTER_NO_ROOT, "cluster-a", False),
        (SlurmMembership.TENANT_CLUSTER, "{project}-bm1", True),
        (SlurmMembership.NONE, None, True),
    ],
)
def test_the_delivered_server_says_how_it_joined_slurm_and_whether_its_tenant_is_root(
    bare_metal, membership, cluster, root
):
    bare_metal.profile.slurm_membership = membership
    bare_metal.profile.target_cluster = "cluster-a" if membership == SlurmMembership.SHARED_CLUSTER_NO_ROOT else ""
    bare_metal.profile.full_clean()
    bare_metal.profile.save(update_fields=["slurm_membership", "target_cluster"])

    request = bare_metal.order()

    assert request.state == RequestState.ACTIVE
    delivered = ProvisioningRun.objects.get(request=request).delivered
    cluster = cluster and cluster.format(project=request.project.slug)
    assert (delivered["slurm_membership"], delivered["cluster"], delivered["root"]) == (membership, cluster, root)
    assert ("cluster_node" in delivered) is (cluster is not None)
    login = login_name(request.requester.username)
    assert delivered["access"]["ssh"] == f"ssh {login}@{delivered['host']}"


def test_release_tears_down_then_returns_the_capacity(compute, run_on_commit):
    request = compute.order()
    run_on_commit(request_services.request_release, request=request, actor=request.requester, reason="done")
    request.refresh_from_db()
    assert request.state == RequestState.RELEASED
    release = ProvisioningRun.objects.get(request=request, kind=RunKind.RELEASE)
    assert release.state == RunState.SUCCEEDED
    assert steps_of(release) == [("stop_workload", StepState.SUCCEEDED, 1), ("return_capacity", StepState.SUCCEEDED, 1)]
    assert Allocation.objects.get(request=request).state == AllocationState.RELEASED
    assert set(Device.objects.values_list("allocated_milli", flat=True)) == {0}


def test_bare_metal_order_runs_the_whole_pipeline_and_release_cleans_the_server(bare_metal, run_on_commit):
    request = bare_metal.order()
    assert request.state == RequestState.ACTIVE
    run = ProvisioningRun.objects.get(request=request)
    assert [name for name, _, _ in steps_of(run)] == BARE_METAL_STEPS
    assert {state for _, state, _ in steps_of(run)} == {StepState.SUCCEEDED}
    assert run.installer_reported_at is not None and run.installer_report["status"] == "succeeded"
    validation = run.steps.get(name="validate_hardware").output
    assert validation["checks"]["inventory_match"] == "passed"
    health = run.steps.get(name="health_check").output
    assert health["checks"]["accelerator_burn_in"] == "passed"
    assert run.delivered["cluster"] == "cluster-a" and run.delivered["host"] == "bm1.cluster-a.internal"

    run_on_commit(request_services.request_release, request=request, actor=request.requester, reason="done")
    request.refresh_from_db()
    assert request.state == RequestState.RELEASED
    release = ProvisioningRun.objects.get(request=request, kind=RunKind.RELEASE)
    assert [name for name, _, _ in steps_of(release)] == [
        "deregister_cluster",
        "power_off",
        "wait_power_off",
        "eject_media",
        "mark_for_cleaning",
        "return_capacity",
    ]
    assert release.state == RunState.SUCCEEDED
    bare_metal.node.refresh_from_db()
    assert bare_metal.node.schedulable


def test_a_bare_metal_lease_accepts_the_requesters_profile_keys_as_a_workspace_does(
    bare_metal, team, run_on_commit, tmp_path
):
    for name in ("laptop", "desktop"):
        private = tmp_path / name
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", private], check=True)
        ssh_key_add(
            user=team.developer, name=name, public_key=private.with_suffix(".pub").read_text(), actor=team.developer
        )

    request = bare_metal.order()

    access = ProvisioningRun.objects.get(request=request).steps.get(name="grant_access").output
    assert (access["user"], access["ssh_keys"]) == (login_name(team.developer.username), 2)


def test_a_transient_fault_is_retried_with_backoff_and_shown_on_the_timeline(compute, settings):
    settings.PROVISIONING_FAULTS = [
        {
            "op": "start_workload",
            "attempts": [1, 2],
            "code": "runtime_busy",
            "message": "The container runtime is busy.",
        }
    ]
    request = compute.order()
    assert request.state == RequestState.ACTIVE
    run = ProvisioningRun.objects.get(request=request)
    assert ("start_workload", StepState.SUCCEEDED, 3) in steps_of(run)
    notes = list(request.events.filter(code=EventCode.PROVISIONING_STEP_FAILED).values_list("message", flat=True))
    assert len(notes) == 2 and "attempt 1 of 4" in notes[0] and "runtime is busy" in notes[0]


def test_a_permanent_failure_fails_the_request_cleans_up_and_returns_the_devices(compute, settings):
    settings.PROVISIONING_FAULTS = [
        {"op": "workload_ready", "code": "probe_failed", "message": "Port 22 never opened."}
    ]
    request = compute.order()
    assert request.state == RequestState.FAILED
    run = ProvisioningRun.objects.get(request=request, kind=RunKind.PROVISION)
    assert run.state == RunState.FAILED
    assert run.failure["step"] == "readiness_check" and run.failure["attempts"] == 4
    failed = request.events.get(code=EventCode.FAILED)
    assert failed.message == "Provisioning failed at “Readiness check” after 4 attempts: " + (
        "Your workload started but never became reachable."
    )
    assert failed.data["failure"]["message"] == "Port 22 never opened."  # the backend's words, for operators
    cleanup = ProvisioningRun.objects.get(request=request, kind=RunKind.CLEANUP)
    assert cleanup.state == RunState.SUCCEEDED
    assert [name for name, _, _ in steps_of(cleanup)] == ["stop_workload", "return_capacity"]
    assert "Cleaned up after the failure: Stop the workload, Return the capacity" in request.events.last().message
    assert Allocation.objects.get(request=request).state == AllocationState.RELEASED
    assert set(Device.objects.values_list("allocated_milli", flat=True)) == {0}
    compute.node.refresh_from_db()
    assert compute.node.schedulable  # a software failure does not isolate the node


def test_a_hardware_mismatch_isolates_the_node(bare_metal, settings):
    settings.PROVISIONING_FAULTS = [{"op": "inventory", "result": {"accelerators": 7}}]
    request = bare_metal.order()
    assert request.state == RequestState.FAILED
    run = ProvisioningRun.objects.get(request=request, kind=RunKind.PROVISION)
    assert (run.failure["step"], run.failure["code"], run.failure["attempts"]) == (
        "validate_hardware",
        "inventory_mismatch",
        1,
    )
    assert "accelerators 7 (inventory says 8)" in run.failure["message"]
    bare_metal.node.refresh_from_db()
    assert not bare_metal.node.schedulable and "validate_hardware" in bare_metal.node.cordon_reason
    assert "isolated for an operator" in request.events.get(code=EventCode.FAILED).message


@override_settings(
    PROVISIONING_FAULTS=[
        {"op": "install_gpu_driver", "code": "dkms_failed", "message": "DKMS build failed.", "retryable": False}
    ]
)
def test_a_failed_install_step_says_which_step_and_what_was_cleaned_up(bare_metal):
    request = bare_metal.order()
    assert request.state == RequestState.FAILED
    cleanup = ProvisioningRun.objects.get(request=request, kind=RunKind.CLEANUP)
    assert [name for name, _, _ in steps_of(cleanup)] == [
        "deregister_cluster",
        "power_off",
        "wait_power_off",
        "eject_media",
        "mark_for_cleaning",
        "return_capacity",
    ]
    assert cleanup.state == RunState.SUCCEEDED
    assert request.events.filter(code=EventCode.CLEANED_UP).exists()
