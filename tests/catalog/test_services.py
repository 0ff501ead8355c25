"""Catalog services: every lifecycle change is validated, audited, and refused cleanly when senseless."""

import pytest
from django.core.exceptions import ValidationError

from catalog.choices import SpecStatus
from catalog.models import AcceleratorModel, Image, ResourceSpec, Service, ServingModel, SliceProfile
from catalog.services import catalog_entry_save, catalog_entry_set_available, spec_deprecate, spec_reactivate
from config.errors import Conflict, DomainError
from tenancy.models import AuditEvent
from tenancy.selectors import audit_events_for
from tests import factories
from tests.factories import (
    AcceleratorModelFactory,
    ImageFactory,
    ResourceSpecFactory,
    ServiceFactory,
    ServingModelFactory,
)

pytestmark = pytest.mark.django_db


@pytest.fixture
def actor():
    return factories.operator()


def _actions(target) -> list[str]:
    return list(audit_events_for(target=target).values_list("action", flat=True))


# --- spec_deprecate / spec_reactivate -------------------------------------------------------------------


def test_deprecate_sets_status_time_and_reason(actor):
    spec = spec_deprecate(spec=ResourceSpecFactory(), reason="  Superseded by L40S  ", actor=actor)
    spec.refresh_from_db()
    assert spec.status == SpecStatus.DEPRECATED
    assert spec.deprecated_at is not None
    assert spec.deprecation_reason == "Superseded by L40S"


def test_deprecate_writes_an_audit_event(actor):
    spec = ResourceSpecFactory()
    spec_deprecate(spec=spec, reason="Superseded", actor=actor)
    event = audit_events_for(target=spec).get()
    assert (event.action, event.actor, event.reason) == ("resourcespec.deprecated", actor, "Superseded")
    assert event.target_repr == spec.name


def test_deprecating_twice_is_a_conflict_and_writes_nothing(actor):
    spec = ResourceSpecFactory()
    spec_deprecate(spec=spec, reason="Superseded", actor=actor)
    first_time = ResourceSpec.objects.get(pk=spec.pk).deprecated_at
    with pytest.raises(Conflict) as raised:
        spec_deprecate(spec=spec, reason="Again", actor=actor)
    assert raised.value.code == "already_deprecated"
    assert raised.value.status_code == 409
    spec.refresh_from_db()
    assert (spec.deprecated_at, spec.deprecation_reason) == (first_time, "Superseded")
    assert _actions(spec) == ["resourcespec.deprecated"]


@pytest.mark.parametrize("reason", ["", "   ", None])
def test_deprecate_without_reason_is_refused_and_changes_nothing(actor, reason):
    spec = ResourceSpecFactory()
    with pytest.raises(DomainError) as raised:
        spec_deprecate(spec=spec, reason=reason, actor=actor)
    assert raised.value.code == "reason_required"
    spec.refresh_from_db()
    assert (spec.status, spec.deprecated_at, spec.deprecation_reason) == (SpecStatus.ACTIVE, None, "")
    assert not AuditEvent.objects.filter(action__startswith="resourcespec.").exists()


def test_reactivate_reverses_deprecation(actor):
    spec = ResourceSpecFactory()
    spec_deprecate(spec=spec, reason="Superseded", actor=actor)
    spec_reactivate(spec=spec, reason="Still needed by vision", actor=actor)
    spec.refresh_from_db()
    assert (spec.status, spec.deprecated_at, spec.deprecation_reason) == (SpecStatus.ACTIVE, None, "")
    assert _actions(spec) == ["resourcespec.reactivated", "resourcespec.deprecated"]
    assert audit_events_for(target=spec).first().reason == "Still needed by vision"


def test_reactivating_an_active_spec_is_a_conflict(actor):
    spec = ResourceSpecFactory()
    with pytest.raises(Conflict) as raised:
        spec_reactivate(spec=spec, reason="Why not", actor=actor)
    assert raised.value.code == "already_active"
    assert _actions(spec) == []


def test_reactivate_needs_a_reason(actor):
    spec = ResourceSpecFactory()
    spec_deprecate(spec=spec, reason="Superseded", actor=actor)
    with pytest.raises(DomainError) as raised:
        spec_reactivate(spec=spec, reason=" ", actor=actor)
    assert raised.value.code == "reason_required"
    spec.refresh_from_db()
    assert spec.status == SpecStatus.DEPRECATED


def test_deprecate_without_actor_records_no_actor():
    spec = ResourceSpecFactory()
    spec_deprecate(spec=spec, reason="Seed data", actor=None)
    assert audit_events_for(target=spec).get().actor is None


# --- catalog_entry_set_available ------------------------------------------------------------------------

# factory, availability field, target availability, expected audit action
AVAILABILITY_CASES = [
    pytest.param(lambda: ImageFactory(approved=False), "approved", True, "image.approved", id="approve-image"),
    pytest.param(lambda: ImageFactory(approved=True), "approved", False, "image.withdrawn", id="withdraw-image"),
    pytest.param(
        lambda: ServingModelFactory(approved=False), "approved", True, "servingmodel.approved", id="approve-model"
    ),
    pytest.param(
        lambda: ServingModelFactory(approved=True), "approved", False, "servingmodel.withdrawn", id="withdraw-model"
    ),
    pytest.param(lambda: ServiceFactory(active=False), "active", True, "service.opened", id="open-service"),
    pytest.param(lambda: ServiceFactory(active=True), "active", False, "service.closed", id="close-service"),
]


@pytest.mark.parametrize(("make", "field", "available", "action"), AVAILABILITY_CASES)
def test_set_available_changes_the_flag_and_audits(actor, make, field, available, action):
    entry = make()
    result = catalog_entry_set_available(entry=entry, available=available, reason="Reviewed", actor=actor)
    entry.refresh_from_db()
    assert getattr(entry, field) is available
    assert getattr(result, field) is available
    event = audit_events_for(target=entry).get()
    assert (event.action, event.actor, event.reason) == (action, actor, "Reviewed")


@pytest.mark.parametrize(
    ("make", "available"),
    [
        (lambda: ImageFactory(approved=True), True),
        (lambda: ServingModelFactory(approved=False), False),
        (lambda: ServiceFactory(active=True), True),
        (lambda: ServiceFactory(active=False), False),
    ],
)
def test_set_available_is_a_no_op_when_already_so(actor, make, available):
    entry = make()
    before = type(entry).objects.get(pk=entry.pk).updated_at
    catalog_entry_set_available(entry=entry, available=available, reason="Reviewed", actor=actor)
    assert type(entry).objects.get(pk=entry.pk).updated_at == before
    assert _actions(entry) == []


@pytest.mark.parametrize("model", [Image, ServingModel, Service])
def test_set_available_needs_a_reason(actor, model):
    entry = {Image: ImageFactory, ServingModel: ServingModelFactory, Service: ServiceFactory}[model]()
    field = "active" if model is Service else "approved"
    with pytest.raises(DomainError) as raised:
        catalog_entry_set_available(entry=entry, available=False, reason="", actor=actor)
    assert raised.value.code == "reason_required"
    assert getattr(model.objects.get(pk=entry.pk), field) is True
    assert _actions(entry) == []


# --- catalog_entry_save ---------------------------------------------------------------------------------


def test_save_new_entry_audits_created(actor):
    entry = AcceleratorModel(
        vendor=factories.vendor("amd"),
        name="MI250X",
        slug="mi250x",
        kind="gpu",
        memory_gb=128,
        interconnect="infinity_fabric",
    )
    catalog_entry_save(entry=entry, changed_fields=["slug", "name"], actor=actor)
    assert entry.pk is not None
    event = audit_events_for(target=entry).get()
    assert (event.action, event.actor, event.data) == ("acceleratormodel.created", actor, {"fields": ["name", "slug"]})


def test_save_existing_entry_audits_updated(actor):
    spec = ResourceSpecFactory()
    spec.cpu_cores = 32
    catalog_entry_save(entry=spec, changed_fields=["cpu_cores"], actor=actor)
    assert ResourceSpec.objects.get(pk=spec.pk).cpu_cores == 32
    event = audit_events_for(target=spec).get()
    assert (event.action, event.data) == ("resourcespec.updated", {"fields": ["cpu_cores"]})


def test_save_validates_and_saves_nothing_when_invalid(actor):
    entry = SliceProfile(
        accelerator=AcceleratorModelFactory(memory_gb=16),
        name="too-big",
        kind="share",
        compute_fraction="0.5",
        memory_gb=32,
        max_per_device=2,
    )
    with pytest.raises(ValidationError):
        catalog_entry_save(entry=entry, changed_fields=["memory_gb"], actor=actor)
    assert not SliceProfile.objects.filter(name="too-big").exists()
    assert not AuditEvent.objects.filter(action__startswith="sliceprofile.").exists()
