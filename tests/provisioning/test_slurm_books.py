"""Slurm's own books on the real local cluster (slurmdbd on MariaDB, the session's fixture): a compute order run
through the platform is read back from `sacct` and reconciled with the platform's card-hours (no difference); a
difference is shown per request in the usage report; slurmdbd out of reach is waited out."""

from datetime import timedelta

import pytest
from django.db.models import F

from metering.books.services import slurm_books_reconcile, slurm_books_refresh
from metering.models import SlurmBooks
from requests import services as request_services
from requests.choices import RequestState
from scheduling.models import Allocation
from scheduling.slurm.accounting import jobs_books
from tests.provisioning.test_slurm_backend import (  # noqa: F401  (fixtures)
    delivered,
    eventually,
    on_slurm,
    slurm_compute,
)

pytestmark = pytest.mark.django_db

# Slurm's End and the platform's release are a moment apart (the cancellation, then the release's commit): a few
# seconds of one card.
SECONDS_APART = 10 / 3600


def ran_and_released(slurm_compute):  # noqa: F811
    """A one-GPU order run as a Slurm job through the platform and released; its job has ended in Slurm's books."""
    request = slurm_compute.order()
    assert request.state == RequestState.ACTIVE
    job_id = delivered(request)["job_id"]
    assert Allocation.objects.get(request=request).slurm_job_id == job_id
    slurm_compute.run_on_commit(
        request_services.request_release, request=request, actor=request.requester, reason="done"
    )
    request.refresh_from_db()
    assert request.state == RequestState.RELEASED
    return request, job_id, eventually(lambda: ended_books(job_id), seconds=30)


def ended_books(job_id: int):
    """The job's books once they say it ended (slurmctld sends the record a moment after the job ends)."""
    books = jobs_books([job_id]).get(job_id)
    return books if books is not None and books.ended else None


def test_a_job_run_through_the_platform_is_reconciled_with_sacct_and_a_difference_is_shown(
    slurm_compute,  # noqa: F811
    api_as,
    client,
):
    request, job_id, books = ran_and_released(slurm_compute)
    assert books.gpus == 1 and books.state.startswith("CANCELLED")  # the release cancelled it

    outcome = slurm_books_reconcile()
    assert outcome.read == [request.pk] and not outcome.waiting
    reading = SlurmBooks.objects.get(request=request)
    assert reading.final and [job["job_id"] for job in reading.jobs] == [job_id]
    assert reading.slurm_card_hours == pytest.approx(books.card_hours, abs=1e-4)
    assert abs(reading.difference_card_hours) <= SECONDS_APART
    assert slurm_books_reconcile().read == []  # final: not read again

    # The platform's meter an hour off (a start recorded an hour early): the books say so, per request.
    Allocation.objects.filter(request=request).update(workload_started_at=F("workload_started_at") - timedelta(hours=1))
    assert slurm_books_reconcile(request_ids=[request.pk]).read == [request.pk]
    reading.refresh_from_db()
    assert reading.difference_card_hours == pytest.approx(-1.0, abs=SECONDS_APART)

    [row] = api_as(request.requester).get("/api/v1/usage/slurm-books/").json()
    assert (row["request"], row["jobs"]) == (request.pk, [job_id])
    assert row["difference_card_hours"] == pytest.approx(-1.0, abs=SECONDS_APART)
    client.force_login(request.requester)
    page = client.get("/usage/").content.decode()
    assert f'id="slurm-books-{request.pk}"' in page and f"{reading.difference_card_hours:.4f}" in page


def test_slurmdbd_out_of_reach_is_waited_out(slurm_compute, client):  # noqa: F811
    request, _job_id, _books = ran_and_released(slurm_compute)
    slurm_compute.cluster.stop_daemon("slurmdbd")

    outcome = slurm_books_refresh()
    assert outcome["read"] == [] and not outcome["refused"]
    assert "Problem talking to the database" in outcome["waiting"] or "Connection refused" in outcome["waiting"]
    assert not SlurmBooks.objects.exists()
    client.force_login(request.requester)
    assert client.get("/usage/").status_code == 200

    slurm_compute.cluster.start_daemon("slurmdbd")
    assert slurm_books_refresh()["read"] == [request.pk]
    assert SlurmBooks.objects.get(request=request).final
