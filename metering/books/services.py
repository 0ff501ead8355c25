"""Slurm's own books against the platform's meter: for each request whose allocations ran as Slurm jobs, the
card-hours slurmdbd recorded (sacct: gres/gpu x elapsed) beside those the platform metered for the same allocations,
and the difference (SlurmBooks). The periodic task reads the requests whose books are still open, with one sacct call
for all their jobs; a reading becomes final once every job has ended in the books and every allocation is released.

slurmdbd out of reach is an outage: nothing is written and the next run reads again; pages and the API show the last
reading. A job the books do not hold yet (slurmctld sends its record a moment after the start) leaves its request
unread until they do.
"""

import logging
from collections import defaultdict
from dataclasses import dataclass, field

from django.conf import settings
from django.db.models import Count, F, Q, Sum
from django.utils import timezone

from metering.expressions import card_hours
from metering.models import SlurmBooks
from metering.selectors import SINCE_EVER
from scheduling.choices import AllocationState
from scheduling.models import Allocation
from scheduling.slurm.accounting import BooksError, BooksUnavailable, JobBooks, jobs_books

logger = logging.getLogger(__name__)

BATCH = 500  # requests read per run: one sacct call for all their jobs
NOT_CONFIGURED = "Slurm not configured (SLURM_REST_URL is empty)"


@dataclass
class BooksOutcome:
    read: list[int] = field(default_factory=list)  # request ids
    not_in_books_yet: list[int] = field(default_factory=list)
    waiting: str = ""  # slurmdbd out of reach: why nothing was read (the next run reads again)
    refused: str = ""  # sacct refused or could not run: what it said

    def as_dict(self) -> dict:
        return {
            "read": self.read,
            "not_in_books_yet": self.not_in_books_yet,
            "waiting": self.waiting,
            "refused": self.refused,
        }


def slurm_books_refresh() -> dict:
    """The periodic task's service (schedule "Metering: Slurm's books"): does nothing while Slurm is not configured."""
    if not settings.SLURM_REST_URL:
        return {"waiting": NOT_CONFIGURED}
    return slurm_books_reconcile().as_dict()


def slurm_books_reconcile(*, request_ids: list[int] | None = None, now=None) -> BooksOutcome:
    """Read Slurm's books for the requests with Slurm jobs whose reading is not final (or these requests) and store
    each request's reading and difference. Two reads, one sacct call and one upsert, however many requests."""
    now = now or timezone.now()
    outcome = BooksOutcome()
    platform = platform_card_hours(request_ids=request_ids, now=now)
    jobs = defaultdict(set)
    for request_id, job_id in Allocation.objects.filter(
        request_id__in=list(platform), slurm_job_id__isnull=False
    ).values_list("request_id", "slurm_job_id"):
        jobs[request_id].add(job_id)
    try:
        books = jobs_books([job_id for ids in jobs.values() for job_id in ids])
    except BooksUnavailable as unavailable:
        logger.info("Slurm's books out of reach, read again next time: %s", unavailable)
        outcome.waiting = str(unavailable)
        return outcome
    except BooksError as refused:
        logger.warning("Slurm's books not read: %s", refused)
        outcome.refused = str(refused)
        return outcome
    readings = []
    for request_id, (metered, running) in platform.items():
        found = [books[job_id] for job_id in sorted(jobs[request_id]) if job_id in books]
        if len(found) < len(jobs[request_id]):
            outcome.not_in_books_yet.append(request_id)
            continue
        readings.append(
            _reading(request_id, found, metered, final=not running and all(j.ended for j in found), now=now)
        )
        outcome.read.append(request_id)
    SlurmBooks.objects.bulk_create(
        readings, update_conflicts=True, unique_fields=["request"], update_fields=READING_FIELDS
    )
    return outcome


def platform_card_hours(*, request_ids: list[int] | None = None, now) -> dict[int, tuple[float, int]]:
    """{request id: (card-hours the platform metered for its Slurm-run allocations, how many still run)} for the
    requests asked for, else those whose books are open, at most BATCH: one query. Open: never read, read while
    something ran, or bound again since the final reading (a preempted request placed again runs a new job)."""
    slurm_run = Allocation.objects.filter(slurm_job_id__isnull=False)
    if request_ids is not None:
        allocations = slurm_run.filter(request_id__in=request_ids)
    else:
        open_books = (
            Q(request__slurm_books__isnull=True)
            | Q(request__slurm_books__final=False)
            | Q(started_at__gt=F("request__slurm_books__read_at"))
        )
        allocations = slurm_run.filter(request_id__in=slurm_run.filter(open_books).values("request_id"))
    rows = (
        allocations.order_by("request_id")
        .values("request_id")
        .annotate(
            metered=Sum(card_hours("", SINCE_EVER, now, now)),
            running=Count("pk", filter=Q(state=AllocationState.ACTIVE)),
        )[:BATCH]
    )
    return {row["request_id"]: (row["metered"] or 0.0, row["running"]) for row in rows}


READING_FIELDS = ["jobs", "slurm_card_hours", "platform_card_hours", "difference_card_hours", "final", "read_at"]


def _reading(request_id: int, found: list[JobBooks], metered: float, *, final: bool, now) -> SlurmBooks:
    slurm = sum(job.card_hours for job in found)
    return SlurmBooks(
        request_id=request_id,
        jobs=[job.as_data() for job in found],
        slurm_card_hours=round(slurm, 4),
        platform_card_hours=round(metered, 4),
        difference_card_hours=round(slurm - metered, 4),
        final=final,
        read_at=now,
    )
