"""The gang benchmark run tiny (one seed, the openb fleet once, the first arrivals): every variant reports its
figures, the platform never places a gang outside its required domain, and the opening table reads the platform
beside Slurm-tree."""

import pytest

from bench import gang
from bench.headline import Headline
from bench.report import gang as gang_report


@pytest.fixture(scope="module")
def summary():
    return gang.run(gang.openb_dir(), scale=1, seeds=[42], max_arrivals=3000)


def test_every_variant_reports_its_figures(summary):
    assert summary["nodes"] == 1213 and set(summary["variants"]) == set(gang.VARIANTS)
    for row in summary["variants"].values():
        assert row["gangs"] > 0 and 0 <= row["gangs_placed"] <= row["gangs"]
        assert row["decisions_per_s"] > 0
    assert summary["mix"]["rack_size"] == 16 and summary["mix"]["racks_per_block"] == 8


def test_the_platform_and_slurm_tree_keep_required_domains_and_first_fit_does_not(summary):
    variants = summary["variants"]
    assert variants["platform"]["violations"] == 0 and variants["slurm-tree"]["violations"] == 0
    assert variants["first-fit"]["violations"] > 0  # topology-blind: what the baseline is there to show


def test_the_tree_files_sixteen_nodes_a_rack_and_eight_racks_a_block():
    nodes = gang.topology_tree(gang.traces.read_nodes(str(gang.openb_dir() / gang.NODES_FILE)), seed=1)
    racks = {}
    for node in nodes:
        racks.setdefault(node.rack, set()).add(node.block)
        assert node.site == "openb"
    assert all(len(blocks) == 1 for blocks in racks.values())
    sizes = sorted(sum(1 for node in nodes if node.rack == rack) for rack in racks)
    assert sizes == [1213 % 16] + [16] * (len(racks) - 1)  # the last rack holds what is left
    blocks = {node.block for node in nodes}
    assert len(blocks) == -(-len(racks) // 8)


def test_the_headline_reads_the_platform_beside_slurm_tree(summary):
    rows = gang_report.rows_of(summary)
    line = gang_report.headline(rows)
    assert isinstance(line, Headline) and line.figure.startswith("platform alloc@100 ")
    assert line.baseline.startswith("slurm-tree ") and "ceiling (hindsight bound)" in line.baseline
    assert rows[-1]["variant"] == gang_report.CEILING and rows[-1]["alloc@100 %"] != "n/a"
