"""Operator console for the catalog: changelists, permissions, reasoned actions, form checks, audits."""

import json

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from catalog.choices import ServiceKind, SpecStatus
from catalog.models import AcceleratorModel, ResourceSpec, Service, SliceProfile, Vendor
from tenancy.models import AuditEvent
from tenancy.selectors import audit_events_for
from tests import factories
from tests.factories import (
    AcceleratorModelFactory,
    BareMetalProfileFactory,
    ImageFactory,
    ResourceSpecFactory,
    ServiceFactory,
    ServingModelFactory,
    ServingTemplateFactory,
    SliceProfileFactory,
    vendor,
)

pytestmark = pytest.mark.django_db

CATALOG_MODELS = [
    "vendor",
    "acceleratormodel",
    "resourcespec",
    "image",
    "baremetalprofile",
    "servingtemplate",
    "servingmodel",
    "service",
]


def _url(model: str, suffix: str = "") -> str:
    return f"/admin/catalog/{model}/{suffix}"


# --- changelists ----------------------------------------------------------------------------------------


def _vendor_row():
    n = Vendor.objects.count()
    return Vendor.objects.create(slug=f"vendor-{n}", name=f"Vendor {n}", software_stack="none")


def _spec_row():
    profile = SliceProfileFactory()
    return ResourceSpecFactory(slice_profile=profile, accelerator_models=[profile.accelerator])


def _service_row():
    service = ServiceFactory(specs=[_spec_row(), ResourceSpecFactory()], images=[ImageFactory()])
    service.bare_metal_profiles.set([BareMetalProfileFactory()])
    service.serving_models.set([ServingModelFactory()])
    return service


ROW_MAKERS = {
    "vendor": _vendor_row,
    "acceleratormodel": lambda: SliceProfileFactory().accelerator,
    "resourcespec": _spec_row,
    "image": lambda: ImageFactory(compatible_vendors=[vendor("nvidia"), vendor("amd")]),
    "baremetalprofile": BareMetalProfileFactory,
    "servingtemplate": ServingTemplateFactory,
    "servingmodel": lambda: ServingModelFactory(templates=[ServingTemplateFactory() for _ in range(2)]),
    "service": _service_row,
}


@pytest.mark.parametrize("model", CATALOG_MODELS)
def test_operator_sees_every_catalog_changelist(console, model):
    ROW_MAKERS[model]()
    assert console.get(_url(model)).status_code == 200


def _count_changelist_queries(console, model) -> int:
    with CaptureQueriesContext(connection) as queries:
        response = console.get(_url(model))
    assert response.status_code == 200
    return len(queries)


@pytest.mark.parametrize("model", CATALOG_MODELS)
def test_changelist_query_count_is_constant(console, model):
    for _ in range(2):
        ROW_MAKERS[model]()
    console.get(_url(model))  # warm caches
    few = _count_changelist_queries(console, model)
    for _ in range(8):
        ROW_MAKERS[model]()
    many = _count_changelist_queries(console, model)
    assert many == few, f"{model}: {few} queries with few rows, {many} with many"
    assert few <= 20


def test_developer_cannot_open_the_console(client, roles):
    client.force_login(roles.developer)
    response = client.get(_url("resourcespec"))
    assert response.status_code == 302
    assert "/admin/login/" in response["Location"]


# --- no deleting ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("model", CATALOG_MODELS)
def test_operator_has_no_delete_permission(operator, model):
    assert not operator.has_perm(f"catalog.delete_{model}")
    assert operator.has_perm(f"catalog.change_{model}")


@pytest.mark.parametrize("model", CATALOG_MODELS)
def test_delete_view_is_forbidden(console, model):
    row = ROW_MAKERS[model]()
    response = console.get(_url(model, f"{row.pk}/delete/"))
    assert response.status_code == 403
    assert type(row).objects.filter(pk=row.pk).exists()


def test_delete_post_is_forbidden_and_keeps_the_row(console):
    spec = ResourceSpecFactory()
    response = console.post(_url("resourcespec", f"{spec.pk}/delete/"), {"post": "yes"})
    assert response.status_code == 403
    assert ResourceSpec.objects.filter(pk=spec.pk).exists()


def test_bulk_delete_action_is_not_offered(console):
    ResourceSpecFactory()
    response = console.get(_url("resourcespec"))
    assert b"delete_selected" not in response.content


# --- deprecate action with a reason ---------------------------------------------------------------------


def test_deprecate_action_first_asks_for_a_reason(console):
    spec = ResourceSpecFactory()
    data = {"action": "deprecate_specs", "_selected_action": [spec.pk]}
    response = console.post(_url("resourcespec"), data)
    assert response.status_code == 200
    assert b'name="reason"' in response.content
    assert spec.name.encode() in response.content
    spec.refresh_from_db()
    assert spec.status == SpecStatus.ACTIVE
    assert not audit_events_for(target=spec).exists()


def test_deprecate_action_with_reason_deprecates_and_audits(console, operator):
    specs = [ResourceSpecFactory(), ResourceSpecFactory()]
    response = console.post(
        _url("resourcespec"),
        {
            "action": "deprecate_specs",
            "_selected_action": [spec.pk for spec in specs],
            "apply": "Confirm",
            "reason": "Superseded by L40S",
        },
    )
    assert response.status_code == 302
    for spec in specs:
        spec.refresh_from_db()
        assert (spec.status, spec.deprecation_reason) == (SpecStatus.DEPRECATED, "Superseded by L40S")
        event = audit_events_for(target=spec).get()
        assert (event.action, event.actor, event.reason) == ("resourcespec.deprecated", operator, "Superseded by L40S")


def test_deprecate_action_with_blank_reason_changes_nothing(console):
    spec = ResourceSpecFactory()
    response = console.post(
        _url("resourcespec"),
        {
            "action": "deprecate_specs",
            "_selected_action": [spec.pk],
            "apply": "Confirm",
            "reason": "",
        },
    )
    assert response.status_code == 200
    assert b"This field is required" in response.content
    spec.refresh_from_db()
    assert spec.status == SpecStatus.ACTIVE


def test_deprecate_action_reports_already_deprecated_specs(console):
    spec = ResourceSpecFactory()
    console.post(
        _url("resourcespec"),
        {"action": "deprecate_specs", "_selected_action": [spec.pk], "apply": "Confirm", "reason": "First"},
    )
    response = console.post(
        _url("resourcespec"),
        {
            "action": "deprecate_specs",
            "_selected_action": [spec.pk],
            "apply": "Confirm",
            "reason": "Second",
        },
        follow=True,
    )
    assert "already deprecated" in response.content.decode()
    assert audit_events_for(target=spec).count() == 1


def test_withdraw_image_action_audits(console, operator):
    image = ImageFactory()
    console.post(
        _url("image"),
        {
            "action": "withdraw_images",
            "_selected_action": [image.pk],
            "apply": "Confirm",
            "reason": "CVE in the base layer",
        },
    )
    image.refresh_from_db()
    assert image.approved is False
    assert audit_events_for(target=image).get().action == "image.withdrawn"


def test_close_service_action_audits(console):
    service = ServiceFactory()
    console.post(
        _url("service"),
        {
            "action": "close_services",
            "_selected_action": [service.pk],
            "apply": "Confirm",
            "reason": "Hardware retired",
        },
    )
    service.refresh_from_db()
    assert service.active is False
    assert audit_events_for(target=service).get().action == "service.closed"


# --- add forms ------------------------------------------------------------------------------------------


def _spec_post(**overrides) -> dict:
    data = {
        "name": "1x Test GPU",
        "slug": "test-gpu-1x",
        "description": "",
        "accelerator_count": 1,
        "slice_profile": "",
        "cpu_cores": 8,
        "memory_gb": 64,
        "local_disk_gb": 100,
        "hourly_price": "2.00",
        "max_duration_hours": 168,
        "node_count": 1,  # one node: the form's initial values, as the page renders them
        "topology_level": "node",
        "topology_mode": "required",
    }
    data.update(overrides)
    return data


def test_add_spec_creates_it_and_audits(console, operator):
    accelerator = AcceleratorModelFactory()
    response = console.post(_url("resourcespec", "add/"), _spec_post(accelerator_models=[accelerator.pk]))
    assert response.status_code == 302, response.context["adminform"].form.errors
    spec = ResourceSpec.objects.get(slug="test-gpu-1x")
    assert list(spec.accelerator_models.all()) == [accelerator]
    event = audit_events_for(target=spec).get()
    assert (event.action, event.actor) == ("resourcespec.created", operator)
    assert "accelerator_models" in event.data["fields"]


def test_add_slice_spec_for_another_model_is_refused(console):
    profile = SliceProfileFactory()
    other = AcceleratorModelFactory()
    response = console.post(
        _url("resourcespec", "add/"), _spec_post(accelerator_models=[other.pk], slice_profile=profile.pk)
    )
    assert response.status_code == 200
    errors = response.context["adminform"].form.non_field_errors()
    assert any("A slice spec runs on one model" in error for error in errors)
    assert not ResourceSpec.objects.exists()
    assert not AuditEvent.objects.filter(action="resourcespec.created").exists()


def test_add_slice_spec_with_extra_models_is_refused(console):
    profile = SliceProfileFactory()
    response = console.post(
        _url("resourcespec", "add/"),
        _spec_post(accelerator_models=[profile.accelerator.pk, AcceleratorModelFactory().pk], slice_profile=profile.pk),
    )
    assert response.status_code == 200
    assert response.context["adminform"].form.non_field_errors()
    assert not ResourceSpec.objects.exists()


def test_add_slice_spec_with_too_many_slices_is_refused(console):
    profile = SliceProfileFactory(max_per_device=2)
    response = console.post(
        _url("resourcespec", "add/"),
        _spec_post(accelerator_models=[profile.accelerator.pk], slice_profile=profile.pk, accelerator_count=3),
    )
    assert response.status_code == 200
    assert "accelerator_count" in response.context["adminform"].form.errors
    assert not ResourceSpec.objects.exists()


def _service_post(**overrides) -> dict:
    data = {
        "name": "Test service",
        "slug": "test-service",
        "kind": ServiceKind.COMPUTE,
        "description": "For tests",
        "default_duration_hours": 24,
        "max_duration_hours": 168,
        "visibility": "all",
    }
    data.update(overrides)
    return data


def test_add_bare_metal_service_without_profile_is_refused(console):
    response = console.post(_url("service", "add/"), _service_post(kind=ServiceKind.BARE_METAL))
    assert response.status_code == 200
    assert "bare_metal_profiles" in response.context["adminform"].form.errors
    assert not Service.objects.exists()


def test_add_compute_service_needs_specs_and_images(console):
    response = console.post(_url("service", "add/"), _service_post(kind=ServiceKind.COMPUTE))
    assert response.status_code == 200
    assert {"specs", "images"} <= set(response.context["adminform"].form.errors)
    assert not Service.objects.exists()


def test_add_bare_metal_service_with_profile_is_saved_and_audited(console, operator):
    profile = BareMetalProfileFactory()
    response = console.post(
        _url("service", "add/"), _service_post(kind=ServiceKind.BARE_METAL, bare_metal_profiles=[profile.pk])
    )
    assert response.status_code == 302, response.context["adminform"].form.errors
    service = Service.objects.get(slug="test-service")
    assert list(service.bare_metal_profiles.all()) == [profile]
    assert audit_events_for(target=service).get().action == "service.created"


def test_add_service_with_inverted_durations_is_refused(console):
    response = console.post(
        _url("service", "add/"),
        _service_post(
            kind=ServiceKind.BARE_METAL,
            bare_metal_profiles=[BareMetalProfileFactory().pk],
            default_duration_hours=200,
            max_duration_hours=100,
        ),
    )
    assert response.status_code == 200
    assert response.context["adminform"].form.errors
    assert not Service.objects.exists()


def test_change_spec_through_admin_audits_updated(console, operator):
    spec = ResourceSpecFactory()
    data = _spec_post(
        name=spec.name,
        slug=spec.slug,
        cpu_cores=32,
        accelerator_models=[model.pk for model in spec.accelerator_models.all()],
    )
    response = console.post(_url("resourcespec", f"{spec.pk}/change/"), data)
    assert response.status_code == 302, response.context["adminform"].form.errors
    spec.refresh_from_db()
    assert spec.cpu_cores == 32
    event = audit_events_for(target=spec).get()
    assert (event.action, event.actor) == ("resourcespec.updated", operator)
    assert "cpu_cores" in event.data["fields"]


def _accelerator_post(slices: list[dict], **overrides) -> dict:
    data = {
        "vendor": vendor("nvidia").pk,
        "name": "B200 192GB",
        "slug": "b200-192gb",
        "kind": "gpu",
        "memory_gb": 192,
        "interconnect": "nvswitch",
        "active": "on",
        "slice_profiles-TOTAL_FORMS": len(slices),
        "slice_profiles-INITIAL_FORMS": 0,
        "slice_profiles-MIN_NUM_FORMS": 0,
        "slice_profiles-MAX_NUM_FORMS": 1000,
    }
    for index, fields in enumerate(slices):
        data.update({f"slice_profiles-{index}-{key}": value for key, value in fields.items()})
    data.update(overrides)
    return data


def _inline_errors(response) -> set[str]:
    formset = response.context["inline_admin_formsets"][0].formset
    return {field for form_errors in formset.errors for field in form_errors}


def test_add_accelerator_with_slice_profiles_inline(console, operator):
    slices = [{"name": "1g.23gb", "kind": "mig", "compute_fraction": "0.1429", "memory_gb": 23, "max_per_device": 7}]
    response = console.post(_url("acceleratormodel", "add/"), _accelerator_post(slices))
    assert response.status_code == 302, response.context["adminform"].form.errors
    model = AcceleratorModel.objects.get(slug="b200-192gb")
    assert list(model.slice_profiles.values_list("name", flat=True)) == ["1g.23gb"]
    assert audit_events_for(target=model).get().action == "acceleratormodel.created"


def test_add_accelerator_with_oversized_slice_is_refused(console):
    slices = [{"name": "too-big", "kind": "share", "compute_fraction": "0.5", "memory_gb": 256, "max_per_device": 2}]
    response = console.post(_url("acceleratormodel", "add/"), _accelerator_post(slices))
    assert response.status_code == 200
    assert "memory_gb" in _inline_errors(response)
    assert not AcceleratorModel.objects.filter(slug="b200-192gb").exists()
    assert not SliceProfile.objects.filter(name="too-big").exists()


def test_change_accelerator_with_oversized_slice_is_refused(console):
    model = AcceleratorModelFactory(memory_gb=40)
    data = _accelerator_post(
        [{"name": "too-big", "kind": "share", "compute_fraction": "0.5", "memory_gb": 41, "max_per_device": 2}],
        name=model.name,
        slug=model.slug,
        memory_gb=40,
    )
    response = console.post(_url("acceleratormodel", f"{model.pk}/change/"), data)
    assert response.status_code == 200
    assert "memory_gb" in _inline_errors(response)
    assert not SliceProfile.objects.filter(name="too-big").exists()


@pytest.mark.django_db
def test_inline_slice_profiles_are_saved_through_the_audited_service(client, django_user_model):
    admin_user = django_user_model.objects.create_superuser("root-inline", "root@example.com", "pw-inline-123")
    client.force_login(admin_user)
    accelerator = factories.AcceleratorModelFactory()
    response = client.post(
        f"/admin/catalog/acceleratormodel/{accelerator.pk}/change/",
        {
            "vendor": accelerator.vendor_id,
            "name": accelerator.name,
            "slug": accelerator.slug,
            "kind": "gpu",
            "memory_gb": 80,
            "interconnect": "nvlink",
            "active": "on",
            "slice_profiles-TOTAL_FORMS": "1",
            "slice_profiles-INITIAL_FORMS": "0",
            "slice_profiles-MIN_NUM_FORMS": "0",
            "slice_profiles-MAX_NUM_FORMS": "1000",
            "slice_profiles-0-name": "2g.20gb",
            "slice_profiles-0-kind": "mig",
            "slice_profiles-0-compute_fraction": "0.2857",
            "slice_profiles-0-memory_gb": "20",
            "slice_profiles-0-max_per_device": "3",
        },
    )
    assert response.status_code == 302
    assert accelerator.slice_profiles.filter(name="2g.20gb").exists()
    assert AuditEvent.objects.filter(action="sliceprofile.created").count() == 1


def test_operator_declares_a_parameter_schema_and_it_is_saved_and_audited(console):
    service = ServiceFactory()
    schema = [{"name": "batch_size", "type": "int", "min": 1, "max": 65536, "label": "Global batch size"}]
    response = console.post(
        _url("service", f"{service.pk}/change/"),
        _service_post(
            name=service.name,
            slug=service.slug,
            specs=[spec.pk for spec in service.specs.all()],
            images=[ImageFactory().pk],
            parameter_schema=json.dumps(schema),
        ),
    )
    assert response.status_code == 302, response.context["adminform"].form.errors
    service.refresh_from_db()
    assert service.parameter_schema == schema
    assert "parameter_schema" in audit_events_for(target=service).get(action="service.updated").data["fields"]


@pytest.mark.parametrize(
    ("schema", "sentence"),
    [
        ({"batch": "int"}, "must be a list"),
        ([{"name": "Batch", "type": "int"}], "name must be lower-case"),
        ([{"name": "batch", "type": "integer"}], "type must be one of"),
        ([{"name": "batch", "type": "int", "min": 10, "max": 1}], "min is above max"),
        ([{"name": "batch", "type": "int", "max": 1e300}], "within ±2^53"),
        ([{"name": "batch", "type": "int", "max": 8, "default": 9}], "the default is not valid"),
        ([{"name": "size", "type": "string", "max_length": 10**6}], "max_length must be"),
        ([{"name": "env", "type": "enum", "choices": []}], "choices must be"),
        ([{"name": "priority", "type": "string"}], "a field of every order"),
        ([{"name": "a", "type": "bool"}, {"name": "a", "type": "bool"}], "declared twice"),
        ([{"name": "a", "type": "bool", "pattern": ".*"}], "unknown key 'pattern'"),
    ],
)
def test_a_parameter_schema_that_cannot_be_used_is_refused_with_the_reason(console, schema, sentence):
    service = ServiceFactory()
    before = service.parameter_schema
    response = console.post(
        _url("service", f"{service.pk}/change/"),
        _service_post(
            name=service.name,
            slug=service.slug,
            specs=[spec.pk for spec in service.specs.all()],
            images=[ImageFactory().pk],
            parameter_schema=json.dumps(schema),
        ),
    )
    assert response.status_code == 200
    assert sentence in " ".join(response.context["adminform"].form.errors["parameter_schema"])
    service.refresh_from_db()
    assert service.parameter_schema == before
