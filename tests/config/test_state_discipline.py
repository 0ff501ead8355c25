"""One state discipline: every stateful model moves only through its django-fsm transitions, which refuse
illegal moves, and no module outside the models assigns a state field directly."""

import re
import uuid
from pathlib import Path

import pytest
from django.conf import settings
from django.utils import timezone
from django_fsm import FSMField, TransitionNotAllowed

from provisioning.choices import RunState, StepState, Wait
from provisioning.models import ProvisioningRun, ProvisioningStep
from requests.choices import ApprovalState, ChangeState, StageState
from requests.models import Approval, ApprovalStage, QuotaChangeRequest
from scheduling.models import IsolationClearance
from serving.choices import DeploymentState
from serving.models import ServingDeployment
from tenancy.choices import DeviceAuthorizationState
from tenancy.models import DeviceAuthorization

NOW = timezone.now()
A, G, R, P, D, C = ApprovalState, StageState, RunState, StepState, DeploymentState, ChangeState
V = DeviceAuthorizationState

# Written out by hand, not derived from the models, so that a changed transition fails here:
# {transition: {source: target}} and the arguments each transition takes.
MACHINES = {
    Approval: {
        "approve": {A.PENDING: A.APPROVED},
        "reject": {A.PENDING: A.REJECTED},
        "cancel": {A.PENDING: A.CANCELLED},
    },
    ApprovalStage: {
        "open": {G.WAITING: G.PENDING},
        "approve": {G.PENDING: G.APPROVED},
        "reject": {G.PENDING: G.REJECTED},
        "cancel": {G.WAITING: G.CANCELLED, G.PENDING: G.CANCELLED},
    },
    ProvisioningRun: {
        "succeed": {R.RUNNING: R.SUCCEEDED},
        "fail": {R.RUNNING: R.FAILED},
        "cancel": {R.RUNNING: R.CANCELLED},
    },
    ProvisioningStep: {
        "claim": {P.PENDING: P.RUNNING, P.WAITING: P.RUNNING, P.RUNNING: P.RUNNING},
        "succeed": {P.RUNNING: P.SUCCEEDED},
        "wait": {P.RUNNING: P.WAITING},
        "fail": {P.RUNNING: P.FAILED},
        "cancel": {P.PENDING: P.CANCELLED, P.WAITING: P.CANCELLED, P.RUNNING: P.CANCELLED},
    },
    ServingDeployment: {
        "serve": {D.DEPLOYING: D.SERVING, D.STOPPED: D.SERVING, D.WAKING: D.SERVING},
        "stop": {
            D.DEPLOYING: D.STOPPED,
            D.SERVING: D.STOPPED,
            D.SCALING_TO_ZERO: D.STOPPED,
            D.SCALED_TO_ZERO: D.STOPPED,
            D.WAKING: D.STOPPED,
        },
        "scale_to_zero": {D.SERVING: D.SCALING_TO_ZERO},
        "reach_zero": {D.SCALING_TO_ZERO: D.SCALED_TO_ZERO},
        "wake": {D.SCALED_TO_ZERO: D.WAKING},
    },
    DeviceAuthorization: {
        "approve": {V.PENDING: V.APPROVED},
        "deny": {V.PENDING: V.DENIED},
        "use": {V.APPROVED: V.USED},
    },
    # The change-request machine, shared with quota changes and extensions (requests.models.change).
    IsolationClearance: {
        "apply": {C.PENDING_APPROVAL: C.APPLIED},
        "reject": {C.PENDING_APPROVAL: C.REJECTED},
        "cancel": {C.PENDING_APPROVAL: C.CANCELLED},
    },
}
ARGUMENTS = {
    (Approval, "approve"): {"at": NOW},
    (Approval, "reject"): {"at": NOW},
    (Approval, "cancel"): {"at": NOW},
    (ApprovalStage, "approve"): {"at": NOW},
    (ApprovalStage, "reject"): {"at": NOW},
    (ProvisioningRun, "succeed"): {"delivered": {"node": "n1"}},
    (ProvisioningRun, "fail"): {"failure": {"step": "boot"}},
    (ProvisioningStep, "claim"): {"owner": uuid.uuid4(), "now": NOW},
    (ProvisioningStep, "succeed"): {"output": {}},
    (ProvisioningStep, "wait"): {"until": NOW, "waiting_for": Wait.RETRY},
    (ProvisioningStep, "fail"): {"error": {"code": "boom"}},
    (DeviceAuthorization, "approve"): {"by": None, "at": NOW},
    (DeviceAuthorization, "deny"): {"by": None, "at": NOW},
    (DeviceAuthorization, "use"): {"token": None},
}
MATRIX = [
    (model, state, name)
    for model, machine in MACHINES.items()
    for state in model._meta.get_field("state").choices
    for name in machine
]


def _state_field(model) -> FSMField:
    return model._meta.get_field("state")


def _model_transitions(model) -> dict[str, dict[str, str]]:
    moves: dict[str, dict[str, str]] = {}
    for move in _state_field(model).get_all_transitions(model):
        moves.setdefault(move.name, {})[move.source] = move.target
    return moves


@pytest.mark.parametrize("model", MACHINES, ids=lambda model: model.__name__)
def test_the_table_is_the_models_state_machine(model):
    assert _model_transitions(model) == MACHINES[model]


@pytest.mark.parametrize("model", MACHINES, ids=lambda model: model.__name__)
def test_state_is_a_protected_fsm_field_that_cannot_be_assigned(model):
    field = _state_field(model)
    assert isinstance(field, FSMField) and field.protected
    instance = model()
    with pytest.raises(AttributeError):
        instance.state = field.default


@pytest.mark.parametrize(
    ("model", "state", "name"),
    [(model, state, name) for model, (state, _label), name in MATRIX],
    ids=[f"{model.__name__}-{state}-{name}" for model, (state, _label), name in MATRIX],
)
def test_transition_from_state(model, state, name):
    instance = model(state=state)
    target = MACHINES[model][name].get(state)
    move = getattr(instance, name)
    if target is None:
        with pytest.raises(TransitionNotAllowed):
            move(**ARGUMENTS.get((model, name), {}))
        assert instance.state == state
    else:
        move(**ARGUMENTS.get((model, name), {}))
        assert instance.state == target


def test_isolation_clearances_share_the_change_request_machine():
    assert _model_transitions(IsolationClearance) == _model_transitions(QuotaChangeRequest)


def test_a_step_leaving_running_gives_up_its_lease():
    for name in ["succeed", "wait", "fail", "cancel"]:
        step = ProvisioningStep(state=P.RUNNING, lease_owner=uuid.uuid4(), lease_expires_at=NOW)
        getattr(step, name)(**ARGUMENTS.get((ProvisioningStep, name), {}))
        assert (step.lease_owner, step.lease_expires_at) == (None, None), name


def test_resuming_after_an_outside_event_is_the_same_attempt():
    owner = uuid.uuid4()
    waited = ProvisioningStep(state=P.WAITING, waiting_for=Wait.EVENT, attempts=1, retry_at=NOW)
    waited.claim(owner=owner, now=NOW)
    backed_off = ProvisioningStep(state=P.WAITING, waiting_for=Wait.RETRY, attempts=1, retry_at=NOW)
    backed_off.claim(owner=owner, now=NOW)
    assert (waited.attempts, backed_off.attempts) == (1, 2)
    assert (waited.lease_owner, waited.waiting_for, waited.retry_at, waited.started_at) == (owner, "", None, NOW)


# --- Nothing outside the models assigns a state -------------------------------------------------------------

APPS = ["requests", "provisioning", "tenancy", "catalog", "metering", "scheduling"]
# scheduling/engine/ is the pure placement engine: its `state` is its own per-node array, not a model field.
NOT_MODEL_STATE = ("scheduling/engine/",)
# Instances can only carry states their transitions reached (the field is protected), so saving them, one by one
# or with bulk_update, is fine; what bypasses the transitions is assigning the attribute or a queryset UPDATE.
DIRECT_STATE_WRITES = [
    re.compile(r"^\s*[\w.\[\]]+\.state\s*(,\s*[\w.\[\]]+\s*)*=(?!=)", re.MULTILINE),  # x.state = / x.state, y =
    re.compile(r"\.update\([^)]*\bstate\s*="),  # queryset.update(state=...)
    re.compile(r"setattr\([^)]*[\"']state[\"']"),
]


def _sources():
    root = Path(settings.BASE_DIR)
    for app in APPS:
        for path in sorted((root / app).rglob("*.py")):
            relative = path.relative_to(root).as_posix()
            if "/migrations/" not in relative and not relative.startswith(NOT_MODEL_STATE):
                yield relative, path.read_text()


# A service writing many rows at once marks the line that sets the state its FSM transitions computed.
CHECKED_BULK_WRITE = "# fsm: "


def _direct_writes(source: str) -> list[str]:
    return [
        match.group(0).strip()
        for pattern in DIRECT_STATE_WRITES
        for match in pattern.finditer(source)
        if CHECKED_BULK_WRITE not in source[match.start() : source.find("\n", match.end())]
    ]


def test_the_scan_recognises_direct_state_writes():
    assert _direct_writes("    step.state = StepState.RUNNING\n")
    assert _direct_writes("    run.state, run.finished_at = RunState.FAILED, now\n")
    assert _direct_writes("ServingDeployment.objects.filter(pk=1).update(state='serving', stopped_at=None)")
    assert not _direct_writes("    if step.state == StepState.RUNNING:\n")
    assert not _direct_writes("    steps.filter(state=StepState.WAITING).update(retry_at=now)\n")
    assert not _direct_writes("    .update(\n        state=target,  # fsm: reached by the transitions above\n")


def test_no_module_assigns_a_state_field():
    scanned = dict(_sources())
    assert "provisioning/engine.py" in scanned and "requests/approvals.py" in scanned
    writes = {path: found for path, source in scanned.items() if (found := _direct_writes(source))}
    assert writes == {}
