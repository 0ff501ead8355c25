"""Preemption in the scheduling cycle: operator rules, grace periods, both timelines, and the database accounting."""

from datetime import timedelta
from types import SimpleNamespace

import pytest
import time_machine
from django.db import IntegrityError, connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from requests import services
from requests.choices import EventCode, PriorityClass, RequestState
from requests.models import ResourceRequest
from scheduling import cycle
from scheduling.choices import AllocationState
from scheduling.models import Allocation, Device, PreemptionRule
from scheduling.preemption import PREEMPTION_PENDING
from tenancy.services import quota_set
from tests import factories
from tests.module_data import shared_by_module
from tests.requests.conftest import GENEROUS_QUOTA, make_order
from tests.scheduling.test_cycle import add_node, device_totals_match_bindings

pytestmark = pytest.mark.django_db

BATCH, STANDARD, HIGH, CRITICAL = (
    PriorityClass.BATCH,
    PriorityClass.STANDARD,
    PriorityClass.HIGH,
    PriorityClass.CRITICAL,
)


@shared_by_module
def shop():
    """Whole-card specs of one, two and four cards on one 80 GB accelerator model."""
    accelerator = factories.AcceleratorModelFactory(memory_gb=80)
    specs = {
        count: factories.ResourceSpecFactory(
            accelerator_models=[accelerator], accelerator_count=count, cpu_cores=4, memory_gb=32
        )
        for count in (1, 2, 4)
    }
    image = factories.ImageFactory()
    service = factories.ServiceFactory(specs=list(specs.values()), images=[image], max_duration_hours=168)
    return SimpleNamespace(service=service, specs=specs, image=image, accelerator=accelerator, whole=specs[2])


@shared_by_module
def team():
    project = factories.project(quota=GENEROUS_QUOTA, max_priority=CRITICAL)  # an operator entitled it to critical
    quota_set(
        quota=project.quota,
        limits={
            "concurrent_tasks": 1000,
            "gpus": 64,
            "accelerator_memory_gb": 64 * 80,
            "cpu_cores": 1024,
            "memory_gb": 8192,
        },
        actor=None,
    )
    return SimpleNamespace(project=project, developer=factories.member(project))


@pytest.fixture
def order(shop, team):
    def submit(priority=BATCH, cards=1) -> ResourceRequest:
        request = services.request_submit(
            order=make_order(shop, team.project, spec=shop.specs[cards], priority=priority), requester=team.developer
        )
        assert request.state == RequestState.QUEUED
        return request

    return submit


def running(order, count, priority=BATCH, cards=1) -> list[ResourceRequest]:
    requests = [order(priority, cards) for _ in range(count)]
    cycle.run_cycle()
    for request in requests:
        request.refresh_from_db()
        assert request.state == RequestState.ALLOCATED
    return requests


def fresh(request) -> ResourceRequest:
    return ResourceRequest.objects.get(pk=request.pk)


def scheduled_victims() -> dict[int, int]:
    """victim request id -> the request it is scheduled to make room for."""
    return dict(
        Allocation.objects.filter(state=AllocationState.ACTIVE, preempt_at__isnull=False).values_list(
            "request_id", "preempted_for_id"
        )
    )


def codes(request) -> list[str]:
    return list(request.events.values_list("code", flat=True))


def test_default_rules_are_seeded():
    rules = {
        (rule.preemptor, rule.victim): (rule.grace_period_seconds, rule.active) for rule in PreemptionRule.objects.all()
    }
    assert rules == {
        ("critical", "batch"): (300, True),
        ("critical", "standard"): (300, True),
        ("high", "batch"): (600, True),
    }


def test_a_rule_may_only_preempt_a_lower_class():
    with pytest.raises(IntegrityError), transaction.atomic():
        PreemptionRule.objects.create(preemptor=STANDARD, victim=HIGH)
    with pytest.raises(IntegrityError), transaction.atomic():
        PreemptionRule.objects.create(preemptor=BATCH, victim=BATCH)


def test_critical_schedules_the_minimal_set_then_preempts_after_the_grace_period(shop, order):
    add_node(shop.accelerator, name="a", cards=4)
    batch = running(order, 4)
    start = timezone.now()
    critical = order(CRITICAL, cards=2)

    with time_machine.travel(start, tick=False):
        result = cycle.run_cycle()
    assert result.waiting[critical.pk] == PREEMPTION_PENDING
    victims = scheduled_victims()
    assert len(victims) == 2 and set(victims.values()) == {critical.pk}  # two cards needed: two victims, no more
    assert set(victims) <= {request.pk for request in batch}
    preempt_at = start + timedelta(seconds=300)
    assert set(Allocation.objects.filter(request_id__in=victims).values_list("preempt_at", flat=True)) == {preempt_at}

    critical = fresh(critical)
    reason = critical.queue_reason
    assert reason["code"] == PREEMPTION_PENDING
    assert reason["numbers"] == {"victims": sorted(victims), "preempt_at": preempt_at.isoformat(), "node": "a"}
    names = ", ".join(f"#{pk}" for pk in sorted(victims))
    note = critical.events.filter(code=EventCode.QUEUE_REASON).last()
    assert f"Waiting for preemption of {names}" in note.message and note.data["code"] == PREEMPTION_PENDING
    for pk in victims:
        event = ResourceRequest.objects.get(pk=pk).events.get(code=EventCode.PREEMPTION_SCHEDULED)
        assert (
            f"Will be preempted at {preempt_at:%Y-%m-%d %H:%M:%S} UTC for request #{critical.pk} "
            "(priority critical)" in event.message
        )
        assert event.data["for_request"] == critical.pk and event.data["grace_seconds"] == 300
    untouched = [request for request in batch if request.pk not in victims]
    assert all(not fresh(request).events.filter(code__startswith="preemption").exists() for request in untouched)

    with time_machine.travel(start + timedelta(seconds=299), tick=False):  # grace period not over: nothing happens
        result = cycle.run_cycle()
    assert result.preempted == [] and result.waiting[critical.pk] == PREEMPTION_PENDING
    assert all(fresh(request).state == RequestState.ALLOCATED for request in batch)
    assert fresh(critical).events.filter(code=EventCode.QUEUE_REASON).count() == 1  # same reason, no new note
    assert (
        ResourceRequest.objects.get(pk=next(iter(victims))).events.filter(code=EventCode.PREEMPTION_SCHEDULED).count()
        == 1
    )
    device_totals_match_bindings()

    victim_devices = set(
        Device.objects.filter(bindings__allocation__request_id__in=victims).values_list("pk", flat=True)
    )
    with time_machine.travel(start + timedelta(seconds=301), tick=False):
        result = cycle.run_cycle()
    assert sorted(result.preempted) == sorted(victims)
    assert result.allocated == [critical.pk]
    for pk in victims:
        victim = ResourceRequest.objects.get(pk=pk)
        assert victim.state == RequestState.QUEUED
        assert victim.queue_reason["code"] == "capacity_in_use"
        event = victim.events.get(code=EventCode.PREEMPTED)
        assert (event.from_state, event.to_state) == (RequestState.ALLOCATED, RequestState.QUEUED)
        assert f"Preempted for request #{critical.pk}" in event.message and event.data["for_request"] == critical.pk
        allocation = victim.allocations.get()
        assert allocation.state == AllocationState.RELEASED
        assert allocation.release_reason == f"preempted for #{critical.pk}"
    assert all(fresh(request).state == RequestState.ALLOCATED for request in untouched)
    critical = fresh(critical)
    assert critical.state == RequestState.ALLOCATED
    assert (
        set(Device.objects.filter(bindings__allocation__request=critical).values_list("pk", flat=True))
        == victim_devices
    )
    device_totals_match_bindings()


def test_standard_cannot_preempt_standard(shop, order):
    add_node(shop.accelerator, cards=2)
    running(order, 2, priority=STANDARD)
    waiting = order(STANDARD)
    result = cycle.run_cycle()
    assert result.waiting[waiting.pk] == "capacity_in_use"
    assert scheduled_victims() == {}
    assert fresh(waiting).queue_reason["code"] == "capacity_in_use"


def test_high_may_preempt_batch_but_not_standard(shop, order):
    """The engine offers only victims the rules allow for the request's class: a plan must not touch standard."""
    add_node(shop.accelerator, cards=2)
    running(order, 1, priority=STANDARD)
    running(order, 1, priority=BATCH)
    high = order(HIGH, cards=2)
    result = cycle.run_cycle()
    assert result.waiting[high.pk] == "capacity_in_use"
    assert scheduled_victims() == {}


def test_high_gets_the_rules_grace_period(shop, order):
    add_node(shop.accelerator, cards=2)
    batch = running(order, 2)
    start = timezone.now()
    high = order(HIGH)
    with time_machine.travel(start, tick=False):
        cycle.run_cycle()
    victims = scheduled_victims()
    assert victims == {batch[1].pk: high.pk}  # one card is enough; the youngest batch allocation goes
    assert Allocation.objects.get(request_id=batch[1].pk).preempt_at == start + timedelta(seconds=600)


def test_an_inactive_rule_is_ignored(shop, order):
    PreemptionRule.objects.filter(preemptor=CRITICAL, victim=BATCH).update(active=False)
    add_node(shop.accelerator, cards=2)
    running(order, 2)
    critical = order(CRITICAL)
    result = cycle.run_cycle()
    assert result.waiting[critical.pk] == "capacity_in_use"
    assert scheduled_victims() == {}


def test_a_victim_already_scheduled_is_not_promised_twice(shop, order):
    add_node(shop.accelerator, cards=4)
    running(order, 4)
    first, second = order(CRITICAL, cards=2), order(CRITICAL, cards=2)
    cycle.run_cycle()
    victims = scheduled_victims()
    assert len(victims) == 4
    first_victims = {pk for pk, winner in victims.items() if winner == first.pk}
    second_victims = {pk for pk, winner in victims.items() if winner == second.pk}
    assert len(first_victims) == len(second_victims) == 2 and not first_victims & second_victims

    third = order(CRITICAL, cards=2)  # every batch allocation is promised already: nothing left to preempt
    cycle.run_cycle()
    assert scheduled_victims() == victims
    assert fresh(third).queue_reason["code"] == "capacity_in_use"
    for pk in victims:
        assert ResourceRequest.objects.get(pk=pk).events.filter(code=EventCode.PREEMPTION_SCHEDULED).count() == 1


def test_a_promised_victim_does_not_count_towards_a_bigger_request(shop, order):
    add_node(shop.accelerator, cards=4)
    running(order, 4)
    small, big = order(CRITICAL, cards=2), order(CRITICAL, cards=4)
    result = cycle.run_cycle()
    assert result.waiting[small.pk] == PREEMPTION_PENDING
    assert result.waiting[big.pk] == "capacity_in_use"  # only two unpromised batch allocations remain
    assert set(scheduled_victims().values()) == {small.pk}


def test_preemption_is_called_off_when_the_winner_stops_waiting(shop, order, team):
    add_node(shop.accelerator, cards=2)
    batch = running(order, 2)
    start = timezone.now()
    critical = order(CRITICAL)
    with time_machine.travel(start, tick=False):
        cycle.run_cycle()
    (victim,) = scheduled_victims()
    services.request_cancel(request=fresh(critical), actor=team.developer, reason="not needed")
    with time_machine.travel(start + timedelta(seconds=400), tick=False):
        result = cycle.run_cycle()
    assert result.preempted == [] and scheduled_victims() == {}
    assert all(fresh(request).state == RequestState.ALLOCATED for request in batch)
    assert codes(ResourceRequest.objects.get(pk=victim))[-2:] == [
        EventCode.PREEMPTION_SCHEDULED,
        EventCode.PREEMPTION_CALLED_OFF,
    ]


def test_preemption_costs_the_same_queries_for_one_or_many_winners(shop, order, team):
    def measured(winners):
        add_node(shop.accelerator, name=f"n{winners}", cards=4 * winners)
        running(order, 4 * winners)
        start = timezone.now()
        for _ in range(winners):
            order(CRITICAL, cards=4)
        with time_machine.travel(start, tick=False), CaptureQueriesContext(connection) as planning:
            result = cycle.run_cycle()
        assert sum(code == PREEMPTION_PENDING for code in result.waiting.values()) == winners
        with (
            time_machine.travel(start + timedelta(seconds=301), tick=False),
            CaptureQueriesContext(connection) as preempting,
        ):
            result = cycle.run_cycle()
        assert len(result.preempted) == 4 * winners and len(result.allocated) == winners
        device_totals_match_bindings()
        for request in ResourceRequest.objects.filter(state=RequestState.QUEUED):  # out of the next measurement
            services.request_cancel(request=request, actor=team.developer)
        return len(planning), len(preempting)

    assert measured(1) == measured(3)


def test_operators_edit_rules_in_the_console_audited(client):
    from tenancy.models import AuditEvent

    client.force_login(factories.operator())
    with CaptureQueriesContext(connection) as queries:
        assert client.get("/admin/scheduling/preemptionrule/").status_code == 200
    assert len(queries) < 20
    rule = PreemptionRule.objects.get(preemptor=HIGH, victim=BATCH)
    data = {"preemptor": HIGH, "victim": BATCH, "grace_period_seconds": "120"}  # "active" unticked
    assert client.post(f"/admin/scheduling/preemptionrule/{rule.pk}/change/", data).status_code == 302
    rule.refresh_from_db()
    assert (rule.grace_period_seconds, rule.active) == (120, False)
    assert AuditEvent.objects.filter(action="preemptionrule.updated").exists()
    refused = {"preemptor": STANDARD, "victim": CRITICAL, "grace_period_seconds": "60", "active": "on"}
    page = client.post("/admin/scheduling/preemptionrule/add/", refused)
    assert page.status_code == 200 and "only preempt a lower priority class" in page.content.decode()
    assert not PreemptionRule.objects.filter(preemptor=STANDARD).exists()


def test_developers_get_no_rule_console(client, team):
    client.force_login(team.developer)
    assert client.get("/admin/scheduling/preemptionrule/").status_code in (302, 403)


# --- Tenants: preemption stays within one unless an operator's rule crosses them explicitly -----------------


@pytest.fixture
def neighbour(shop):
    """Another tenant's project on the same hardware, submitting batch work."""
    project = factories.project(quota=GENEROUS_QUOTA)
    quota_set(
        quota=project.quota,
        limits={
            "concurrent_tasks": 1000,
            "gpus": 64,
            "accelerator_memory_gb": 64 * 80,
            "cpu_cores": 1024,
            "memory_gb": 8192,
        },
        actor=None,
    )
    developer = factories.member(project)

    def run_batch(count: int) -> list[ResourceRequest]:
        requests = [
            services.request_submit(
                order=make_order(shop, project, spec=shop.specs[1], priority=BATCH), requester=developer
            )
            for _ in range(count)
        ]
        cycle.run_cycle()
        assert all(fresh(request).state == RequestState.ALLOCATED for request in requests)
        return requests

    return run_batch


def test_critical_does_not_preempt_another_tenants_work_by_default(shop, order, neighbour):
    add_node(shop.accelerator, cards=2)
    theirs = neighbour(2)
    critical = order(CRITICAL)

    result = cycle.run_cycle()

    assert result.waiting[critical.pk] == "capacity_in_use"  # before the fix: preemption_pending, evicting theirs
    assert scheduled_victims() == {}
    assert all(not fresh(request).events.filter(code__startswith="preemption").exists() for request in theirs)


def test_critical_preempts_its_own_tenants_work_and_spares_the_neighbours(shop, order, neighbour):
    add_node(shop.accelerator, cards=2)
    (ours,) = running(order, 1)
    theirs = neighbour(1)  # the youngest: the engine's first choice if tenants did not matter
    critical = order(CRITICAL)

    result = cycle.run_cycle()

    assert result.waiting[critical.pk] == PREEMPTION_PENDING
    assert scheduled_victims() == {ours.pk: critical.pk}
    event = fresh(ours).events.get(code=EventCode.PREEMPTION_SCHEDULED)
    assert event.data["cross_tenant"] is False and "another tenant" not in event.message
    assert not fresh(theirs[0]).events.filter(code__startswith="preemption").exists()


def test_an_operators_cross_tenant_rule_lets_critical_preempt_another_tenant(shop, order, neighbour):
    PreemptionRule.objects.filter(preemptor=CRITICAL, victim=BATCH).update(cross_tenant=True)
    add_node(shop.accelerator, cards=1)
    (theirs,) = neighbour(1)
    start = timezone.now()
    critical = order(CRITICAL)

    with time_machine.travel(start, tick=False):
        result = cycle.run_cycle()
    assert result.waiting[critical.pk] == PREEMPTION_PENDING
    assert scheduled_victims() == {theirs.pk: critical.pk}
    scheduled = fresh(theirs).events.get(code=EventCode.PREEMPTION_SCHEDULED)
    assert scheduled.data["cross_tenant"] is True
    assert "another tenant, under an operator's cross-tenant rule" in scheduled.message

    with time_machine.travel(start + timedelta(seconds=301), tick=False):
        result = cycle.run_cycle()
    assert result.preempted == [theirs.pk] and result.allocated == [critical.pk]
    preempted = fresh(theirs).events.get(code=EventCode.PREEMPTED)
    assert preempted.data["cross_tenant"] is True and "another tenant" in preempted.message


def test_withdrawing_the_cross_tenant_rule_calls_a_scheduled_preemption_off(shop, order, neighbour):
    rule = PreemptionRule.objects.get(preemptor=CRITICAL, victim=BATCH)
    PreemptionRule.objects.filter(pk=rule.pk).update(cross_tenant=True)
    add_node(shop.accelerator, cards=1)
    (theirs,) = neighbour(1)
    start = timezone.now()
    critical = order(CRITICAL)
    with time_machine.travel(start, tick=False):
        cycle.run_cycle()
    assert scheduled_victims() == {theirs.pk: critical.pk}

    PreemptionRule.objects.filter(pk=rule.pk).update(cross_tenant=False)
    with time_machine.travel(start + timedelta(seconds=301), tick=False):
        result = cycle.run_cycle()

    assert result.preempted == [] and scheduled_victims() == {}
    assert fresh(theirs).state == RequestState.ALLOCATED
    note = fresh(theirs).events.get(code=EventCode.PREEMPTION_CALLED_OFF)
    assert note.message == (
        "Preemption called off: no active rule lets priority critical preempt this allocation across tenants."
    )
    assert fresh(critical).queue_reason["code"] == "capacity_in_use"


def test_operators_tick_cross_tenant_on_the_rules_change_page_audited(client):
    from tenancy.models import AuditEvent

    client.force_login(factories.operator())
    rule = PreemptionRule.objects.get(preemptor=CRITICAL, victim=BATCH)
    data = {"preemptor": CRITICAL, "victim": BATCH, "grace_period_seconds": "300", "cross_tenant": "on", "active": "on"}
    assert client.post(f"/admin/scheduling/preemptionrule/{rule.pk}/change/", data).status_code == 302
    assert PreemptionRule.objects.get(pk=rule.pk).cross_tenant is True
    event = AuditEvent.objects.filter(action="preemptionrule.updated").latest("id")
    assert "cross_tenant" in str(event.data)


@pytest.mark.parametrize("who", ["anonymous", "developer", "approver", "lead"])
def test_nobody_but_operators_may_change_a_preemption_rule(client, roles, who):
    rule = PreemptionRule.objects.get(preemptor=CRITICAL, victim=BATCH)
    if who != "anonymous":
        client.force_login(getattr(roles, who))
    data = {"preemptor": CRITICAL, "victim": BATCH, "grace_period_seconds": "300", "cross_tenant": "on", "active": "on"}

    response = client.post(f"/admin/scheduling/preemptionrule/{rule.pk}/change/", data)

    assert response.status_code == 302 and response.url.startswith("/admin/login/")
    assert PreemptionRule.objects.get(pk=rule.pk).cross_tenant is False
