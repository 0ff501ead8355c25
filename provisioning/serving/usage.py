"""Token metering for the gateway: every answer's input and output tokens, per deployment (request), API key and
day, in metering's ledger (one upsert per answer, so counts are exact across gateway processes)."""

from datetime import datetime

from django.db import connection, transaction
from django.db.models import Sum
from django.utils import timezone

from metering.models import TokenUsage
from provisioning.models import ApiKey, ServingDeployment
from requests.quota import month_start


@transaction.atomic
def tokens_record(*, key: ApiKey, deployment: ServingDeployment, prompt: int, completion: int, at: datetime) -> None:
    table = TokenUsage._meta.db_table
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            # Not worth a disk flush per answer on the gateway's hot path: a crash may lose the last instant's
            # counts, never corrupt them (PostgreSQL's asynchronous commit).
            cursor.execute("SET LOCAL synchronous_commit TO OFF")
        cursor.execute(
            f"INSERT INTO {table} (request_id, project_id, model, key_prefix, day, requests, prompt_tokens, "
            "completion_tokens) VALUES (%s, %s, %s, %s, %s, 1, %s, %s) "
            "ON CONFLICT (request_id, key_prefix, day) DO UPDATE SET requests = "
            f"{table}.requests + 1, prompt_tokens = {table}.prompt_tokens + excluded.prompt_tokens, "
            f"completion_tokens = {table}.completion_tokens + excluded.completion_tokens",
            [
                deployment.request_id,
                deployment.project_id,
                deployment.model_name,
                key.prefix,
                timezone.localdate(at),
                prompt,
                completion,
            ],
        )


def month_totals(deployment: ServingDeployment) -> dict:
    """This month's answers and tokens of the deployment: {requests, prompt, completion}."""
    totals = TokenUsage.objects.filter(request_id=deployment.request_id, day__gte=month_start()).aggregate(
        requests=Sum("requests"), prompt=Sum("prompt_tokens"), completion=Sum("completion_tokens")
    )
    return {name: value or 0 for name, value in totals.items()}


def tokens_this_month(deployment: ServingDeployment) -> int:
    totals = month_totals(deployment)
    return totals["prompt"] + totals["completion"]
