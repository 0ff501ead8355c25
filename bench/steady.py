"""Steady state in simulated time: `python -m bench scheduler --scale K --steady MINUTES` (benchmark only).

The clock is simulated (time_machine moves `timezone.now()`, so preemption grace periods, the head-of-line
reservation and terms all run on it). At t = 0 `queued` trace requests are waiting; every `interval_s` simulated
seconds (the production safety-net cadence; submissions and releases trigger cycles at once in production, which a
coalescing lock turns into back-to-back cycles): the requests whose trace duration has passed since they were
allocated are released through the release service (nothing was provisioned, so their devices go back at once,
`reclaim.allocation_free`), Poisson arrivals of `arrivals_per_minute` are queued, and one scheduling cycle runs with
preemption rules and the reservation as configured. Reported per cycle: wall and CPU time, queries, allocations,
preemptions, departures, the queue length, the simulated waits (queued -> allocated) of what it placed and the
oldest wait still queued per reason. Cycles before `warmup_minutes` (filling an empty fleet) are reported but left
out of the cycle percentiles.
"""

import heapq
import random
import statistics
import time
from datetime import timedelta

import time_machine
from django.db import connection
from django.utils import timezone

from bench import fleet
from bench.start_accuracy import StartAccuracy
from requests.choices import RequestState
from requests.models import ResourceRequest
from requests.services import request_release
from scheduling import kept_engine, reclaim
from scheduling.cycle import HOLDING_STATES, run_cycle

RELEASE_REASON = "its trace duration ended (steady-state replay)"


def _percentile(values: list[float], share: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def run(
    workload,
    shapes,
    *,
    minutes,
    queued,
    interval_s=60.0,
    arrivals_per_minute=None,
    warmup_minutes=0.0,
    seed=42,
    progress=None,
):
    rng = random.Random(seed)
    rate = arrivals_per_minute if arrivals_per_minute is not None else max(1.0, queued / 60)
    start = timezone.now()
    arrived: dict[int, float] = {}
    durations: dict[int, int] = {}
    allocated_at: dict[int, float] = {}
    ends: list[tuple[float, int, float]] = []
    waits: list[float] = []
    cycles: list[dict] = []
    draws = 0
    accuracy = StartAccuracy(start, interval_s, warmup_s=warmup_minutes * 60)

    def arrive(count: int, at: float) -> None:
        nonlocal draws
        draws += 1
        batch = fleet.draw_requests(shapes, count, projects=len(workload.projects), seed=seed * 1000 + draws)
        ids = workload.queue(batch, created_at=start + timedelta(seconds=at))
        for request_id, synthetic in zip(ids, batch, strict=True):
            arrived[request_id], durations[request_id] = at, synthetic.shape.duration_s

    with time_machine.travel(start, tick=False) as traveller:
        arrive(queued, 0.0)
        ticks = int(minutes * 60 / interval_s)
        for tick in range(ticks + 1):
            now = tick * interval_s
            traveller.move_to(start + timedelta(seconds=now))
            due = []
            while ends and ends[0][0] <= now:
                _end, request_id, when = heapq.heappop(ends)
                if allocated_at.get(request_id) == when:  # not preempted and placed again since
                    due.append(request_id)
            departed = release_ended(due)
            if tick:
                arrive(_poisson(rng, rate * interval_s / 60), now)
            queries = [0]

            def count(execute, sql, params, many, context, queries=queries):
                queries[0] += 1
                return execute(sql, params, many, context)

            waiting = ResourceRequest.objects.filter(state=RequestState.QUEUED).count()
            started, cpu_started = time.perf_counter(), time.process_time()
            engines = (kept_engine.kept.builds, kept_engine.kept.relearns)
            with connection.execute_wrapper(count):
                result = run_cycle()
            seconds, cpu = time.perf_counter() - started, time.process_time() - cpu_started
            placed_waits = [now - arrived[request_id] for request_id in result.allocated]
            waits.extend(placed_waits)
            accuracy.note_estimates(arrived, set(result.allocated))
            for request_id in result.allocated:
                if request_id not in allocated_at:  # its first start (one placed again after preemption: not)
                    accuracy.note_start(request_id, arrived[request_id], now)
                allocated_at[request_id] = now
                heapq.heappush(ends, (now + durations[request_id], request_id, now))
            row = {
                "t_s": now,
                "queued": waiting,
                "departed": departed,
                "allocated": len(result.allocated),
                "preempted": len(result.preempted),
                "cycle_s": round(seconds, 3),
                "cycle_cpu_s": round(cpu, 3),  # this process only (the database server's share is not in it)
                "queries": queries[0],
                "engine": _engine_step(engines),
                "policy_drift": round(kept_engine.kept.drift, 3),
                "wait_p50_s": _percentile(placed_waits, 0.5),  # simulated, of the requests this cycle placed
                "wait_p99_s": _percentile(placed_waits, 0.99),
                "wait_max_s": max(placed_waits, default=0.0),
                "oldest_queued_by_reason_s": _oldest_queued_by_reason(arrived, now),
                "warmup": now < warmup_minutes * 60,
            }
            cycles.append(row)
            if progress:
                progress(str(row))
        still = ResourceRequest.objects.filter(state=RequestState.QUEUED).count()
        oldest_by_reason = cycles[-1]["oldest_queued_by_reason_s"]
    measured = [row for row in cycles if not row["warmup"]] or cycles
    seconds = [row["cycle_s"] for row in measured]
    cpu_seconds = [row["cycle_cpu_s"] for row in measured]
    return {
        "minutes": minutes,
        "interval_s": interval_s,
        "arrivals_per_minute": rate,
        "cycles": len(cycles),
        "warmup_cycles": len(cycles) - len(measured),  # the cycle figures below are of the cycles after the warm-up
        "queued_min": min(row["queued"] for row in measured),
        "queued_max": max(row["queued"] for row in measured),
        "cycle_p50_s": round(statistics.median(seconds), 3),
        "cycle_p99_s": round(_percentile(seconds, 0.99), 3),
        "cycle_max_s": round(max(seconds), 3),
        "cycle_cpu_p50_s": round(statistics.median(cpu_seconds), 3),
        "cycle_cpu_p99_s": round(_percentile(cpu_seconds, 0.99), 3),
        "queries_min": min(row["queries"] for row in measured),
        "queries_max": max(row["queries"] for row in measured),
        "engine_builds": sum(row["engine"] == "built" for row in cycles),
        "engine_relearns": sum(row["engine"] == "relearnt" for row in cycles),  # the others kept engine and policy
        "allocated": sum(row["allocated"] for row in cycles),
        "preempted": sum(row["preempted"] for row in cycles),
        "departed": sum(row["departed"] for row in cycles),
        "wait_p50_s": _percentile(waits, 0.5),
        "wait_p99_s": _percentile(waits, 0.99),
        "wait_max_s": max(waits, default=0.0),
        "still_queued": still,
        "oldest_queued_wait_s": max(oldest_by_reason.values(), default=0.0),
        "oldest_queued_by_reason_s": oldest_by_reason,
        "expected_start_accuracy": accuracy.report(),
        "per_cycle": cycles,
    }


def release_ended(request_ids: list[int]) -> int:
    """Release the requests whose run ended, through the release service (nothing was provisioned: their devices
    go back at once); how many were still holding capacity."""
    departed = 0
    for request in ResourceRequest.objects.filter(pk__in=request_ids, state__in=HOLDING_STATES):
        request_release(request=request, actor=None, reason=RELEASE_REASON)
        departed += 1
    if request_ids:
        reclaim.allocation_free(request_ids=request_ids, reason=RELEASE_REASON)
    return departed


def _engine_step(before: tuple[int, int]) -> str:
    """What the cycle did with the kept engine: built one, learnt its policy again, or kept both (advanced)."""
    if kept_engine.kept.builds > before[0]:
        return "built"
    return "relearnt" if kept_engine.kept.relearns > before[1] else "kept"


def _oldest_queued_by_reason(arrived: dict[int, float], now: float) -> dict[str, float]:
    """The longest simulated wait among the requests still queued, per queue reason (a quota wait is the project's
    own limit, not the scheduler's; "not_seen": outside every window so far)."""
    oldest: dict[str, float] = {}
    for pk, code in ResourceRequest.objects.filter(state=RequestState.QUEUED).values_list("pk", "queue_reason__code"):
        key = code or "not_seen"
        oldest[key] = max(oldest.get(key, 0.0), now - arrived.get(pk, 0.0))
    return oldest


def _poisson(rng: random.Random, mean: float) -> int:
    """Arrivals in one interval (Knuth's method in chunks, fine for the hundreds a minute used here)."""
    total = 0
    while mean > 0:
        chunk = min(mean, 30.0)
        mean -= chunk
        limit, k, p = pow(2.718281828459045, -chunk), 0, 1.0
        while True:
            p *= rng.random()
            if p <= limit:
                break
            k += 1
        total += k
    return total
