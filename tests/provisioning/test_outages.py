"""Outages on the simulated backend (PROVISIONING_FAULTS with "unavailable"), where time and the backend's answers are
the test's to move: the rules the Slurm fault tests (test_slurm_faults.py) show on the real cluster, each alone.

- an outage is no attempt and no failure: a teardown waits for the backend past any budget with its devices held,
  a provisioning step fails only past PROVISIONING_OUTAGE_BUDGET_SECONDS, neither cordons a node;
- a teardown refused for good cordons the node and holds the devices until an operator forces it (audited; role
  matrix on the API);
- a whole backend out is marked degraded: new orders wait with its sentence (queue, preview, operator home), and its
  first answer clears it and places them."""

from datetime import timedelta

import pytest
import time_machine
from django.urls import reverse
from django.utils import timezone
from rest_framework.test import APIClient

from provisioning import engine
from provisioning.choices import RunKind, RunState, StepState, Wait
from provisioning.models import ProvisioningRun, ProvisioningStep
from requests import services as request_services
from requests.choices import EventCode, RequestState
from scheduling.choices import AllocationState
from scheduling.models import Allocation, BackendStatus
from tenancy.models import AuditEvent
from tests.requests.conftest import make_order

pytestmark = pytest.mark.django_db

OUTAGE = {"unavailable": True}


@pytest.fixture
def outage(settings):
    """Faults to switch on and off; steps that wait go back to the sweeper, which the test drives."""
    settings.PROVISIONING_CHAIN_SECONDS = 0.0
    settings.PROVISIONING_INLINE_WAIT_SECONDS = 0.0

    def on(op: str, **fault):
        settings.PROVISIONING_FAULTS = [{"op": op, **OUTAGE, **fault}]

    def off():
        settings.PROVISIONING_FAULTS = []

    return on, off


def sweep(run_on_commit) -> None:
    run_on_commit(engine.steps_resume_due)


def current_step(request, kind: str) -> ProvisioningStep:
    run = ProvisioningRun.objects.get(request=request, kind=kind)
    return run.steps.get(position=run.current_position)


def release(run_on_commit, request):
    run_on_commit(request_services.request_release, request=request, actor=request.requester, reason="done")
    request.refresh_from_db()
    return request


def waiting(api_as, request) -> dict | None:
    answer = api_as(request.requester).get(f"/api/v1/requests/{request.pk}/")
    assert answer.status_code == 200
    return answer.json()["provisioning"]["waiting"]


def test_a_release_waits_out_an_outage_for_as_long_as_it_lasts_with_its_devices_held(
    compute, outage, run_on_commit, api_as, settings
):
    settings.PROVISIONING_OUTAGE_BUDGET_SECONDS = 60  # a provisioning step's: a teardown has none
    on, off = outage
    request = compute.order()
    assert request.state == RequestState.ACTIVE
    on("stop_workload")

    with time_machine.travel(timezone.now(), tick=False) as clock:
        release(run_on_commit, request)
        clock.shift(timedelta(hours=3))
        sweep(run_on_commit)

        step = current_step(request, RunKind.RELEASE)
        assert (step.state, step.waiting_for, step.attempts) == (StepState.WAITING, Wait.OUTAGE, 1)
        request.refresh_from_db()
        assert request.state == RequestState.RELEASING
        assert Allocation.objects.get(request=request).state == AllocationState.ACTIVE
        compute.node.refresh_from_db()
        assert compute.node.schedulable
        reason = waiting(api_as, request)
        assert reason["code"] == "backend_unavailable" and reason["details"]["waiting_for"] == "the host of n1"
        assert reason["message"].startswith(
            "Releasing — waiting for the backend to confirm the workload stopped: the host of n1 has not answered"
        )
        notes = request.events.filter(code=EventCode.BACKEND_WAIT)
        assert notes.count() == 1  # once when the wait began, however many times it asked

        off()
        clock.shift(timedelta(seconds=settings.PROVISIONING_OUTAGE_RETRY_MAX_SECONDS))  # its next retry is due
        sweep(run_on_commit)

    request.refresh_from_db()
    assert request.state == RequestState.RELEASED
    assert Allocation.objects.get(request=request).state == AllocationState.RELEASED
    assert notes.last().message == "The host of n1 answers again after 180 min 10 s; step 'stop_workload' goes on."
    assert not request.events.filter(code=EventCode.PROVISIONING_STEP_FAILED).exists()
    assert waiting(api_as, request) is None


def test_a_provisioning_step_fails_past_the_outage_budget_without_cordoning_and_its_cleanup_returns_the_devices(
    compute, outage, run_on_commit, settings
):
    settings.PROVISIONING_OUTAGE_BUDGET_SECONDS = 120
    on, _off = outage
    on("start_workload")

    with time_machine.travel(timezone.now(), tick=False) as clock:
        request = compute.order()
        assert request.state == RequestState.PROVISIONING
        clock.shift(timedelta(seconds=119))
        sweep(run_on_commit)
        assert current_step(request, RunKind.PROVISION).waiting_for == Wait.OUTAGE
        clock.shift(timedelta(seconds=settings.PROVISIONING_OUTAGE_RETRY_MAX_SECONDS))  # its next retry is due
        sweep(run_on_commit)

    request.refresh_from_db()
    assert request.state == RequestState.FAILED
    failure = ProvisioningRun.objects.get(request=request, kind=RunKind.PROVISION).failure
    assert (failure["step"], failure["code"], failure["attempts"]) == ("start_workload", "simulated_unavailable", 1)
    assert failure["message"].startswith("The host of n1 did not answer for 2 min 9 s (the outage budget is 2 min): ")
    compute.node.refresh_from_db()
    assert compute.node.schedulable
    assert ProvisioningRun.objects.get(request=request, kind=RunKind.CLEANUP).state == RunState.SUCCEEDED
    assert Allocation.objects.get(request=request).state == AllocationState.RELEASED


def test_a_teardown_refused_for_good_cordons_the_node_and_holds_the_devices_until_an_operator_forces_it(
    compute, run_on_commit, api_as, roles, settings, client
):
    request = compute.order()
    settings.PROVISIONING_FAULTS = [
        {"op": "stop_workload", "code": "host_refused", "message": "The host refused.", "retryable": False}
    ]
    release(run_on_commit, request)

    run = ProvisioningRun.objects.get(request=request, kind=RunKind.RELEASE)
    assert run.state == RunState.FAILED and request.state == RequestState.RELEASING
    assert Allocation.objects.get(request=request).state == AllocationState.ACTIVE
    compute.node.refresh_from_db()
    assert not compute.node.schedulable and "stop_workload" in compute.node.cordon_reason
    reason = waiting(api_as, request)
    assert reason["code"] == "teardown_refused" and "an operator confirms the workload is gone" in reason["message"]
    assert request.events.filter(code=EventCode.TEARDOWN_STUCK).exists()
    client.force_login(roles.operator)
    assert f"Run #{run.pk} of request #{request.pk}" in client.get(reverse("admin:index")).content.decode()

    url = f"/api/v1/provisioning/runs/{run.pk}/force-release/"
    assert APIClient().post(url, {"reason": "x"}, format="json").status_code == 401
    for somebody in (request.requester, roles.approver, roles.other_developer):
        refused = api_as(somebody).post(url, {"reason": "x"}, format="json")
        assert (refused.status_code, refused.json()["code"]) == (403, "permission_denied")
    operator = roles.operator
    assert api_as(operator).post(url, {}, format="json").status_code == 400
    answer = run_on_commit(api_as(operator).post, url, {"reason": "reinstalled the node"}, format="json")
    assert answer.status_code == 200, answer.content

    request.refresh_from_db()
    assert request.state == RequestState.RELEASED
    assert Allocation.objects.get(request=request).state == AllocationState.RELEASED
    assert AuditEvent.objects.get(action="provisioning.teardown_forced").actor == operator
    assert request.events.get(code=EventCode.TEARDOWN_FORCED).actor == operator
    again = api_as(operator).post(url, {"reason": "again"}, format="json")
    assert (again.status_code, again.json()["code"]) == (409, "not_forceable")


def test_a_whole_backend_out_is_degraded_new_orders_wait_with_its_sentence_and_its_answer_places_them(
    compute, outage, run_on_commit, console, settings
):
    on, off = outage
    on("start_workload", whole_backend=True)
    first = compute.order()
    assert first.state == RequestState.PROVISIONING
    status = BackendStatus.objects.get(backend="simulated")
    assert status.unavailable and status.message.startswith("simulated cluster unreachable since ")

    second = run_on_commit(
        request_services.request_submit, order=make_order(compute.shop, compute.team.project), requester=first.requester
    )
    second.refresh_from_db()
    assert (second.state, second.queue_reason["code"]) == (RequestState.QUEUED, "backend_unavailable")
    assert second.queue_reason["message"] == status.message
    preview = request_services.request_preview(
        order=make_order(compute.shop, compute.team.project), requester=first.requester
    )
    assert (preview["placement"]["code"], preview["placement"]["message"]) == ("backend_unavailable", status.message)
    home = console.get(reverse("admin:index")).content.decode()
    assert status.message in home
    assert not compute.node.__class__.objects.filter(schedulable=False).exists()

    off()
    sweep(run_on_commit)

    for request in (first, second):
        request.refresh_from_db()
        assert request.state == RequestState.ACTIVE
    assert not BackendStatus.objects.get(backend="simulated").unavailable
    assert AuditEvent.objects.filter(action__in=["backend.unavailable", "backend.answering"]).count() == 2


def test_a_release_whose_teardown_task_was_lost_is_resumed_by_the_minute_sweeper(compute, run_on_commit, settings):
    """The task that starts a release's teardown can die with its worker or its database connection (the fault
    bench's database_drop scenario lost two): the request would stay `releasing` with its devices held for ever."""
    from provisioning import tasks

    request = compute.order()
    request_services.request_release(request=request, actor=request.requester, reason="done")  # its task never runs
    request.refresh_from_db()
    assert request.state == RequestState.RELEASING
    assert run_on_commit(tasks.start_stranded_runs)["releases_resumed"] == []  # within the grace period

    with time_machine.travel(timezone.now() + timedelta(seconds=settings.PROVISIONING_RELEASE_GRACE_SECONDS + 1)):
        resumed = run_on_commit(tasks.start_stranded_runs)["releases_resumed"]

    assert resumed == [request.pk]
    request.refresh_from_db()
    assert request.state == RequestState.RELEASED
    assert ProvisioningRun.objects.get(request=request, kind=RunKind.RELEASE).state == RunState.SUCCEEDED
    assert request.events.filter(code=EventCode.PROVISIONING_RECOVERED).exists()
    assert run_on_commit(tasks.start_stranded_runs)["releases_resumed"] == []


def test_an_operator_returns_the_devices_of_a_release_still_waiting_for_its_backend_from_the_console(
    compute, outage, run_on_commit, console
):
    """The backend may never come back (a cluster given up): the console's action, with a reason, stops the waiting
    teardown and ends the release."""
    on, _off = outage
    request = compute.order()
    on("stop_workload")
    release(run_on_commit, request)
    run = ProvisioningRun.objects.get(request=request, kind=RunKind.RELEASE)
    url = "/admin/provisioning/provisioningrun/"

    form = console.post(url, {"action": "force_release_runs", "_selected_action": [run.pk]})
    assert b"reason" in form.content and Allocation.objects.get(request=request).state == AllocationState.ACTIVE
    run_on_commit(
        console.post,
        url,
        {"action": "force_release_runs", "_selected_action": [run.pk], "apply": "1", "reason": "cluster retired"},
    )

    request.refresh_from_db()
    assert request.state == RequestState.RELEASED
    run.refresh_from_db()
    assert run.state == RunState.CANCELLED
    assert AuditEvent.objects.get(action="provisioning.teardown_forced").reason == "cluster retired"


def test_a_node_s_podman_out_of_reach_is_an_outage_of_that_node(tmp_path):
    """The real podman client against a socket nobody serves: "not now" for that node's service (waited out), not a
    failure, and nothing backend-wide."""
    from provisioning.drivers.base import BackendUnavailable
    from provisioning.drivers.container import Podman

    with pytest.raises(BackendUnavailable) as caught:
        Podman(f"unix://{tmp_path}/podman.sock").containers()

    assert (caught.value.code, caught.value.whole_backend) == ("podman_unreachable", False)
    assert caught.value.waiting_for == f"podman at unix://{tmp_path}/podman.sock"
