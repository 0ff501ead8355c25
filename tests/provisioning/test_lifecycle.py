"""Runs meeting the rest of the lifecycle: release while provisioning, preemption, a dead worker's lease, the
installer callback's refusals, and the operator's retry from the failed step."""

from datetime import timedelta

import pytest
from django.db import transaction
from django.urls import reverse
from django.utils import timezone
from django_fsm import ConcurrentTransition

from config.errors import Conflict, NotPermitted
from provisioning import engine, installer_tokens, services
from provisioning.choices import RunKind, RunState, StepState
from provisioning.models import ProvisioningRun, ProvisioningStep
from requests import services as request_services
from requests.choices import EventCode, RequestState
from scheduling.choices import AllocationState
from scheduling.models import Allocation, Device
from scheduling.services import device_isolate
from tenancy.models import AuditEvent
from tests import factories

pytestmark = pytest.mark.django_db

NEVER_READY = [{"op": "workload_ready", "result": {"ready": False}}]


def test_release_while_provisioning_cancels_the_run_and_tears_down(compute, settings, run_on_commit):
    settings.PROVISIONING_FAULTS = NEVER_READY
    settings.PROVISIONING_INLINE_WAIT_SECONDS = 0  # the readiness poll goes back to the sweeper
    request = compute.order()
    assert request.state == RequestState.PROVISIONING
    run_on_commit(request_services.request_release, request=request, actor=request.requester, reason="not needed")
    request.refresh_from_db()
    assert request.state == RequestState.RELEASED
    provision = ProvisioningRun.objects.get(request=request, kind=RunKind.PROVISION)
    assert provision.state == RunState.CANCELLED
    assert provision.steps.get(name="readiness_check").state == StepState.CANCELLED
    assert ProvisioningRun.objects.get(request=request, kind=RunKind.RELEASE).state == RunState.SUCCEEDED
    assert set(Device.objects.values_list("allocated_milli", flat=True)) == {0}


def test_preemption_tears_the_environment_down_and_the_request_runs_again(compute, run_on_commit):
    request = compute.order()
    run_on_commit(
        device_isolate, device=Device.objects.get(uuid="GPU-n1-0"), reason="XID 79"
    )  # requeues what runs there
    teardown = ProvisioningRun.objects.get(request=request, kind=RunKind.TEARDOWN)
    assert teardown.state == RunState.SUCCEEDED
    assert list(teardown.steps.values_list("name", flat=True)) == ["stop_workload"]
    assert request.events.filter(code=EventCode.CLEANED_UP, message__contains="preemption").exists()
    request.refresh_from_db()
    assert request.state == RequestState.ACTIVE  # placed again on healthy cards, and provisioned there
    again = Allocation.objects.get(request=request, state=AllocationState.ACTIVE)
    assert "GPU-n1-0" not in again.devices.values_list("device__uuid", flat=True)
    assert ProvisioningRun.objects.get(allocation=again, kind=RunKind.PROVISION).state == RunState.SUCCEEDED


def test_an_expired_lease_is_resumed_by_another_worker_without_repeating_done_steps(
    compute, settings, monkeypatch, run_on_commit
):
    """In process: a claim whose worker never reports back (as if killed), then the sweeper."""
    calls = []
    real = engine._attempt
    monkeypatch.setattr(engine, "_attempt", lambda claimed: calls.extend(c.step.name for c in claimed) or real(claimed))
    settings.PROVISIONING_FAULTS = NEVER_READY
    settings.PROVISIONING_INLINE_WAIT_SECONDS = 0
    request = compute.order()
    step = ProvisioningStep.objects.get(run__request=request, name="readiness_check")
    ProvisioningStep.objects.filter(pk=step.pk).update(retry_at=timezone.now())
    assert engine._claim([step.pk], owner=engine.uuid.uuid4())  # a worker takes it, then dies
    ProvisioningStep.objects.filter(pk=step.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    settings.PROVISIONING_FAULTS = []
    assert run_on_commit(engine.steps_resume_due) == 1
    request.refresh_from_db()
    assert request.state == RequestState.ACTIVE
    assert calls.count("prepare_image") == 1 and calls.count("start_workload") == 1
    assert "lease expired" in ProvisioningStep.objects.get(pk=step.pk).log


def test_a_worker_whose_lease_was_taken_over_discards_its_result(compute, settings):
    settings.PROVISIONING_FAULTS = NEVER_READY
    settings.PROVISIONING_INLINE_WAIT_SECONDS = 0
    request = compute.order()
    step = ProvisioningStep.objects.get(run__request=request, name="readiness_check")
    ProvisioningStep.objects.filter(pk=step.pk).update(retry_at=timezone.now())
    slow, fast = engine.uuid.uuid4(), engine.uuid.uuid4()
    engine._claim([step.pk], owner=slow)
    ProvisioningStep.objects.filter(pk=step.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    engine._claim([step.pk], owner=fast)
    assert engine._record(slow, {step.pk: engine.Done({"ready": True})}) == {step.pk: None}
    step.refresh_from_db()
    assert (step.state, step.lease_owner) == (StepState.RUNNING, fast)


def test_a_stale_run_cannot_overwrite_a_transition_saved_meanwhile(compute, settings):
    settings.PROVISIONING_FAULTS = NEVER_READY
    settings.PROVISIONING_INLINE_WAIT_SECONDS = 0
    request = compute.order()
    run = ProvisioningRun.objects.get(request=request, kind=RunKind.PROVISION)
    stale = ProvisioningRun.objects.get(pk=run.pk)
    run.cancel()
    run.save(update_fields=["state", "finished_at"])
    stale.fail(failure={"step": "readiness_check"})
    with pytest.raises(ConcurrentTransition), transaction.atomic():
        stale.save(update_fields=["state", "finished_at", "failure"])
    assert ProvisioningRun.objects.get(pk=run.pk).state == RunState.CANCELLED


@pytest.fixture
def installer_reports_through_the_api(monkeypatch):
    """The simulated BMC boots no installer: the test posts the installer's report itself."""
    monkeypatch.setattr("provisioning.drivers.simulated.SimulatedBmc._boot_installer", lambda self, machine: None)


def test_installer_callback_refuses_unknown_and_reused_tokens_and_bad_input(
    bare_metal, api, installer_reports_through_the_api
):
    url = reverse("provisioning-installer-callback")
    assert api.post(url, {"token": "nope", "status": "succeeded"}, format="json").json()["code"] == "unknown_token"
    bad = api.post(url, {"token": "x", "status": "maybe"}, format="json")
    assert bad.status_code == 400 and bad.json()["code"] == "validation_error"
    run = ProvisioningRun.objects.get(request=bare_metal.order())
    assert run.steps.get(name="wait_for_install").state == StepState.WAITING
    token = installer_tokens.installer_token_issue(run=run)  # as the boot step hands it to the installer
    assert api.post(url, {"token": token, "status": "failed", "detail": "disk"}, format="json").status_code == 202
    assert api.post(url, {"token": token, "status": "failed"}, format="json").json()["code"] == "token_used"


def test_installer_failure_fails_the_request_at_the_wait_step(
    bare_metal, run_on_commit, installer_reports_through_the_api
):
    request = bare_metal.order()
    run = ProvisioningRun.objects.get(request=request)
    token = installer_tokens.installer_token_issue(run=run)  # as if the boot step had handed it to the installer
    run_on_commit(services.installer_report, token=token, status="failed", detail="No disk found", source_address=None)
    request.refresh_from_db()
    assert request.state == RequestState.FAILED
    assert ProvisioningRun.objects.get(pk=run.pk).failure["code"] == "installer_failed"


def failed_compute(compute, settings):
    settings.PROVISIONING_FAULTS = [
        {"op": "start_workload", "code": "image_pull_failed", "message": "manifest unknown", "retryable": False}
    ]
    request = compute.order()
    assert request.state == RequestState.FAILED
    settings.PROVISIONING_FAULTS = []
    return request, ProvisioningRun.objects.get(request=request, kind=RunKind.PROVISION)


def test_operator_retries_from_the_failed_step_on_the_same_devices(compute, settings, run_on_commit):
    request, failed = failed_compute(compute, settings)
    operator = compute.team.operator
    retry = run_on_commit(services.run_retry, run=failed, actor=operator, reason="registry fixed")
    request.refresh_from_db()
    assert request.state == RequestState.ACTIVE
    retry.refresh_from_db()
    assert retry.retry_of == failed and retry.state == RunState.SUCCEEDED
    steps = list(retry.steps.values_list("name", "attempts"))
    assert steps == [("prepare_image", 0), ("start_workload", 1), ("readiness_check", 1), ("publish_access", 1)]
    assert "Carried over" in retry.steps.get(name="prepare_image").log
    allocations = Allocation.objects.filter(request=request).order_by("id")
    assert [a.state for a in allocations] == [AllocationState.RELEASED, AllocationState.ACTIVE]
    assert list(allocations[0].devices.values_list("device_id", "milli")) == list(
        allocations[1].devices.values_list("device_id", "milli")
    )
    event = request.events.get(code=EventCode.PROVISIONING_RETRIED)
    assert event.intervention and event.actor == operator and "from step 'start_workload'" in event.message
    assert AuditEvent.objects.filter(action="provisioning.retried", actor=operator).exists()


def test_retry_is_for_operators_and_only_once(compute, settings, run_on_commit):
    request, failed = failed_compute(compute, settings)
    with pytest.raises(NotPermitted):
        services.run_retry(run=failed, actor=request.requester, reason="please")
    run_on_commit(services.run_retry, run=failed, actor=compute.team.operator, reason="registry fixed")
    with pytest.raises(Conflict) as refusal:
        services.run_retry(run=failed, actor=compute.team.operator, reason="again")
    assert refusal.value.code == "not_retryable"


def test_retry_is_refused_when_the_devices_went_to_other_work(compute, settings, run_on_commit):
    request, failed = failed_compute(compute, settings)
    other = compute.order()  # the freed cards go to the next request
    assert other.state == RequestState.ACTIVE
    third = compute.order()
    assert third.state == RequestState.ACTIVE
    with pytest.raises(Conflict) as refusal:
        services.run_retry(run=failed, actor=compute.team.operator, reason="try again")
    assert refusal.value.code == "capacity_taken"
    request.refresh_from_db()
    assert request.state == RequestState.FAILED


def test_retry_is_refused_on_an_isolated_node(bare_metal, settings):
    settings.PROVISIONING_FAULTS = [{"op": "inventory", "result": {"health": "Critical"}}]
    request = bare_metal.order()
    failed = ProvisioningRun.objects.get(request=request, kind=RunKind.PROVISION)
    with pytest.raises(Conflict) as refusal:
        services.run_retry(run=failed, actor=factories.operator(), reason="check")
    assert refusal.value.code == "node_isolated"


def test_an_operator_isolating_a_busy_card_counts_as_an_intervention_a_health_rule_does_not(compute, run_on_commit):
    request = compute.order()
    run_on_commit(
        device_isolate, device=Device.objects.get(uuid="GPU-n1-0"), reason="reseating", actor=compute.team.operator
    )
    run_on_commit(device_isolate, device=Device.objects.get(uuid="GPU-n1-1"), reason="XID 79")
    isolations = request.events.filter(code=EventCode.DEVICE_ISOLATED).order_by("id")
    assert [event.intervention for event in isolations] == [True, False]


def test_a_provisioning_that_finishes_after_a_release_began_leaves_the_release_in_charge(
    compute, settings, run_on_commit
):
    settings.PROVISIONING_FAULTS = NEVER_READY
    settings.PROVISIONING_INLINE_WAIT_SECONDS = 0
    request = compute.order()
    request_services.request_release(request=request, actor=request.requester, reason="changed my mind")
    settings.PROVISIONING_FAULTS = []  # the workload comes up just as the release starts
    ProvisioningStep.objects.filter(run__request=request, name="readiness_check").update(retry_at=timezone.now())
    run_on_commit(engine.steps_resume_due)
    request.refresh_from_db()
    assert request.state == RequestState.RELEASING  # not activated behind the release's back
    assert not request.events.filter(code__in=[EventCode.ACTIVE, EventCode.CLEANED_UP]).exists()
    run_on_commit(services.release_start, request_id=request.pk, reason="changed my mind")
    request.refresh_from_db()
    assert request.state == RequestState.RELEASED
    assert ProvisioningRun.objects.get(request=request, kind=RunKind.RELEASE).state == RunState.SUCCEEDED


def _handed_to_the_broker(monkeypatch) -> list[int]:
    handed = []
    monkeypatch.setattr(engine, "step_task", lambda step_ids: handed.extend(step_ids))
    return handed


def test_a_worker_goes_on_with_the_run_s_next_steps_its_readiness_watch_included(compute, monkeypatch):
    """The worker that submitted the workload watches it come up (no trip through the broker), and publishing is
    done in the readiness step's record."""
    handed = _handed_to_the_broker(monkeypatch)
    request = compute.order()
    steps = ProvisioningRun.objects.get(request=request, kind=RunKind.PROVISION).steps
    assert request.state == RequestState.ACTIVE and handed == []
    assert set(steps.values_list("state", flat=True)) == {StepState.SUCCEEDED}
    readiness, published = steps.get(name="readiness_check"), steps.get(name="publish_access")
    assert published.started_at >= readiness.finished_at


def test_a_chain_past_its_budget_hands_the_run_s_next_step_to_the_broker(compute, settings, monkeypatch):
    settings.PROVISIONING_CHAIN_SECONDS = 0
    handed = _handed_to_the_broker(monkeypatch)
    request = compute.order()
    steps = ProvisioningRun.objects.get(request=request, kind=RunKind.PROVISION).steps
    assert handed == [steps.get(name="start_workload").pk]
    assert steps.get(name="prepare_image").state == StepState.SUCCEEDED
    assert steps.get(name="start_workload").state == StepState.PENDING
