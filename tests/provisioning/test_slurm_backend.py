"""The `slurm` execution backend against the local Slurm cluster (devcluster/slurm_cluster.py): compute orders run as
Slurm jobs pinned to the node the platform chose, Slurm's GPU binding and pending reasons reach the record, release
cancels the job, jobs that end by themselves are reconciled, and what an operator forced while Slurm was down is
cleaned up once it answers."""

import threading
import time
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
from django.db import connection
from django.urls import reverse

from catalog.models import Vendor
from provisioning import engine
from provisioning import services as provisioning_services
from provisioning.choices import RunKind, RunState
from provisioning.drivers import slurm as slurm_driver
from provisioning.drivers.base import StepError, StepPending, Target
from provisioning.drivers.slurm import (
    START_STEP,
    WATCH_EVERY_SECONDS,
    SlurmWorkloads,
    gpu_indexes,
    gres,
    job_name,
    pending_reason,
)
from provisioning.models import ProvisioningRun
from provisioning.reconcile import workloads_reconcile
from provisioning.targets import run_target
from requests import services as request_services
from requests.choices import EventCode, RequestState
from requests.orders import Order
from scheduling import cycle
from scheduling.choices import AllocationState, ExecutionBackend
from scheduling.models import Allocation, AllocationDevice, Device
from scheduling.slurm.api import SlurmApi
from tests import factories
from tests.provisioning.conftest import add_node

pytestmark = pytest.mark.django_db

FAILING_COMMAND = "sleep 2; exit 3"


@pytest.fixture
def on_slurm(settings, slurm_settings):
    """The platform pointed at the session's cluster; jobs write their output where the REST user may write."""
    slurm = slurm_settings
    settings.SLURM_JOB_DIRECTORY = str(slurm.job_dir)
    settings.SLURM_PARTITION = slurm.partition
    with SlurmApi.from_settings() as api:
        yield SimpleNamespace(cluster=slurm, api=api)


@pytest.fixture
def slurm_compute(on_slurm, team, run_on_commit):
    """A one-GPU compute service whose only node is the cluster's first (2 x a100), and an order helper."""
    nvidia = Vendor.objects.get(slug="nvidia")
    cluster = on_slurm.cluster
    accelerator = factories.AcceleratorModelFactory(vendor=nvidia, slug=cluster.node_shape.gpu_type, name="A100 80GB")
    spec = factories.ResourceSpecFactory(
        accelerator_models=[accelerator], accelerator_count=1, cpu_cores=2, memory_gb=4
    )
    workspace = factories.ImageFactory(compatible_vendors=[nvidia], configuration={"env": {"NCCL_DEBUG": "WARN"}})
    batch = factories.ImageFactory(compatible_vendors=[nvidia], configuration={"command": FAILING_COMMAND})
    service = factories.ServiceFactory(specs=[spec], images=[workspace, batch])
    node = add_node(
        accelerator,
        name=cluster.node_names[0],
        cards=cluster.node_shape.gpus,
        cpu_cores=cluster.node_shape.cpus,
        memory_gb=cluster.node_shape.real_memory_mib // 1024,
        execution_backend=ExecutionBackend.SLURM,
    )

    def submit(image=workspace):
        """Queued; called without run_on_commit, without the cycle its submission triggers after the commit."""
        return request_services.request_submit(
            order=Order(service=service, project=team.project, duration_hours=1, spec=spec, image=image),
            requester=team.developer,
        )

    def order(image=workspace):
        request = run_on_commit(submit, image)
        run_on_commit(cycle.run_cycle)
        request.refresh_from_db()
        return request

    return SimpleNamespace(
        submit=submit,
        order=order,
        node=node,
        api=on_slurm.api,
        cluster=cluster,
        batch=batch,
        service=service,
        spec=spec,
        workspace=workspace,
        team=team,
        run_on_commit=run_on_commit,
    )


def delivered(request) -> dict:
    return ProvisioningRun.objects.get(request=request, kind=RunKind.PROVISION).delivered


def eventually(check, seconds: float = 20.0, every: float = 0.2):
    deadline = time.monotonic() + seconds
    while not (result := check()):
        assert time.monotonic() < deadline, f"not within {seconds} s"
        time.sleep(every)
    return result


def job_state(api: SlurmApi, job_id: int) -> str:
    return api.job(job_id)["job_state"]


def outside_job(api: SlurmApi, cluster, node: str, gpus: int) -> int:
    """A job someone submitted to Slurm directly, behind the platform's back, holding GPUs of the node."""
    answer = api.submit_job(
        "#!/bin/sh\nexec sleep infinity\n",
        {
            "name": "outside-the-platform",
            "nodes": "1",
            "nodelist": node,
            "gres": f"gpu:{cluster.node_shape.gpu_type}:{gpus}",
            "cpus_per_task": 1,
            "memory_per_node": 256,
            "time_limit": 10,
            "current_working_directory": str(cluster.job_dir),
            "environment": {"PATH": "/usr/bin:/bin"},
        },
    )
    eventually(lambda: job_state(api, answer["job_id"]) == "RUNNING")
    return answer["job_id"]


def resumed_until(check, seconds: float = 30.0):
    """What the minute sweeper does, sooner: hand due steps to a worker until `check()` holds; returns its value."""

    def done():
        result = check()
        if not result:
            engine.steps_resume_due()
        return result

    return eventually(done, seconds, every=0.3)


def in_state(request, state: str) -> bool:
    request.refresh_from_db()
    return request.state == state


def finished(run: ProvisioningRun) -> bool:
    run.refresh_from_db()
    return run.state != RunState.RUNNING


def test_a_compute_order_runs_as_a_slurm_job_on_the_chosen_node_and_release_cancels_it(slurm_compute, client):
    request = slurm_compute.order()

    assert request.state == RequestState.ACTIVE
    access = delivered(request)
    job = slurm_compute.api.job(access["job_id"])
    assert job["job_state"] == "RUNNING"
    assert (job["name"], job["nodes"], job["tres_per_node"]) == (
        job_name(request.pk),
        slurm_compute.node.name,
        "gres:gpu:a100:1",
    )
    assert (job["cpus"], job["memory_per_node"], job["time_limit"]) == (2, 4096, 60)
    assert (access["node"], access["partition"], access["backend"]) == (slurm_compute.node.name, "gpu", "slurm")
    assert access["access"] == {"attach": f"srun --jobid={job['job_id']} --pty bash"}
    assert access["output"] == f"{slurm_compute.cluster.job_dir}/cc-request-{request.pk}-{job['job_id']}.out"
    bound = job["gres_detail"][0]
    assert [device["index"] for device in access["devices"]] == [int(bound.split("IDX:")[1].rstrip(")"))]
    output = eventually(lambda: Path(access["output"]).exists() and Path(access["output"]).read_text())
    assert f"request {request.pk}" in output and f"Slurm job {job['job_id']}" in output
    client.force_login(request.requester)
    page = client.get(reverse("portal:request-detail", args=[request.pk])).content.decode()
    assert f"srun --jobid={job['job_id']} --pty bash" in page and access["output"] in page

    slurm_compute.run_on_commit(
        request_services.request_release, request=request, actor=request.requester, reason="done"
    )

    request.refresh_from_db()
    assert request.state == RequestState.RELEASED
    assert eventually(lambda: job_state(slurm_compute.api, job["job_id"]) == "CANCELLED")
    assert Allocation.objects.get(request=request).state == AllocationState.RELEASED
    assert not Device.objects.filter(node=slurm_compute.node, allocated_milli__gt=0).exists()


def test_the_allocation_follows_the_gpu_index_slurm_bound(slurm_compute):
    # Slurm gives GPU 0 to a job it got directly; the platform, which does not know that job, chooses GPU 0 too.
    outside_job(slurm_compute.api, slurm_compute.cluster, slurm_compute.node.name, gpus=1)

    request = slurm_compute.order()

    assert request.state == RequestState.ACTIVE
    assert slurm_compute.api.job(delivered(request)["job_id"])["gres_detail"] == ["gpu:a100:1(IDX:1)"]
    binding = AllocationDevice.objects.get(allocation__request=request)
    assert binding.device.index == 1
    assert dict(Device.objects.filter(node=slurm_compute.node).values_list("index", "allocated_milli")) == {
        0: 0,
        1: 1000,
    }
    note = request.events.get(code=EventCode.DEVICES_REBOUND)
    assert note.data == {"backend": "slurm", "chosen": [0], "bound": [1]}
    assert [device["index"] for device in delivered(request)["devices"]] == [1]


def test_a_batch_of_first_tries_is_submitted_without_a_job_list_and_slurm_binds_what_the_platform_chose(
    slurm_compute, monkeypatch
):
    """Both of the node's GPUs in one cycle: one start batch, the node's requests in the order of their devices. Both
    are their start step's first attempt, which nothing can have submitted before: no job list is read."""
    job_lists = []
    real_jobs = SlurmApi.jobs
    monkeypatch.setattr(SlurmApi, "jobs", lambda api: job_lists.append(api) or real_jobs(api))
    requests = [slurm_compute.submit(), slurm_compute.submit()]
    slurm_compute.run_on_commit(cycle.run_cycle)

    assert [in_state(request, RequestState.ACTIVE) for request in requests] == [True, True]
    assert job_lists == []  # first tries look for no earlier job; readiness asks by id
    for request in requests:
        chosen = AllocationDevice.objects.get(allocation__request=request).device.index
        job = slurm_compute.api.job(delivered(request)["job_id"])
        assert gpu_indexes(job["gres_detail"]) == [chosen]
        assert not request.events.filter(code=EventCode.DEVICES_REBOUND).exists()


def test_a_job_slurm_keeps_pending_shows_slurms_reason_until_it_runs(slurm_compute, settings, client):
    settings.PROVISIONING_INLINE_WAIT_SECONDS = 0  # the readiness poll goes back to the sweeper between checks
    blocker = outside_job(slurm_compute.api, slurm_compute.cluster, slurm_compute.node.name, gpus=2)

    request = slurm_compute.order()

    assert request.state == RequestState.PROVISIONING
    waiting = resumed_until(lambda: request.events.filter(code=EventCode.QUEUE_REASON).first())
    assert waiting.data["code"] == "capacity_in_use"
    assert waiting.data["details"]["slurm_reason"] == "Resources"
    assert "Resources" in waiting.message and slurm_compute.node.name in waiting.message
    client.force_login(request.requester)
    page = client.get(reverse("portal:request-detail", args=[request.pk])).content.decode()
    assert 'id="backend-wait" data-code="capacity_in_use"' in page and waiting.message in page

    slurm_compute.cluster.scancel(str(blocker))
    resumed_until(lambda: in_state(request, RequestState.ACTIVE))

    assert job_state(slurm_compute.api, delivered(request)["job_id"]) == "RUNNING"
    assert request.events.filter(code=EventCode.QUEUE_REASON).count() == 1  # repeated polls add no notes


def test_a_release_forced_by_an_operator_while_slurmctld_is_down_leaves_an_orphan_the_reconciler_stops(
    slurm_compute, settings, operator
):
    """slurmctld stopped under a release: the teardown waits for Slurm with the devices held (tests/provisioning/
    test_slurm_faults.py has the outages); an operator who gives up on it returns them (audited), and once Slurm
    answers again the reconciler cancels the job the teardown could not."""
    settings.PROVISIONING_INLINE_WAIT_SECONDS = 0
    settings.PROVISIONING_CHAIN_SECONDS = 1.0
    settings.SLURM_TIMEOUT_SECONDS = 3.0
    outside_job(slurm_compute.api, slurm_compute.cluster, slurm_compute.node.name, gpus=2)
    request = slurm_compute.order()
    assert request.state == RequestState.PROVISIONING  # submitted; Slurm holds it pending
    job_id = ProvisioningRun.objects.get(request=request).steps.get(name="start_workload").output["job_id"]

    slurm_compute.cluster.stop_controller()
    try:
        slurm_compute.run_on_commit(
            request_services.request_release, request=request, actor=request.requester, reason="done"
        )
        release = ProvisioningRun.objects.get(request=request, kind=RunKind.RELEASE)
        assert (release.state, Allocation.objects.get(request=request).state) == (RunState.RUNNING, "active")
        provisioning_services.teardown_force(run=release, actor=operator, reason="the cluster is being rebuilt")
    finally:
        slurm_compute.cluster.start_controller()

    request.refresh_from_db()
    assert request.state == RequestState.RELEASED
    assert Allocation.objects.get(request=request).state == AllocationState.RELEASED
    assert not Device.objects.filter(node=slurm_compute.node, allocated_milli__gt=0).exists()
    slurm_compute.node.refresh_from_db()
    assert slurm_compute.node.schedulable  # an outage cordons nothing
    assert job_state(slurm_compute.api, job_id) == "PENDING"  # Slurm still holds the job nobody could cancel
    assert slurm_compute.run_on_commit(workloads_reconcile) == {request.pk: "orphan_stopped"}
    assert eventually(lambda: job_state(slurm_compute.api, job_id) == "CANCELLED")
    assert request.events.get(code=EventCode.CLEANED_UP).data["workload"] == f"slurm job {job_id}"


def test_a_job_cancelled_outside_the_platform_is_reclaimed_with_the_reason(slurm_compute):
    request = slurm_compute.order()
    job_id = delivered(request)["job_id"]

    slurm_compute.cluster.scancel(str(job_id))
    eventually(lambda: job_state(slurm_compute.api, job_id) == "CANCELLED")
    outcome = slurm_compute.run_on_commit(workloads_reconcile)

    assert outcome == {request.pk: "released"}
    request.refresh_from_db()
    assert request.state == RequestState.RELEASED
    releasing = request.events.get(code=EventCode.RELEASING)
    assert f"Slurm job {job_id} was cancelled outside the platform" in releasing.message
    assert Allocation.objects.get(request=request).state == AllocationState.RELEASED
    assert slurm_compute.run_on_commit(workloads_reconcile) == {}  # settled once


def test_a_job_that_exits_non_zero_fails_the_request_with_its_exit_code(slurm_compute):
    request = slurm_compute.order(image=slurm_compute.batch)
    assert request.state == RequestState.ACTIVE
    job_id = delivered(request)["job_id"]

    eventually(lambda: job_state(slurm_compute.api, job_id) == "FAILED")
    outcome = slurm_compute.run_on_commit(workloads_reconcile)

    assert outcome == {request.pk: "failed"}
    request.refresh_from_db()
    assert request.state == RequestState.FAILED
    failed = request.events.get(code=EventCode.FAILED)
    assert f"Slurm job {job_id} failed (exit code 3, Slurm's reason: NonZeroExitCode)" in failed.message
    assert failed.data["failure"]["details"]["exit_code"] == 3
    cleanup = ProvisioningRun.objects.get(request=request, kind=RunKind.CLEANUP)
    assert cleanup.state == RunState.SUCCEEDED
    assert Allocation.objects.get(request=request).state == AllocationState.RELEASED
    assert not Device.objects.filter(node=slurm_compute.node, allocated_milli__gt=0).exists()


def test_the_reconciler_reclaims_nothing_while_slurm_cannot_be_asked(slurm_compute, settings):
    settings.SLURM_TIMEOUT_SECONDS = 3.0
    request = slurm_compute.order()

    slurm_compute.cluster.stop_daemon("slurmctld")
    try:
        outcome = slurm_compute.run_on_commit(workloads_reconcile)
    finally:
        slurm_compute.cluster.start_daemon("slurmctld")

    assert outcome == {request.pk: "backend_unreachable"}
    request.refresh_from_db()
    assert request.state == RequestState.ACTIVE


@pytest.mark.django_db(transaction=True, serialized_rollback=True)
def test_two_workers_submitting_for_the_same_request_create_one_job(on_slurm):
    cluster = on_slurm.cluster
    target = Target(
        run_id=1,
        request_id=424242,
        node=cluster.node_names[2],
        devices=({"index": 0, "uuid": "GPU-x", "model": "A100", "model_slug": "a100", "milli": 1000},),
        snapshot={"demand": {"cpu_cores": 1, "memory_gb": 1}, "duration_hours": 1},
        backend=ExecutionBackend.SLURM,
        allocation_id=7,
    )
    image = {"name": "img", "version": "1", "reference": "registry.test/img:1", "configuration": {}}
    both_ready = threading.Barrier(2)
    results = []

    def worker():
        try:
            both_ready.wait()
            results.append(SlurmWorkloads().start_workload(target, image))
        finally:
            connection.close()

    threads = [threading.Thread(target=worker) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    jobs = [job for job in on_slurm.api.jobs() if job["name"] == job_name(target.request_id)]
    assert len(jobs) == 1
    assert sorted(result["submitted"] for result in results) == [False, True]
    assert {result["job_id"] for result in results} == {jobs[0]["job_id"]}


def test_a_first_attempt_whose_step_was_taken_over_reads_the_job_list_and_never_submits_twice(
    slurm_compute, monkeypatch
):
    """A worker whose first attempt stalled (its lease ran out) while another took the step over and submitted: the
    takeover counted a second attempt, which the stalled worker reads under the submission locks, so it looks for
    the job and finds it instead of submitting another."""
    request = slurm_compute.order()
    run = ProvisioningRun.objects.get(request=request, kind=RunKind.PROVISION)
    step = run.steps.get(name=START_STEP)
    assert (step.attempts, step.output["submitted"]) == (1, True)
    step.attempts = 2  # as the takeover's claim counted it
    step.save(update_fields=["attempts"])
    job_lists = []
    real_jobs = SlurmApi.jobs
    monkeypatch.setattr(SlurmApi, "jobs", lambda api: job_lists.append(api) or real_jobs(api))

    stalled = SlurmWorkloads().start_workload(run_target(run, attempt=1), request.approved_spec["image"])

    assert len(job_lists) == 1
    assert (stalled["submitted"], stalled["job_id"]) == (False, run.delivered["job_id"])
    assert [job["job_id"] for job in real_jobs(slurm_compute.api) if job["name"] == job_name(request.pk)] == [
        run.delivered["job_id"]
    ]


def slurm_target(cluster, node: str, request_id: int, gpus: int) -> Target:
    """What the engine hands the Slurm backend for a one-hour request of `gpus` cards of `node`."""
    devices = tuple(
        {
            "index": index,
            "uuid": f"GPU-{index}",
            "model": "A100",
            "model_slug": cluster.node_shape.gpu_type,
            "milli": 1000,
        }
        for index in range(gpus)
    )
    return Target(
        run_id=request_id,
        request_id=request_id,
        node=node,
        devices=devices,
        snapshot={"demand": {"cpu_cores": 1, "memory_gb": 1}, "duration_hours": 1},
        backend=ExecutionBackend.SLURM,
        allocation_id=request_id,
    )


def test_a_batch_s_running_jobs_are_ready_without_waiting_for_one_slurm_keeps_pending(on_slurm):
    """The readiness of a batch hands back as soon as some of its jobs run: those are ready (their runs go on), the
    one Slurm holds back (here for a GPU another job holds) is checked again at once rather than after the watch."""
    cluster, api = on_slurm.cluster, on_slurm.api
    node = cluster.node_names[1]
    outside_job(api, cluster, node, gpus=1)
    image = {"name": "img", "version": "1", "reference": "registry.test/img:1", "configuration": {}}
    # the node's one free GPU; both of its GPUs
    runs, held = slurm_target(cluster, node, 525251, gpus=1), slurm_target(cluster, node, 525252, gpus=2)
    workloads = SlurmWorkloads()
    items = list(zip([runs, held], workloads.start_workloads([(runs, image), (held, image)]), strict=True))
    eventually(lambda: job_state(api, items[0][1]["job_id"]) == "RUNNING")
    ready, pending = workloads.workloads_ready(items)

    assert ready["ready"] is True and ready["job_id"] == items[0][1]["job_id"]
    assert isinstance(pending, StepPending) and pending.retry_after == WATCH_EVERY_SECONDS
    assert job_state(api, items[1][1]["job_id"]) == "PENDING"


def test_while_a_batch_s_jobs_all_wait_each_poll_asks_for_one_of_them_in_turn(on_slurm, monkeypatch):
    """Slurm starts a wave in a few scheduling passes: while the job asked for waits, the others do too, so the watch
    does not ask slurmrestd for the whole batch ten times a second (CPU that slurmctld needs to start them). Right
    after the submissions it asks for none at once (they were pending moments ago), then one a poll, in turn; once the
    outside job is gone and Slurm starts them, a later check's first look finds them all ready."""
    cluster, api = on_slurm.cluster, on_slurm.api
    node = cluster.node_names[1]
    holder = outside_job(api, cluster, node, gpus=cluster.node_shape.gpus)
    image = {"name": "img", "version": "1", "reference": "registry.test/img:1", "configuration": {}}
    targets = [slurm_target(cluster, node, 525271 + position, gpus=1) for position in range(2)]
    workloads = SlurmWorkloads()
    items = list(zip(targets, workloads.start_workloads([(target, image) for target in targets]), strict=True))
    first, second = (started["job_id"] for _, started in items)
    asked, ask = [], SlurmApi.job

    def counted(self, job_id):
        asked.append(job_id)
        return ask(self, job_id)

    asked_before_each_sleep = []

    def sleep(seconds):
        asked_before_each_sleep.append(len(asked))
        time.sleep(seconds)

    monkeypatch.setattr(SlurmApi, "job", counted)
    monkeypatch.setattr(slurm_driver, "time", SimpleNamespace(monotonic=time.monotonic, sleep=sleep))
    monkeypatch.setattr(slurm_driver, "WATCH_SECONDS", 0.5)
    waiting = workloads.workloads_ready(items)

    assert all(isinstance(outcome, StepPending) for outcome in waiting)
    polls = asked
    assert 2 <= len(polls) <= 0.5 / WATCH_EVERY_SECONDS + 1  # fewer when slurmrestd answers slowly
    assert polls == [first, second] * (len(polls) // 2) + [first] * (len(polls) % 2)
    # one job asked for between two polls' waits, however slowly slurmrestd answers
    assert asked_before_each_sleep == list(range(len(asked_before_each_sleep)))

    api.cancel_job(holder)
    eventually(lambda: {job_state(api, first), job_state(api, second)} == {"RUNNING"})
    asked.clear()
    ready = workloads.workloads_ready([(replace(target, attempt=2), started) for target, started in items])

    assert [outcome["job_id"] for outcome in ready] == [first, second]
    assert sorted(asked) == [first, second]  # one look: nothing waits


def test_a_readiness_look_asks_for_the_batch_s_jobs_side_by_side(on_slurm, monkeypatch):
    """While slurmctld starts a wave of jobs each job query waits hundreds of milliseconds: a batch's jobs are asked
    for at once, not one after another. Each query here waits until all three are in flight, which one after
    another never are."""
    cluster, api = on_slurm.cluster, on_slurm.api
    items = [
        (slurm_target(cluster, node, 525261 + position, gpus=1), {"job_id": outside_job(api, cluster, node, gpus=1)})
        for position, node in enumerate(cluster.node_names)
    ]
    in_flight = threading.Barrier(len(items), timeout=10)
    ask = SlurmApi.job

    def ask_with_the_others(self, job_id):
        in_flight.wait()
        return ask(self, job_id)

    monkeypatch.setattr(SlurmApi, "job", ask_with_the_others)
    try:
        results = SlurmWorkloads().workloads_ready(items)
    finally:
        monkeypatch.undo()
        for _, started in items:
            api.cancel_job(started["job_id"])

    assert [result["job_id"] for result in results] == [started["job_id"] for _, started in items]
    assert all(result["ready"] for result in results)


def _on(models: list[tuple[str, str]]) -> Target:
    devices = tuple(
        {"index": index, "uuid": f"GPU-{index}", "model": name, "model_slug": slug, "milli": 1000}
        for index, (slug, name) in enumerate(models)
    )
    return Target(run_id=1, request_id=1, node="n1", devices=devices, snapshot={}, allocation_id=1)


@pytest.mark.parametrize(
    ("mapping", "wanted"),
    [
        ({}, "gpu:a100-80gb:2"),  # an unmapped GRES type is the model's slug
        ({"a100": "a100-80gb"}, "gpu:a100:2"),  # SLURM_GPU_MODELS maps the type onto the slug...
        ({"a100": "A100 80GB"}, "gpu:a100:2"),  # ...or onto the name
        ({"gpu": "a100-80gb"}, "gpu:2"),  # untyped GPUs
    ],
)
def test_the_gres_names_the_devices_model_as_slurm_knows_it(settings, mapping, wanted):
    settings.SLURM_GPU_MODELS = mapping

    assert gres(_on([("a100-80gb", "A100 80GB")] * 2)) == wanted


def test_devices_of_two_models_cannot_be_one_gres():
    with pytest.raises(StepError) as refused:
        gres(_on([("a100-80gb", "A100 80GB"), ("h100", "H100")]))

    assert refused.value.code == "slurm_gres_ambiguous" and not refused.value.retryable


@pytest.mark.parametrize(
    ("gres_detail", "indexes"),
    [(["gpu:a100:1(IDX:1)"], [1]), (["gpu:a100:4(IDX:0,2-3,5)"], [0, 2, 3, 5]), (["gpu(IDX:N/A)"], []), ([], [])],
)
def test_gpu_indexes_are_read_from_gres_detail(gres_detail, indexes):
    assert gpu_indexes(gres_detail) == indexes


@pytest.mark.parametrize(
    ("slurm_reason", "code"),
    [
        ("Resources", "capacity_in_use"),
        ("Priority", "higher_priority_ahead"),
        ("ReqNodeNotAvail", "insufficient_healthy_capacity"),
        ("JobHeldAdmin", "backend_hold"),
    ],
)
def test_slurms_pending_reasons_map_onto_the_platforms_codes_keeping_slurms_text(slurm_reason, code):
    job = {"job_id": 12, "nodes": "", "required_nodes": "n1", "state_reason": slurm_reason, "state_description": ""}

    reason = pending_reason(job)

    assert reason["code"] == code and reason["details"]["slurm_reason"] == slurm_reason
    assert reason["message"] == f"Slurm keeps job 12 pending on n1: {slurm_reason}."
