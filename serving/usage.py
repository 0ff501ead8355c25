"""Token metering for the gateway: every answer's input and output tokens, per deployment (request), API key and
day, in metering's ledger. A gateway process adds its answers up in memory and flushes them here at least every
second (one upsert per (request, key, day) with the increments, so counts stay exact across gateway processes)."""

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import date

from django.db import connection, transaction
from django.db.models import Sum
from django.utils import timezone

from metering.models import TokenUsage
from requests.quota import month_start
from serving.models import ServingDeployment


def month_totals(deployment: ServingDeployment) -> dict:
    """This month's answers and tokens of the deployment: {requests, prompt, completion}."""
    totals = TokenUsage.objects.filter(request_id=deployment.request_id, day__gte=month_start()).aggregate(
        requests=Sum("requests"), prompt=Sum("prompt_tokens"), completion=Sum("completion_tokens")
    )
    return {name: value or 0 for name, value in totals.items()}


def tokens_this_month(deployment: ServingDeployment) -> int:
    totals = month_totals(deployment)
    return totals["prompt"] + totals["completion"]


@dataclass(frozen=True)
class Tally:
    """What one gateway process served for one (request, key, day) since its last flush."""

    request_id: int
    project_id: int
    model: str
    key_prefix: str
    day: date
    requests: int
    prompt: int
    completion: int


@transaction.atomic
def tokens_flush(tallies: Iterable[Tally]) -> int:
    """Add a gateway's in-memory tallies to the ledger (one statement per row, in one transaction)."""
    flushed_at = timezone.now()  # within a flush interval of the calls: idle detection's "last gateway call"
    rows = [
        [t.request_id, t.project_id, t.model, t.key_prefix, t.day, t.requests, t.prompt, t.completion, flushed_at]
        for t in tallies
    ]
    if not rows:
        return 0
    table = TokenUsage._meta.db_table
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SET LOCAL synchronous_commit TO OFF")
        cursor.executemany(
            f"INSERT INTO {table} (request_id, project_id, model, key_prefix, day, requests, prompt_tokens, "
            "completion_tokens, last_call_at) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s) "
            f"ON CONFLICT (request_id, key_prefix, day) DO UPDATE SET requests = {table}.requests + excluded.requests, "
            f"prompt_tokens = {table}.prompt_tokens + excluded.prompt_tokens, "
            f"completion_tokens = {table}.completion_tokens + excluded.completion_tokens, "
            "last_call_at = excluded.last_call_at",
            rows,
        )
    return len(rows)


def tokens_this_month_by_request(request_ids: Iterable[int]) -> dict[int, int]:
    """Tokens metered this month per deployment (request): the budget counters' base, read once a flush."""
    ids = list(request_ids)
    if not ids:
        return {}
    rows = (
        TokenUsage.objects.filter(request_id__in=ids, day__gte=month_start())
        .values("request_id")
        .annotate(prompt=Sum("prompt_tokens"), completion=Sum("completion_tokens"))
    )
    return {row["request_id"]: (row["prompt"] or 0) + (row["completion"] or 0) for row in rows}
