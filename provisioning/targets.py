"""What a provisioning run's steps act on: an allocation's node and devices, and the request's snapshot."""

from collections import defaultdict

from provisioning.choices import Pipeline
from provisioning.drivers.base import Target
from provisioning.models import ProvisioningRun
from scheduling.engine import MILLI
from scheduling.models import Allocation, AllocationDevice, MigInstance


def run_target(run: ProvisioningRun, *, attempt: int = 1) -> Target:
    """What the run's steps act on: its allocation's node and devices, and the request's snapshot."""
    return allocation_target(run, run.allocation, attempt=attempt)


def runs_targets(attempts: list[tuple[ProvisioningRun, int]]) -> list[Target]:
    """The targets of a batch of runs, each at its step's attempt, with one read of their devices."""
    allocations = [run.allocation for run, _ in attempts]
    bindings = _bindings([allocation.pk for allocation in allocations])
    return [
        _target(run, allocation, bindings[allocation.pk], attempt)
        for (run, attempt), allocation in zip(attempts, allocations, strict=True)
    ]


def allocation_target(run: ProvisioningRun, allocation: Allocation, *, attempt: int = 1) -> Target:
    """The run's target on one of its request's allocations (a serving replica's, which may be on another node
    than the run's own)."""
    return _target(run, allocation, _bindings([allocation.pk])[allocation.pk], attempt)


def _bindings(allocation_ids: list[int]) -> dict[int, list[AllocationDevice]]:
    by_allocation = defaultdict(list)
    rows = AllocationDevice.objects.filter(allocation_id__in=allocation_ids).select_related("device__model")
    for binding in rows:  # in device index order (the model's ordering)
        by_allocation[binding.allocation_id].append(binding)
    return by_allocation


def _target(run: ProvisioningRun, allocation: Allocation, bindings: list[AllocationDevice], attempt: int) -> Target:
    node = allocation.node
    # The recorded cards, which only a bare-metal server's hardware validation compares with what its BMC reports.
    bare_metal = run.pipeline == Pipeline.BARE_METAL
    recorded = list(node.devices.order_by("index").values_list("index", "serial_number")) if bare_metal else []
    # A MIG instance is a slice of a card in MIG mode: whole cards (the common case) need no look.
    sliced = any(binding.device.mig_mode or binding.milli < MILLI for binding in bindings)
    mig_instances = _mig_instances(allocation.pk) if sliced else {}
    devices = tuple(_device(binding, mig_instances) for binding in bindings)
    return Target(
        run_id=run.pk,
        request_id=run.request_id,
        node=node.name,
        snapshot=run.request.approved_spec,
        devices=devices,
        bmc_address=node.bmc_address,
        bmc_credentials_ref=node.bmc_credentials_ref,
        bmc_inventory_address=node.bmc_inventory_address,
        os_address=node.os_address,
        ssh_credentials_ref=node.ssh_credentials_ref,
        attempt=attempt,
        backend=node.execution_backend,
        allocation_id=allocation.pk,
        requester=run.request.requester.username,
        duration_hours=run.request.duration_hours,
        gang=gang_of(allocation),
        inventory={
            "cpu_cores": node.cpu_milli // 1000,
            "memory_gb": node.memory_mib // 1024,
            **(
                {
                    "accelerators": len(recorded),
                    "accelerator_serials": [{"index": index, "serial": serial} for index, serial in recorded],
                }
                if bare_metal
                else {}
            ),
        },
    )


def _device(binding: AllocationDevice, mig_instances: dict[int, dict]) -> dict:
    return {
        "index": binding.device.index,
        "uuid": binding.device.uuid,
        "model": binding.device.model.name,
        "model_slug": binding.device.model.slug,
        "milli": binding.milli,
        "mig": mig_instances.get(binding.device_id),  # the GPU instance the work is bound to, if MIG
        "mig_changes": binding.mig_changes,  # what the host changes on the card first (the scheduler's plan)
    }


def gang_of(allocation: Allocation) -> tuple[dict, ...]:
    """Every member of the allocation's gang (bound, or released, with it), in member order, with its node and
    devices (two queries; none for work on one node). A gang's members hold whole cards (the cycle places no slices
    across nodes)."""
    if allocation.member is None:
        return ()
    members = list(
        Allocation.objects.filter(
            request_id=allocation.request_id,
            member__isnull=False,
            state=allocation.state,
            released_at=allocation.released_at,
        )
        .select_related("node")
        .order_by("member")
    )
    bindings = _bindings([member.pk for member in members])
    return tuple(
        {
            "member": member.member,
            "node": member.node.name,
            "allocation_id": member.pk,
            "devices": tuple(_device(binding, {}) for binding in bindings[member.pk]),
        }
        for member in members
    )


def _mig_instances(allocation_id: int) -> dict[int, dict]:
    """The GPU instances an allocation's work is bound to, by device (read only for cards in MIG mode)."""
    return {
        i.device_id: {
            "profile": i.profile.name,
            "profile_id": i.profile.profile_id,
            "start": i.start,
            "size": i.size,
            "gi_id": i.gi_id,
            "ci_id": i.ci_id,
            "uuid": i.uuid,
            "create": i.created_by_scheduler,
        }
        for i in MigInstance.objects.filter(allocation_id=allocation_id).select_related("profile")
    }
