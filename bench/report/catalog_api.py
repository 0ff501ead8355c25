"""Read API latency and query counts on a catalog larger than any real one we expect."""

import statistics
import time

from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from bench.headline import Headline

TITLE = "Catalog and project read API"
SERVICES, SPECS, IMAGES, PROJECTS, REPEATS = 300, 120, 40, 200, 200
DESCRIPTION = (
    f"{SERVICES} services offering 8 specs and 3 images each ({SPECS} specs, {IMAGES} images in all), "
    f"{PROJECTS} projects with the caller a member of all of them; a developer with a token pages through "
    f"each list at 50 rows a page, {REPEATS} requests per endpoint after a warm-up. Latency is server time "
    "through the full Django/DRF stack in one process; queries are per request and must not grow with rows."
)
TARGET = "queries a page constant as rows grow"
ENDPOINTS = [
    "/api/v1/catalog/services/",
    "/api/v1/catalog/specs/",
    "/api/v1/catalog/images/",
    "/api/v1/catalog/specs/?vendor=nvidia&slice=false",
    "/api/v1/projects/",
]


def _populate():
    from tests import factories

    developer = factories.UserFactory(username="bench-developer")
    accelerators = [factories.AcceleratorModelFactory() for _ in range(6)]
    specs = [factories.ResourceSpecFactory(accelerator_models=[accelerators[n % 6]]) for n in range(SPECS)]
    images = [factories.ImageFactory() for _ in range(IMAGES)]
    for n in range(SERVICES):
        factories.ServiceFactory(specs=specs[n % 100 : n % 100 + 8], images=images[n % 37 : n % 37 + 3])
    tenant = factories.tenant()
    for _ in range(PROJECTS):
        factories.member(factories.project(tenant_obj=tenant), user=developer)
    return factories.token_for(developer)


def _measure(client: Client, token: str, path: str) -> dict:
    headers = {"HTTP_AUTHORIZATION": f"Token {token}"}
    for _ in range(10):
        client.get(path, **headers)
    timings = []
    for _ in range(REPEATS):
        started = time.perf_counter()
        response = client.get(path, **headers)
        timings.append((time.perf_counter() - started) * 1000)
        assert response.status_code == 200, response.content[:200]
    with CaptureQueriesContext(connection) as queries:
        client.get(path, **headers)
    timings.sort()
    return {
        "endpoint": f"`GET {path}`",
        "rows/page": len(response.json()["results"]),
        "queries": len(queries),
        "p50 ms": f"{statistics.median(timings):.1f}",
        "p95 ms": f"{timings[int(len(timings) * 0.95)]:.1f}",
        "req/s": f"{1000 / statistics.mean(timings):.0f}",
    }


def headline(rows: list[dict]) -> Headline:
    slowest = max(rows, key=lambda row: float(row["p95 ms"]))
    queries = max(int(row["queries"]) for row in rows)
    return Headline(
        f"slowest list p95 {slowest['p95 ms']} ms ({slowest['endpoint']}); at most {queries} queries a page"
    )


def run() -> list[dict]:
    token = _populate()
    client = Client()
    return [_measure(client, token, path) for path in ENDPOINTS]
