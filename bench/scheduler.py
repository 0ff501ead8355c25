"""python -m bench scheduler --nodes NODES.csv --requests 10000 [--json]
python -m bench scheduler --nodes openb_node_list_gpu_node.csv --scale 10 --requests 100000 [--pods PODS.csv]

End to end through the database: import the node list, queue N approved requests of mixed shapes, run ONE
scheduling cycle, and report wall time, allocations per second (database writes included) and SQL queries.
It adds a benchmark tenant, nodes and requests: run it on a scratch database (`make bench` does).

--scale K: the openb node list K times (sites site-00.., topology domains of 64 nodes; K=10: 12,130 nodes,
62,120 GPUs) and requests drawn from the openb trace's GPU pod shapes (--pods, default the gpuspec33 list beside
the node list) with the priority classes, projects, quotas and durations of `bench.fleet` (documented
there and in docs/benchmarks/history.md). --cycles N runs N cycles in a row (the second and later ones on what the first
left waiting). --steady MINUTES replays arrivals and departures in simulated time instead (`bench.steady`);
--warmup MINUTES leaves the cycles that fill the fleet out of its cycle percentiles (they are still reported).
"""

import json as json_module
import random
import time
from decimal import Decimal
from pathlib import Path

from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError
from django.db import connection
from django.test.utils import CaptureQueriesContext

from bench.scale import queued_row
from catalog.choices import ServiceKind, SliceKind
from catalog.models import AcceleratorModel, Image, ResourceSpec, Service, SliceProfile, Vendor
from requests.choices import RequestState
from requests.models import ResourceRequest
from requests.models.request import snapshot_hash
from requests.services import approved_snapshot
from scheduling.cycle import run_cycle
from tenancy.models import Project, Tenant, User
from tenancy.services import project_create, tenant_create

# name, accelerator count, share profile (None = whole cards), CPU cores, memory GB, weight
SHAPES = [
    ("bench-1x", 1, None, 8, 32, 40),
    ("bench-half", 1, "0.5", 4, 16, 20),
    ("bench-quarter", 1, "0.25", 2, 8, 10),
    ("bench-2x", 2, None, 16, 64, 15),
    ("bench-4x", 4, None, 32, 128, 10),
    ("bench-8x", 8, None, 48, 256, 5),
]


class Command(BaseCommand):
    help = __doc__

    def add_arguments(self, parser):
        parser.add_argument("--nodes", type=Path, required=True, help="Node list (openb format or inventory CSV).")
        parser.add_argument("--requests", type=int, default=10000)
        parser.add_argument("--seed", type=int, default=42)
        parser.add_argument("--json", action="store_true", dest="as_json", help="Print one JSON object.")
        parser.add_argument("--force", action="store_true", help="Run on a database not named *_bench.")
        parser.add_argument("--scale", type=int, default=0, help="The openb node list K times, trace workload.")
        parser.add_argument("--pods", type=Path, default=None, help="openb pod list for --scale's request shapes.")
        parser.add_argument("--projects", type=int, default=200)
        parser.add_argument("--cycles", type=int, default=1, help="With --scale: cycles in a row, one row each.")
        parser.add_argument("--steady", type=float, default=0, metavar="MINUTES", help="Steady-state replay.")
        parser.add_argument("--interval", type=float, default=60, help="--steady: simulated seconds between cycles.")
        parser.add_argument("--arrivals", type=float, default=None, help="--steady: arrivals per simulated minute.")
        parser.add_argument(
            "--warmup",
            type=float,
            default=0,
            metavar="MINUTES",
            help="--steady: cycles in the first MINUTES are reported but left out of the cycle percentiles.",
        )

    def handle(self, *args, nodes: Path, requests: int, seed: int, as_json: bool, force: bool, **options):
        if not force and not str(connection.settings_dict["NAME"]).endswith("_bench"):
            raise CommandError("This adds thousands of rows: point DATABASE_URL at a *_bench database or pass --force.")
        if options["scale"] or options["steady"]:
            return self._scaled(nodes, requests, seed, as_json, options)
        call_command("import_inventory", str(nodes), verbosity=0)
        queued = queue_requests(requests, seed)
        started = time.perf_counter()
        with CaptureQueriesContext(connection) as queries:
            result = run_cycle()
        seconds = time.perf_counter() - started
        report = {
            "requests": queued,
            "allocated": len(result.allocated),
            "cycle_seconds": round(seconds, 3),
            "allocated_per_s": round(len(result.allocated) / seconds, 1),
            "queries_per_cycle": len(queries),
        }
        self.stdout.write(
            json_module.dumps(report) if as_json else "\n".join(f"{key:>18}: {value}" for key, value in report.items())
        )

    def _scaled(self, nodes: Path, requests: int, seed: int, as_json: bool, options) -> None:
        from bench import fleet, scale

        pods = options["pods"] or nodes.with_name("openb_pod_list_gpuspec33.csv")
        k = max(1, options["scale"])
        inventory = scale.import_fleet(nodes, k)
        shapes = fleet.read_pod_shapes(pods)
        workload = scale.Workload(shapes, projects=options["projects"])
        if options["steady"]:
            from bench import steady

            report = steady.run(
                workload,
                shapes,
                minutes=options["steady"],
                queued=requests,
                interval_s=options["interval"],
                arrivals_per_minute=options["arrivals"],
                warmup_minutes=options["warmup"],
                seed=seed,
                progress=None if as_json else self.stdout.write,
            )
            self.stdout.write(json_module.dumps({**inventory, **report}))
            return
        workload.queue(fleet.draw_requests(shapes, requests, projects=options["projects"], seed=seed))
        rows = []
        for n in range(options["cycles"]):
            queued = ResourceRequest.objects.filter(state=RequestState.QUEUED).count()
            started = time.perf_counter()
            with CaptureQueriesContext(connection) as queries:
                result = run_cycle()
            seconds = time.perf_counter() - started
            rows.append(
                {
                    **inventory,
                    "cycle": n + 1,
                    "queued": queued,
                    "allocated": len(result.allocated),
                    "preempted": len(result.preempted),
                    "cycle_seconds": round(seconds, 3),
                    "queries_per_cycle": len(queries),
                }
            )
            if not as_json:
                self.stdout.write(json_module.dumps(rows[-1]))
        if as_json:
            self.stdout.write(json_module.dumps(rows if len(rows) > 1 else rows[0]))


def _specs() -> list[tuple[ResourceSpec, int]]:
    models = list(AcceleratorModel.objects.filter(devices__isnull=False).distinct())
    specs = []
    for slug, count, share, cpu, memory, weight in SHAPES:
        profile = None
        if share is not None:  # a share spec runs on one model: the most common one in the inventory
            common = max(models, key=lambda model: model.devices.count())
            profile, _ = SliceProfile.objects.get_or_create(
                accelerator=common,
                name=share,
                defaults={
                    "kind": SliceKind.SHARE,
                    "compute_fraction": Decimal(share),
                    "memory_gb": max(1, int(common.memory_gb * float(share))),
                    "max_per_device": int(1 / float(share)),
                },
            )
        spec, _ = ResourceSpec.objects.get_or_create(
            slug=slug,
            defaults={
                "name": slug,
                "accelerator_count": count,
                "slice_profile": profile,
                "cpu_cores": cpu,
                "memory_gb": memory,
                "hourly_price": Decimal("1.00"),
                "max_duration_hours": 720,
            },
        )
        spec.accelerator_models.set([profile.accelerator] if profile else models)
        specs.append((spec, weight))
    return specs


def queue_requests(count: int, seed: int) -> int:
    """Bulk-create `count` approved, queued requests whose snapshots are what submission would have frozen."""
    requester, _ = User.objects.get_or_create(username="bench-requester")
    tenant = Tenant.objects.filter(slug="bench").first() or tenant_create(name="Bench", slug="bench", actor=None)
    project = Project.objects.filter(slug="bench").first() or project_create(
        tenant=tenant, name="Bench", slug="bench", lead=requester, cost_centre="BENCH", actor=None
    )
    image, _ = Image.objects.get_or_create(
        name="bench", version="1", defaults={"reference": "bench", "os": "linux", "runtime": "cuda", "approved": True}
    )
    image.compatible_vendors.set(Vendor.objects.all())
    service, _ = Service.objects.get_or_create(
        slug="bench",
        defaults={
            "name": "Bench",
            "kind": ServiceKind.COMPUTE,
            "description": "benchmark",
            "default_duration_hours": 24,
            "max_duration_hours": 720,
        },
    )
    specs = _specs()
    service.specs.set([spec for spec, _ in specs])
    rng = random.Random(seed)
    chosen = rng.choices([spec for spec, _ in specs], weights=[weight for _, weight in specs], k=count)
    rows = [queued_request(spec, project, requester, service, image) for spec in chosen]
    ResourceRequest.objects.bulk_create(rows, batch_size=2000)
    return ResourceRequest.objects.filter(project=project, state=RequestState.QUEUED).count()


def queued_request(spec, project, requester, service, image, parameters=None) -> ResourceRequest:
    """An approved, queued request for the spec, with the snapshot submission would have frozen (not saved)."""
    request = queued_row(spec, project, requester, service, image, parameters)
    request.approved_spec = approved_snapshot(request)
    request.approved_spec_hash = snapshot_hash(request.approved_spec)
    request.approved_at = project.created_at
    return request
