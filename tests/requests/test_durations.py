"""Issue 12 item 10: the duration limit is one number everywhere: the smallest of the service's, the spec's, the
serving template's and the bare-metal profile's maxima, in the form, the preview, the catalog and the API."""

import pytest

from catalog.choices import ServiceKind
from catalog.durations import duration_limits, max_duration_hours
from requests import services
from requests.forms import OrderForm
from requests.models import ResourceRequest
from requests.orders import Order, OrderInvalid, validate_order
from tests import factories
from tests.requests.conftest import make_order

pytestmark = pytest.mark.django_db


@pytest.fixture
def serving(shop):
    """The demo's serving service in miniature: default 720 h, maximum 2160 h, its spec capped at 336 h."""
    spec = factories.ResourceSpecFactory(
        accelerator_models=[shop.accelerator], accelerator_count=1, max_duration_hours=336
    )
    template = factories.ServingTemplateFactory(spec=spec)
    model = factories.ServingModelFactory(templates=[template])
    service = factories.ServiceFactory(
        kind=ServiceKind.MODEL_SERVING, specs=[spec], images=[], default_duration_hours=720, max_duration_hours=2160
    )
    service.serving_models.set([model])
    return Order(
        service=service, project=None, duration_hours=720, spec=spec, serving_model=model, serving_template=template
    )


def test_the_limit_is_the_smallest_of_every_maximum(serving):
    serving.serving_template.spec = factories.ResourceSpecFactory(max_duration_hours=100)
    assert duration_limits(serving.service, spec=serving.spec, serving_template=serving.serving_template) == {
        "service": 2160,
        "spec": 336,
        "serving_template": 100,
    }
    assert max_duration_hours(serving.service, spec=serving.spec, serving_template=serving.serving_template) == 100


def test_the_form_defaults_validates_and_hints_within_the_spec_s_cap(serving, team):
    form = OrderForm(user=team.developer, service=serving.service)
    field = form.fields["duration_hours"]
    assert field.initial == 336  # the service's 720 h default, clamped: it used to be refused on submission
    assert (field.max_value, field.widget.attrs["max"]) == (336, 336)
    assert field.help_text.startswith("Up to 336 hours.")

    data = {
        "project": team.project.pk,
        "spec": serving.spec.pk,
        "serving_model": serving.serving_model.pk,
        "serving_template": serving.serving_template.pk,
        "duration_hours": 720,
        "priority": "standard",
        "justification": "",
        "over_quota": "reject",
    }
    bound = OrderForm(data, user=team.developer, service=serving.service)
    assert not bound.is_valid()
    assert "less than or equal to 336" in bound.errors["duration_hours"][0]
    assert OrderForm({**data, "duration_hours": 336}, user=team.developer, service=serving.service).is_valid()


def test_the_form_hint_names_each_choice_s_limit_when_they_differ(shop, team):
    shop.sliced.max_duration_hours = 48
    shop.sliced.save()
    form = OrderForm(user=team.developer, service=shop.service)
    hint = form.fields["duration_hours"].help_text
    assert f"{shop.whole.name}: 168 h" in hint and f"{shop.sliced.name}: 48 h" in hint
    shop.service.specs.add(
        factories.ResourceSpecFactory(accelerator_models=[shop.accelerator], max_duration_hours=500)
    )  # capped at the service's 168
    hint = OrderForm(user=team.developer, service=shop.service).fields["duration_hours"].help_text
    assert hint.endswith(f"By choice: {shop.sliced.name}: 48 h; the others: 168 h.")


def test_the_order_page_renders_the_clamped_default_and_max(client, serving, team):
    client.force_login(team.developer)
    body = client.get(f"/order/{serving.service.slug}/").content.decode()
    assert 'name="duration_hours" value="336"' in body and 'max="336"' in body
    assert "Up to 2160 hours" not in body


def test_validation_refuses_above_the_template_s_spec_with_every_limit(serving, team):
    serving.project = team.project
    serving.serving_template.spec = factories.ResourceSpecFactory(max_duration_hours=100)
    serving.duration_hours = 200
    with pytest.raises(OrderInvalid) as refusal:
        validate_order(serving, team.developer)
    assert refusal.value.code == "duration_out_of_range"
    assert refusal.value.details["maximum"] == 100
    assert refusal.value.details["limits"] == {"service": 2160, "spec": 336, "serving_template": 100}


def test_the_preview_states_the_limit_that_applies(api_as, shop, team):
    shop.sliced.max_duration_hours = 48
    shop.sliced.save()
    body = {
        "service": shop.service.pk,
        "project": team.project.pk,
        "spec": shop.sliced.pk,
        "image": shop.image.pk,
        "duration_hours": 10,
    }
    response = api_as(team.developer).post("/api/v1/requests/preview/", body)
    assert response.status_code == 200, response.content
    assert response.json()["duration"] == {"requested": 10, "maximum": 48, "limits": {"service": 168, "spec": 48}}
    assert (
        services.request_preview(order=make_order(shop, team.project, spec=shop.sliced), requester=team.developer)[
            "duration"
        ]["maximum"]
        == 48
    )


def test_the_catalog_api_answers_the_limit_per_offering(api_as, shop, team, django_assert_max_num_queries):
    shop.sliced.max_duration_hours = 48
    shop.sliced.save()
    client = api_as(team.developer)
    detail = client.get(f"/api/v1/catalog/services/{shop.service.pk}/").json()
    assert {row["name"]: row["max_duration_hours"] for row in detail["durations"]} == {
        shop.whole.name: 168,
        shop.sliced.name: 48,
    }
    assert {row["name"]: row["default_duration_hours"] for row in detail["durations"]} == {
        shop.whole.name: 24,
        shop.sliced.name: 24,
    }
    assert detail["longest_duration_hours"] == 168
    for _ in range(3):
        factories.ServiceFactory()
    with django_assert_max_num_queries(12):
        rows = client.get("/api/v1/catalog/services/").json()
    rows = rows["results"] if isinstance(rows, dict) else rows
    assert all("durations" in row and "longest_duration_hours" in row for row in rows)


def test_the_catalog_page_shows_each_offering_s_own_limit(client, shop, team):
    shop.sliced.max_duration_hours = 48
    shop.sliced.save()
    client.force_login(team.developer)
    body = client.get("/").content.decode()
    assert "48 h" in body and "168 h" in body


def test_submission_refuses_the_old_default_and_accepts_the_clamped_one(serving, team):
    serving.project = team.project
    with pytest.raises(OrderInvalid):
        services.request_submit(order=serving, requester=team.developer)
    serving.duration_hours = 336
    assert services.request_submit(order=serving, requester=team.developer).duration_hours == 336
    assert ResourceRequest.objects.count() == 1
