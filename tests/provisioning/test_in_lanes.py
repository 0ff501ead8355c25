"""Calls side by side on the process's kept threads (provisioning/drivers/base.py `in_lanes`): what the Slurm
driver's looks at a batch's jobs and nodes and the container driver's batches run on."""

import multiprocessing
import threading

import pytest

from provisioning.drivers import base
from provisioning.drivers.base import in_lanes

WAIT_SECONDS = 10  # a barrier that is never met fails the test instead of hanging it


def _met_in_groups_of(size: int, seen: dict):
    """A call that waits until `size` calls are under way together and notes, for each item, its thread and how
    many calls ran at once."""
    barrier, counting = threading.Barrier(size, timeout=WAIT_SECONDS), threading.Lock()
    running = [0]

    def call(item):
        with counting:
            running[0] += 1
            seen.setdefault("most", 0)
            seen["most"] = max(seen["most"], running[0])
        barrier.wait()
        with counting:
            running[0] -= 1
        seen.setdefault("threads", set()).add(threading.get_ident())
        return item * 10

    return call


def test_the_results_come_in_the_items_order_with_at_most_at_once_calls_under_way():
    seen = {}

    assert in_lanes(_met_in_groups_of(3, seen), list(range(9)), 3) == [item * 10 for item in range(9)]
    assert seen["most"] == 3  # the barrier of three was met three times: three at once, never four
    assert threading.get_ident() in seen["threads"]  # the caller took its share
    assert len(seen["threads"]) == 3


def test_one_at_a_time_runs_in_the_caller_alone():
    threads = set()

    assert in_lanes(lambda item: threads.add(threading.get_ident()) or item, [1, 2, 3], 1) == [1, 2, 3]
    assert threads == {threading.get_ident()}
    assert in_lanes(lambda item: item, [], 4) == []


def test_later_calls_run_on_the_threads_the_first_one_started():
    first, later = {}, {}
    in_lanes(_met_in_groups_of(4, first), list(range(4)), 4)
    kept = first["threads"] - {threading.get_ident()}
    for _ in range(3):
        in_lanes(_met_in_groups_of(4, later), list(range(4)), 4)

    assert len(kept) == 3
    assert later["threads"] - {threading.get_ident()} <= kept  # no thread started again


def test_a_call_s_exception_is_raised_after_every_lane_is_done_and_the_other_items_still_run():
    done = []

    def call(item):
        if item == 2:
            raise ValueError("two")
        done.append(item)
        return item

    with pytest.raises(ValueError, match="two"):
        in_lanes(call, list(range(8)), 3)
    assert sorted(done) == [0, 1, 3, 4, 5, 6, 7]


def test_calls_go_on_in_the_caller_while_every_kept_thread_is_busy(monkeypatch):
    monkeypatch.setattr(base, "KEPT_THREADS", 1)
    base._kept_threads.cache_clear()
    try:
        # The only kept thread runs the outer call's second lane, which itself asks for two at once: its inner
        # items run in its own lane, none waits for a free thread.
        outer = in_lanes(lambda item: in_lanes(lambda inner: inner + item, [1, 2], 2), [10, 20], 2)
    finally:
        base._kept_threads.cache_clear()
    assert outer == [[11, 12], [21, 22]]


def _in_lanes_in_child(answer) -> None:
    answer.put(in_lanes(lambda item: item + 1, list(range(6)), 3))


def test_a_forked_process_runs_its_calls_on_threads_of_its_own():
    in_lanes(lambda item: item, list(range(4)), 4)  # the parent's kept threads exist, and do not in a fork
    context = multiprocessing.get_context("fork")
    answer = context.Queue()
    child = context.Process(target=_in_lanes_in_child, args=(answer,))
    child.start()
    child.join(WAIT_SECONDS)

    assert child.exitcode == 0
    assert answer.get(timeout=WAIT_SECONDS) == [1, 2, 3, 4, 5, 6]
