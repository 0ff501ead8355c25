from django.db import models


class Pipeline(models.TextChoices):
    COMPUTE = "compute", "Compute (image on allocated cards)"
    BARE_METAL = "bare_metal", "Bare metal (Redfish)"
    MODEL_SERVING = "model_serving", "Model serving (gateway)"


class RunKind(models.TextChoices):
    PROVISION = "provision", "Provision"
    RELEASE = "release", "Release"  # requested release or expiry: tear down, then return the capacity
    CLEANUP = "cleanup", "Clean up after a failure"  # tear down, return the capacity; the request stays failed
    TEARDOWN = "teardown", "Tear down after preemption"  # the scheduler has already taken the devices back


class RunState(models.TextChoices):
    RUNNING = "running", "Running"
    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed"
    CANCELLED = "cancelled", "Cancelled"


class StepState(models.TextChoices):
    PENDING = "pending", "Pending"
    RUNNING = "running", "Running"
    WAITING = "waiting", "Waiting"  # for a retry after backoff, or for an outside event (power, installer)
    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed"
    CANCELLED = "cancelled", "Cancelled"


class Wait(models.TextChoices):
    NONE = "", "Not waiting"
    RETRY = "retry", "Backoff before the next attempt"
    EVENT = "event", "An outside event (not an attempt)"
    OUTAGE = "outage", "The backend to answer again (not an attempt)"


# Teardown runs retry an outage until the backend answers: the workload may still run, so its capacity stays held.
TEARDOWN_KINDS = frozenset({"release", "cleanup", "teardown"})
# Teardowns whose devices are returned by their last step (a preemption's were taken back already): an operator may
# return them (teardown_force) when the backend never confirms the workload is gone.
FORCEABLE_KINDS = frozenset({"release", "cleanup"})


FINISHED_STEP_STATES = frozenset({StepState.SUCCEEDED, StepState.FAILED, StepState.CANCELLED})


class BmcDriverName(models.TextChoices):
    """The out-of-band driver of bare-metal servers (PROVISIONING_BMC_DRIVER)."""

    SIMULATED = "simulated", "Simulated BMC (demo)"
    REDFISH = "redfish", "DMTF Redfish over HTTP"


class InBandDriverName(models.TextChoices):
    """The driver of a bare-metal server's post-install steps (PROVISIONING_IN_BAND_DRIVER)."""

    SIMULATED = "simulated", "Simulated host (demo)"
    ANSIBLE = "ansible", "Ansible playbooks over SSH"
