"""Provisioning in batches: a cycle's allocations start together, their runs' steps are claimed, attempted and
recorded together (the backend asked once per batch where it has a batch form), a node's work in the order of the
devices chosen there, and one run's failure leaves the others of its batch alone."""

import threading

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from provisioning import engine, pipelines, services, wiring
from provisioning.choices import RunKind, RunState, StepState
from provisioning.drivers.base import StepError, WorkloadDriver, each
from provisioning.drivers.simulated import SimulatedHost
from provisioning.models import ProvisioningRun, ProvisioningStep
from provisioning.tasks import start_runs
from requests import notifications
from requests import services as request_services
from requests.choices import EventCode, RequestState
from requests.models import RequestEvent, ResourceRequest
from scheduling import cycle
from scheduling.models import AllocationDevice
from tests.provisioning.conftest import add_node
from tests.requests.conftest import make_order

pytestmark = pytest.mark.django_db


@pytest.fixture
def wide(shop):
    """Two 8-card nodes with room for four of the shop's 2-card orders each."""
    return [add_node(shop.accelerator, name=name, cards=8, cpu_cores=128, memory_gb=1024) for name in ("n1", "n2")]


@pytest.fixture
def submit(shop, team):
    """Orders queued without the cycle each submission triggers after its commit: the test's cycle places them."""

    def submit(count: int) -> list[ResourceRequest]:
        return [
            request_services.request_submit(order=make_order(shop, team.project), requester=team.developer)
            for _ in range(count)
        ]

    return submit


@pytest.fixture
def start_batches(monkeypatch):
    """The start tasks the cycle's allocation enqueues, kept to be run by the test: [request ids] each."""
    batches = []
    monkeypatch.setattr(wiring, "async_task", lambda name, request_ids: batches.append(request_ids))
    return batches


@pytest.fixture
def started_batches(monkeypatch):
    """The batches the simulated backend's start_workloads is asked for: [(node, first device index)] each."""
    calls = []

    def spy(self, items):
        calls.append([(target.node, min(device["index"] for device in target.devices)) for target, _ in items])
        return WorkloadDriver.start_workloads(self, items)

    monkeypatch.setattr(SimulatedHost, "start_workloads", spy, raising=False)
    return calls


def states(requests) -> list[str]:
    return [ResourceRequest.objects.get(pk=request.pk).state for request in requests]


def test_a_cycle_s_allocations_go_through_their_steps_as_one_batch_a_node_s_in_device_order(
    wide, submit, started_batches, run_on_commit
):
    requests = submit(6)
    run_on_commit(cycle.run_cycle)

    assert states(requests) == [RequestState.ACTIVE] * 6
    assert len(started_batches) == 1 and len(started_batches[0]) == 6
    assert started_batches[0] == sorted(started_batches[0])  # node by node, each in the order of its devices
    chosen = AllocationDevice.objects.filter(allocation__request__in=requests).values_list("device__node__name")
    assert {name for (name,) in chosen} == {"n1", "n2"}


def test_the_start_batches_never_split_a_node_s_requests(wide, submit, start_batches, settings, run_on_commit):
    settings.PROVISIONING_START_BATCH = 3  # the first node's four go together all the same
    requests = submit(8)
    run_on_commit(cycle.run_cycle)

    assert [len(batch) for batch in start_batches] == [4, 4]
    nodes = [
        set(
            AllocationDevice.objects.filter(allocation__request_id__in=batch).values_list(
                "device__node__name", flat=True
            )
        )
        for batch in start_batches
    ]
    assert sorted(map(sorted, nodes)) == [["n1"], ["n2"]]
    assert sorted(request_id for batch in start_batches for request_id in batch) == [r.pk for r in requests]


def test_one_run_s_failure_leaves_the_rest_of_its_batch_alone(wide, submit, monkeypatch, run_on_commit):
    requests = submit(4)
    doomed = requests[1].pk
    real = SimulatedHost.start_workload

    def start(self, target, image):
        if target.request_id == doomed:
            raise StepError("image_rejected", "The node refused the image.", retryable=False)
        return real(self, target, image)

    monkeypatch.setattr(SimulatedHost, "start_workload", start)
    run_on_commit(cycle.run_cycle)

    assert states(requests) == [RequestState.ACTIVE, RequestState.FAILED, RequestState.ACTIVE, RequestState.ACTIVE]
    failed = ProvisioningRun.objects.get(request_id=doomed, kind=RunKind.PROVISION)
    assert (failed.state, failed.failure["code"]) == (RunState.FAILED, "image_rejected")
    assert ProvisioningRun.objects.get(request_id=doomed, kind=RunKind.CLEANUP).state == RunState.SUCCEEDED


def provisioning_queries(batch: list[int], run_on_commit) -> int:
    """Queries from the start task to every request of the batch active."""
    with CaptureQueriesContext(connection) as queries:
        run_on_commit(start_runs, batch)
    assert set(ResourceRequest.objects.filter(pk__in=batch).values_list("state", flat=True)) == {RequestState.ACTIVE}
    return len(queries)


def test_a_batch_of_runs_costs_far_fewer_queries_than_its_runs_one_by_one(wide, submit, start_batches, run_on_commit):
    submit(1)
    run_on_commit(cycle.run_cycle)
    alone = provisioning_queries(start_batches.pop(), run_on_commit)
    submit(6)
    run_on_commit(cycle.run_cycle)
    together = provisioning_queries(start_batches.pop(), run_on_commit)

    assert together < 3 * alone  # six runs in one batch cost less than half of six runs one by one


def test_a_backend_s_calls_side_by_side_run_at_once_and_keep_their_order_and_errors():
    together = threading.Barrier(3, timeout=10)  # passes only when all three calls are in flight at once

    def call(target, argument):
        together.wait()
        if argument["fails"]:
            raise StepError("image_rejected", "The node refused the image.", retryable=False)
        return {"n": argument["n"]}

    results = each(call, [(None, {"n": n, "fails": n == 1}) for n in range(3)], side_by_side=3)

    assert results[0] == {"n": 0} and results[2] == {"n": 2}
    assert isinstance(results[1], StepError) and results[1].code == "image_rejected"


def test_a_batch_s_activations_are_announced_in_one_notification_task(wide, submit, monkeypatch, run_on_commit):
    announced = []
    monkeypatch.setattr(notifications, "async_task", lambda name, ids: announced.append((name, ids)))
    requests = submit(3)
    run_on_commit(cycle.run_cycle)

    active = RequestEvent.objects.filter(request__in=requests, code=EventCode.ACTIVE).values_list("pk", flat=True)
    assert len(active) == 3
    assert [sorted(ids) for name, ids in announced if set(ids) & set(active)] == [sorted(active)]
    assert {name for name, _ in announced} == {notifications.NOTIFY_TASK}


def test_a_batch_reads_and_writes_its_requests_once_to_start_them_and_once_to_activate_them(
    wide, submit, start_batches, run_on_commit
):
    """From the start task to all active: the start locks the batch's requests in one read and moves them in one
    UPDATE with one INSERT of their events, and so does the activation; no transition writes the approved snapshot.
    Each claim and each record of the batch's steps writes them in one statement, and moves their runs on in one;
    the finished runs are saved in one."""
    requests = submit(6)
    run_on_commit(cycle.run_cycle)
    with CaptureQueriesContext(connection) as queries:
        run_on_commit(start_runs, start_batches.pop())

    assert states(requests) == [RequestState.ACTIVE] * 6
    statements = [query["sql"] for query in queries.captured_queries]
    reads = [sql for sql in statements if sql.startswith('SELECT "requests_resourcerequest"')]
    writes = [sql for sql in statements if sql.startswith('UPDATE "requests_resourcerequest"')]
    events = [sql for sql in statements if sql.startswith('INSERT INTO "requests_requestevent"')]
    assert len(reads) == 2 and all(sql.endswith("FOR UPDATE") for sql in reads)
    assert len(writes) == 2 and not any("approved_spec" in sql for sql in writes)
    assert len(events) == 2
    step_writes = [sql for sql in statements if sql.startswith("UPDATE provisioning_provisioningstep SET")]
    run_moves = [sql for sql in statements if sql.startswith('UPDATE "provisioning_provisioningrun" SET "current_')]
    pipeline = len(pipelines.COMPUTE)
    computed = sum(definition.computed for definition in pipelines.COMPUTE)
    # A claim and a record per step; a computed step (publish_access) is claimed and recorded in one statement, in
    # the transaction that records the step before it.
    assert computed == 1
    assert (len(step_writes), len(run_moves)) == (2 * pipeline - computed, pipeline)
    assert not [sql for sql in statements if sql.startswith('UPDATE "provisioning_provisioningstep"')]
    run_ends = [sql for sql in statements if sql.startswith('UPDATE "provisioning_provisioningrun" SET "state"')]
    assert len(run_ends) == 1  # the batch's finished runs in one statement
    for request in requests:
        timeline = list(request.events.order_by("id").values_list("from_state", "to_state", "code"))
        assert timeline[-2:] == [
            (RequestState.ALLOCATED, RequestState.PROVISIONING, EventCode.PROVISIONING),
            (RequestState.PROVISIONING, RequestState.ACTIVE, EventCode.ACTIVE),
        ]


def test_a_computed_step_is_done_in_the_record_of_the_step_before_it(wide, submit, start_batches, run_on_commit):
    """publish_access calls nothing: the record that finds the batch's workloads ready publishes their access and
    activates their requests in the same transaction, without a claim and a record of its own."""
    requests = submit(2)
    run_on_commit(cycle.run_cycle)
    runs = services.runs_start(request_ids=start_batches.pop())
    step_ids = [run.first_step_id for run in runs]
    for name in ("prepare_image", "start_workload"):
        outcomes = engine._execute_once(step_ids)
        assert all(isinstance(then, engine.Following) and not then.computed for then in outcomes.values()), name
        step_ids = [then.step_id for then in outcomes.values()]

    with CaptureQueriesContext(connection) as queries:
        outcomes = run_on_commit(engine._execute_once, step_ids)

    assert list(outcomes.values()) == [None, None]  # both runs finished in that one record
    assert states(requests) == [RequestState.ACTIVE] * 2
    published = ProvisioningStep.objects.filter(run__in=runs, name="publish_access")
    assert [(step.state, step.attempts) for step in published] == [(StepState.SUCCEEDED, 1)] * 2
    assert all(step.output["host"] for step in published)
    statements = [query["sql"] for query in queries.captured_queries]
    locks = [
        sql for sql in statements if sql.startswith('SELECT "provisioning_provisioningstep"') and "FOR UPDATE" in sql
    ]
    assert len(locks) == 3  # the readiness claim, its record, and publish_access locked within that record


def test_a_step_that_calls_nothing_on_its_run_s_driver_is_done_in_the_claim_of_the_step_after_it(
    wide, submit, start_batches, monkeypatch, run_on_commit
):
    """A driver whose image step calls nothing (Slurm: nothing to pull) has it done in the transaction that claims
    it, and the submission step claimed there in its place: the first attempt of a batch goes straight to the
    backend's start, one claim later than it would without the image step, not a claim and a record."""
    monkeypatch.setattr(SimulatedHost, "image_step_calls", False)
    spy, spy_calls = calls_to(SimulatedHost.prepare_images)
    monkeypatch.setattr(SimulatedHost, "prepare_images", spy)
    requests = submit(2)
    run_on_commit(cycle.run_cycle)
    runs = services.runs_start(request_ids=start_batches.pop())

    with CaptureQueriesContext(connection) as queries:
        outcomes = engine._execute_once([run.first_step_id for run in runs])

    assert len(spy_calls) == 1  # the image step was done, once, for the batch
    image_steps = ProvisioningStep.objects.filter(run__in=runs, name="prepare_image")
    assert [(step.state, step.attempts) for step in image_steps] == [(StepState.SUCCEEDED, 1)] * 2
    started = ProvisioningStep.objects.filter(run__in=runs, name="start_workload")
    assert [(step.state, step.attempts) for step in started] == [(StepState.SUCCEEDED, 1)] * 2
    readiness = set(ProvisioningStep.objects.filter(run__in=runs, name="readiness_check").values_list("pk", flat=True))
    assert {then.step_id for then in outcomes.values()} == readiness  # what the worker goes on with
    locks = [
        query["sql"]
        for query in queries.captured_queries
        if query["sql"].startswith('SELECT "provisioning_provisioningstep"') and "FOR UPDATE" in query["sql"]
    ]
    assert len(locks) == 4  # the image steps' claim, their record there, the start steps' claim, their record
    assert states(requests) == [RequestState.PROVISIONING] * 2


def calls_to(method):
    """`method` with each call's arguments kept in the returned function's list."""
    calls = []

    def spy(self, *args):
        calls.append(args)
        return method(self, *args)

    return spy, calls
