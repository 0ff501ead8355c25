"""Slurm node objects read into inventory facts (scheduling/slurm/nodes.py): GPU GRES and out-of-service states."""

import pytest

from scheduling.slurm.nodes import GpuGres, GresError, SlurmNodeState, parse_gpus


@pytest.mark.parametrize(
    ("gres", "gpus"),
    [
        ("gpu:a100:2", [GpuGres("a100", 2)]),
        ("gpu:4", [GpuGres("", 4)]),
        ("gpu:a100:2(S:0-1),gpu:h100_80g:1(S:1)", [GpuGres("a100", 2), GpuGres("h100_80g", 1)]),
        ("mps:200,gpu:l40s:8,shard:16", [GpuGres("l40s", 8)]),
        ("gpu:t4", [GpuGres("t4", 1)]),
        ("", []),
        ("(null)", []),
    ],
)
def test_gpus_from_gres(gres, gpus):
    assert parse_gpus(gres) == gpus


def test_unreadable_gpu_gres_is_an_error():
    with pytest.raises(GresError, match="gpu:a100:two"):
        parse_gpus("gpu:a100:two")


@pytest.mark.parametrize(
    ("state", "flags", "unavailable", "label"),
    [
        ("idle", [], False, "IDLE"),
        ("mixed", ["NOT_RESPONDING"], True, "MIXED+NOT_RESPONDING"),  # Slurm starts nothing there either
        ("mixed", ["MAINTENANCE"], False, "MIXED+MAINTENANCE"),
        ("unknown", [], False, "UNKNOWN"),  # a controller just restarted, before the nodes register
        ("idle", ["DRAIN"], True, "IDLE+DRAIN"),
        ("allocated", ["DRAIN"], True, "ALLOCATED+DRAIN"),
        ("down", ["NOT_RESPONDING"], True, "DOWN+NOT_RESPONDING"),
        ("mixed", ["FAIL"], True, "MIXED+FAIL"),
        ("error", [], True, "ERROR"),
    ],
)
def test_out_of_service_states(state, flags, unavailable, label):
    node_state = SlurmNodeState.of({"state": state, "state_flags": flags, "reason": "fan"})

    assert (node_state.unavailable, node_state.label) == (unavailable, label)
    assert node_state.cordon_reason() == f"Slurm reports the node {label}: fan"
