"""MIG writes: a card's reported layout (inventory import, agent reports), layout pins, and the bridge from the
catalog's geometry rows to the pure engine's `scheduling.mig.Geometry`.

Every write locks what it changes, writes one audit row, and refuses with a DomainError (code, message, details)
that leaves the record as it was: an impossible layout, a profile the card does not have, an instance held by
running work that the report drops, a mode change on a card that is not empty.
"""

from collections.abc import Iterable

from django.db import transaction

from catalog.models import AcceleratorModel, MigGeometry
from config.errors import Conflict, DomainError
from scheduling import mig
from scheduling.models import Device, MigInstance, Node
from tenancy.models import User
from tenancy.services import audit_record


def _reason(reason: str | None) -> str:
    text = (reason or "").strip()
    if not text:
        raise DomainError("Give a reason; it goes on the audit record.", code="reason_required")
    return text


def geometry_from_catalog(geometry: MigGeometry) -> mig.Geometry:
    """The engine's view of a catalog geometry (profiles prefetched or read here)."""
    return mig.Geometry(
        geometry.name,
        geometry.compute_slices,
        geometry.memory_slices,
        tuple(
            mig.Profile(
                p.name,
                p.profile_id,
                p.compute_slices,
                p.memory_slices,
                p.memory_gb,
                tuple((start, size) for start, size in p.placements),
                p.max_instances,
            )
            for p in geometry.profiles.all()
        ),
        geometry.source,
    )


def geometries_by_model(models: Iterable[AcceleratorModel]) -> dict[int, mig.Geometry]:
    """Accelerator model id -> engine geometry, for the MIG-capable ones (two queries whatever the count)."""
    ids = {m.mig_geometry_id for m in models if m.mig_geometry_id}
    rows = MigGeometry.objects.filter(pk__in=ids).prefetch_related("profiles")
    by_id = {row.pk: geometry_from_catalog(row) for row in rows}
    return {m.pk: by_id[m.mig_geometry_id] for m in models if m.mig_geometry_id in by_id}


@transaction.atomic
def device_mig_layout_report(
    *, device: Device, mig_mode: bool, instances: list[dict], source: str, actor: User | None
) -> Device:
    """Store what the node reports for one card: its mode and, in MIG mode, its GPU instances
    (``{"profile", "start", "size", "gi_id", "ci_id", "uuid"}`` each). Instances held by work keep their holder;
    the report may not drop them."""
    device = (
        Device.objects.select_for_update(of=("self",)).select_related("model__mig_geometry", "node").get(pk=device.pk)
    )
    details = {"device": str(device), "model": device.model.name}
    if mig_mode and device.model.mig_geometry_id is None:
        raise DomainError(
            f"{device.model.name} is not MIG-capable (no MIG geometry in the catalog).",
            code="not_mig_capable",
            details=details,
        )
    if not mig_mode and instances:
        raise DomainError(
            "A card in whole mode has no GPU instances.", code="whole_mode_with_instances", details=details
        )
    geometry_row = device.model.mig_geometry
    profiles = {p.name: p for p in geometry_row.profiles.all()} if geometry_row else {}
    wanted = []
    for item in instances:
        name = str(item.get("profile", ""))
        if name not in profiles:
            raise DomainError(
                f"{name or 'an empty profile'} is not a MIG profile of {device.model.name}.",
                code="unknown_mig_profile",
                details={**details, "profile": name, "profiles": sorted(profiles)},
            )
        try:
            start = int(item["start"])
            size = int(item.get("size", profiles[name].memory_slices))
        except (KeyError, TypeError, ValueError):
            raise DomainError(
                "Every instance needs a start (and size) in memory slices.",
                code="invalid_mig_instance",
                details=details,
            ) from None
        wanted.append((name, start, size, item))
    if geometry_row is not None and wanted:
        problems = mig.layout_problems(geometry_from_catalog(geometry_row), [(n, s, z) for n, s, z, _ in wanted])
        if problems:
            raise DomainError(
                f"{device} cannot have this layout: {'; '.join(problems)}.",
                code="invalid_mig_layout",
                details={**details, "problems": problems},
            )
    uuids = [str(item.get("uuid") or "") for _n, _s, _z, item in wanted if item.get("uuid")]
    if len(set(uuids)) != len(uuids):
        raise DomainError("Two instances report the same MIG UUID.", code="mig_uuid_repeated", details=details)
    taken = list(MigInstance.objects.filter(uuid__in=uuids).exclude(device=device).values_list("uuid", flat=True))
    if taken:
        raise Conflict(
            f"MIG UUID {taken[0]} belongs to an instance on another card.",
            code="mig_uuid_in_use",
            details={**details, "uuids": taken},
        )
    current = {i.start: i for i in device.mig_instances.select_related("profile", "allocation")}
    reported = {start: (name, size, item) for name, start, size, item in wanted}
    for start, held in current.items():
        if held.allocation_id is None:
            continue
        same = reported.get(start)
        if same is None or same[0] != held.profile.name:
            raise Conflict(
                f"{device}: the {held.profile.name} instance at memory slice {start} is held by allocation "
                f"{held.allocation_id}; a layout change never touches running work.",
                code="mig_instance_in_use",
                details={**details, "start": start, "profile": held.profile.name, "allocation": held.allocation_id},
            )
    for start, instance in current.items():
        if start not in reported or reported[start][0] != instance.profile.name:
            instance.delete()
    for name, start, size, item in wanted:
        instance = current.get(start)
        values = {
            "profile": profiles[name],
            "size": size,
            "gi_id": item.get("gi_id"),
            "ci_id": item.get("ci_id"),
            "uuid": str(item.get("uuid") or ""),
        }
        if instance is None or instance.profile.name != name:
            MigInstance.objects.create(device=device, start=start, **values)
        else:
            for field, value in values.items():
                setattr(instance, field, value)
            instance.save()
    if device.mig_mode != mig_mode:
        device.mig_mode = mig_mode
        device.save(update_fields=["mig_mode", "updated_at"])
    audit_record(
        actor=actor,
        action="device.mig_layout_reported",
        target=device,
        reason=source,
        data={"mig_mode": mig_mode, "instances": [[n, s, z] for n, s, z, _ in wanted]},
    )
    return device


@transaction.atomic
def node_mig_pin(node: Node, reason: str, actor: User | None) -> Node:
    """Freeze a node's MIG layouts: the scheduler uses the free instances as they are, never repartitions."""
    reason = _reason(reason)
    node = Node.objects.select_for_update().get(pk=node.pk)
    if node.mig_layout_pinned:
        raise Conflict(
            f"{node.name}'s MIG layout is already pinned: {node.mig_pin_reason}",
            code="already_pinned",
            details={"node": node.name, "reason": node.mig_pin_reason},
        )
    node.mig_layout_pinned, node.mig_pin_reason = True, reason
    node.save(update_fields=["mig_layout_pinned", "mig_pin_reason", "updated_at"])
    audit_record(actor=actor, action="node.mig_layout_pinned", target=node, reason=reason)
    return node


@transaction.atomic
def node_mig_unpin(node: Node, reason: str, actor: User | None) -> Node:
    reason = _reason(reason)
    node = Node.objects.select_for_update().get(pk=node.pk)
    if not node.mig_layout_pinned:
        raise Conflict(f"{node.name}'s MIG layout is not pinned.", code="not_pinned", details={"node": node.name})
    previous = node.mig_pin_reason
    node.mig_layout_pinned, node.mig_pin_reason = False, ""
    node.save(update_fields=["mig_layout_pinned", "mig_pin_reason", "updated_at"])
    audit_record(actor=actor, action="node.mig_layout_unpinned", target=node, reason=reason, data={"was": previous})
    return node


def mig_instances_created(*, allocation_id: int, reported: list[dict]) -> int:
    """The host driver created the GPU instances an allocation holds: store the GI/CI ids and MIG device UUIDs it
    reports (by card index and placement start), in the provisioning step's transaction. Two queries."""
    rows = {
        (i.device.index, i.start): i
        for i in MigInstance.objects.filter(allocation_id=allocation_id).select_related("device")
    }
    changed = []
    for item in reported:
        row = rows.get((item.get("gpu"), item.get("start")))
        if row is None:
            continue
        row.gi_id, row.ci_id, row.uuid = item.get("gi_id"), item.get("ci_id"), str(item.get("uuid") or "")
        changed.append(row)
    MigInstance.objects.bulk_update(changed, ["gi_id", "ci_id", "uuid"])
    return len(changed)
