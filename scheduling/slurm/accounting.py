"""Slurm's own books: what slurmdbd recorded for jobs, read with `sacct` (slurmrestd v0.0.38's /slurm/ API has no
accounting; its /slurmdb/ plugin needs slurmdbd to accept JWTs as well, which sacct does not).

sacct finds the cluster through SLURM_CONF and authenticates with munge, as scontrol does (the platform's host is a
login node of the cluster). One call reads every job asked for: `-X` keeps the allocation's line (not its steps);
SLURM_TIME_FORMAT=%s makes the times seconds since the epoch, so no time zone is guessed.

What a job held, in card-hours: the GPUs in its AllocTRES (`gres/gpu=N`, recorded with AccountingStorageTRES=gres/gpu)
times its elapsed seconds (ElapsedRaw: so far while it runs).
"""

import os
import subprocess
from dataclasses import dataclass
from datetime import UTC, datetime

from django.conf import settings

SACCT_TIMEOUT_SECONDS = 30
FIELDS = ("JobID", "ElapsedRaw", "AllocTRES", "Start", "End", "State")
GPU_TRES = "gres/gpu"
# What sacct prints when slurmdbd (or the database behind it) does not answer (Slurm's own error strings).
UNREACHABLE_MARKS = ("problem talking to the database", "connection refused", "unable to connect", "timed out")


class BooksError(RuntimeError):
    """sacct failed or could not be run; the message holds what it printed."""


class BooksUnavailable(BooksError):
    """slurmdbd did not answer sacct (down, restarting, its database out of reach): asked again later, never final."""


@dataclass(frozen=True)
class JobBooks:
    """One job as Slurm's books have it."""

    job_id: int
    state: str  # RUNNING, COMPLETED, CANCELLED by 0, TIMEOUT, ...
    gpus: int
    elapsed_seconds: int
    started_at: datetime | None
    ended_at: datetime | None

    @property
    def card_hours(self) -> float:
        return self.gpus * self.elapsed_seconds / 3600

    @property
    def ended(self) -> bool:
        return self.ended_at is not None

    def as_data(self) -> dict:
        return {
            "job_id": self.job_id,
            "state": self.state,
            "gpus": self.gpus,
            "elapsed_seconds": self.elapsed_seconds,
            "started_at": self.started_at.isoformat() if self.started_at else None,
            "ended_at": self.ended_at.isoformat() if self.ended_at else None,
            "card_hours": round(self.card_hours, 4),
        }


def jobs_books(job_ids: list[int]) -> dict[int, JobBooks]:
    """The books of these jobs, by job id; a job slurmdbd has not recorded yet is absent (slurmctld sends its
    records a moment after the job starts)."""
    if not job_ids:
        return {}
    output = _sacct(
        f"--jobs={','.join(str(job_id) for job_id in sorted(set(job_ids)))}",
        f"--format={','.join(FIELDS)}",
        "--allocations",
        "--allusers",
        "--parsable2",
        "--noheader",
    )
    return {books.job_id: books for books in map(parse_line, output.splitlines()) if books is not None}


def parse_line(line: str) -> JobBooks | None:
    """One `--parsable2` line of FIELDS; None for a line that is not a plain job (an array or heterogeneous job's
    part, a blank line)."""
    values = line.split("|")
    if len(values) != len(FIELDS) or not values[0].isdigit():
        return None
    job_id, elapsed, tres, start, end, state = values
    return JobBooks(
        job_id=int(job_id),
        state=state,
        gpus=gpus_of(tres),
        elapsed_seconds=int(elapsed or 0),
        started_at=_time(start),
        ended_at=_time(end),
    )


def gpus_of(tres: str) -> int:
    """The `gres/gpu=N` of a TRES list ("billing=1,cpu=1,gres/gpu=2,mem=256M,node=1"); typed counts
    (gres/gpu:a100=2) repeat it and are not added again."""
    for item in tres.split(","):
        name, _, count = item.partition("=")
        if name == GPU_TRES and count.isdigit():
            return int(count)
    return 0


def _time(value: str) -> datetime | None:
    """Seconds since the epoch, or "Unknown"/"None" (not started, or not ended yet)."""
    return datetime.fromtimestamp(int(value), tz=UTC) if value.isdigit() and int(value) > 0 else None


def _sacct(*arguments: str) -> str:
    env = {**os.environ, "SLURM_TIME_FORMAT": "%s"}
    if settings.SLURM_CONF:
        env["SLURM_CONF"] = settings.SLURM_CONF
    try:
        result = subprocess.run(
            [settings.SLURM_SACCT, *arguments], env=env, capture_output=True, text=True, timeout=SACCT_TIMEOUT_SECONDS
        )
    except subprocess.TimeoutExpired as error:
        raise BooksUnavailable(f"sacct got no answer from slurmdbd: {error}") from error
    except OSError as error:
        raise BooksError(f"sacct could not run: {error}") from error
    output = (result.stderr or "").strip()
    if result.returncode != 0 or "error" in output.lower():
        unreachable = any(mark in output.lower() for mark in UNREACHABLE_MARKS)
        raise (BooksUnavailable if unreachable else BooksError)(f"sacct failed ({result.returncode}): {output}")
    return result.stdout
