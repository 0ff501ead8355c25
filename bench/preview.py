"""python -m bench preview --nodes NODES.csv --queued 10000 [--json]

The order preview at a long queue: import the node list, queue N approved requests of mixed shapes, run one
scheduling cycle (it leaves its outcome for the preview), queue a few more after it, then estimate the placement of
orders of each shape one after another (the preview's "would it fit now?", the part that grew with the queue) and
report p50/p95 latency and the most SQL queries one estimate took.
It adds a benchmark tenant, nodes and requests: run it on a scratch database (`make bench` does).
"""

import json as json_module
import statistics
import time
from pathlib import Path

from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError
from django.db import connection
from django.test.utils import CaptureQueriesContext

from bench.scheduler import SHAPES, queue_requests
from catalog.models import Image, ResourceSpec, Service
from requests.choices import RequestState
from requests.models import ResourceRequest
from requests.orders import Order, size_order
from scheduling.cycle import run_cycle
from scheduling.estimate import placement_estimate
from tenancy.models import Project

QUEUED_SINCE_CYCLE = 50  # what arrives between two cycles: the preview places these itself
MAX_CYCLES = 5  # the first cycle fills the cluster; the next ones place little


class Command(BaseCommand):
    help = __doc__

    def add_arguments(self, parser):
        parser.add_argument("--nodes", type=Path, required=True, help="Node list (openb format or inventory CSV).")
        parser.add_argument("--queued", type=int, default=10000)
        parser.add_argument("--previews", type=int, default=200)
        parser.add_argument("--seed", type=int, default=42)
        parser.add_argument("--json", action="store_true", dest="as_json", help="Print one JSON object.")
        parser.add_argument("--force", action="store_true", help="Run on a database not named *_bench.")

    def handle(self, *args, nodes: Path, queued: int, previews: int, seed: int, as_json: bool, force: bool, **options):
        if not force and not str(connection.settings_dict["NAME"]).endswith("_bench"):
            raise CommandError("This adds thousands of rows: point DATABASE_URL at a *_bench database or pass --force.")
        call_command("import_inventory", str(nodes), verbosity=0)
        # Cycles place what fits; top the queue up until `queued` wait (`make bench` runs this after the scheduler
        # benchmark, on the same database and cluster).
        for round_ in range(MAX_CYCLES):
            missing = queued - ResourceRequest.objects.filter(state=RequestState.QUEUED).count()
            if missing <= 0 and round_:
                break
            queue_requests(max(0, missing), seed + round_)
            run_cycle()
        queue_requests(QUEUED_SINCE_CYCLE, seed - 1)
        orders = [(order, size_order(order)) for order in _orders()]
        timings, queries = [], 0
        for n in range(previews):
            order, sizing = orders[n % len(orders)]
            started = time.perf_counter()
            with CaptureQueriesContext(connection) as captured:
                placement_estimate(order, sizing)
            timings.append((time.perf_counter() - started) * 1000)
            queries = max(queries, len(captured))
        first_of_each = timings[: len(orders)]  # a shape's first preview in a cycle replays its expected start
        report = {
            "queued": ResourceRequest.objects.filter(state=RequestState.QUEUED).count(),
            "p50_ms": round(statistics.median(timings), 1),
            "p95_ms": round(statistics.quantiles(timings, n=20)[-1], 1),
            "first_of_shape_ms": f"{min(first_of_each):.1f}-{max(first_of_each):.1f}",
            "queries": queries,
        }
        self.stdout.write(
            json_module.dumps(report) if as_json else "\n".join(f"{key:>8}: {value}" for key, value in report.items())
        )


def _orders() -> list[Order]:
    """One order of each benchmark shape, from the project, service and image the queued requests use."""
    project, service, image = (
        Project.objects.get(slug="bench"),
        Service.objects.get(slug="bench"),
        Image.objects.get(name="bench"),
    )
    service.images.add(image)  # the queued requests were made without an order; an order must name an offered image
    return [
        Order(
            service=service, project=project, duration_hours=24, spec=ResourceSpec.objects.get(slug=slug), image=image
        )
        for slug, *_ in SHAPES
    ]
