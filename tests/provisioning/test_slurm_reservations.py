"""An advance reservation on the real local Slurm cluster: at its start it becomes an allocation, a Slurm reservation
of its whole node for its users and window is made (`scontrol create reservation`; slurmrestd v0.0.38 cannot), its job
runs inside it, and the release deletes it."""

import re
from datetime import timedelta

import pytest
import time_machine
from django.utils import timezone

from provisioning.drivers.slurm import reservation_name
from requests import services as request_services
from requests.choices import RequestState
from requests.orders import Order
from scheduling import cycle
from tests.provisioning.test_slurm_backend import (  # noqa: F401  (fixtures)
    delivered,
    on_slurm,
    slurm_compute,
)

pytestmark = pytest.mark.django_db


def field(description: str, name: str) -> str:
    return re.search(rf"\b{name}=(\S+)", description).group(1)


def test_a_reservation_runs_inside_a_slurm_reservation_of_its_node_and_release_deletes_it(slurm_compute):  # noqa: F811
    team, cluster = slurm_compute.team, slurm_compute.cluster
    start = (timezone.now() + timedelta(minutes=2)).replace(microsecond=0)
    order = Order(
        service=slurm_compute.service,
        project=team.project,
        duration_hours=1,
        spec=slurm_compute.spec,
        image=slurm_compute.workspace,
        start_at=start,
    )
    request = slurm_compute.run_on_commit(request_services.request_submit, order=order, requester=team.developer)
    slurm_compute.run_on_commit(cycle.run_cycle)
    request.refresh_from_db()
    assert request.state == RequestState.QUEUED and request.queue_reason["code"] == "reservation_not_due"
    assert reservation_name(request.pk) not in cluster.reservations()

    with time_machine.travel(start, tick=True):
        slurm_compute.run_on_commit(cycle.run_cycle)
        request.refresh_from_db()
        assert request.state == RequestState.ACTIVE

        described = cluster.reservations()[reservation_name(request.pk)]
        assert field(described, "Nodes") == slurm_compute.node.name
        assert field(described, "Users") == cluster.user_name
        assert field(described, "Duration") == "01:00:00"
        job = cluster.scontrol("show", "job", str(delivered(request)["job_id"]))
        assert field(job, "Reservation") == reservation_name(request.pk) and field(job, "JobState") == "RUNNING"

        slurm_compute.run_on_commit(
            request_services.request_release, request=request, actor=request.requester, reason="done"
        )
        request.refresh_from_db()
        assert request.state == RequestState.RELEASED
        assert reservation_name(request.pk) not in cluster.reservations()
