"""Preemption inside the scheduling cycle: operator rules say which priority class may evict which.

Two steps, both under the cycle's advisory lock and transaction:

1. `carry_out` (start of the cycle): allocations whose grace period is over are preempted (devices back to the
   pool, allocation released "preempted for #N", request back to the queue with a PREEMPTED event), so the same
   cycle's placement gives their devices to the waiting winner. Preemptions whose winner no longer waits (it was
   placed elsewhere, cancelled, ...) or that no active rule allows any more (an operator deactivated the rule or
   withdrew its `cross_tenant`) are called off.
2. `schedule` (after placement): for each higher-priority request still waiting for capacity, in queue order, the
   engine plans the smallest set of running allocations whose eviction makes room (for a MIG slice: whose GPU
   instances, or whole cards that can then change mode, free a valid placement of its profile; for a multi-node gang,
   also one waiting for nodes in one domain: victims all inside one domain of its level, the cheapest domain's,
   `scheduling/engine/gang_preemption.py`; when no domain can be freed enough its reason says so). When every
   victim's class may be preempted by the request's class under an active `PreemptionRule`, every victim belongs to
   the request's own tenant (unless that rule is `cross_tenant`: an operator's explicit choice) and no victim is
   already promised to another request, the victims' allocations get `preempt_at` (now + the longest grace among
   the rules involved, one time for the whole set) and `preempted_for`, their timelines say when and for whom, and
   the winner's queue reason becomes `preemption_pending` with the victims, where they are (a gang's: the domain and
   the nodes they free) and the time.

Queries are constant per cycle (a handful when anything is scheduled or due, however many requests wait).
Planning runs on one engine for the whole cycle: a fork of the cycle's start state holding its placements
(`CycleEngine.at_start`, no pass over the fleet); who may be evicted is a predicate on the winner's class and tenant
read with the promises made so far, so one cycle never promises the same victim twice.
"""

from collections import defaultdict
from dataclasses import dataclass, field, replace
from datetime import UTC, timedelta

from requests.choices import PRIORITY_RANK, EventCode, RequestState
from requests.services import PREEMPTABLE_STATES, requests_note, requests_preempt
from scheduling import reclaim
from scheduling.choices import AllocationState
from scheduling.engine import (
    CAPACITY_IN_USE,
    FRAGMENTATION,
    TOPOLOGY_CONSTRAINT,
    Demand,
    PlacementResult,
    PreemptionPlan,
    RunningAllocation,
)
from scheduling.models import Allocation, PreemptionRule

PREEMPTION_PENDING = "preemption_pending"
PLANNABLE = frozenset({CAPACITY_IN_USE, FRAGMENTATION})  # waits that evicting can end
# A gang also waits for nodes in one domain (topology_constraint): evicting inside one domain can end that too.
PLANNABLE_FOR_GANGS = PLANNABLE | {TOPOLOGY_CONSTRAINT}
MAX_PLANS_PER_CYCLE = 25  # engine plans tried per cycle (each is an exhaustive search); the rest wait a cycle
CLASS_OF_RANK = {rank: str(priority.value) for priority, rank in PRIORITY_RANK.items()}


@dataclass
class CarriedOut:
    preempted: list[int] = field(default_factory=list)  # victim request ids, now queued again
    called_off: list[int] = field(default_factory=list)  # victim request ids that keep running
    scheduled: dict[int, list[Allocation]] = field(default_factory=dict)  # winner id -> victims still to come


def _at(moment) -> str:
    return f"{moment.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC"


def carry_out(now) -> CarriedOut:
    """Preempt what is due, call off what is no longer needed, and report what is still scheduled."""
    rows = list(
        Allocation.objects.select_for_update(of=("self", "request"))
        .filter(state=AllocationState.ACTIVE, preempt_at__isnull=False)
        .select_related("request", "preempted_for")
        .order_by("preempt_at", "pk")
    )
    outcome = CarriedOut()
    due: list[Allocation] = []
    called_off: list[tuple[Allocation, str]] = []
    rules = _active_rules() if rows else {}
    for allocation in rows:
        winner = allocation.preempted_for
        if winner.state != RequestState.QUEUED:
            called_off.append((allocation, f"request #{winner.pk} no longer needs these devices"))
        elif _rule_for(rules, winner, allocation) is None:  # an operator changed the rules since it was scheduled
            called_off.append(
                (
                    allocation,
                    f"no active rule lets priority {winner.priority} preempt this "
                    f"allocation{' across tenants' if _crosses(winner, allocation) else ''}",
                )
            )
        elif allocation.preempt_at <= now and allocation.request.state in PREEMPTABLE_STATES:
            due.append(allocation)
        else:  # not yet due, or the victim is being released anyway: the winner keeps waiting for it
            outcome.scheduled.setdefault(winner.pk, []).append(allocation)
    if called_off:
        _call_off(called_off)
        outcome.called_off = list({allocation.request_id for allocation, _why in called_off})
    if due:
        victims = {}
        for allocation in due:
            victims.setdefault(allocation.request_id, allocation)
        reclaim.allocation_free(
            request_ids=list(victims), reason=lambda freed: f"preempted for #{freed.preempted_for_id}"
        )
        requests_preempt(
            preempted=[
                (
                    allocation.request,
                    allocation.preempted_for_id,
                    _preempted_message(allocation),
                    {
                        "for_request": allocation.preempted_for_id,
                        "priority": allocation.preempted_for.priority,
                        "cross_tenant": _crosses(allocation.preempted_for, allocation),
                        "allocations": [row.pk for row in due if row.request_id == request_id],
                    },
                )
                for request_id, allocation in victims.items()
            ]
        )
        outcome.preempted = list(victims)
    return outcome


OTHER_TENANT = ", another tenant, under an operator's cross-tenant rule"


def _crosses(winner, allocation: Allocation) -> bool:
    return winner.tenant_id != allocation.request.tenant_id


def _preempted_message(allocation: Allocation) -> str:
    winner = allocation.preempted_for
    across = OTHER_TENANT if _crosses(winner, allocation) else ""
    return (
        f"Preempted for request #{winner.pk} (priority {winner.priority}{across}); devices returned to the pool, "
        "back in the queue."
    )


def _rule_for(rules: dict, winner, allocation: Allocation) -> PreemptionRule | None:
    """The active rule that lets the winner evict this allocation now, or None."""
    rule = rules.get(winner.priority, {}).get(CLASS_OF_RANK.get(allocation.priority))
    return rule if rule is not None and (rule.cross_tenant or not _crosses(winner, allocation)) else None


def _call_off(called_off: list[tuple[Allocation, str]]) -> None:
    Allocation.objects.filter(pk__in=[allocation.pk for allocation, _why in called_off]).update(
        preempt_at=None, preempted_for=None
    )
    victims = {allocation.request_id: (allocation, why) for allocation, why in called_off}
    requests_note(
        code=EventCode.PREEMPTION_CALLED_OFF,
        notes=[
            (allocation.request, f"Preemption called off: {why}.", {"for_request": allocation.preempted_for_id})
            for allocation, why in victims.values()
        ],
    )


def _pending_reason(victims: list[int], preempt_at, where: str, place: dict, priority: str) -> dict:
    """`where` the victims are in words ("on a1", a gang's "in rack r2 (freeing r2-n0)"), `place` in numbers."""
    names = ", ".join(f"#{victim}" for victim in victims)
    return {
        "code": PREEMPTION_PENDING,
        "message": f"Waiting for preemption of {names} {where} at {_at(preempt_at)} "
        f"(priority {priority} may preempt them).",
        "numbers": {"victims": victims, "preempt_at": preempt_at.isoformat(), **place},
    }


def _still_pending(winner, allocations: list[Allocation], running: dict) -> dict:
    """The reason of a winner still waiting for an earlier plan: the one it was given (a gang's names its domain,
    which the victims' rows do not keep), or, for a one-node plan, the same made again from the victims' node."""
    victims = sorted({allocation.request_id for allocation in allocations})
    given = winner.queue_reason or {}
    if given.get("code") == PREEMPTION_PENDING and given["numbers"].get("victims") == victims:
        return given
    node = running[str(victims[0])].node if str(victims[0]) in running else "?"
    preempt_at = max(a.preempt_at for a in allocations)
    return _pending_reason(victims, preempt_at, f"on {node}", {"node": node}, winner.priority)


def _no_domain_frees(waiting: dict[int, dict], demand: Demand, plan: PreemptionPlan) -> dict[int, dict]:
    """{id: reason} for a gang no domain of its level can be freed enough for by any victims its rules allow: its
    reason in `waiting`, with that said and the closest domain's numbers; {} for anything else."""
    reason = waiting.get(int(demand.id))
    if demand.nodes == 1 or plan.feasible or reason is None:
        return {}
    return {
        int(demand.id): {
            **reason,
            "message": f"{reason['message']}; {plan.message}",
            "numbers": {
                **reason["numbers"],
                "preemption": {"level": plan.level, "best_domain": plan.domain, "reachable": plan.reachable},
            },
        }
    }


def _plannable(reason: str | None, demand: Demand) -> bool:
    return reason in (PLANNABLE_FOR_GANGS if demand.nodes > 1 else PLANNABLE)


def _active_rules() -> dict[str, dict[str, PreemptionRule]]:
    """preemptor class -> victim class -> its active rule."""
    rules: dict[str, dict[str, PreemptionRule]] = defaultdict(dict)
    for rule in PreemptionRule.objects.filter(active=True):
        rules[rule.preemptor][rule.victim] = rule
    return rules


def _tenants_of_running() -> dict[str, int]:
    """Engine allocation id (request id) -> tenant, for every running allocation (one query)."""
    return {
        str(request_id): tenant_id
        for request_id, tenant_id in Allocation.objects.filter(state=AllocationState.ACTIVE).values_list(
            "request_id", "request__tenant_id"
        )
    }


def _evictable(
    allocation: RunningAllocation,
    allowed: dict[str, PreemptionRule],
    tenant: int,
    tenants: dict[str, int],
    promised: set[str],
) -> bool:
    """May a request of this tenant, whose class has the `allowed` rules, evict this running allocation?"""
    rule = allowed.get(CLASS_OF_RANK.get(allocation.priority))
    return (
        rule is not None
        and allocation.id not in promised
        and (rule.cross_tenant or tenants.get(allocation.id) == tenant)
    )


def schedule(
    *,
    cluster,
    result: PlacementResult,
    demands: list[Demand],
    requests: dict,
    scheduled: dict[int, list[Allocation]],
    waiting: dict[int, dict],
    now,
    engine,
) -> dict[int, dict]:
    """Plan and record preemptions for waiting requests; returns queue reasons (preemption_pending) by request id,
    and, for a multi-node gang no single domain of its level can be freed enough for, its reason in `waiting` (the
    cycle's reasons so far) with that said.

    `cluster` is the cycle's ClusterSnapshot (before placement), `result` the placement just committed, `engine`
    the cycle's engine after it (scheduling.mig.cycle.CycleEngine): a waiting MIG slice is planned on its MIG
    engine, among the same allowed victims, so that what they free is a valid placement for the profile; the rest
    on `engine.at_start` plus this cycle's placements.
    """
    pending = {int(item.demand_id): item.reason for item in result.pending}
    running = {allocation.id: allocation for allocation in cluster.snapshot.allocations}
    reasons: dict[int, dict] = {}
    for winner_id, allocations in scheduled.items():  # still waiting for an earlier plan: same reason as before
        if winner_id in pending:
            reasons[winner_id] = _still_pending(requests[winner_id], allocations, running)
    candidates = [
        demand
        for demand in demands
        if _plannable(pending.get(int(demand.id)), demand) and int(demand.id) not in scheduled
    ]
    if not candidates:
        return reasons
    rules = _active_rules()
    candidates = [demand for demand in candidates if rules.get(requests[int(demand.id)].priority)]
    if not candidates:
        return reasons

    promised = {str(allocation.request_id) for allocations in scheduled.values() for allocation in allocations}
    tenants = _tenants_of_running()
    placed_now = [
        RunningAllocation(
            binding.demand_id,
            binding.node,
            binding.devices,
            binding.cpu_milli,
            binding.memory_mib,
            PRIORITY_RANK[requests[int(binding.demand_id)].priority],
            preemptible=False,
            started_at=now.timestamp(),
        )
        for binding in result.bindings
    ]
    # One engine over what runs now (the cluster plus this cycle's placements, which nobody may evict) for every
    # plan: who may evict whom is a predicate on the winner's class and tenant, read with the promises made so far,
    # so a plan never counts on another plan's victims and no engine is built again per class, tenant or plan (it is
    # a fork of the cycle's start state: no pass over the whole fleet).
    planning = engine.at_start(placed_now)
    this_cycle = {allocation.id for allocation in placed_now}

    def evictable_by(priority: str, tenant: int):
        def evictable(allocation: RunningAllocation) -> bool:
            return allocation.id not in this_cycle and _evictable(
                allocation, rules[priority], tenant, tenants, promised
            )

        return evictable

    plans = []  # (winner id, victim ids, plan, preempt_at, grace seconds, priority, winner's tenant)
    hopeless: dict = {}  # (class, tenant, demand shape) that found no plan this cycle -> that plan
    for demand in candidates[:MAX_PLANS_PER_CYCLE]:
        winner = requests[int(demand.id)]
        priority, tenant = winner.priority, winner.tenant_id
        shape = (priority, tenant, replace(demand, id=""))
        if shape in hopeless:
            reasons.update(_no_domain_frees(waiting, demand, hopeless[shape]))
            continue
        allowed = rules[priority]
        if engine.is_mig(demand):
            sliced = engine.plan_preemption(
                demand,
                lambda victim, allowed=allowed, tenant=tenant: (
                    victim in running and _evictable(running[victim], allowed, tenant, tenants, promised)
                ),
            )
            plan = PreemptionPlan(sliced.feasible, sliced.node, sliced.victims, sliced.message)
        else:
            plan = planning.plan_preemption(demand, evictable=evictable_by(priority, tenant))
        if not plan.feasible or not plan.victims:
            hopeless[shape] = plan
            reasons.update(_no_domain_frees(waiting, demand, plan))
            continue
        if not all(
            victim in running and _evictable(running[victim], allowed, tenant, tenants, promised)
            for victim in plan.victims
        ):
            continue  # defensive: the planning copy only offers allowed (class, tenant), unpromised victims
        grace = max(allowed[CLASS_OF_RANK[running[victim].priority]].grace_period_seconds for victim in plan.victims)
        preempt_at = now + timedelta(seconds=grace)
        victims = sorted(int(victim) for victim in plan.victims)
        plans.append((int(demand.id), victims, plan, preempt_at, grace, priority, tenant))
        promised.update(plan.victims)  # the next plan must not count on these victims
        reasons[int(demand.id)] = _pending_reason(victims, preempt_at, plan.where, plan.numbers, priority)
    if plans:
        _mark(plans)
    return reasons


def _mark(plans) -> None:
    """Write the plans: victims' allocations get preempt_at/preempted_for (two queries), timelines one INSERT."""
    by_victim = {
        victim: (winner, plan, preempt_at, grace, priority, tenant)
        for winner, victims, plan, preempt_at, grace, priority, tenant in plans
        for victim in victims
    }
    rows = list(
        Allocation.objects.filter(request_id__in=list(by_victim), state=AllocationState.ACTIVE).select_related(
            "request"
        )
    )
    for allocation in rows:
        winner, _plan, preempt_at, _grace, _priority, _tenant = by_victim[allocation.request_id]
        allocation.preempt_at, allocation.preempted_for_id = preempt_at, winner
    Allocation.objects.bulk_update(rows, ["preempt_at", "preempted_for"])
    notes = {}
    for allocation in rows:
        winner, plan, preempt_at, grace, priority, tenant = by_victim[allocation.request_id]
        crosses = tenant != allocation.request.tenant_id
        notes[allocation.request_id] = (
            allocation.request,
            f"Will be preempted at {_at(preempt_at)} for request #{winner} (priority {priority}"
            f"{OTHER_TENANT if crosses else ''}); save your work before then. The request then goes back to the "
            "queue.",
            {
                "for_request": winner,
                "priority": priority,
                "preempt_at": preempt_at.isoformat(),
                **plan.numbers,
                "grace_seconds": grace,
                "cross_tenant": crosses,
            },
        )
    requests_note(code=EventCode.PREEMPTION_SCHEDULED, notes=list(notes.values()))
