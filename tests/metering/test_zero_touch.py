"""The zero-touch delivery KPI: requests delivered (active at some point) with no manual operator intervention."""

from datetime import date

import pytest

from metering.selectors import zero_touch_kpi
from requests import services as request_services
from requests.choices import EventCode, RequestState
from requests.orders import Order
from tests import factories
from tests.metering.conftest import delivered
from tests.requests.lifecycle import stored_request

pytestmark = pytest.mark.django_db


def kpi(user, first=date(2026, 10, 1), last=date(2026, 11, 1)):
    return [
        (row["service"], row["month"], row["delivered"], row["zero_touch"], row["interventions"], row["zero_touch_pct"])
        for row in zero_touch_kpi(user=user, first_month=first, last_month=last)
    ]


def test_share_delivered_without_touches_by_service_and_month(world):
    operator = factories.operator()
    other_service = factories.ServiceFactory(specs=[world.whole], images=[world.image], name="Another service")
    delivered(world, "2026-10-30 09:00")
    delivered(world, "2026-11-02 09:00")
    touched = delivered(world, "2026-11-03 09:00")
    request_services.request_release(request=touched, actor=operator, reason="node maintenance")  # a manual touch
    delivered(world, "2026-11-04 09:00", service=other_service)
    cancelled = stored_request(
        Order(service=world.service, project=world.project, duration_hours=4, spec=world.whole, image=world.image),
        world.developer,
        RequestState.QUEUED,
    )
    request_services.request_cancel(request=cancelled, actor=operator, reason="wrong project")  # never delivered
    delivered(world, "2026-09-15 09:00")  # before the months asked for
    assert kpi(operator) == [
        (world.service.slug, "2026-10", 1, 1, 0, 100.0),
        (other_service.slug, "2026-11", 1, 1, 0, 100.0),
        (world.service.slug, "2026-11", 2, 1, 1, 50.0),
    ]
    assert touched.events.get(code=EventCode.RELEASING).intervention is True
    assert cancelled.events.get(code=EventCode.CANCELLED).intervention is True


def test_a_requester_releasing_their_own_request_is_no_intervention(world):
    request = delivered(world, "2026-11-02 09:00")
    request_services.request_release(request=request, actor=world.project.lead, reason="done")  # its requester
    assert kpi(factories.operator(), first=date(2026, 11, 1)) == [(world.service.slug, "2026-11", 1, 1, 0, 100.0)]


def test_developers_see_the_kpi_of_their_projects_only(world):
    delivered(world, "2026-11-02 09:00")
    assert len(kpi(world.developer)) == 1
    assert kpi(factories.member(world.other_project)) == []


def test_the_kpi_of_one_project_and_the_usage_page_under_its_project_filter(world, client):
    operator = factories.operator()
    delivered(world, "2026-11-02 09:00")
    delivered(world, "2026-11-03 09:00", project=world.other_project)
    of_one = zero_touch_kpi(
        user=operator, first_month=date(2026, 11, 1), last_month=date(2026, 11, 1), project_id=world.other_project.pk
    )
    assert [row["delivered"] for row in of_one] == [1]
    client.force_login(operator)
    page = client.get(f"/usage/?project={world.other_project.pk}&from=2026-11&to=2026-11").content.decode()
    table = page[page.index('id="zero-touch-table"') :].split("</table>")[0]
    assert (
        table.count('<tr><td data-label="Month">2026-11</td>') == 1
        and '<td class="num" data-label="Delivered">1</td>' in table
    )
