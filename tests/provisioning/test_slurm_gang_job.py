"""The one Slurm job of a multi-node gang, as the driver writes it and reads it back (no cluster: the real cluster's
tests are in test_slurm_gang.py): a node count (never a range), the members' nodes pinned, GPUs, CPUs and memory
per node, one task per node; readiness lists each member node with the GPU indexes Slurm bound there and refuses a
job Slurm runs on fewer nodes than the gang has."""

import pytest

from provisioning.drivers.base import StepError, Target
from provisioning.drivers.slurm import gang_members, job_properties

IMAGE = {"name": "img", "version": "1", "reference": "registry.test/img:1", "configuration": {}}


def devices(count: int) -> tuple[dict, ...]:
    return tuple(
        {"index": index, "uuid": f"GPU-{index}", "model": "A100", "model_slug": "a100", "milli": 1000}
        for index in range(count)
    )


def gang_target(*nodes: str) -> Target:
    """The leader's target of a gang of `nodes` x 2 A100 ordering 8 CPUs and 16 GB in all."""
    gang = tuple(
        {"member": member, "node": node, "allocation_id": 100 + member, "devices": devices(2)}
        for member, node in enumerate(nodes)
    )
    return Target(
        run_id=1,
        request_id=7,
        node=nodes[0],
        devices=devices(2),
        snapshot={"demand": {"cpu_cores": 8, "memory_gb": 16}, "duration_hours": 3},
        backend="slurm",
        allocation_id=100,
        gang=gang,
    )


def test_a_gang_is_one_job_of_a_node_count_pinned_to_its_members_with_its_shape_per_node(settings):
    settings.SLURM_PARTITION = ""
    job = job_properties(gang_target("gpu-2", "gpu-1"), IMAGE)
    assert (job["nodes"], job["nodelist"]) == ("2", "gpu-2,gpu-1")
    assert (job["gres"], job["tasks"], job["tasks_per_node"]) == ("gpu:a100:2", 2, 1)
    assert (job["cpus_per_task"], job["memory_per_node"], job["time_limit"]) == (4, 8 * 1024, 180)


def test_readiness_lists_every_member_node_with_the_gpus_slurm_bound_there():
    job = {
        "job_id": 42,
        "node_count": 2,
        "nodes": "gpu-[1-2]",
        "gres_detail": ["gpu:a100:2(IDX:0-1)", "gpu:a100:2(IDX:0,1)"],
    }
    assert gang_members(gang_target("gpu-2", "gpu-1"), job) == [
        {"node": "gpu-1", "allocation_id": 101, "bound_indexes": [0, 1]},
        {"node": "gpu-2", "allocation_id": 100, "bound_indexes": [0, 1]},
    ]


def test_a_job_slurm_runs_on_fewer_nodes_than_the_gang_is_never_ready():
    job = {"job_id": 42, "node_count": 1, "nodes": "gpu-1", "gres_detail": ["gpu:a100:2(IDX:0-1)"]}
    with pytest.raises(StepError) as refused:
        gang_members(gang_target("gpu-1", "gpu-2"), job)
    assert refused.value.code == "slurm_gang_partial" and not refused.value.retryable
    assert "on 1 nodes (gpu-1); the gang has 2 (gpu-1, gpu-2)" in refused.value.message
