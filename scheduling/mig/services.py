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
from scheduling.choices import AllocationState, MigMode
from scheduling.models import Allocation, Device, MigInstance, Node
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
    if device.mig_mode != mig_mode:
        _refuse_while_running(device, mig_mode, details)
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
    wanted_done = device.mig_mode_wanted == _mode_word(mig_mode)  # the node carried out a drained switch
    if device.mig_mode != mig_mode or wanted_done:
        device.mig_mode = mig_mode
        device.mig_mode_wanted = "" if wanted_done else device.mig_mode_wanted
        device.save(update_fields=["mig_mode", "mig_mode_wanted", "updated_at"])
    audit_record(
        actor=actor,
        action="device.mig_layout_reported",
        target=device,
        reason=source,
        data={"mig_mode": mig_mode, "instances": [[n, s, z] for n, s, z, _ in wanted]},
    )
    return device


def _mode_word(mig_mode: bool) -> str:
    return MigMode.MIG if mig_mode else MigMode.WHOLE


def _running_on(device: Device) -> list[Allocation]:
    return list(
        Allocation.objects.filter(devices__device=device, state=AllocationState.ACTIVE).order_by("pk").distinct()
    )


def _refuse_while_running(device: Device, mig_mode: bool, details: dict) -> None:
    """A mode change stops whatever runs on the card: refused, naming the allocations, while any does."""
    running = _running_on(device)
    if running:
        names = ", ".join(f"allocation {a.pk} (request #{a.request_id})" for a in running)
        raise Conflict(
            f"{device} runs {names}; switching it to {MigMode(_mode_word(mig_mode)).label} mode would stop that "
            "work. Wait for it to end, or ask for the switch after a drain.",
            code="mig_mode_change_in_use",
            details={
                **details,
                "mig_mode": mig_mode,
                "allocations": [{"allocation": a.pk, "request": a.request_id} for a in running],
            },
        )


@transaction.atomic
def device_mig_mode_switch(*, device: Device, mig_mode: bool, reason: str, actor: User | None, drain: bool = False):
    """An operator switches a MIG-capable card between MIG and whole mode. The card's idle GPU instances go (in
    whole mode it has none; in MIG mode the scheduler creates what work needs). While allocations run on the card
    the switch is refused with them named, unless ``drain``: then the card takes no new work and switches when the
    last of them is released (`mode_switches_after_drain`). A pinned layout is not switched. The audit row holds
    the commands the node runs (`nvidia-smi`), which its next layout report confirms."""
    reason = _reason(reason)
    device = Device.objects.select_for_update(of=("self",)).select_related("model", "node").get(pk=device.pk)
    details = {"device": str(device), "model": device.model.name, "mig_mode": mig_mode}
    if device.model.mig_geometry_id is None:
        raise DomainError(
            f"{device.model.name} is not MIG-capable (no MIG geometry in the catalog).",
            code="not_mig_capable",
            details=details,
        )
    if device.mig_mode == mig_mode and not device.mig_mode_wanted:
        raise Conflict(
            f"{device} is in {MigMode(_mode_word(mig_mode)).label} mode already.",
            code="mig_mode_unchanged",
            details=details,
        )
    if device.node.mig_layout_pinned:
        raise Conflict(
            f"{device.node.name}'s MIG layout is pinned ({device.node.mig_pin_reason}); unpin it first.",
            code="mig_layout_pinned",
            details=details,
        )
    if device.mig_mode == mig_mode:  # asked back before the drain ended: nothing waits any more
        device.mig_mode_wanted = ""
        device.save(update_fields=["mig_mode_wanted", "updated_at"])
        audit_record(actor=actor, action="device.mig_mode_switch_withdrawn", target=device, reason=reason, data=details)
        return device
    if not drain:
        _refuse_while_running(device, mig_mode, details)
    elif _running_on(device):
        device.mig_mode_wanted = _mode_word(mig_mode)
        device.save(update_fields=["mig_mode_wanted", "updated_at"])
        running = [a.pk for a in _running_on(device)]
        audit_record(
            actor=actor,
            action="device.mig_mode_drain",
            target=device,
            reason=reason,
            data={**details, "allocations": running},
        )
        return device
    return _switch(device, mig_mode, reason, actor)


def _switch(device: Device, mig_mode: bool, reason: str, actor: User | None) -> Device:
    """The card (locked, nothing running on it) in the other mode: its idle instances go, the mode is recorded."""
    idle = list(device.mig_instances.order_by("start"))
    commands = mig.host_commands(device.index, destroy=[i.gi_id for i in idle], mode=_mode_word(mig_mode))
    MigInstance.objects.filter(pk__in=[i.pk for i in idle]).delete()
    device.mig_mode, device.mig_mode_wanted = mig_mode, ""
    device.save(update_fields=["mig_mode", "mig_mode_wanted", "updated_at"])
    audit_record(
        actor=actor,
        action="device.mig_mode_switched",
        target=device,
        reason=reason,
        data={"mig_mode": mig_mode, "destroyed": [[i.gi_id, i.start] for i in idle], "commands": commands},
    )
    return device


def mode_switches_after_drain(device_ids: Iterable[int]) -> list[Device]:
    """The drained switches of these cards whose last allocation was just released (in the release's
    transaction): each card goes to the mode the operator asked for. One query when none waits."""
    waiting = list(
        Device.objects.select_for_update(of=("self",))
        .filter(pk__in=list(device_ids))
        .exclude(mig_mode_wanted="")
        .exclude(bindings__allocation__state=AllocationState.ACTIVE)
        .select_related("node")
    )
    return [
        _switch(device, device.mig_mode_wanted == MigMode.MIG, "the card's running work ended (drain)", None)
        for device in waiting
    ]


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
