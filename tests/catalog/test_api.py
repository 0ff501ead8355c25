"""Catalog API: authentication, who sees what, filters, error shape, pagination and query counts."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from catalog.choices import AcceleratorKind, Runtime, ServiceKind, Visibility
from catalog.services import spec_deprecate
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

BASE = "/api/v1/catalog"
ENDPOINTS = ["services", "specs", "images", "bare-metal-profiles", "serving-models"]


def _get(client, url, status=200):
    response = client.get(url)
    assert response.status_code == status, response.content
    return response.json()


def _names(client, url) -> set[str]:
    body = _get(client, url)
    return {row["name"] for row in body["results"]}


def _assert_error_shape(body, code):
    assert set(body) == {"code", "message", "details"}
    assert body["code"] == code
    assert isinstance(body["message"], str) and body["message"]


# --- authentication -------------------------------------------------------------------------------------


@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_anonymous_gets_401_in_error_shape(api, endpoint):
    response = api.get(f"{BASE}/{endpoint}/")
    assert response.status_code == 401
    _assert_error_shape(response.json(), "not_authenticated")


def test_bad_token_gets_401(api):
    api.credentials(HTTP_AUTHORIZATION="Token not-a-real-token")
    response = api.get(f"{BASE}/specs/")
    assert response.status_code == 401
    _assert_error_shape(response.json(), "authentication_failed")


@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_developer_can_list(api_as, roles, endpoint):
    body = _get(api_as(roles.developer), f"{BASE}/{endpoint}/")
    assert {"count", "next", "previous", "results"} <= set(body)


# --- visibility -----------------------------------------------------------------------------------------


def _deprecated_spec(**fields):
    spec = ResourceSpecFactory(**fields)
    spec_deprecate(spec=spec, reason="Superseded", actor=None)
    return spec


# endpoint, factory for an orderable entry, factory for a retired one
VISIBILITY_CASES = [
    pytest.param("specs", ResourceSpecFactory, _deprecated_spec, id="deprecated-spec"),
    pytest.param("images", ImageFactory, lambda: ImageFactory(approved=False), id="unapproved-image"),
    pytest.param(
        "serving-models", ServingModelFactory, lambda: ServingModelFactory(approved=False), id="withdrawn-model"
    ),
    pytest.param("services", ServiceFactory, lambda: ServiceFactory(active=False), id="closed-service"),
    pytest.param(
        "bare-metal-profiles",
        BareMetalProfileFactory,
        lambda: BareMetalProfileFactory(active=False),
        id="inactive-profile",
    ),
]


@pytest.mark.parametrize(("endpoint", "orderable", "retired"), VISIBILITY_CASES)
def test_retired_entries_are_hidden_from_developers(api_as, roles, endpoint, orderable, retired):
    live, gone = orderable(), retired()
    client = api_as(roles.developer)
    assert _names(client, f"{BASE}/{endpoint}/") == {live.name}
    _get(client, f"{BASE}/{endpoint}/{gone.pk}/", status=404)
    assert _get(client, f"{BASE}/{endpoint}/{live.pk}/")["id"] == live.pk


@pytest.mark.parametrize(("endpoint", "orderable", "retired"), VISIBILITY_CASES)
def test_retired_entries_are_listed_for_operators(api_as, roles, endpoint, orderable, retired):
    live, gone = orderable(), retired()
    client = api_as(roles.operator)
    assert _names(client, f"{BASE}/{endpoint}/") == {live.name, gone.name}
    assert _get(client, f"{BASE}/{endpoint}/{gone.pk}/")["id"] == gone.pk


def test_deprecated_spec_shows_its_status_to_operators(api_as, roles):
    spec = _deprecated_spec()
    row = _get(api_as(roles.operator), f"{BASE}/specs/{spec.pk}/")
    assert row["status"] == "deprecated"
    assert row["deprecated_at"] is not None


@pytest.fixture(params=["project", "tenant"])
def restricted_service(request, roles):
    service = ServiceFactory(visibility=Visibility.RESTRICTED)
    if request.param == "project":
        service.visible_projects.set([roles.project])
    else:
        service.visible_tenants.set([roles.project.tenant])
    return service


def test_restricted_service_is_visible_to_its_audience(api_as, roles, restricted_service):
    client = api_as(roles.developer)
    assert restricted_service.name in _names(client, f"{BASE}/services/")
    assert _get(client, f"{BASE}/services/{restricted_service.pk}/")["visibility"] == "restricted"


@pytest.mark.parametrize("who", ["other_developer", "outsider"])
def test_restricted_service_is_hidden_from_others(api_as, roles, restricted_service, who):
    open_service = ServiceFactory()
    client = api_as(getattr(roles, who))
    assert _names(client, f"{BASE}/services/") == {open_service.name}
    body = _get(client, f"{BASE}/services/{restricted_service.pk}/", status=404)
    _assert_error_shape(body, "not_found")


def test_restricted_service_is_listed_for_operators(api_as, roles, restricted_service):
    assert restricted_service.name in _names(api_as(roles.operator), f"{BASE}/services/")


def test_restricted_service_appears_once_when_visible_both_ways(api_as, roles):
    service = ServiceFactory(visibility=Visibility.RESTRICTED)
    service.visible_projects.set([roles.project])
    service.visible_tenants.set([roles.project.tenant])
    body = _get(api_as(roles.developer), f"{BASE}/services/")
    assert [row["id"] for row in body["results"]] == [service.pk]
    assert body["count"] == 1


def test_closed_restricted_service_is_hidden_even_from_its_audience(api_as, roles):
    service = ServiceFactory(visibility=Visibility.RESTRICTED, active=False)
    service.visible_projects.set([roles.project])
    _get(api_as(roles.developer), f"{BASE}/services/{service.pk}/", status=404)


def test_service_detail_omits_deprecated_specs_for_developers(api_as, roles):
    live, gone = ResourceSpecFactory(), _deprecated_spec()
    service = ServiceFactory(specs=[live, gone])
    developer_view = _get(api_as(roles.developer), f"{BASE}/services/{service.pk}/")
    assert [spec["slug"] for spec in developer_view["specs"]] == [live.slug]


def test_service_detail_keeps_deprecated_specs_for_operators(api_as, roles):
    live, gone = ResourceSpecFactory(), _deprecated_spec()
    service = ServiceFactory(specs=[live, gone])
    operator_view = _get(api_as(roles.operator), f"{BASE}/services/{service.pk}/")
    assert {spec["slug"] for spec in operator_view["specs"]} == {live.slug, gone.slug}


def test_service_detail_omits_unapproved_images_and_models_for_developers(api_as, roles):
    image, hidden_image = ImageFactory(), ImageFactory(approved=False)
    model, hidden_model = ServingModelFactory(), ServingModelFactory(approved=False)
    service = ServiceFactory(images=[image, hidden_image])
    service.serving_models.set([model, hidden_model])
    row = _get(api_as(roles.developer), f"{BASE}/services/{service.pk}/")
    assert [item["id"] for item in row["images"]] == [image.pk]
    assert [item["id"] for item in row["serving_models"]] == [model.pk]


def test_spec_row_carries_quota_quantities(api_as, roles):
    profile = SliceProfileFactory(memory_gb=10, max_per_device=7)
    spec = ResourceSpecFactory(slice_profile=profile, accelerator_count=2, accelerator_models=[profile.accelerator])
    row = _get(api_as(roles.developer), f"{BASE}/specs/{spec.pk}/")
    assert row["gpu_equivalents"] == "0.2858"
    assert row["accelerator_memory_gb"] == 20
    assert row["slice_profile"]["accelerator"] == profile.accelerator.slug
    assert row["currency"] == "USD"


# --- filters --------------------------------------------------------------------------------------------


@pytest.fixture
def mixed_specs():
    nvidia = AcceleratorModelFactory(vendor=vendor("nvidia"), slug="h100-test")
    amd = AcceleratorModelFactory(vendor=vendor("amd"), slug="mi300x-test")
    ascend = AcceleratorModelFactory(vendor=vendor("huawei-ascend"), slug="910b-test", kind=AcceleratorKind.NPU)
    profile = SliceProfileFactory(accelerator=nvidia)
    return {
        "whole": ResourceSpecFactory(name="nvidia whole", accelerator_models=[nvidia]),
        "slice": ResourceSpecFactory(name="nvidia slice", accelerator_models=[nvidia], slice_profile=profile),
        "either": ResourceSpecFactory(name="nvidia or amd", accelerator_models=[nvidia, amd]),
        "amd": ResourceSpecFactory(name="amd whole", accelerator_models=[amd]),
        "npu": ResourceSpecFactory(name="ascend whole", accelerator_models=[ascend]),
    }


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("vendor=amd", {"nvidia or amd", "amd whole"}),
        ("vendor=nvidia", {"nvidia whole", "nvidia slice", "nvidia or amd"}),
        ("model=mi300x-test", {"nvidia or amd", "amd whole"}),
        ("model=h100-test", {"nvidia whole", "nvidia slice", "nvidia or amd"}),
        ("kind=npu", {"ascend whole"}),
        ("kind=gpu", {"nvidia whole", "nvidia slice", "nvidia or amd", "amd whole"}),
        ("slice=true", {"nvidia slice"}),
        ("slice=false", {"nvidia whole", "nvidia or amd", "amd whole", "ascend whole"}),
        ("vendor=nvidia&slice=false", {"nvidia whole", "nvidia or amd"}),
        ("vendor=intel-gaudi", set()),
    ],
)
def test_spec_filters(api_as, roles, mixed_specs, query, expected):
    assert _names(api_as(roles.developer), f"{BASE}/specs/?{query}") == expected


def test_spec_vendor_filter_lists_a_multi_model_spec_once(api_as, roles):
    ResourceSpecFactory(accelerator_models=[AcceleratorModelFactory(), AcceleratorModelFactory()])
    body = _get(api_as(roles.developer), f"{BASE}/specs/?vendor=nvidia")
    assert body["count"] == 1
    assert len(body["results"]) == 1


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("vendor=amd", {"rocm-image", "multi-image"}),
        ("vendor=nvidia", {"cuda-image", "multi-image"}),
        ("runtime=rocm", {"rocm-image"}),
        ("runtime=cann", set()),
        ("vendor=nvidia&runtime=cuda", {"cuda-image", "multi-image"}),
    ],
)
def test_image_filters(api_as, roles, query, expected):
    ImageFactory(name="cuda-image", runtime=Runtime.CUDA, compatible_vendors=[vendor("nvidia")])
    ImageFactory(name="rocm-image", runtime=Runtime.ROCM, compatible_vendors=[vendor("amd")])
    ImageFactory(name="multi-image", runtime=Runtime.CUDA, compatible_vendors=[vendor("nvidia"), vendor("amd")])
    assert _names(api_as(roles.developer), f"{BASE}/images/?{query}") == expected


@pytest.fixture
def mixed_services():
    nvidia = AcceleratorModelFactory(vendor=vendor("nvidia"))
    amd = AcceleratorModelFactory(vendor=vendor("amd"))
    nvidia_specs = [ResourceSpecFactory(accelerator_models=[nvidia]) for _ in range(2)]
    ServiceFactory(name="nvidia compute", specs=nvidia_specs)
    ServiceFactory(name="amd compute", specs=[ResourceSpecFactory(accelerator_models=[amd])])
    bare_metal = ServiceFactory(name="nvidia bare metal", kind=ServiceKind.BARE_METAL, specs=[], images=[])
    bare_metal.bare_metal_profiles.set([BareMetalProfileFactory(accelerator_model=nvidia)])
    serving = ServiceFactory(name="serving", kind=ServiceKind.MODEL_SERVING, specs=[], images=[])
    serving.serving_models.set([ServingModelFactory()])


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("kind=compute", {"nvidia compute", "amd compute"}),
        ("kind=bare_metal", {"nvidia bare metal"}),
        ("kind=model_serving", {"serving"}),
        ("vendor=nvidia", {"nvidia compute", "nvidia bare metal"}),
        ("vendor=amd", {"amd compute"}),
        ("vendor=nvidia&kind=bare_metal", {"nvidia bare metal"}),
        ("vendor=huawei-ascend", set()),
    ],
)
def test_service_filters(api_as, roles, mixed_services, query, expected):
    assert _names(api_as(roles.developer), f"{BASE}/services/?{query}") == expected


def test_service_vendor_filter_lists_each_service_once(api_as, roles, mixed_services):
    body = _get(api_as(roles.developer), f"{BASE}/services/?vendor=nvidia")
    assert body["count"] == len(body["results"]) == 2


def test_service_vendor_filter_respects_visibility(api_as, roles):
    hidden = ServiceFactory(visibility=Visibility.RESTRICTED)
    hidden.visible_projects.set([roles.other_project])
    assert _names(api_as(roles.developer), f"{BASE}/services/?vendor=nvidia") == set()


@pytest.mark.parametrize(("query", "expected"), [("vendor=amd", {"amd server"}), ("vendor=nvidia", {"nvidia server"})])
def test_bare_metal_profile_filters(api_as, roles, query, expected):
    nvidia = AcceleratorModelFactory(vendor=vendor("nvidia"))
    BareMetalProfileFactory(name="nvidia server", accelerator_model=nvidia)
    amd = AcceleratorModelFactory(vendor=vendor("amd"))
    BareMetalProfileFactory(
        name="amd server", accelerator_model=amd, os_image=ImageFactory(compatible_vendors=[vendor("amd")])
    )
    assert _names(api_as(roles.developer), f"{BASE}/bare-metal-profiles/?{query}") == expected


@pytest.mark.parametrize(
    ("endpoint", "query", "field"),
    [
        ("specs", "kind=bogus", "kind"),
        ("services", "kind=bogus", "kind"),
        ("images", "runtime=bogus", "runtime"),
        ("bare-metal-profiles", "kind=tpu", "kind"),
    ],
)
def test_invalid_filter_choice_is_a_400_validation_error(api_as, roles, endpoint, query, field):
    response = api_as(roles.developer).get(f"{BASE}/{endpoint}/?{query}")
    assert response.status_code == 400
    body = response.json()
    _assert_error_shape(body, "validation_error")
    assert field in body["details"]
    assert field in body["message"]


# --- pagination -----------------------------------------------------------------------------------------


def test_page_size_limits_results_and_links_next_page(api_as, roles):
    for _ in range(3):
        ImageFactory()
    client = api_as(roles.developer)
    body = _get(client, f"{BASE}/images/?page_size=2")
    assert len(body["results"]) == 2
    assert body["count"] == 3
    assert body["next"] and "page=2" in body["next"]
    second = _get(client, body["next"])
    assert len(second["results"]) == 1
    assert second["next"] is None


def test_page_out_of_range_is_404_in_error_shape(api_as, roles):
    ImageFactory()
    response = api_as(roles.developer).get(f"{BASE}/images/?page=999")
    assert response.status_code == 404
    _assert_error_shape(response.json(), "not_found")


def test_unknown_api_path_is_404_in_error_shape(api_as, roles):
    response = api_as(roles.developer).get(f"{BASE}/no-such-thing/")
    assert response.status_code == 404
    _assert_error_shape(response.json(), "not_found")


def test_catalog_is_read_only(api_as, roles):
    response = api_as(roles.operator).post(f"{BASE}/specs/", {"name": "x"})
    assert response.status_code == 405
    _assert_error_shape(response.json(), "method_not_allowed")


# --- query counts: constant per page, however many rows and relations ----------------------------------


def _rich_spec():
    slice_profile = SliceProfileFactory()
    return ResourceSpecFactory(
        accelerator_models=[slice_profile.accelerator, AcceleratorModelFactory()],
        slice_profile=slice_profile,
        accelerator_count=1,
    )


def _rich_service():
    specs = [_rich_spec(), ResourceSpecFactory(), _deprecated_spec()]
    images = [ImageFactory(compatible_vendors=[vendor("nvidia"), vendor("amd")]), ImageFactory(approved=False)]
    service = ServiceFactory(specs=specs, images=images)
    service.bare_metal_profiles.set([BareMetalProfileFactory()])
    templates = [ServingTemplateFactory(), ServingTemplateFactory()]
    service.serving_models.set([ServingModelFactory(templates=templates)])
    return service


def _restricted_service(roles):
    service = _rich_service()
    service.visibility = Visibility.RESTRICTED
    service.save()
    service.visible_projects.set([roles.project])
    service.visible_tenants.set([roles.project.tenant])
    return service


ROW_MAKERS = {
    "services": lambda roles: _rich_service() if roles is None else _restricted_service(roles),
    "specs": lambda roles: _rich_spec(),
    "images": lambda roles: ImageFactory(compatible_vendors=[vendor("nvidia"), vendor("intel-gaudi")]),
    "bare-metal-profiles": lambda roles: BareMetalProfileFactory(),
    "serving-models": lambda roles: ServingModelFactory(
        templates=[ServingTemplateFactory(), ServingTemplateFactory(spec=_rich_spec())]
    ),
}


def _count_queries(client, url) -> tuple[int, dict]:
    with CaptureQueriesContext(connection) as queries:
        body = _get(client, url)
    return len(queries), body


def _add_rows(endpoint, roles, count):
    for n in range(count):
        ROW_MAKERS[endpoint](roles if n % 2 else None)


@pytest.mark.parametrize("who", ["developer", "operator"])
@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_list_query_count_is_constant(api_as, roles, endpoint, who):
    client = api_as(getattr(roles, who))
    url = f"{BASE}/{endpoint}/"
    _add_rows(endpoint, roles, 2)
    _get(client, url)  # warm caches (content types, permissions) so both measurements are alike
    few, few_body = _count_queries(client, url)
    _add_rows(endpoint, roles, 8)
    many, many_body = _count_queries(client, url)
    assert many_body["count"] == 10
    assert few_body["count"] == 2
    assert many == few, f"{endpoint}: {few} queries for 2 rows, {many} for 10"
    assert few <= 15


@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_detail_query_count_is_bounded(api_as, roles, endpoint, django_assert_max_num_queries):
    _add_rows(endpoint, roles, 1)
    client = api_as(roles.developer)
    row_id = _get(client, f"{BASE}/{endpoint}/")["results"][0]["id"]
    with django_assert_max_num_queries(12):
        _get(client, f"{BASE}/{endpoint}/{row_id}/")
