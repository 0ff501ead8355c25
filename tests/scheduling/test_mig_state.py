"""MIG in the catalog and the inventory: the seeded NVIDIA geometry, operator edits with validation, a card's
reported layout (mode, GPU instances with ids and UUIDs), layout pins, and what the admin and the API show."""

import pytest
from django.core.exceptions import ValidationError
from django.db import connection
from django.test.utils import CaptureQueriesContext

from catalog.models import MigGeometry, MigProfile
from config.errors import DomainError
from scheduling import mig
from scheduling.mig import services as mig_services
from scheduling.models import Device, MigInstance
from tenancy.models import AuditEvent
from tests.scheduling.inventory_helpers import accelerator, active_request, allocate, node

pytestmark = pytest.mark.django_db

CAPACITY, DEVICES = "/api/v1/inventory/capacity/", "/api/v1/inventory/devices/"


def test_the_migration_seeds_nvidias_tables_as_the_engine_knows_them():
    seeded = {g.name: g for g in MigGeometry.objects.prefetch_related("profiles")}
    assert sorted(seeded) == sorted(mig.SEEDED)
    for name, geometry in seeded.items():
        assert mig_services.geometry_from_catalog(geometry) == mig.SEEDED[name]
        assert "RN-08625-v2.0" in geometry.source
    h100 = seeded["H100 80GB"].profiles.get(name="3g.40gb")
    assert (h100.profile_id, h100.compute_slices, h100.memory_slices, h100.placements) == (9, 3, 4, [[0, 4], [4, 4]])


def _profile(**changes):
    geometry = MigGeometry.objects.get(name="A100 40GB")
    values = dict(
        geometry=geometry,
        name="x",
        profile_id=99,
        compute_slices=3,
        memory_slices=4,
        memory_gb=20,
        max_instances=2,
        placements=[[0, 4], [4, 4]],
    )
    values.update(changes)
    return MigProfile(**values)


@pytest.mark.parametrize(
    ("changes", "field", "words"),
    [
        ({"placements": [[2, 4], [6, 4]]}, "placements", "end past the card's 8 memory slices"),
        ({"placements": [[0, 3]]}, "placements", "has size 3, the profile takes 4"),
        ({"placements": [[0, 4], [0, 4]]}, "placements", "repeats"),
        ({"placements": "0,4"}, "placements", "at least one placement"),
        ({"placements": [[-1, 4]]}, "placements", "before slice 0"),
        ({"compute_slices": 8}, "compute_slices", "7 compute slices"),
        ({"max_instances": 3}, "max_instances", "At most 2 instances"),
        (
            {"name": "2g.10gb+me", "compute_slices": 2, "memory_slices": 2, "placements": [[0, 2], [2, 2]]},
            "max_instances",
            "one set of media engines (JPEG/OFA): at most one +me instance of any size per card",
        ),
    ],
)
def test_operator_edits_are_validated(changes, field, words):
    profile = _profile(**changes)
    with pytest.raises(ValidationError) as error:
        profile.full_clean()
    assert words in " ".join(error.value.message_dict[field])


def test_a_valid_edit_passes():
    _profile().full_clean()


def test_admin_lists_and_refuses_a_bad_profile_edit(console, roles, client):
    geometry = MigGeometry.objects.get(name="H100 80GB")
    page = console.get("/admin/catalog/miggeometry/")
    assert page.status_code == 200 and b"H100 80GB" in page.content
    url = f"/admin/catalog/miggeometry/{geometry.pk}/change/"
    assert console.get(url).status_code == 200
    profiles = list(geometry.profiles.all())
    form = {
        "name": geometry.name,
        "compute_slices": 7,
        "memory_slices": 8,
        "source": geometry.source,
        "profiles-TOTAL_FORMS": len(profiles),
        "profiles-INITIAL_FORMS": len(profiles),
        "profiles-MIN_NUM_FORMS": 0,
        "profiles-MAX_NUM_FORMS": 1000,
    }
    for k, p in enumerate(profiles):
        placements = "[[2, 4], [6, 4]]" if p.name == "3g.40gb" else str(p.placements)
        form.update(
            {
                f"profiles-{k}-id": p.pk,
                f"profiles-{k}-geometry": geometry.pk,
                f"profiles-{k}-name": p.name,
                f"profiles-{k}-profile_id": p.profile_id,
                f"profiles-{k}-compute_slices": p.compute_slices,
                f"profiles-{k}-memory_slices": p.memory_slices,
                f"profiles-{k}-memory_gb": p.memory_gb,
                f"profiles-{k}-max_instances": p.max_instances,
                f"profiles-{k}-placements": placements,
            }
        )
    response = console.post(url, form)
    assert response.status_code == 200  # the form again, with the error
    assert b"end past the card" in response.content
    assert MigProfile.objects.get(geometry=geometry, name="3g.40gb").placements == [[0, 4], [4, 4]]
    # developers and anonymous visitors do not get the console page
    client.logout()
    assert client.get(url).status_code == 302
    client.force_login(roles.developer)
    assert client.get(url).status_code in (302, 403)


def _h100_node(devices=2):
    model = accelerator()
    model.mig_geometry = MigGeometry.objects.get(name="H100 80GB")
    model.save()
    return node(devices=devices, model=model)


def test_reported_layout_is_stored_validated_and_audited(roles, api_as):
    host = _h100_node()
    device = host.devices.order_by("index").first()
    layout = [
        {"profile": "4g.40gb", "start": 0, "size": 4, "gi_id": 1, "ci_id": 0, "uuid": "MIG-aaaa"},
        {"profile": "3g.40gb", "start": 4, "size": 4, "gi_id": 2, "ci_id": 0, "uuid": "MIG-bbbb"},
    ]
    mig_services.device_mig_layout_report(
        device=device, mig_mode=True, instances=layout, source="nvidia-smi on node", actor=None
    )
    device.refresh_from_db()
    assert device.mig_mode
    assert [(i.profile.name, i.start, i.size, i.gi_id, i.uuid) for i in device.mig_instances.order_by("start")] == [
        ("4g.40gb", 0, 4, 1, "MIG-aaaa"),
        ("3g.40gb", 4, 4, 2, "MIG-bbbb"),
    ]
    assert AuditEvent.objects.filter(action="device.mig_layout_reported", target_id=str(device.pk)).count() == 1
    # an impossible layout is refused and changes nothing
    with pytest.raises(DomainError) as error:
        mig_services.device_mig_layout_report(
            device=device,
            mig_mode=True,
            instances=[{"profile": "3g.40gb", "start": 0}, {"profile": "3g.40gb", "start": 2}],
            source="agent",
            actor=None,
        )
    assert error.value.code == "invalid_mig_layout"
    assert device.mig_instances.count() == 2
    with pytest.raises(DomainError) as error:
        mig_services.device_mig_layout_report(
            device=device, mig_mode=True, instances=[{"profile": "1g.5gb", "start": 0}], source="agent", actor=None
        )
    assert error.value.code == "unknown_mig_profile"
    # the capacity API counts MIG-mode cards and instances; the device API lists the layout
    rows = {row["slug"]: row for row in api_as(roles.developer).get(CAPACITY).json()}
    assert rows[device.model.slug]["mig_mode_devices"] == 1
    assert rows[device.model.slug]["mig_instances"] == [
        {"profile": "3g.40gb", "total": 1, "held": 0, "free": 1},
        {"profile": "4g.40gb", "total": 1, "held": 0, "free": 1},
    ]
    body = api_as(roles.operator).get(DEVICES, {"search": device.uuid}).json()
    (listed,) = body["results"] if isinstance(body, dict) else body
    assert listed["mig_mode"] is True
    assert [(i["profile"], i["profile_id"], i["start"], i["uuid"]) for i in listed["mig_instances"]] == [
        ("4g.40gb", 5, 0, "MIG-aaaa"),
        ("3g.40gb", 9, 4, "MIG-bbbb"),
    ]


def test_running_work_is_never_touched_and_mode_changes_only_when_empty():
    host = _h100_node()
    device = host.devices.order_by("index").first()
    mig_services.device_mig_layout_report(
        device=device,
        mig_mode=True,
        instances=[{"profile": "3g.40gb", "start": 0, "gi_id": 1}],
        source="agent",
        actor=None,
    )
    allocation = allocate(active_request(), [device], milli=428)
    MigInstance.objects.filter(device=device).update(allocation=allocation)
    with pytest.raises(DomainError) as error:
        mig_services.device_mig_layout_report(device=device, mig_mode=True, instances=[], source="agent", actor=None)
    assert error.value.code == "mig_instance_in_use"
    with pytest.raises(DomainError) as error:
        mig_services.device_mig_layout_report(
            device=device, mig_mode=False, instances=[{"profile": "3g.40gb", "start": 0}], source="agent", actor=None
        )
    assert error.value.code == "whole_mode_with_instances"
    plain = node(devices=1).devices.get()
    with pytest.raises(DomainError) as error:
        mig_services.device_mig_layout_report(device=plain, mig_mode=True, instances=[], source="agent", actor=None)
    assert error.value.code == "not_mig_capable"
    assert MigInstance.objects.get(device=device).allocation_id == allocation.pk


def test_a_report_of_two_media_extension_instances_on_one_card_is_refused():
    model = accelerator()
    model.mig_geometry = MigGeometry.objects.get(name="A30 24GB")
    model.save()
    device = node(devices=1, model=model).devices.get()
    with pytest.raises(DomainError) as error:
        mig_services.device_mig_layout_report(
            device=device,
            mig_mode=True,
            instances=[{"profile": "1g.6gb+me", "start": 0}, {"profile": "2g.12gb+me", "start": 2}],
            source="agent",
            actor=None,
        )
    assert error.value.code == "invalid_mig_layout"
    assert "one set of media engines" in error.value.message
    assert not MigInstance.objects.exists()


def test_pin_and_unpin_need_a_reason(operator):
    host = _h100_node(devices=1)
    with pytest.raises(DomainError):
        mig_services.node_mig_pin(host, " ", operator)
    mig_services.node_mig_pin(host, "inference fleet keeps 7x1g", operator)
    host.refresh_from_db()
    assert host.mig_layout_pinned and host.mig_pin_reason == "inference fleet keeps 7x1g"
    with pytest.raises(DomainError) as error:
        mig_services.node_mig_pin(host, "again", operator)
    assert error.value.code == "already_pinned"
    mig_services.node_mig_unpin(host, "repartitioning allowed again", operator)
    host.refresh_from_db()
    assert not host.mig_layout_pinned and host.mig_pin_reason == ""


def test_device_list_queries_do_not_grow_with_mig_instances(roles, api_as):
    def count():
        with CaptureQueriesContext(connection) as ctx:
            assert api_as(roles.operator).get(DEVICES).status_code == 200
        return len(ctx)

    host = _h100_node(devices=1)
    device = host.devices.get()
    mig_services.device_mig_layout_report(
        device=device, mig_mode=True, instances=[{"profile": "1g.10gb", "start": 0}], source="agent", actor=None
    )
    count()  # the first request also creates the token
    before = count()
    for extra in range(3):
        other = _h100_node(devices=2)
        for d in Device.objects.filter(node=other):
            mig_services.device_mig_layout_report(
                device=d,
                mig_mode=True,
                instances=[{"profile": "1g.10gb", "start": s} for s in range(extra + 2)],
                source="agent",
                actor=None,
            )
    assert count() == before


def test_a_mig_slice_profile_must_match_its_cards_geometry():
    from decimal import Decimal

    from catalog.models import SliceProfile

    model = accelerator()
    model.mig_geometry = MigGeometry.objects.get(name="H100 80GB")
    model.save()
    good = SliceProfile(
        accelerator=model,
        name="3g.40gb",
        kind="mig",
        compute_fraction=Decimal("0.4286"),
        memory_gb=40,
        max_per_device=2,
    )
    good.full_clean()
    wrong = SliceProfile(
        accelerator=model, name="3g.40gb", kind="mig", compute_fraction=Decimal("0.5"), memory_gb=30, max_per_device=3
    )
    with pytest.raises(ValidationError) as error:
        wrong.full_clean()
    assert set(error.value.message_dict) == {"compute_fraction", "memory_gb", "max_per_device"}
    unknown = SliceProfile(
        accelerator=model, name="5g.50gb", kind="mig", compute_fraction=Decimal("0.7"), memory_gb=50, max_per_device=1
    )
    with pytest.raises(ValidationError) as error:
        unknown.full_clean()
    assert "has no MIG profile 5g.50gb" in error.value.message_dict["name"][0]
    # quota: a 7g.80gb counts 8x the accelerator memory of a 1g.10gb and the whole card's compute
    big = SliceProfile(
        accelerator=model, name="7g.80gb", kind="mig", compute_fraction=Decimal("1"), memory_gb=80, max_per_device=1
    )
    big.full_clean()
    assert big.memory_gb == 8 * MigProfile.objects.get(geometry=model.mig_geometry, name="1g.10gb").memory_gb


def test_inventory_import_reads_mig_layouts_from_yaml(tmp_path):
    from io import StringIO

    from django.core.management import call_command
    from django.core.management.base import CommandError

    model = accelerator()
    model.mig_geometry = MigGeometry.objects.get(name="H100 80GB")
    model.save()
    path = tmp_path / "inventory.yaml"
    path.write_text(f"""
nodes:
  - name: mig-01
    cpu_milli: 96000
    memory_mib: 1048576
    devices:
      - index: 0
        model: {model.slug}
        uuid: GPU-mig-0
        mig:
          mode: mig
          instances:
            - {{profile: 4g.40gb, start: 0, size: 4, gi_id: 1, ci_id: 0, uuid: MIG-aa}}
            - {{profile: 2g.20gb, start: 4, size: 2, gi_id: 5, ci_id: 0, uuid: MIG-bb}}
      - {{index: 1, model: {model.slug}, uuid: GPU-mig-1, mig: {{mode: whole}}}}
""")
    call_command("import_inventory", str(path), stdout=StringIO())
    first, second = Device.objects.filter(node__name="mig-01").order_by("index")
    assert first.mig_mode and not second.mig_mode
    assert list(first.mig_instances.values_list("profile__name", "start", "uuid")) == [
        ("4g.40gb", 0, "MIG-aa"),
        ("2g.20gb", 4, "MIG-bb"),
    ]
    path.write_text(path.read_text().replace("start: 4, size: 2", "start: 2, size: 2"))  # overlaps the 4g
    with pytest.raises(CommandError, match="overlaps memory slices 2–3"):  # noqa: RUF001
        call_command("import_inventory", str(path), stdout=StringIO())
    assert list(first.mig_instances.values_list("start", flat=True)) == [0, 4]
