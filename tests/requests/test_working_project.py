"""The catalog and the order form start on the project the person is working on: the one of their latest order,
else the first they may order on (so the demo's developer, whose latest runs were for LLM Pretraining, orders there
from every default form)."""

import re

import pytest

from requests import services
from tests import factories
from tests.requests.conftest import GENEROUS_QUOTA, make_order

pytestmark = pytest.mark.django_db


def selected_project(body: str) -> str:
    select = re.search(r'<select name="project".*?</select>', body, re.S).group(0)
    return re.search(r'<option value="(\d+)" selected>', select).group(1)


def test_the_catalog_and_the_order_form_start_on_the_project_of_the_latest_order(client, shop, team):
    first = team.project
    second = factories.project(tenant_obj=first.tenant, name="Zeta", quota=GENEROUS_QUOTA)
    factories.member(second, user=team.developer)
    client.force_login(team.developer)
    assert selected_project(client.get(f"/order/{shop.service.slug}/").content.decode()) == str(first.pk)

    services.request_submit(order=make_order(shop, second), requester=team.developer)
    assert selected_project(client.get(f"/order/{shop.service.slug}/").content.decode()) == str(second.pk)
    catalog = client.get("/").content.decode()
    assert f"/order/{shop.service.slug}/?project={second.pk}" in catalog
    linked = client.get(f"/order/{shop.service.slug}/?project={first.pk}").content.decode()
    assert selected_project(linked) == str(first.pk)  # a link's project wins
