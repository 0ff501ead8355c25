"""Inventory import: the records an inventory file (formats.py) or Slurm gives become Site/Rack/Node/Device rows.

Create or update only: a second run of the same file changes nothing, cordons, health, isolation and allocations
are never touched, devices missing from the file are kept, and each node created or changed has its audit row.
"""

from dataclasses import dataclass, field

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from catalog.choices import AcceleratorKind
from catalog.models import AcceleratorModel, Vendor
from catalog.services import catalog_entry_save
from config.errors import Conflict, DomainError
from scheduling.inventory.formats import OPENB_MODELS, NodeRecord
from scheduling.mig import services as mig_services
from scheduling.models import UNPLACED_RACK, Block, Device, Node, Rack, Site
from tenancy.models import User
from tenancy.services import audit_record


@dataclass
class ImportResult:
    nodes_created: int = 0
    nodes_updated: int = 0
    nodes_unchanged: int = 0
    devices_created: int = 0
    devices_updated: int = 0
    models_created: list[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return bool(self.nodes_created or self.nodes_updated or self.models_created)


def _accelerator_models(records: list[NodeRecord], *, create_openb: bool, actor: User | None) -> dict:
    """Accelerator models the records name (by slug or name); openb models are created when missing."""
    wanted = {device.model for record in records for device in record.devices}
    found = {}
    for model in AcceleratorModel.objects.filter(Q(slug__in=wanted) | Q(name__in=wanted)).select_related("vendor"):
        found[model.slug] = found[model.name] = model
    created = []
    if create_openb:
        by_slug = {slug: (name, memory, link) for slug, name, memory, link in OPENB_MODELS.values()}
        nvidia = Vendor.objects.get(slug="nvidia")
        for slug in sorted(wanted - set(found)):
            name, memory, link = by_slug[slug]
            model = found[slug] = AcceleratorModel.objects.filter(name=name).first() or catalog_entry_save(
                entry=AcceleratorModel(
                    vendor=nvidia, slug=slug, name=name, kind=AcceleratorKind.GPU, memory_gb=memory, interconnect=link
                ),
                changed_fields=["vendor", "slug", "name", "kind", "memory_gb", "interconnect"],
                actor=actor,
            )
            created.append(model.slug)
    missing = sorted(wanted - set(found))
    if missing:
        raise DomainError(
            f"Unknown accelerator models: {', '.join(missing)}. Add them to the catalog first.",
            code="unknown_accelerator_model",
            details={"models": missing},
        )
    return found, created


def _racks(records: list[NodeRecord], default_site: str) -> dict[tuple[str, str], Rack]:
    """The racks the records name (created when new), each in the block a record names for it (a rack named in no
    block keeps the one it has)."""
    places: dict[tuple[str, str], str] = {}  # (site, rack) -> block
    for record in records:
        site = record.site or default_site
        if (record.rack or record.block) and not site:
            raise DomainError(
                f"{record.where}: rack {record.rack or '-'} and block {record.block or '-'} need a site (column or "
                "--site).",
                code="rack_without_site",
                details={"node": record.name},
            )
        if not site:
            continue
        key = (site, record.rack or UNPLACED_RACK)
        if record.block and places.get(key, record.block) != record.block:
            raise DomainError(
                f"{record.where}: rack {key[1]} is in block {places[key]} on another line, not {record.block}.",
                code="rack_in_two_blocks",
                details={"node": record.name, "rack": key[1], "blocks": sorted({places[key], record.block})},
            )
        places[key] = record.block or places.get(key, "")
    racks = {}
    for (site_name, rack_name), block_name in sorted(places.items()):
        site, _ = Site.objects.get_or_create(name=site_name)
        rack, _ = Rack.objects.get_or_create(site=site, name=rack_name)
        if block_name and rack_name != UNPLACED_RACK:
            block, _ = Block.objects.get_or_create(site=site, name=block_name)
            if rack.block_id != block.pk:
                rack.block = block
                rack.save(update_fields=["block"])
        racks[(site_name, rack_name)] = rack
    return racks


def _apply(obj, values: dict) -> list[str]:
    """Set the given (non-None) values that differ; the names of the changed fields (foreign keys by field name)."""
    changed = [name for name, value in values.items() if value is not None and getattr(obj, name) != value]
    for name in changed:
        setattr(obj, name, values[name])
    return [name.removesuffix("_id") for name in changed]


@transaction.atomic
def inventory_import(
    *, records: list[NodeRecord], actor: User | None, default_site: str = "", create_openb_models: bool = False
) -> ImportResult:
    """Create or update nodes and their devices; unchanged rows are left alone, so a second run changes nothing.

    Only inventory facts are written: cordons, health, isolation and allocations are never touched, and
    devices missing from the file are kept (they may hold allocations).
    """
    result = ImportResult()
    models, result.models_created = _accelerator_models(records, create_openb=create_openb_models, actor=actor)
    racks = _racks(records, default_site)
    nodes = Node.objects.in_bulk([record.name for record in records], field_name="name")
    serial_owners = dict(
        Node.objects.filter(serial_number__in=[r.serial_number for r in records]).values_list("serial_number", "name")
    )
    devices = {
        (device.node.name, device.index): device
        for device in Device.objects.filter(node__name__in=list(nodes)).select_related("node")
    }
    uuid_owners = {
        uuid: (node, index)
        for uuid, node, index in Device.objects.filter(
            uuid__in=[d.uuid for r in records for d in r.devices]
        ).values_list("uuid", "node__name", "index")
    }
    device_serial_owners = {
        serial: (node, index)
        for serial, node, index in Device.objects.filter(
            serial_number__in=[d.serial_number for r in records for d in r.devices if d.serial_number]
        ).values_list("serial_number", "node__name", "index")
    }
    problems = [
        f"{r.where}: serial {r.serial_number} belongs to node {serial_owners[r.serial_number]}"
        for r in records
        if serial_owners.get(r.serial_number, r.name) != r.name
    ]
    problems += [
        f"{r.where}: device uuid {d.uuid} belongs to {uuid_owners[d.uuid][0]}/gpu{uuid_owners[d.uuid][1]}"
        for r in records
        for d in r.devices
        if uuid_owners.get(d.uuid, (r.name, d.index)) != (r.name, d.index)
    ]
    problems += [
        f"{r.where}: device serial {d.serial_number} belongs to "
        f"{device_serial_owners[d.serial_number][0]}/gpu{device_serial_owners[d.serial_number][1]}"
        for r in records
        for d in r.devices
        if d.serial_number and device_serial_owners.get(d.serial_number, (r.name, d.index)) != (r.name, d.index)
    ]
    if problems:
        raise Conflict(problems[0], code="inventory_conflict", details={"problems": problems})

    now = timezone.now()
    new_nodes, changed_nodes, node_fields, changes = [], [], set(), {}
    for record in records:
        site = record.site or default_site
        values = {
            "serial_number": record.serial_number,
            "cpu_milli": record.cpu_milli,
            "memory_mib": record.memory_mib,
            "topology_domain": record.topology_domain,
            "bmc_address": record.bmc_address,
            "bmc_credentials_ref": record.bmc_credentials_ref,
            "bmc_inventory_address": record.bmc_inventory_address,
            "execution_backend": record.execution_backend,
            "rack_id": racks[(site, record.rack or UNPLACED_RACK)].pk if site else None,
        }
        node = nodes.get(record.name)
        if node is None:
            node = nodes[record.name] = Node(name=record.name)
            _apply(node, values)
            new_nodes.append(node)
        elif fields := _apply(node, values):
            node.updated_at = now
            changed_nodes.append(node)
            node_fields.update(fields)
            changes[record.name] = fields
    Node.objects.bulk_create(new_nodes, batch_size=1000)
    created_names = {node.name for node in new_nodes}

    new_devices, changed_devices, device_fields = [], [], set()
    for record in records:
        node = nodes[record.name]
        for item in record.devices:
            model = models[item.model]
            values = {
                "uuid": item.uuid,
                "serial_number": item.serial_number,
                "model_id": model.pk,
                "memory_gb": item.memory_gb or model.memory_gb,
            }
            device = devices.get((record.name, item.index))
            if device is None:
                device = Device(node=node, index=item.index)
                _apply(device, values)
                new_devices.append(device)
                if record.name not in created_names:
                    changes.setdefault(record.name, []).append(f"gpu{item.index} added")
            elif fields := _apply(device, values):
                device.updated_at = now
                changed_devices.append(device)
                device_fields.update(fields)
                changes.setdefault(record.name, []).extend(f"gpu{item.index}.{name}" for name in fields)
    Device.objects.bulk_create(new_devices, batch_size=2000)
    if changed_nodes:
        Node.objects.bulk_update(changed_nodes, [*sorted(node_fields), "updated_at"], batch_size=1000)
    if changed_devices:
        Device.objects.bulk_update(changed_devices, [*sorted(device_fields), "updated_at"], batch_size=1000)

    result.nodes_created, result.devices_created = len(new_nodes), len(new_devices)
    result.nodes_updated, result.devices_updated = len(changes), len(changed_devices)
    result.nodes_unchanged = len(records) - result.nodes_created - result.nodes_updated
    for record in records:
        if record.name in created_names:
            audit_record(
                actor=actor, action="node.imported", target=nodes[record.name], data={"devices": len(record.devices)}
            )
    for name, fields in changes.items():
        audit_record(actor=actor, action="node.import_updated", target=nodes[name], data={"changed": fields})
    _import_mig_layouts(records, actor)
    return result


def _import_mig_layouts(records: list[NodeRecord], actor: User | None) -> None:
    """The MIG layouts the file gives (YAML `mig:` per device), stored as a node's report would be."""
    wanted = {(r.name, d.index): d.mig for r in records for d in r.devices if d.mig is not None}
    if not wanted:
        return
    rows = Device.objects.filter(node__name__in={name for name, _ in wanted}).select_related("node")
    for device in rows:
        layout = wanted.get((device.node.name, device.index))
        if layout is not None:
            mig_services.device_mig_layout_report(
                device=device,
                mig_mode=layout["mig_mode"],
                instances=layout["instances"],
                source="inventory import",
                actor=actor,
            )
