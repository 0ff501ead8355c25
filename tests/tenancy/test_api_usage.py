"""Current usage on /api/v1/projects/: supplied through tenancy.hooks by the request workflow, once per page."""

from decimal import Decimal

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from config import hooks
from requests import services
from requests.orders import Order
from requests.quota import month_start, usage_by_project
from tenancy import hooks as tenancy_hooks
from tenancy import services as tenancy_services
from tenancy.choices import QuotaDimension
from tenancy.models import MonthlyUsage
from tests import factories

pytestmark = pytest.mark.django_db

PROJECTS = "/api/v1/projects/"


def usage_of(response, project) -> dict:
    assert response.status_code == 200, response.content
    return next(row["usage"] for row in response.json()["results"] if row["id"] == project.pk)


@pytest.fixture
def order_for(db):
    """Orders of 2 cards, 16 cores and 128 GB for 10 hours, from a service open to every project."""
    spec = factories.ResourceSpecFactory(accelerator_count=2, cpu_cores=16, memory_gb=128)
    image = factories.ImageFactory()
    service = factories.ServiceFactory(specs=[spec], images=[image])
    return lambda project: Order(service=service, project=project, duration_hours=10, spec=spec, image=image)


@pytest.fixture
def busy(order_for):
    """A project whose developer holds one queued request."""
    project = factories.project()
    developer = factories.member(project)
    services.request_submit(order=order_for(project), requester=developer)
    return project, developer


def test_the_request_workflow_registers_the_usage_provider():
    assert hooks.get(tenancy_hooks.PROJECT_USAGE) is usage_by_project


def test_projects_list_shows_current_usage_per_dimension(api_as, busy):
    project, developer = busy

    usage = usage_of(api_as(developer).get(PROJECTS), project)

    assert set(usage) == set(QuotaDimension.values)
    assert Decimal(usage["gpus"]) == 2
    assert (usage["cpu_cores"], usage["memory_gb"], usage["concurrent_tasks"]) == (16, 128, 1)
    assert Decimal(usage["monthly_card_hours"]) == 20


def test_project_detail_shows_usage_too(api_as, busy):
    project, developer = busy

    usage = api_as(developer).get(f"{PROJECTS}{project.pk}/").json()["usage"]

    assert usage["concurrent_tasks"] == 1


def test_usage_is_null_without_a_provider(api_as, busy, monkeypatch):
    project, developer = busy
    monkeypatch.delitem(hooks._registered, tenancy_hooks.PROJECT_USAGE.name)

    assert usage_of(api_as(developer).get(PROJECTS), project) is None


def test_the_provider_is_asked_once_for_the_whole_page(api_as, busy, monkeypatch):
    project, developer = busy
    second = factories.project()
    factories.member(second, user=developer)
    calls = []
    monkeypatch.setitem(
        hooks._registered, tenancy_hooks.PROJECT_USAGE.name, lambda ids: calls.append(ids) or usage_by_project(ids)
    )

    api_as(developer).get(PROJECTS)

    assert len(calls) == 1 and sorted(calls[0]) == sorted([project.pk, second.pk])


def test_usage_by_project_keeps_projects_apart_and_adds_the_metered_ledger(busy):
    project, _developer = busy
    idle = factories.project()
    MonthlyUsage.objects.create(project=idle, month=month_start(), card_hours=Decimal("3.5"))

    usage = usage_by_project([project.pk, idle.pk])

    assert usage[project.pk]["concurrent_tasks"] == 1
    assert usage[idle.pk] == {
        "gpus": 0,
        "accelerator_memory_gb": 0,
        "cpu_cores": 0,
        "memory_gb": 0,
        "concurrent_tasks": 0,
        "monthly_card_hours": Decimal("3.5"),
    }


def test_projects_list_query_count_with_usage_does_not_grow_with_projects(api_as, order_for):
    developer = factories.UserFactory()

    def another_busy_project():
        project = factories.project()
        tenancy_services.tenant_quota_ensure(tenant=project.tenant, actor=None)
        services.request_submit(order=order_for(project), requester=factories.member(project, user=developer))

    another_busy_project()
    client = api_as(developer)
    client.get(PROJECTS)  # warm per-process caches (content types) before measuring

    with CaptureQueriesContext(connection) as few:
        client.get(PROJECTS)
    for _ in range(6):
        another_busy_project()
    with CaptureQueriesContext(connection) as many:
        response = client.get(PROJECTS)

    assert response.json()["count"] == 7
    assert all(row["usage"]["concurrent_tasks"] == 1 for row in response.json()["results"])
    assert len(few) == len(many)
