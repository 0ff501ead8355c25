"""Request workflow throughput: submissions through validation, quota admission (under the tenant and project
row locks) and approval routing; then the list endpoints that grow with requests."""

import statistics
import time

from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from bench.headline import Headline

TITLE = "Request workflow"
SUBMISSIONS, REPEATS = 400, 100
DESCRIPTION = (
    f"{SUBMISSIONS} orders submitted one after another by one developer into one project with a generous quota, "
    "half of them matching a two-stage approval rule (the rest approved automatically, frozen and queued); "
    "each submission validates the order against the catalog, locks tenant and project, sums committed usage on "
    f"six dimensions and resolves approvers. Then {REPEATS} reads of the request list (50 a page) and of the "
    "approver's inbox with quota impact per row."
)
TARGET = "tracked: no target of its own (the API under load has them)"


def _scenario():
    from decimal import Decimal

    from requests.choices import ApprovalMode, ApproverSource
    from requests.models import ApprovalPolicy, ApprovalRule, ApprovalRuleStage
    from tenancy.choices import Role
    from tests import factories

    quota = {
        "gpus": Decimal(100000),
        "accelerator_memory_gb": 10**8,
        "cpu_cores": 10**8,
        "memory_gb": 10**8,
        "concurrent_tasks": 10**6,
        "monthly_card_hours": Decimal(10**9),
    }
    project = factories.project(quota=quota)
    developer = factories.member(project)
    approver = factories.member(project, Role.APPROVER)
    accelerator = factories.AcceleratorModelFactory()
    specs = [
        factories.ResourceSpecFactory(accelerator_models=[accelerator], accelerator_count=count) for count in (1, 2)
    ]
    image = factories.ImageFactory()
    service = factories.ServiceFactory(specs=specs, images=[image], max_duration_hours=168)
    policy = ApprovalPolicy.objects.create(name="bench", subject="resource_request")
    rule = ApprovalRule.objects.create(policy=policy, name="two cards", spec=specs[1])
    ApprovalRuleStage.objects.create(
        rule=rule,
        order=1,
        name="approver",
        source=ApproverSource.PROJECT_ROLE,
        mode=ApprovalMode.ANY,
        project_role=Role.APPROVER,
    )
    ApprovalRuleStage.objects.create(
        rule=rule, order=2, name="ops", source=ApproverSource.OPERATORS, mode=ApprovalMode.ANY
    )
    factories.operator()
    return project, developer, approver, service, specs, image


def _timed(call, repeats: int) -> list[float]:
    timings = []
    for _ in range(repeats):
        started = time.perf_counter()
        call()
        timings.append((time.perf_counter() - started) * 1000)
    return sorted(timings)


def _row(what: str, timings: list[float], queries: int | str) -> dict:
    return {
        "operation": what,
        "queries": queries,
        "p50 ms": f"{statistics.median(timings):.1f}",
        "p95 ms": f"{timings[int(len(timings) * 0.95)]:.1f}",
        "per s": f"{1000 / statistics.mean(timings):.0f}",
    }


def _page(client: Client, token: str, path: str) -> tuple[list[float], int]:
    headers = {"HTTP_AUTHORIZATION": f"Token {token}"}
    client.get(path, **headers)
    with CaptureQueriesContext(connection) as queries:
        assert client.get(path, **headers).status_code == 200
    count = len(queries)  # read now: every later request clears the connection's query log
    return _timed(lambda: client.get(path, **headers), REPEATS), count


def headline(rows: list[dict]) -> Headline:
    submit = next(row for row in rows if row["operation"].startswith("submit"))
    return Headline(f"submit p50 {submit['p50 ms']} ms ({submit['per s']}/s from one client)")


def run() -> list[dict]:
    from requests.orders import Order
    from requests.services import request_submit
    from tests import factories

    project, developer, approver, service, specs, image = _scenario()
    orders = [
        Order(service=service, project=project, duration_hours=24, spec=specs[n % 2], image=image)
        for n in range(SUBMISSIONS)
    ]
    pending = iter(orders)
    submit_times = _timed(lambda: request_submit(order=next(pending), requester=developer), SUBMISSIONS)
    client = Client()
    rows = [_row("submit (validate, admit, route)", submit_times, "-")]
    for who, path in (
        (developer, "/api/v1/requests/"),
        (approver, "/api/v1/approvals/"),
        (developer, "/api/v1/projects/"),
    ):
        timings, queries = _page(client, factories.token_for(who), path)
        rows.append(_row(f"`GET {path}`", timings, queries))
    return rows
