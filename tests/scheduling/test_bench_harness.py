"""The openb harness on a tiny hand-computed trace."""

import json

from bench import placement
from bench import traces as bench
from bench.fleet import scaled_engine_nodes
from bench.traces import Pod

NODES = "sn,cpu_milli,memory_mib,gpu,model\nn0,8000,32768,2,T4\nn1,8000,32768,1,V100M16\n"
PODS = (
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\n"
    "p0,1000,1024,1,500,\np1,1000,1024,2,1000,T4\np2,1000,1024,1,1000,V100M16\np3,1000,1024,1,1000,T4\n"
)


def _files(tmp_path):
    (tmp_path / "nodes.csv").write_text(NODES)
    (tmp_path / "pods.csv").write_text(PODS)
    return str(tmp_path / "nodes.csv"), str(tmp_path / "pods.csv")


def test_workload_follows_the_protocol():
    pods = [Pod(f"p{k}", 0, 0, 1, 1000, frozenset()) for k in range(4)]
    same = bench.workload(pods, capacity=3000, seed=7, inflate=1.0)
    assert len(same) == 3 and sum(p.gpu_milli for p in same) == 3000  # trace above target: random pods dropped
    grown = bench.workload(pods, capacity=2000, seed=7, inflate=3.0)
    assert sum(p.gpu_milli for p in grown) == 6000 and {p.name for p in grown[:4]} == {f"p{k}" for k in range(4)}
    assert bench.workload(pods, 2000, 7, 3.0) == grown


def test_hand_computed_trace(tmp_path, monkeypatch):
    """Capacity 3000m (2 T4 on n0, 1 V100 on n1). Sequence p0 (500m any), p1 (2 x T4), p2 (1 x V100).

    BestFit scores p0: n0 leaves 7000m CPU and 1500m GPU -> int(100 * (1 - 7/128/2 - 1.5/8/2)) = 87; n1 leaves 500m
    GPU -> 94, so p0 shares the V100. p1 takes both T4s; p2 finds 500m left on the V100 and fails (capacity in use).
    Events: arrived 17%, 83%, 117% with allocated 500m, 2500m, 2500m; no event lands within 100 +- 1.
    """
    nodes_path, pods_path = _files(tmp_path)
    nodes, pods = bench.read_nodes(nodes_path), bench.read_pods(pods_path)
    assert [len(n.devices) for n in nodes] == [2, 1] and pods[1].spec == frozenset({"T4"})
    monkeypatch.setattr(bench, "workload", lambda *args: [pods[0], pods[1], pods[2]])
    result = bench.simulate(nodes, pods, "bestfit", seed=1, inflate=1.17)
    assert result["pods"] == 3 and result["reasons"] == {"capacity_in_use": 1}
    assert result["alloc_at_130"] == 100 * 2500 / 3000  # the figure at round(100 x inflate) = 117%
    assert result["alloc_at_100"] != result["alloc_at_100"]  # NaN: nothing arrived at 99-101%
    monkeypatch.setattr(bench, "workload", lambda *args: [pods[1], pods[2], pods[0]])
    result = bench.simulate(nodes, pods, "fgd", seed=1, inflate=1.0)
    assert result["alloc_at_100"] == 100.0 and result["frag_at_100"] == 0.0  # p2 completes the cluster at 100%


def test_cli_json(tmp_path, capsys):
    nodes_path, pods_path = _files(tmp_path)
    assert (
        placement.main(
            [
                "openb",
                "--nodes",
                nodes_path,
                "--pods",
                pods_path,
                "--policy",
                "fgd",
                "--seeds",
                "1-3",
                "--inflate",
                "1.3",
                "--json",
            ]
        )
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {
        "policy",
        "seeds",
        "alloc_at_100",
        "alloc_at_130",
        "frag_at_100",
        "decisions_per_s",
        "decisions_per_cpu_s",
        "peak_mem_mb",
        "nodes",
        "gpus",
    }
    assert out["seeds"] == [1, 2, 3] and set(out["alloc_at_100"]) == {"mean", "std"}
    assert out["decisions_per_cpu_s"] > 0


def test_scale_replicates_the_node_list_with_distinct_names(tmp_path, capsys):
    nodes_path, pods_path = _files(tmp_path)
    single = bench.read_nodes(nodes_path)
    args = ["openb", "--nodes", nodes_path, "--pods", pods_path, "--seeds", "1", "--json"]
    assert placement.main([*args, "--scale", "3"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["nodes"] == 3 * len(single)
    assert out["gpus"] == 3 * sum(len(node.devices) for node in single)
    names = [node.name for node in scaled_engine_nodes(single, 3)]
    assert len(set(names)) == len(names) == 3 * len(single)
