"""Reasons people read name cores, GiB/TiB and cards; the engine's milli-CPU and MiB stay in the numbers."""

from scheduling.engine import (
    CAPACITY_IN_USE,
    Demand,
    DeviceView,
    NodeView,
    Snapshot,
    cards_text,
    cores_text,
    memory_text,
    place,
)

CARD = DeviceView(index=0, model="h100")


def test_a_wait_for_cpu_and_memory_is_said_in_cores_and_tib():
    """Two nodes with a free card each, but the first card's node has no CPU or memory for the second order."""
    node = NodeView("n1", cpu_milli=128_000, memory_mib=1_572_864, devices=(CARD, DeviceView(1, "h100")))
    first = Demand("first", count=1, cpu_milli=128_000, memory_mib=1_572_864)
    second = Demand("second", count=1, cpu_milli=128_000, memory_mib=1_572_864)
    result = place(Snapshot(nodes=(node,)), [first, second])
    (pending,) = [reason for reason in result.pending if reason.demand_id == "second"]
    assert pending.reason == CAPACITY_IN_USE
    assert "128 CPU cores and 1.5 TiB memory" in pending.message
    assert "m CPU" not in pending.message and "MiB" not in pending.message
    assert pending.numbers["cpu_milli"] == 128_000 and pending.numbers["memory_mib"] == 1_572_864


def test_units_in_words():
    assert cores_text(500) == "0.5 CPU cores"
    assert memory_text(131_072) == "128 GiB memory"
    assert memory_text(1_048_576) == "1 TiB memory"
    assert (cards_text(1000), cards_text(2500)) == ("1 card", "2.5 cards")
