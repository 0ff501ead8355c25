"""Drives the embedded demo on SQLite from its own process while a real qcluster works on the same file (see
test_sqlite_demo.py): orders that get placed and provisioned, then releases overlapping usage refreshes, run both
here and as tasks. Prints one JSON line with what the test checks."""

import json
import time

from django.utils import timezone
from django_q.models import Failure, OrmQ
from django_q.tasks import async_task

from catalog.models import Image, ResourceSpec, Service
from metering import services as metering
from requests import services
from requests.approvals import approvals_bulk_approve
from requests.choices import RequestState
from requests.models import ResourceRequest
from requests.orders import Order
from requests.selectors import approval_inbox
from scheduling import cycle
from tenancy.models import Project, User

ORDERS = 4
DEADLINE_SECONDS = 120


def wait_until(condition, what: str) -> None:
    deadline = time.monotonic() + DEADLINE_SECONDS
    while not condition():
        if time.monotonic() > deadline:
            raise SystemExit(json.dumps({"timeout": what, **report()}))
        time.sleep(0.2)


MINE = {"pk__gt": 0}  # this driver's orders, after the seeded demo's own


def mine():
    return ResourceRequest.objects.filter(**MINE).order_by("pk")


def states() -> list[str]:
    return list(mine().values_list("state", flat=True))


def approve_everything() -> None:
    """Whoever holds an approval task approves it, stage after stage."""
    while mine().filter(state=RequestState.PENDING_APPROVAL).exists():
        for user in User.objects.all():
            tasks = list(approval_inbox(user=user).values_list("pk", flat=True))
            approvals_bulk_approve(task_ids=tasks, comment="Fine for the test.", actor=user)


def report() -> dict:
    return {
        "states": states(),
        "failures": [f"{failure.func}: {failure.result}"[:400] for failure in Failure.objects.all()],
        "queued_tasks": OrmQ.objects.count(),
    }


def main() -> None:
    developer = User.objects.get(username="developer")
    order = Order(
        service=Service.objects.get(slug="gpu-workspace"),
        project=Project.objects.get(slug="vision"),
        duration_hours=8,
        spec=ResourceSpec.objects.get(slug="t4-quarter"),
        image=Image.objects.filter(services__slug="gpu-workspace").first(),
    )
    MINE["pk__gt"] = ResourceRequest.objects.order_by("pk").values_list("pk", flat=True).last() or 0
    for _ in range(ORDERS):
        services.request_submit(order=order, requester=developer)
    approve_everything()
    cycle.run_cycle()
    wait_until(lambda: states() == [RequestState.ACTIVE] * ORDERS, "every order to become active")

    started = timezone.now()
    for request in mine():
        services.request_release(request=request, actor=developer, reason="Done with it.")
        async_task("metering.tasks.refresh_usage")  # the workers write usage while they free the releases
        metering.usage_refresh()  # and so does this process
    wait_until(lambda: states() == [RequestState.RELEASED] * ORDERS, "every release to finish")
    print(json.dumps({**report(), "release_seconds": (timezone.now() - started).total_seconds()}))
