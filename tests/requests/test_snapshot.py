"""The approved snapshot is the contract: frozen with its hash on approval, immune to catalog edits, tamper-proof."""

import hashlib
import importlib
import json
from decimal import Decimal

import pytest

from catalog.services import catalog_entry_save, spec_deprecate
from requests import approvals, services
from requests.models import ResourceRequest
from requests.models.request import SnapshotTampered, snapshot_hash
from requests.signals import request_queued
from tests.requests.conftest import approval_rule, approver_stage, make_order

pytestmark = pytest.mark.django_db


def sha256_of(snapshot: dict) -> str:
    return hashlib.sha256(json.dumps(snapshot, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def approve_by_approver(shop, team) -> ResourceRequest:
    """A request approved by the project approver, read back from the database."""
    approval_rule(approver_stage())
    request = services.request_submit(order=make_order(shop, team.project), requester=team.developer)
    assert request.approved_spec is None
    [assignment] = approvals.approval_for(request).stages.get().assignments.all()
    approvals.approval_decide(assignment=assignment, decision="approve", comment="", actor=team.approver)
    return ResourceRequest.objects.get(pk=request.pk)


@pytest.fixture
def approved(shop, team):
    return approve_by_approver(shop, team)


def test_approval_stores_the_snapshot_and_its_hash(approved, shop):
    assert approved.state == "queued"
    assert approved.approved_at is not None
    assert approved.approved_spec_hash == sha256_of(approved.approved_spec)
    assert approved.snapshot_intact
    spec = approved.approved_spec["spec"]
    assert (spec["slug"], spec["cpu_cores"], spec["hourly_price"]) == (shop.whole.slug, 16, "4.00")
    assert (approved.approved_spec["demand"]["gpu_equivalents"], approved.approved_spec["cost_estimate"]) == (
        "2.0000",
        "80.00",
    )
    assert approved.events.get(code="queued").data == {"approved_spec_hash": approved.approved_spec_hash}


def test_automatic_and_manual_approval_freeze_the_same_numbers(shop, team):
    automatic = services.request_submit(order=make_order(shop, team.project), requester=team.developer)
    assert automatic.state == "queued"
    manual = approve_by_approver(shop, team)
    frozen = [
        (request.approved_spec["demand"], request.approved_spec["cost_estimate"]) for request in (automatic, manual)
    ]
    assert frozen[0] == frozen[1]
    assert frozen[0][0]["card_hours"] == "20.0000"


def test_snapshot_survives_catalog_edits_and_deprecation(approved, shop, team):
    spec = shop.whole
    spec.hourly_price, spec.cpu_cores = Decimal("9.99"), 64
    catalog_entry_save(entry=spec, changed_fields=["hourly_price", "cpu_cores"], actor=team.operator)
    spec_deprecate(spec=spec, reason="Replaced by a newer card", actor=team.operator)
    request = ResourceRequest.objects.get(pk=approved.pk)
    assert (request.approved_spec["spec"]["hourly_price"], request.approved_spec["spec"]["cpu_cores"]) == ("4.00", 16)
    assert request.approved_spec == approved.approved_spec
    assert request.snapshot_intact


@pytest.mark.parametrize("rehash", [False, True], ids=["snapshot_only", "snapshot_and_hash"])
def test_changing_the_snapshot_is_refused_and_nothing_is_saved(approved, rehash):
    approved.approved_spec["spec"]["cpu_cores"] = 128
    if rehash:
        approved.approved_spec_hash = sha256_of(approved.approved_spec)
    with pytest.raises(SnapshotTampered):
        approved.save()
    stored = ResourceRequest.objects.get(pk=approved.pk)
    assert stored.approved_spec["spec"]["cpu_cores"] == 16
    assert stored.approved_spec_hash == sha256_of(stored.approved_spec)
    assert stored.snapshot_intact


def test_dropping_the_snapshot_is_refused(approved):
    approved.approved_spec = None
    with pytest.raises(SnapshotTampered):
        approved.save()
    assert ResourceRequest.objects.get(pk=approved.pk).snapshot_intact


def test_queued_signal_fires_after_commit_with_the_request_id(shop, team, django_capture_on_commit_callbacks):
    received = []

    def receiver(sender, request_id, **kwargs):
        received.append(request_id)

    request_queued.connect(receiver)
    try:
        with django_capture_on_commit_callbacks(execute=False) as callbacks:
            request = services.request_submit(order=make_order(shop, team.project), requester=team.developer)
        assert received == []
        for callback in callbacks:
            callback()
    finally:
        request_queued.disconnect(receiver)
    assert received == [request.pk]


@pytest.mark.parametrize("number", [1e16, 1.5e300, 1.2345678901234567e19, 0.1, 1e-7, 2**70])
def test_a_snapshot_with_any_json_number_survives_the_database_round_trip(shop, team, number):
    """jsonb reads 1e16 back as the integer 10000000000000000: the reloaded snapshot must still hash the same,
    or every later save (provisioning, release) is refused as tampering and the allocation is held for ever."""
    request = services.request_submit(order=make_order(shop, team.project), requester=team.developer)
    request.approved_spec = {**request.approved_spec, "parameters": {"batch": number}}
    request.approved_spec_hash = snapshot_hash(request.approved_spec)
    request._loaded_spec_hash = ""  # as a snapshot frozen before parameters were checked
    request.save()
    reloaded = ResourceRequest.objects.get(pk=request.pk)
    assert reloaded.snapshot_intact
    services.request_release(request=walk_to_active(reloaded), actor=team.developer, reason="done")
    assert ResourceRequest.objects.get(pk=request.pk).state == "releasing"


def walk_to_active(request: ResourceRequest) -> ResourceRequest:
    for name in ("allocate", "start_provisioning", "activate"):
        getattr(request, name)()
    request.save()
    return ResourceRequest.objects.get(pk=request.pk)


def test_a_snapshot_hashed_before_the_fix_is_rehashed_by_the_migration_and_real_tampering_is_not(shop, team):
    """Requests frozen with 1e16 before the fix hold their allocation for ever unless their hash is mended."""
    from django.apps import apps

    rehash = importlib.import_module("requests.migrations.0010_rehash_round_tripped_snapshots")
    legacy, tampered = (
        services.request_submit(order=make_order(shop, team.project), requester=team.developer) for _ in range(2)
    )
    frozen = {**legacy.approved_spec, "parameters": {"batch": 1e16}}  # jsonb keeps it as 10000000000000000
    ResourceRequest.objects.filter(pk=legacy.pk).update(
        approved_spec=frozen, approved_spec_hash=sha256_of_as_written(frozen)
    )
    forged = {**tampered.approved_spec, "parameters": {"batch": 1e16}}
    ResourceRequest.objects.filter(pk=tampered.pk).update(
        approved_spec={**forged, "cost_estimate": "0.00"}, approved_spec_hash=sha256_of_as_written(forged)
    )
    with pytest.raises(SnapshotTampered):
        ResourceRequest.objects.get(pk=legacy.pk).save()

    rehash.rehash_round_tripped(apps, None)

    ResourceRequest.objects.get(pk=legacy.pk).save()
    assert ResourceRequest.objects.get(pk=legacy.pk).snapshot_intact
    with pytest.raises(SnapshotTampered):
        ResourceRequest.objects.get(pk=tampered.pk).save()


def sha256_of_as_written(snapshot: dict) -> str:
    """The hash as it was computed before the fix: over the floats as Python writes them."""
    return hashlib.sha256(json.dumps(snapshot, sort_keys=True, separators=(",", ":"), default=str).encode()).hexdigest()
