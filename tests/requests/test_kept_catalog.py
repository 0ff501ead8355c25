"""What orders are checked against and routed by, kept per process (catalog/orderable.py, the approval rules):
a change, however it is written, applies to the very next order; nothing changed costs one query."""

import pytest

from catalog.choices import SpecStatus
from catalog.models import ResourceSpec
from catalog.orderable import orderable_catalog
from requests.approvals import matching_rule
from requests.models import ApprovalPolicy, ApprovalRule
from requests.orders import Order, OrderInvalid, approval_facts, size_order, validate_order

pytestmark = pytest.mark.django_db
PREVIEW = "/api/v1/requests/preview/"


def _order(shop, team) -> Order:
    return Order(service=shop.service, project=team.project, spec=shop.whole, image=shop.image, duration_hours=4)


def test_an_order_is_checked_against_the_catalog_as_it_is_now(api_as, shop, team):
    """A spec deprecated behind the admin's back (a bulk update, no save()) is refused at the very next order."""
    api = api_as(team.developer)
    body = {"service": shop.service.pk, "project": team.project.pk, "spec": shop.whole.pk, "image": shop.image.pk,
            "duration_hours": 4}  # fmt: skip
    assert api.post(PREVIEW, body, format="json").status_code == 200  # the process keeps the catalog now
    ResourceSpec.objects.filter(pk=shop.whole.pk).update(
        status=SpecStatus.DEPRECATED, deprecated_at="2026-01-01T00:00Z", deprecation_reason="end of life"
    )
    refused = api.post("/api/v1/requests/", body, format="json")
    assert (refused.status_code, refused.json()["code"]) == (422, "spec_deprecated")


def test_an_item_no_longer_offered_is_refused_at_the_next_order(shop, team):
    validate_order(_order(shop, team), team.developer)
    shop.service.specs.remove(shop.whole)  # an m2m write, no save() of the service
    with pytest.raises(OrderInvalid) as refusal:
        validate_order(_order(shop, team), team.developer)
    assert refusal.value.code == "spec_not_offered"


def test_the_catalog_of_an_order_is_read_with_one_query_while_nothing_changed(shop, django_assert_num_queries):
    orderable_catalog()
    with django_assert_num_queries(1):
        catalog = orderable_catalog()
    assert list(catalog.get(ResourceSpec, shop.whole.pk).accelerator_models.all()) == [shop.accelerator]


def test_approval_rules_apply_to_the_next_order_however_they_change(shop, team):
    order = _order(shop, team)
    facts = approval_facts(order, size_order(order), team.developer, quota_exception=False)
    assert matching_rule(facts) is None
    policy = ApprovalPolicy.objects.create(name="Everything", subject=facts.subject)
    rule = ApprovalRule.objects.create(policy=policy, name="all orders")
    assert matching_rule(facts) == rule
    ApprovalPolicy.objects.filter(pk=policy.pk).update(active=False)
    assert matching_rule(facts) is None
