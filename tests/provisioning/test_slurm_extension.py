"""An approved extension raises the Slurm job's time limit, against the real local Slurm cluster: right after the
approval, at readiness for a job submitted with the old term, and by the reconciler when Slurm could not be told."""

import re

import pytest
from django.urls import reverse

from provisioning.drivers.base import Target
from provisioning.drivers.slurm import job_properties
from provisioning.reconcile import workloads_reconcile
from requests.choices import EventCode, RequestState
from requests.extensions import request_extension_submit
from scheduling.choices import ExecutionBackend
from scheduling.models import Allocation
from tests.provisioning.test_slurm_backend import (  # noqa: F401  (fixtures)
    delivered,
    in_state,
    on_slurm,
    outside_job,
    resumed_until,
    slurm_compute,
)

pytestmark = pytest.mark.django_db


def time_limit(api, job_id: int) -> int:
    return api.job(job_id)["time_limit"]


def scontrol_time_limit(cluster, job_id: int) -> str:
    return re.search(r"TimeLimit=(\S+)", cluster.scontrol("show", "job", str(job_id))).group(1)


def extend(slurm_compute, request, hours: int):  # noqa: F811
    return slurm_compute.run_on_commit(
        request_extension_submit,
        request=request,
        hours=hours,
        justification="The run needs another epoch",
        actor=slurm_compute.team.developer,
    )


def test_an_approved_extension_raises_the_running_jobs_time_limit(slurm_compute, client):  # noqa: F811
    request = slurm_compute.order()
    job_id = delivered(request)["job_id"]
    assert time_limit(slurm_compute.api, job_id) == 60 and delivered(request)["time_limit_minutes"] == 60

    extension = extend(slurm_compute, request, hours=2)

    extension.refresh_from_db()
    assert extension.state == "applied"
    assert time_limit(slurm_compute.api, job_id) == 180
    assert scontrol_time_limit(slurm_compute.cluster, job_id) == "03:00:00"
    note = request.events.get(code=EventCode.WORKLOAD_EXTENDED)
    # The test cluster's REST user is no operator: Slurm refuses it a raise, scontrol (as root) makes it.
    assert (note.data["job_id"], note.data["was_minutes"], note.data["time_limit_minutes"]) == (job_id, 60, 180)
    assert note.data["via"] == "scontrol" and note.data["moved"] is True
    assert f"Slurm job {job_id}: time limit raised from 60 to 180 minutes" in note.message
    record = delivered(request)
    assert record["time_limit_minutes"] == 180
    assert record["expires_at"] == Allocation.objects.get(request=request).expires_at.isoformat()
    client.force_login(request.requester)
    page = client.get(reverse("portal:request-detail", args=[request.pk])).content.decode()
    assert '<dd id="slurm-time-limit">180 minutes</dd>' in page and "time limit raised from 60 to 180" in page
    assert slurm_compute.run_on_commit(workloads_reconcile) == {}  # nothing left to move
    assert request.events.filter(code=EventCode.WORKLOAD_EXTENDED).count() == 1


def test_a_job_submitted_with_the_old_term_gets_the_new_one_at_readiness(slurm_compute, settings):  # noqa: F811
    settings.PROVISIONING_INLINE_WAIT_SECONDS = 0
    blocker = outside_job(slurm_compute.api, slurm_compute.cluster, slurm_compute.node.name, gpus=2)
    request = slurm_compute.order()
    assert request.state == RequestState.PROVISIONING  # submitted, pending behind the blocker
    job_id = request.provisioning_runs.get().steps.get(name="start_workload").output["job_id"]
    # As if the job had been submitted just before an extension to 1 hour was approved: a shorter limit in Slurm.
    slurm_compute.api.update_job(job_id, {"time_limit": 30})
    assert time_limit(slurm_compute.api, job_id) == 30

    slurm_compute.cluster.scancel(str(blocker))
    resumed_until(lambda: in_state(request, RequestState.ACTIVE))

    assert time_limit(slurm_compute.api, job_id) == 60
    assert delivered(request)["time_limit_minutes"] == 60


def test_the_reconciler_raises_the_limit_slurm_could_not_be_told_of(slurm_compute, settings):  # noqa: F811
    request = slurm_compute.order()
    job_id = delivered(request)["job_id"]
    rest_url, settings.SLURM_REST_URL = settings.SLURM_REST_URL, "http://127.0.0.1:9"  # slurmrestd unreachable
    settings.SLURM_TIMEOUT_SECONDS = 2.0

    extend(slurm_compute, request, hours=1)

    request.refresh_from_db()
    assert request.duration_hours == 2
    missed = request.events.get(code=EventCode.WORKLOAD_EXTENDED)
    assert (missed.data["moved"], missed.data["code"]) == (False, "slurm_unavailable")
    assert "the reconciler tries again every minute" in missed.message
    assert time_limit(slurm_compute.api, job_id) == 60

    settings.SLURM_REST_URL = rest_url
    assert slurm_compute.run_on_commit(workloads_reconcile) == {}  # nothing ended

    assert time_limit(slurm_compute.api, job_id) == 120
    moved = request.events.filter(code=EventCode.WORKLOAD_EXTENDED).latest("id")
    assert (moved.data["moved"], moved.data["time_limit_minutes"]) == (True, 120)
    assert delivered(request)["time_limit_minutes"] == 120


def test_a_job_submitted_after_an_extension_asks_for_the_whole_term():
    target = Target(
        run_id=1,
        request_id=7,
        node="n1",
        devices=({"index": 0, "uuid": "GPU-x", "model": "A100", "model_slug": "a100", "milli": 1000},),
        snapshot={"demand": {"cpu_cores": 1, "memory_gb": 1}, "duration_hours": 1},
        backend=ExecutionBackend.SLURM,
        allocation_id=3,
        duration_hours=4,  # the approved hour and three more approved since
    )
    image = {"name": "img", "version": "1", "reference": "registry.test/img:1", "configuration": {}}

    assert job_properties(target, image)["time_limit"] == 240
