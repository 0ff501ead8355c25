"""Orders of a multi-node spec: quota, cost, approval and the approved snapshot count the whole gang (nodes x cards
per node), from the spec's totals."""

from decimal import Decimal

import pytest

from catalog.choices import TopologyLevel, TopologyMode
from requests import services
from requests.choices import OverQuota, RequestState
from requests.orders import approval_facts, size_order
from requests.services import QuotaExceeded
from tenancy.models import ProjectQuota
from tests import factories
from tests.requests.conftest import make_order

pytestmark = pytest.mark.django_db


@pytest.fixture
def gang(shop):
    """2 nodes x the shop's whole-card shape (2 cards of 80 GB, 16 cores, 128 GB per node), one rack."""
    spec = factories.ResourceSpecFactory(
        accelerator_models=[shop.accelerator],
        accelerator_count=2,
        cpu_cores=16,
        memory_gb=128,
        hourly_price=Decimal("4.00"),
        node_count=2,
        topology_level=TopologyLevel.RACK,
        topology_mode=TopologyMode.REQUIRED,
    )
    shop.service.specs.add(spec)
    return spec


def test_sizing_counts_every_node(shop, team, gang):
    sizing = size_order(make_order(shop, team.project, spec=gang))
    assert (sizing.gpu_equivalents, sizing.accelerator_count) == (Decimal(4), 4)
    assert (sizing.accelerator_memory_gb, sizing.cpu_cores, sizing.memory_gb) == (320, 32, 256)
    assert (sizing.hourly_cost, sizing.cost_estimate, sizing.card_hours) == (Decimal(16), Decimal(160), Decimal(40))
    facts = approval_facts(make_order(shop, team.project, spec=gang), sizing, team.developer, quota_exception=False)
    assert facts.accelerator_count == 4


def test_quota_refuses_a_gang_whose_whole_exceeds_it_where_one_node_would_fit(shop, team, gang):
    ProjectQuota.objects.filter(project=team.project).update(gpus=3)
    assert (
        services.request_submit(
            order=make_order(shop, team.project), requester=team.developer, over_quota=OverQuota.REJECT
        ).state
        == RequestState.QUEUED
    )  # one node's worth: 2 cards
    with pytest.raises(QuotaExceeded) as refusal:
        services.request_submit(
            order=make_order(shop, team.project, spec=gang), requester=team.developer, over_quota=OverQuota.REJECT
        )
    [reason] = refusal.value.details["reasons"]
    assert (reason["dimension"], Decimal(str(reason["requested"])), Decimal(str(reason["limit"]))) == (
        "gpus",
        Decimal(4),
        Decimal(3),
    )


def test_the_approved_snapshot_keeps_the_per_node_shape_and_the_gang(shop, team, gang):
    request = services.request_submit(
        order=make_order(shop, team.project, spec=gang), requester=team.developer, over_quota=OverQuota.REJECT
    )
    frozen = request.approved_spec
    assert frozen["spec"]["accelerator_count"] == 2 and frozen["spec"]["nodes"] == 2
    assert frozen["spec"]["topology"] == {"level": "rack", "mode": "required"}
    assert frozen["demand"]["accelerator_count"] == 4 and frozen["demand"]["cpu_cores"] == 32


def test_the_catalog_page_says_what_a_gang_is(client, shop, team, gang):
    client.force_login(team.developer)
    page = client.get(f"/?project={team.project.pk}").content.decode()
    shown = 'data-nodes="2">2 nodes, one rack: 2 cards, 16 CPU cores and 128 GiB on each node, 4 cards in all</div>'
    assert shown in page
    row = page[page.index(f'data-offer="{gang.slug}"') :]
    assert row[: row.index("</tr>")].count('<td class="num">16.00') == 1  # per hour: 2 cards x 2 nodes x 4.00
