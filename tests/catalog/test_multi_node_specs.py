"""Multi-node specs: node count and topology requirement, their constraints and validation, and the totals every
count of the whole spec reads (cards, CPU, memory, GPU equivalents, price)."""

from decimal import Decimal

import pytest
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction

from catalog.choices import TopologyLevel, TopologyMode
from tests.factories import AcceleratorModelFactory, ResourceSpecFactory, SliceProfileFactory, UserFactory, token_for

pytestmark = pytest.mark.django_db


def gang_spec(**fields):
    model = AcceleratorModelFactory(memory_gb=80)
    values = {
        "accelerator_models": [model],
        "accelerator_count": 8,
        "cpu_cores": 96,
        "memory_gb": 1536,
        "hourly_price": Decimal("3.90"),
        "node_count": 4,
        "topology_level": TopologyLevel.BLOCK,
        "topology_mode": TopologyMode.REQUIRED,
    }
    return ResourceSpecFactory(**{**values, **fields})


def test_a_gang_spec_counts_every_node():
    spec = gang_spec()
    assert spec.is_gang
    assert (spec.total_accelerator_count, spec.total_cpu_cores, spec.total_memory_gb) == (32, 384, 6144)
    assert spec.gpu_equivalents == Decimal(32)
    assert spec.accelerator_memory_gb == 32 * 80
    assert spec.hourly_cost == Decimal("124.80")
    assert spec.topology_text == "4 nodes, one block"
    spec.topology_mode = TopologyMode.PREFERRED
    assert spec.topology_text == "4 nodes, one block preferred"


def test_a_one_node_spec_is_counted_as_before():
    spec = ResourceSpecFactory(accelerator_count=2, cpu_cores=16, memory_gb=128)
    assert not spec.is_gang and spec.node_count == 1 and spec.topology_level == TopologyLevel.NODE
    assert (spec.total_accelerator_count, spec.total_cpu_cores, spec.total_memory_gb) == (2, 16, 128)
    assert spec.topology_text == ""


@pytest.mark.parametrize(
    ("fields", "constraint"),
    [
        ({"node_count": 65}, "spec_node_count_in_bounds"),
        ({"topology_level": TopologyLevel.NODE}, "spec_gang_whole_cards_in_a_domain"),
        ({"node_count": 1}, "spec_gang_whole_cards_in_a_domain"),  # one node asks for no domain
        ({"topology_mode": "sometimes"}, "spec_topology_mode_valid"),
    ],
)
def test_the_database_refuses_an_impossible_gang(fields, constraint):
    with pytest.raises(IntegrityError) as raised, transaction.atomic():
        gang_spec(**fields)
    assert constraint in str(raised.value)


def test_the_database_refuses_a_gang_of_slices():
    model = AcceleratorModelFactory()
    profile = SliceProfileFactory(accelerator=model)
    with pytest.raises(IntegrityError) as raised, transaction.atomic():
        gang_spec(accelerator_models=[model], accelerator_count=1, slice_profile=profile)
    assert "spec_gang_whole_cards_in_a_domain" in str(raised.value)


def test_validation_explains_each_mistake_on_its_field():
    spec = gang_spec()
    spec.topology_level = TopologyLevel.NODE
    with pytest.raises(ValidationError) as raised:
        spec.full_clean()
    assert "choose a rack, block or site" in str(raised.value.message_dict["topology_level"])
    spec.topology_level, spec.node_count = TopologyLevel.RACK, 65
    with pytest.raises(ValidationError) as raised:
        spec.full_clean()
    assert "node_count" in raised.value.message_dict
    single = ResourceSpecFactory()
    single.topology_level = TopologyLevel.RACK
    with pytest.raises(ValidationError) as raised:
        single.full_clean()
    assert "one node" in str(raised.value.message_dict["topology_level"])


def test_validation_refuses_slices_on_several_nodes():
    model = AcceleratorModelFactory()
    spec = gang_spec(accelerator_models=[model], node_count=1, topology_level=TopologyLevel.NODE, accelerator_count=1)
    spec.slice_profile = SliceProfileFactory(accelerator=model)
    spec.node_count, spec.topology_level = 2, TopologyLevel.RACK
    with pytest.raises(ValidationError) as raised:
        spec.full_clean()
    assert "whole cards on each node" in str(raised.value.message_dict["slice_profile"])


def test_the_catalog_api_shows_nodes_topology_and_totals(client):
    spec = gang_spec()
    response = client.get(f"/api/v1/catalog/specs/{spec.pk}/", HTTP_AUTHORIZATION=f"Token {token_for(UserFactory())}")
    body = response.json()
    assert (body["node_count"], body["topology_level"], body["topology_mode"]) == (4, "block", "required")
    assert body["accelerator_count"] == 8 and body["total_accelerator_count"] == 32
    assert Decimal(body["hourly_cost"]) == Decimal("124.80")
