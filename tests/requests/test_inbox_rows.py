"""The approval inbox builds its rows directly (ApprovalTaskListSerializer), not through DRF's fields: each row must
say byte for byte what ApprovalTaskSerializer says of the same task."""

from decimal import Decimal

import pytest
from rest_framework.renderers import JSONRenderer

from catalog.choices import ServiceKind
from requests import quota_changes, selectors, services
from requests.api.serializers import ApprovalTaskSerializer
from requests.models import ResourceRequest
from scheduling import services as scheduling_services
from tenancy import services as tenancy_services
from tenancy.choices import Role
from tests import factories
from tests.requests.conftest import GENEROUS_QUOTA, approval_rule, approver_stage, make_order
from tests.scheduling.inventory_helpers import clearance_holder, node

pytestmark = pytest.mark.django_db

APPROVALS = "/api/v1/approvals/"


def rendered(data) -> bytes:
    return JSONRenderer().render(data)


def each_through_drf(approver) -> bytes:
    return rendered([ApprovalTaskSerializer(task).data for task in selectors.approval_inbox(user=approver)])


@pytest.fixture
def inboxes(shop, team):
    """Tasks of every kind an inbox shows: requests (compute, bare metal, a served model, a quota exception) in two
    projects, one of them under a tenant cap; a quota change; an isolation clearance (no project)."""
    approval_rule(approver_stage())
    capped = factories.project(quota=GENEROUS_QUOTA)
    tenant_quota = tenancy_services.tenant_quota_ensure(tenant=capped.tenant, actor=None)
    tenancy_services.quota_set(quota=tenant_quota, limits={"gpus": Decimal(100)}, actor=None)
    factories.member(capped, Role.APPROVER, user=team.approver)

    def submitted(project, **fields) -> ResourceRequest:
        request = services.request_submit(order=make_order(shop, project), requester=factories.member(project))
        ResourceRequest.objects.filter(pk=request.pk).update(**fields)
        return request

    submitted(team.project)
    submitted(capped, quota_exception=True, justification="Deadline", cost_estimate=Decimal("1234567.80"))
    submitted(
        team.project,
        service=factories.ServiceFactory(kind=ServiceKind.BARE_METAL, specs=[], images=[]),
        spec=None,
        image=None,
        bare_metal_profile=factories.BareMetalProfileFactory(name="HGX node"),
    )
    submitted(capped, serving_model=factories.ServingModelFactory(name="Llama", version="3.1-70B"))
    quota_changes.quota_change_request_submit(
        project=team.project, limits={"gpus": Decimal(32), "cpu_cores": None}, justification="More", actor=team.lead
    )
    asking, deciding = clearance_holder(username="alice"), clearance_holder(username="bob")
    device = scheduling_services.device_isolate(device=node(devices=1).devices.get(), reason="XID 79", actor=None)
    scheduling_services.isolation_clearance_request(device=device, reason="Card reseated", actor=asking)
    return [team.approver, team.operator, deciding]


def test_inbox_rows_are_what_the_task_serializer_says_of_each_task(api_as, inboxes):
    for approver in inboxes:
        page = api_as(approver).get(APPROVALS).json()

        assert page["count"] > 0
        assert rendered(page["results"]) == each_through_drf(approver)


def test_the_inboxes_hold_every_kind_of_task(api_as, inboxes):
    rows = [row for approver in inboxes for row in api_as(approver).get(APPROVALS).json()["results"]]
    orders = [row["request"] for row in rows if row["request"] is not None]

    assert {row["request"]["service"]["kind"] for row in rows if row["request"]} == {"compute", "bare_metal"}
    assert any(request["serving_model"] for request in orders)
    assert any(request["quota_exception"] for request in orders)
    assert any(impact["scope"] == "tenant" for request in orders for impact in request["quota_impact"])
    assert any(row["quota_change"] for row in rows)
    assert any(row["project"] is None and row["request"] is None and row["quota_change"] is None for row in rows)
