"""Inventory topology: blocks and racks from inventory files and from Slurm's topology.conf, and what the engine
sees of them (a node without a rack is its own rack)."""

from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from scheduling import cycle
from scheduling.models import Block, Node, Rack
from scheduling.slurm.topology import TopologyError, expand_hostlist, parse_topology
from tests.factories import AcceleratorModelFactory

TOPOLOGY_CONF = """
# two leaf switches under one spine, a third leaf on its own
SwitchName=leaf1 Nodes=gpu[01-02]
SwitchName=leaf2 Nodes=gpu03,gpu04
SwitchName=leaf3 Nodes=gpu05
SwitchName=spine1 Switches=leaf[1-2]
"""


def test_hostlists_expand_with_their_padding():
    assert expand_hostlist("gpu[01-03,07],login1") == ["gpu01", "gpu02", "gpu03", "gpu07", "login1"]
    assert expand_hostlist("n[8-10]") == ["n8", "n9", "n10"]
    with pytest.raises(TopologyError):
        expand_hostlist("n[a-b]")


def test_leaf_switches_are_racks_and_their_parents_blocks():
    assert parse_topology(TOPOLOGY_CONF) == {
        "gpu01": ("leaf1", "spine1"),
        "gpu02": ("leaf1", "spine1"),
        "gpu03": ("leaf2", "spine1"),
        "gpu04": ("leaf2", "spine1"),
        "gpu05": ("leaf3", ""),
    }


@pytest.mark.parametrize("text", ["Nodes=gpu01", "SwitchName=leaf1 Nodes"])
def test_a_line_it_cannot_read_is_named(text):
    with pytest.raises(TopologyError, match="line 1"):
        parse_topology(text)


def run_import(path, *options) -> str:
    out = StringIO()
    call_command("import_inventory", str(path), *options, stdout=out)
    return out.getvalue()


@pytest.mark.django_db
def test_csv_and_yaml_file_racks_into_blocks_and_the_engine_sees_them(tmp_path):
    AcceleratorModelFactory(slug="h100-80gb", name="H100 80GB", memory_gb=80)
    csv = tmp_path / "inventory.csv"
    csv.write_text(
        "name,cpu_cores,memory_gib,site,block,rack,gpu_model,gpu_count\n"
        "a1,64,512,dc1,b1,r1,h100-80gb,8\n"
        "a2,64,512,dc1,b1,r2,h100-80gb,8\n"
        "a3,64,512,dc1,,,h100-80gb,8\n"
    )
    assert "3 created" in run_import(csv)
    yaml = tmp_path / "inventory.yaml"
    yaml.write_text("site: dc1\nblock: b2\nnodes:\n  - {name: y1, cpu_cores: 8, memory_gib: 64, rack: r3}\n")
    assert "1 created" in run_import(yaml)
    assert sorted(Rack.objects.values_list("name", "block__name")) == [
        ("default", None),
        ("r1", "b1"),
        ("r2", "b1"),
        ("r3", "b2"),
    ]
    views = {node.name: (node.site, node.block, node.rack) for node in cycle.load_inventory()}
    assert views == {
        "a1": ("dc1", "b1", "r1"),
        "a2": ("dc1", "b1", "r2"),
        "a3": ("dc1", "", ""),  # filed under the import's placeholder rack: a rack of its own for gangs
        "y1": ("dc1", "b2", "r3"),
    }
    assert "0 created, 0 updated, 3 unchanged" in run_import(csv)


@pytest.mark.django_db
def test_a_rack_named_in_two_blocks_is_refused_and_nothing_is_imported(tmp_path):
    csv = tmp_path / "inventory.csv"
    csv.write_text("name,cpu_cores,memory_gib,site,block,rack\nx1,8,64,dc1,b1,r1\nx2,8,64,dc1,b2,r1\n")
    with pytest.raises(CommandError, match="rack r1 is in block b1 on another line, not b2"):
        run_import(csv)
    assert not Node.objects.exists() and not Block.objects.exists()


@pytest.mark.django_db
def test_from_slurm_files_nodes_by_topology_conf(slurm_settings, tmp_path):
    AcceleratorModelFactory(slug="a100", name="A100 (Slurm)")
    first, second, third = slurm_settings.node_names[:3]
    conf = tmp_path / "topology.conf"
    conf.write_text(
        f"SwitchName=leaf1 Nodes={first},{second}\nSwitchName=leaf2 Nodes={third}\n"
        "SwitchName=spine Switches=leaf[1-2]\n"
    )
    out = StringIO()
    call_command("import_inventory", "--from-slurm", "--site", "lab", "--topology-conf", str(conf), stdout=out)
    placed = dict(Node.objects.filter(name__in=[first, second, third]).values_list("name", "rack__name"))
    assert placed == {first: "leaf1", second: "leaf1", third: "leaf2"}
    assert set(Rack.objects.filter(site__name="lab").values_list("block__name", flat=True)) == {"spine"}
