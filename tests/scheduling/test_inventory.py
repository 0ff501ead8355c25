"""Inventory services (cordon, isolation, health) and the import_inventory command."""

from io import StringIO
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from catalog.models import AcceleratorModel
from config.errors import Conflict, DomainError
from requests.choices import EventCode
from scheduling import services
from scheduling.choices import DeviceHealth
from scheduling.inventory.formats import device_uuid
from scheduling.models import Device, Node
from scheduling.reclaim import allocation_release
from tenancy.models import AuditEvent
from tests.factories import AcceleratorModelFactory
from tests.scheduling.inventory_helpers import active_request, allocate, node

pytestmark = pytest.mark.django_db


# --- cordon / uncordon ---------------------------------------------------------------------------------


def test_cordon_and_uncordon_are_audited_with_reason_and_actor(operator):
    target = node()
    services.node_cordon(target, "Replacing PSU", operator)
    target.refresh_from_db()
    assert not target.schedulable and target.cordon_reason == "Replacing PSU"
    assert target.cordoned_by == operator and target.cordoned_at is not None
    audit = AuditEvent.objects.get(action="node.cordoned")
    assert audit.actor == operator and audit.reason == "Replacing PSU" and audit.target_id == str(target.pk)

    services.node_uncordon(target, "PSU replaced", operator)
    target.refresh_from_db()
    assert target.schedulable and target.cordon_reason == "" and target.cordoned_by is None
    audit = AuditEvent.objects.get(action="node.uncordoned")
    assert audit.reason == "PSU replaced" and audit.data == {"cordon_reason": "Replacing PSU"}


def test_cordon_nodes_command_cordons_a_backend_pool_with_the_reason_and_leaves_the_rest():
    node(name="sim-1")
    already, slurm = node(name="sim-2"), node(name="slurm-1")
    Node.objects.filter(pk=slurm.pk).update(execution_backend="slurm")
    services.node_cordon(already, "Fan failure", None)
    out = StringIO()
    call_command("cordon_nodes", "--backend", "simulated", "--reason", "Demo runs on Slurm", stdout=out)
    assert out.getvalue().strip() == "Cordoned 1 node(s): sim-1"
    assert dict(Node.objects.values_list("name", "cordon_reason")) == {
        "sim-1": "Demo runs on Slurm",
        "sim-2": "Fan failure",
        "slurm-1": "",
    }
    assert AuditEvent.objects.filter(action="node.cordoned", reason="Demo runs on Slurm").count() == 1


@pytest.mark.parametrize("arguments", [["--reason", "  ", "--backend", "simulated"], ["--reason", "why"]])
def test_cordon_nodes_command_needs_a_reason_and_a_selection(arguments):
    node(name="sim-1")
    with pytest.raises(CommandError):
        call_command("cordon_nodes", *arguments, stdout=StringIO())
    assert Node.objects.get(name="sim-1").schedulable


@pytest.mark.parametrize("reason", ["", "   ", None])
def test_cordon_without_reason_is_refused_and_changes_nothing(operator, reason):
    target = node()
    with pytest.raises(DomainError) as refusal:
        services.node_cordon(target, reason, operator)
    assert refusal.value.code == "reason_required"
    assert Node.objects.get(pk=target.pk).schedulable
    assert not AuditEvent.objects.filter(action__startswith="node.").exists()


def test_uncordon_without_reason_is_refused(operator):
    target = services.node_cordon(node(), "Maintenance", operator)
    with pytest.raises(DomainError):
        services.node_uncordon(target, "", operator)
    assert not Node.objects.get(pk=target.pk).schedulable


def test_cordoning_twice_or_uncordoning_a_schedulable_node_is_a_conflict(operator):
    target = node()
    with pytest.raises(Conflict) as refusal:
        services.node_uncordon(target, "why not", operator)
    assert refusal.value.code == "not_cordoned"
    services.node_cordon(target, "Maintenance", operator)
    with pytest.raises(Conflict) as refusal:
        services.node_cordon(target, "Again", operator)
    assert refusal.value.code == "already_cordoned"
    assert Node.objects.get(pk=target.pk).cordon_reason == "Maintenance"


# --- isolation and health ------------------------------------------------------------------------------


def test_isolate_is_audited_with_reason_and_refused_without(operator):
    device = node(devices=1).devices.get()
    with pytest.raises(DomainError):
        services.device_isolate(device, "", actor=operator)
    assert not Device.objects.get(pk=device.pk).isolated
    services.device_isolate(device, "ECC double-bit errors", actor=operator)
    device.refresh_from_db()
    assert device.isolated and device.isolation_reason == "ECC double-bit errors" and device.isolated_at
    audit = AuditEvent.objects.get(action="device.isolated")
    assert audit.actor == operator and audit.reason == "ECC double-bit errors"


def test_isolating_an_isolated_device_changes_nothing(operator):
    device = node(devices=1).devices.get()
    services.device_isolate(device, "First", actor=operator)
    services.device_isolate(device, "Second", actor=None)
    assert Device.objects.get(pk=device.pk).isolation_reason == "First"
    assert AuditEvent.objects.filter(action="device.isolated").count() == 1


def test_isolation_is_noted_on_the_timeline_of_each_active_allocation_holding_the_device(operator):
    host = node(devices=2)
    first, second = host.devices.all()
    holder, bystander = active_request(), active_request()
    allocate(holder, [first], milli=500)
    allocate(bystander, [second])
    released = allocate(active_request(), [first], milli=250)
    allocation_release(allocations=[released], reason="done")

    services.device_isolate(first, "XID 48 (double-bit ECC)", actor=operator)

    [event] = holder.events.filter(code=EventCode.DEVICE_ISOLATED)
    assert first.uuid in event.message and "XID 48 (double-bit ECC)" in event.message
    assert event.actor == operator and event.from_state == event.to_state == "active"
    assert event.data["device"] == first.uuid and event.data["reason"] == "XID 48 (double-bit ECC)"
    assert not bystander.events.filter(code=EventCode.DEVICE_ISOLATED).exists()
    assert not released.request.events.filter(code=EventCode.DEVICE_ISOLATED).exists()
    assert AuditEvent.objects.get(action="device.isolated").data["affected_requests"] == [holder.pk]


def test_set_health_records_changes_only(operator):
    device = node(devices=1).devices.get()
    services.device_set_health(device, DeviceHealth.DEGRADED, "temp 91 C")
    services.device_set_health(device, DeviceHealth.DEGRADED, "temp 92 C")
    device.refresh_from_db()
    assert device.health == DeviceHealth.DEGRADED and device.health_detail == "temp 91 C"
    [audit] = AuditEvent.objects.filter(action="device.health_changed")
    assert audit.data == {"from": "healthy", "to": "degraded"}
    with pytest.raises(DomainError) as refusal:
        services.device_set_health(device, "on fire", "?")
    assert refusal.value.code == "invalid_health"


# --- import_inventory ----------------------------------------------------------------------------------

# The openb trace lives in the shared data beside the checkout (CI copies shared/ next to its fresh clone); on the
# development machine that is /work/shared. A missing trace fails the test: it must never pass by not running.
OPENB_NODE_LIST = "data/openb/openb_node_list_gpu_node.csv"
SHARED_DIRS = (Path(__file__).resolve().parents[2].parent / "shared", Path("/work/shared"))


def openb_node_list() -> Path:
    for shared in SHARED_DIRS:
        if (path := shared / OPENB_NODE_LIST).exists():
            return path
    pytest.fail(f"{OPENB_NODE_LIST} is in none of {', '.join(map(str, SHARED_DIRS))}")


def run_import(*args) -> str:
    out = StringIO()
    call_command("import_inventory", *map(str, args), stdout=out)
    return out.getvalue()


def snapshot():
    return (
        list(Node.objects.order_by("pk").values()),
        list(Device.objects.order_by("pk").values()),
        AuditEvent.objects.count(),
    )


def test_openb_node_list_imports_1213_nodes_6212_devices_and_a_second_run_changes_nothing():
    openb = openb_node_list()
    output = run_import(openb)
    assert "1213 created" in output
    assert Node.objects.count() == 1213 and Device.objects.count() == 6212
    models = {
        model.slug: model.memory_gb for model in AcceleratorModel.objects.filter(devices__isnull=False).distinct()
    }
    assert models == {
        "t4-16gb": 16,
        "p100-16gb": 16,
        "v100-16gb": 16,
        "v100-32gb": 32,
        "a10-24gb": 24,
        "openb-g2": 32,
        "openb-g3": 32,
    }
    first = Node.objects.get(name="openb-node-0000")
    assert first.serial_number == "openb-node-0000" and first.cpu_milli == 64000 and first.memory_mib == 262144
    assert list(first.devices.values_list("index", "model__slug")) == [(0, "p100-16gb"), (1, "p100-16gb")]
    assert first.devices.get(index=0).uuid == device_uuid("openb-node-0000", 0)
    before = snapshot()
    output = run_import(openb, "--format", "openb")
    assert "0 created, 0 updated, 1213 unchanged" in output
    assert snapshot() == before


OPENB_SMALL = """sn,cpu_milli,memory_mib,gpu,model
n-1,64000,262144,2,P100
n-2,96000,786432,8,G2
n-3,32000,131072,1,A10
"""


def test_openb_rerun_updates_changed_rows_only_and_keeps_operational_state(tmp_path, operator):
    path = tmp_path / "nodes.csv"
    path.write_text(OPENB_SMALL)
    run_import(path)
    node = Node.objects.get(name="n-1")
    services.node_cordon(node, "Maintenance", operator)
    device = node.devices.get(index=0)
    services.device_isolate(device, "XID 79", actor=operator)
    before = snapshot()
    assert "0 created, 0 updated, 3 unchanged" in run_import(path)
    assert snapshot() == before

    path.write_text(OPENB_SMALL.replace("n-1,64000,262144,2,P100", "n-1,64000,524288,3,P100"))
    output = run_import(path, "--site", "dc2")
    assert "0 created, 3 updated, 0 unchanged" in output and "Devices: 1 created, 0 updated" in output
    node.refresh_from_db()
    assert node.memory_mib == 524288 and node.devices.count() == 3
    assert node.rack.site.name == "dc2" and node.rack.name == "default"
    assert not node.schedulable and node.cordon_reason == "Maintenance"
    assert Device.objects.get(pk=device.pk).isolated
    audit = AuditEvent.objects.get(action="node.import_updated", target_id=str(node.pk))
    assert set(audit.data["changed"]) == {"memory_mib", "rack", "gpu2 added"}


def test_generic_csv_with_devices_and_empty_cells(tmp_path):
    model = AcceleratorModelFactory(slug="h100-80gb", name="H100 80GB SXM", memory_gb=80)
    path = tmp_path / "inventory.csv"
    path.write_text(
        "name,serial_number,cpu_cores,memory_gib,site,rack,topology_domain,bmc_address,gpu_model,gpu_count,gpu_uuids\n"
        "dgx-01,SN-1,112,2048,dc1,r01,nvl-1,https://dgx-01-bmc.example,h100-80gb,2,GPU-a;GPU-b\n"
        "cpu-01,,64,256,dc1,,,,,,\n"
    )
    assert "2 created" in run_import(path)
    dgx = Node.objects.get(name="dgx-01")
    assert (dgx.serial_number, dgx.cpu_milli, dgx.memory_mib) == ("SN-1", 112000, 2048 * 1024)
    assert (dgx.rack.site.name, dgx.rack.name, dgx.topology_domain) == ("dc1", "r01", "nvl-1")
    assert list(dgx.devices.values_list("uuid", "model", "memory_gb")) == [
        ("GPU-a", model.pk, 80),
        ("GPU-b", model.pk, 80),
    ]
    cpu = Node.objects.get(name="cpu-01")
    assert cpu.serial_number == "cpu-01" and cpu.rack.name == "default" and not cpu.devices.exists()
    assert "0 updated, 2 unchanged" in run_import(path, "--format", "csv")


def test_yaml_with_device_list_and_defaults(tmp_path):
    AcceleratorModelFactory(slug="mi300x", name="MI300X 192GB", memory_gb=192)
    path = tmp_path / "inventory.yaml"
    path.write_text("""
site: dc3
nodes:
  - name: mi-01
    cpu_milli: 96000
    memory_mib: 1048576
    rack: r7
    devices:
      - {index: 0, model: mi300x, uuid: GPU-mi-0}
      - {index: 1, model: "MI300X 192GB", memory_gb: 190}
""")
    assert "1 created" in run_import(path)
    node = Node.objects.get(name="mi-01")
    assert node.rack.site.name == "dc3" and node.rack.name == "r7"
    assert list(node.devices.values_list("index", "uuid", "memory_gb")) == [
        (0, "GPU-mi-0", 192),
        (1, device_uuid("mi-01", 1), 190),
    ]
    assert "0 created, 0 updated, 1 unchanged" in run_import(path)


def test_execution_backend_is_imported_validated_and_kept_when_the_column_is_empty(tmp_path):
    path = tmp_path / "inventory.csv"
    path.write_text("name,cpu_cores,memory_gib,execution_backend\nslurm-01,8,64,slurm\nplain-01,8,64,\n")
    run_import(path)
    assert dict(Node.objects.values_list("name", "execution_backend")) == {
        "slurm-01": "slurm",
        "plain-01": "simulated",
    }
    path.write_text("name,cpu_cores,memory_gib,execution_backend\nslurm-01,8,64,\n")
    assert "0 updated, 1 unchanged" in run_import(path)
    path.write_text("name,cpu_cores,memory_gib,execution_backend\nslurm-01,8,64,kubernetes\n")
    with pytest.raises(CommandError, match="unknown execution_backend 'kubernetes'"):
        run_import(path)
    assert Node.objects.get(name="slurm-01").execution_backend == "slurm"


def test_bad_rows_are_all_reported_and_nothing_is_imported(tmp_path):
    path = tmp_path / "bad.csv"
    path.write_text(
        "name,cpu_cores,memory_gib,gpu_model,gpu_count\n"
        "ok-1,8,64,,\n"
        "bad-1,eight,64,,\n"
        "bad-2,8,64,nonexistent,2\n"
        ",8,64,,\n"
    )
    with pytest.raises(CommandError) as error:
        run_import(path)
    assert "line 3" in str(error.value) and "line 5" in str(error.value)
    assert not Node.objects.exists()
    path.write_text("name,cpu_cores,memory_gib,gpu_model,gpu_count\nok-1,8,64,nonexistent,2\n")
    with pytest.raises(CommandError, match="nonexistent"):
        run_import(path)
    assert not Node.objects.exists()


def test_gpu_serials_and_the_inventory_address_are_imported_from_csv_and_yaml(tmp_path):
    AcceleratorModelFactory(slug="h100-80gb", memory_gb=80)
    path = tmp_path / "inventory.csv"
    path.write_text(
        "name,cpu_cores,memory_gib,bmc_address,bmc_inventory_address,gpu_model,gpu_count,gpu_serials\n"
        "hgx-01,112,2048,https://hgx-01-bmc,https://hgx-01-hmc/redfish/v1/Systems/HGX_Baseboard_0,h100-80gb,2,S-0;S-1\n"
    )
    run_import(path)
    hgx = Node.objects.get(name="hgx-01")
    assert hgx.bmc_inventory_address == "https://hgx-01-hmc/redfish/v1/Systems/HGX_Baseboard_0"
    assert list(hgx.devices.values_list("serial_number", flat=True)) == ["S-0", "S-1"]
    yaml_path = tmp_path / "inventory.yaml"
    yaml_path.write_text(
        "nodes:\n  - name: hgx-01\n    cpu_cores: 112\n    memory_gib: 2048\n    devices:\n"
        "      - {index: 0, model: h100-80gb, uuid: " + device_uuid("hgx-01", 0) + ", serial_number: S-9}\n"
    )
    assert "1 updated" in run_import(yaml_path)
    assert list(hgx.devices.values_list("serial_number", flat=True)) == ["S-9", "S-1"]
    assert "0 updated, 1 unchanged" in run_import(yaml_path)


def test_a_gpu_serial_repeated_or_held_by_another_device_is_refused(tmp_path):
    AcceleratorModelFactory(slug="h100-80gb", memory_gb=80)
    path = tmp_path / "inventory.csv"
    header = "name,cpu_cores,memory_gib,gpu_model,gpu_count,gpu_serials\n"
    path.write_text(header + "a-01,8,64,h100-80gb,2,S-0;S-0\n")
    with pytest.raises(CommandError, match="device serial S-0 also appears"):
        run_import(path)
    path.write_text(header + "a-01,8,64,h100-80gb,1,S-0\n")
    run_import(path)
    path.write_text(header + "b-01,8,64,h100-80gb,1,S-0\n")
    with pytest.raises(CommandError, match="device serial S-0 belongs to a-01/gpu0"):
        run_import(path)
    assert not Node.objects.filter(name="b-01").exists()


def test_serial_of_another_node_is_a_conflict(tmp_path):
    node(name="existing")
    path = tmp_path / "clash.csv"
    path.write_text("name,serial_number,cpu_cores,memory_gib\nnewcomer,SN-existing,8,64\n")
    with pytest.raises(CommandError, match="belongs to node existing"):
        run_import(path)
    assert not Node.objects.filter(name="newcomer").exists()
