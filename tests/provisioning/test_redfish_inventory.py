"""Hardware validation against a BMC that reports GPUs: `sushy-static` serves the HGX mockup (2 CPUs, 8 GPUs with
serials, 2 TiB; variants with a Critical GPU and with 7 GPUs) as the node's inventory address, while
`sushy-emulator --fake` keeps serving power, boot override and virtual media at its BMC address."""

from urllib.parse import urlsplit

import pytest

from provisioning.choices import RunKind
from provisioning.drivers.base import Target
from provisioning.drivers.redfish import RedfishBmc
from provisioning.models import ProvisioningRun
from requests.choices import RequestState
from scheduling.models import Device
from tests.provisioning.redfish_mockup import CPU_CORES, CPU_SOCKETS, GPU_MODEL, GPU_SERIALS, MEMORY_GIB
from tests.provisioning.test_redfish_pipeline import installer_callback_from_media

pytestmark = pytest.mark.django_db


@pytest.fixture
def hgx(on_redfish, sushy_emulator, sushy_static):
    """The bare-metal shop's 8-card server with the mockup's GPU serials recorded, power and media on the fake BMC;
    `inventory_from(variant)` points its inventory address at one of the mockup's systems."""
    node = on_redfish.node
    node.bmc_address = sushy_emulator.system_url("hgx")
    node.save(update_fields=["bmc_address"])
    for device in Device.objects.filter(node=node):
        device.serial_number = GPU_SERIALS[device.index]
        device.save(update_fields=["serial_number"])

    def inventory_from(variant: str):
        node.bmc_inventory_address = sushy_static.system_url(variant)
        node.save(update_fields=["bmc_inventory_address"])

    on_redfish.inventory_from = inventory_from
    return on_redfish


def test_the_driver_reads_cpus_gpus_with_serials_and_memory_from_the_static_bmc(sushy_static):
    bmc = RedfishBmc()
    node = Target(
        run_id=1,
        request_id=1,
        node="hgx-1",
        devices=(),
        snapshot={},
        bmc_address="http://127.0.0.1:9/unused-for-inventory",
        bmc_inventory_address=sushy_static.system_url("hgx"),
    )
    try:
        found = bmc.inventory(node)
    finally:
        bmc.close()

    assert (found["cpu_cores"], found["cpu_sockets"], found["memory_gb"]) == (
        CPU_CORES * CPU_SOCKETS,
        CPU_SOCKETS,
        MEMORY_GIB,
    )
    assert found["accelerators"] == 8
    gpus = [processor for processor in found["processors"] if processor["type"] == "GPU"]
    assert [gpu["serial"] for gpu in gpus] == list(GPU_SERIALS)
    assert {(gpu["model"], gpu["health"]) for gpu in gpus} == {(GPU_MODEL, "OK")}


def test_a_matching_server_passes_validation_and_is_delivered(hgx, sushy_emulator, api, run_on_commit):
    hgx.inventory_from("hgx")

    request = hgx.order()

    run = ProvisioningRun.objects.get(request=request, kind=RunKind.PROVISION)
    validation = run.steps.get(name="validate_hardware").output
    assert validation["checks"] == {"bmc_reachable": "passed", "system_health": "passed", "inventory_match": "passed"}
    assert validation["inventory"]["accelerators"] == 8
    callback, token = installer_callback_from_media(sushy_emulator.system_url("hgx"))
    answer = run_on_commit(api.post, urlsplit(callback).path, {"token": token, "status": "succeeded"}, format="json")
    assert answer.status_code == 202
    request.refresh_from_db()
    assert request.state == RequestState.ACTIVE
    hgx.node.refresh_from_db()
    assert hgx.node.schedulable


def failed_validation(hgx) -> tuple[dict, object]:
    request = hgx.order()
    assert request.state == RequestState.FAILED
    run = ProvisioningRun.objects.get(request=request, kind=RunKind.PROVISION)
    assert run.failure["step"] == "validate_hardware"
    hgx.node.refresh_from_db()
    assert not hgx.node.schedulable and run.failure["message"] in hgx.node.cordon_reason
    return run.failure, request


def test_a_critical_gpu_fails_validation_with_the_card_and_isolates_the_node(hgx):
    hgx.inventory_from("hgx-critical-gpu")

    failure, _ = failed_validation(hgx)

    assert failure["code"] == "processor_unhealthy"
    assert (failure["details"]["accelerators"], failure["details"]["accelerators_unhealthy"]) == (8, 1)
    [card] = failure["details"]["unhealthy"]
    assert (card["id"], card["serial"], card["health"]) == ("GPU_SXM_4", GPU_SERIALS[3], "Critical")
    assert (
        f"1 of 8 accelerators and 0 CPUs unhealthy: GPU_SXM_4 (GPU {GPU_MODEL}, serial {GPU_SERIALS[3]})"
        in (failure["message"])
    )


def test_a_missing_gpu_fails_validation_with_the_count_and_the_missing_serial(hgx):
    hgx.inventory_from("hgx-seven-gpus")

    failure, _ = failed_validation(hgx)

    assert failure["code"] == "inventory_mismatch"
    mismatches = failure["details"]["mismatches"]
    assert mismatches["accelerators"] == {"inventory": 8, "bmc": 7}
    assert mismatches["accelerator_serials"] == {
        "missing_at_bmc": [{"index": 7, "serial": GPU_SERIALS[7]}],
        "unknown_to_inventory": [],
    }
    assert "accelerators 7 (inventory says 8)" in failure["message"]
    assert f"gpu7 serial {GPU_SERIALS[7]} not at the BMC" in failure["message"]


def test_a_swapped_card_fails_validation_with_both_serials(hgx):
    hgx.inventory_from("hgx")
    Device.objects.filter(node=hgx.node, index=2).update(serial_number="1654223019999")

    failure, _ = failed_validation(hgx)

    assert failure["code"] == "inventory_mismatch"
    assert failure["details"]["mismatches"] == {
        "accelerator_serials": {
            "missing_at_bmc": [{"index": 2, "serial": "1654223019999"}],
            "unknown_to_inventory": [GPU_SERIALS[2]],
        }
    }


def test_serials_are_only_compared_where_the_inventory_records_them(hgx):
    hgx.inventory_from("hgx")
    Device.objects.filter(node=hgx.node).update(serial_number="")

    request = hgx.order()

    run = ProvisioningRun.objects.get(request=request, kind=RunKind.PROVISION)
    checks = run.steps.get(name="validate_hardware").output["checks"]
    assert checks["inventory_match"] == "passed"


def test_with_some_serials_recorded_only_those_are_held_to_the_bmc(hgx):
    hgx.inventory_from("hgx")
    Device.objects.filter(node=hgx.node).exclude(index=0).update(serial_number="")
    Device.objects.filter(node=hgx.node, index=0).update(serial_number="1654223019999")

    failure, _ = failed_validation(hgx)

    assert failure["details"]["mismatches"]["accelerator_serials"] == {
        "missing_at_bmc": [{"index": 0, "serial": "1654223019999"}],
        "unknown_to_inventory": [],  # the seven cards without a recorded serial could be any of the others
    }
