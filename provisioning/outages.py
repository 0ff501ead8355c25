"""Waiting out a backend that does not answer (docs/provisioning.md, "Outages").

A driver classifies every answer once (drivers/base.py, `BackendUnavailable`): "not now" is never a step's final
outcome while the outage lasts. The engine asks again with backoff, and the step waits as `Wait.OUTAGE` (not an
attempt: its attempts stay for its own faults):

- a provisioning step for at most PROVISIONING_OUTAGE_BUDGET_SECONDS of outage (then it fails with the backend's
  words, and the cleanup that follows waits for the backend in turn); a teardown (release, cleanup, preemption)
  until the backend answers, since the workload may still run and its capacity stays held until it is confirmed
  gone (or an operator forces it, audited);
- the request shows why it waits ("Waiting for the Slurm controller since 14:02 UTC, retrying.", or "Releasing —
  waiting for Slurm to confirm the job stopped ..."), on its page and in the API (`provisioning.waiting`), with one
  timeline note when the wait begins and one when the backend answers again;
- an outage of a whole backend (a Slurm controller) marks it degraded (scheduling/backends.py): new placements onto
  it wait, and one task asks it again every few seconds while it is out (`backend_watch`). Its first answer clears
  the mark, wakes every step waiting for it, and the queue is placed again.

The time a step waited for its backend does not count against the step's own timeout.
"""

import logging
import time
from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import F
from django.utils import timezone

from config.workers import wait_unless_stopping
from provisioning.choices import TEARDOWN_KINDS, RunKind, RunState, StepState, Wait
from provisioning.drivers.base import BackendUnavailable, StepError
from provisioning.models import ProvisioningRun, ProvisioningStep
from provisioning.step_tasks import step_task
from requests.choices import EventCode
from requests.services import record_event
from scheduling import backends

logger = logging.getLogger(__name__)

BACKEND_UNAVAILABLE = backends.BACKEND_UNAVAILABLE
TEARDOWN_REFUSED = "teardown_refused"
WATCH_TASK = "provisioning.tasks.watch_backend"
WAKE_TASK = "provisioning.tasks.wake_steps"
# What a teardown waits for the backend to confirm, by backend (the BMC drivers' for bare metal).
CONFIRMS = {
    "slurm": ("Slurm", "the job stopped"),
    "container": ("podman", "the container was removed"),
    "redfish": ("the BMC", "the server is off"),
}
CONFIRMS_DEFAULT = ("the backend", "the workload stopped")


def budget(run: ProvisioningRun) -> timedelta | None:
    """How long a step of this run waits out an outage before failing; None: until the backend answers."""
    if run.kind in TEARDOWN_KINDS:
        return None
    return timedelta(seconds=settings.PROVISIONING_OUTAGE_BUDGET_SECONDS)


def budget_spent(step: ProvisioningStep, now: datetime) -> bool:
    allowed = budget(step.run)
    return allowed is not None and now - step.outage_since >= allowed


def budget_error(step: ProvisioningStep, error: BackendUnavailable) -> StepError:
    """The final failure of a provisioning step whose backend stayed out longer than the budget: the backend's
    words, no isolation (nothing is known against the node)."""
    waited = timezone.now() - step.outage_since
    return StepError(
        error.code,
        f"{_capitalised(error.waiting_for)} did not answer for {_duration(waited)} "
        f"(the outage budget is {_duration(budget(step.run))}): {error.message}",
        retryable=False,
        details={**error.details, "outage_seconds": round(waited.total_seconds())},
    )


def retry_delay(step: ProvisioningStep, now: datetime) -> float:
    """Backoff without a counter: as long as the outage has lasted so far, from PROVISIONING_BACKOFF_SECONDS up to
    PROVISIONING_OUTAGE_RETRY_MAX_SECONDS (so a restart of seconds is seen within seconds)."""
    lasted = (now - step.outage_since).total_seconds()
    return min(max(settings.PROVISIONING_BACKOFF_SECONDS, lasted), settings.PROVISIONING_OUTAGE_RETRY_MAX_SECONDS)


def asked_again_inline(step: ProvisioningStep, error: BackendUnavailable, seconds: float, now: datetime) -> bool:
    """Whether the worker sleeps until the step's next try: only for a node's own service (a BMC, podman) during the
    first PROVISIONING_INLINE_WAIT_SECONDS of its outage. A whole backend out is asked by its watcher, whose first
    answer wakes every step waiting for it, so no worker is held by it (the workers stay free for the scheduling
    cycle and the other steps, and a hundred steps do not ask a backend that does not answer a hundred times)."""
    young = (now - step.outage_since).total_seconds() + seconds <= settings.PROVISIONING_INLINE_WAIT_SECONDS
    return young and not error.whole_backend


def note_outage(step: ProvisioningStep, error: BackendUnavailable) -> None:
    """The timeline note when a step starts waiting for its backend (once per outage of the step)."""
    reason = waiting_reason(step.run, step, error.details)
    record_event(
        step.run.request,
        actor=None,
        code=EventCode.BACKEND_WAIT,
        message=reason["message"],
        data={"run": step.run_id, "step": step.name, **reason},
    )


def outage_over(step: ProvisioningStep, now: datetime) -> str | None:
    """The step's backend answered again: a timeline note, its deadline moved by the time it waited (an outage is
    no part of the step's own timeout), its outage cleared. Returns the backend when the whole of it had been out."""
    waited = now - step.outage_since
    outage = (step.error.get("details") or {}).get("outage") or {}
    if step.deadline_at is not None:
        step.deadline_at += waited
    step.outage_since = None
    record_event(
        step.run.request,
        actor=None,
        code=EventCode.BACKEND_WAIT,
        message=f"{_capitalised(outage.get('waiting_for', 'the backend'))} answers again after {_duration(waited)}; "
        f"step '{step.name}' goes on.",
        data={
            "run": step.run_id,
            "step": step.name,
            "code": "backend_answered",
            "seconds": round(waited.total_seconds()),
        },
    )
    return outage.get("backend") if outage.get("whole_backend") else None


def backends_seen(*, unavailable: list[BackendUnavailable], answered: set[str]) -> None:
    """What a batch's attempts learnt about whole backends: the latest "not now" of each marks it degraded, an
    answer after an outage clears it."""
    latest = {error.backend: error for error in unavailable if error.whole_backend}
    for backend, error in latest.items():
        backends.backend_unavailable(backend=backend, cause=_cause(error))
    for backend in answered - latest.keys():
        backends.backend_answered(backend=backend)


def _cause(error: BackendUnavailable) -> dict:
    return {"code": error.code, "message": error.message, "part": error.waiting_for}


# --- What the request shows ---------------------------------------------------------------------------------------


def waiting_reason(run: ProvisioningRun, step: ProvisioningStep, details: dict | None = None) -> dict:
    """Why the run's step waits for its backend: {code, message, details}, for the request's page and API."""
    outage = (details or (step.error or {}).get("details") or {}).get("outage") or {}
    waiting_for = outage.get("waiting_for") or "the backend"
    since = timezone.localtime(step.outage_since or timezone.now())
    at = f"{since:%H:%M} {since:%Z}"
    if run.kind in TEARDOWN_KINDS:
        backend, confirms = CONFIRMS.get(run.driver, CONFIRMS_DEFAULT)
        message = (
            f"Releasing — waiting for {backend} to confirm {confirms}: {waiting_for} has not answered since {at}; "
            "retrying."
            if run.kind == RunKind.RELEASE
            else f"Cleaning up — waiting for {backend} to confirm {confirms}: {waiting_for} has not answered since "
            f"{at}; retrying."
        )
    else:
        message = f"Waiting for {waiting_for} since {at}, retrying."
    return {
        "code": BACKEND_UNAVAILABLE,
        "message": message,
        "details": {
            "backend": outage.get("backend") or run.driver,
            "waiting_for": waiting_for,
            "since": since.isoformat(),
            "run": run.pk,
            "step": step.name,
        },
    }


def stuck_reason(run: ProvisioningRun) -> dict:
    """A teardown the backend refused for good: the capacity stays held until an operator confirms the workload is
    gone."""
    failure = run.failure or {}
    backend, confirms = CONFIRMS.get(run.driver, CONFIRMS_DEFAULT)
    return {
        "code": TEARDOWN_REFUSED,
        "message": f"{'Releasing' if run.kind == RunKind.RELEASE else 'Cleaning up'} — {backend} could not confirm "
        f"{confirms}: {failure.get('message', '')} The devices stay held until an operator confirms the workload "
        "is gone.",
        "details": {"run": run.pk, "step": failure.get("step"), "failure_code": failure.get("code")},
    }


# --- The backend's return -----------------------------------------------------------------------------------------


def steps_wake(*, backend: str) -> int:
    """The backend answers again: every step waiting for it is due now, handed to workers in batches."""
    waiting = ProvisioningStep.objects.filter(
        state=StepState.WAITING,
        waiting_for=Wait.OUTAGE,
        run__state=RunState.RUNNING,
        run__driver=backend,
        position=F("run__current_position"),
    )
    due = list(waiting.order_by("pk").values_list("pk", flat=True))
    ProvisioningStep.objects.filter(pk__in=due).update(retry_at=timezone.now())
    size = max(1, settings.PROVISIONING_START_BATCH)
    for first in range(0, len(due), size):
        step_task(due[first : first + size])
    return len(due)


def backend_watch(*, backend: str) -> str:
    """While the backend is degraded, ask it again every PROVISIONING_OUTAGE_PROBE_SECONDS for up to
    PROVISIONING_OUTAGE_WATCH_SECONDS (within a task's timeout). One watcher at a time (a lease on the backend's
    status); during a longer outage the reconciler's minute pass starts the next one, as it does when a watcher's
    worker died."""
    from provisioning.drivers import workload_driver

    interval = settings.PROVISIONING_OUTAGE_PROBE_SECONDS
    lease = interval * 2 + settings.SLURM_TIMEOUT_SECONDS
    if not backends.backend_watch_lease(backend=backend, seconds=lease, renew=False):
        return "not_watched"  # answering again, or watched by another task
    ends = time.monotonic() + settings.PROVISIONING_OUTAGE_WATCH_SECONDS
    driver = workload_driver(backend)
    while True:
        try:
            driver.probe()
        except StepError as unavailable:
            logger.info("%s still unavailable: %s", backend, unavailable.message)
        else:
            backends.backend_answered(backend=backend)
            return "answered"
        if time.monotonic() + interval > ends or wait_unless_stopping(interval):
            break
        if not backends.backend_watch_lease(backend=backend, seconds=lease, renew=True):
            return "answered"  # another caller saw it answer meanwhile
    backends.backend_watch_lease(backend=backend, seconds=0, renew=True)  # the next pass may start another
    return "still_unavailable"


def _capitalised(text: str) -> str:
    return text[:1].upper() + text[1:]


def _duration(span: timedelta) -> str:
    """e.g. "45 s", "2 min", "2 min 9 s"."""
    seconds = round(span.total_seconds())
    if seconds < 120:
        return f"{seconds} s"
    minutes, seconds = divmod(seconds, 60)
    return f"{minutes} min" + (f" {seconds} s" if seconds else "")
