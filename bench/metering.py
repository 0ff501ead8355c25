"""python -m bench metering --samples 1000000 --allocations 100000 [--json]

Generates, with set-based SQL (generate_series), a month of usage: N released or still running allocations of
whole-card and half-card specs across 40 projects in 8 tenants on 300 nodes of three models, their device bindings,
and M one-minute telemetry samples; rolls the samples up (timed as rollup_seconds), then times the monthly usage
report grouped by project, tenant, accelerator model, spec and month, with cost and energy (report_seconds).
It adds rows: run it on a scratch PostgreSQL database (`make bench` does).
"""

import json
import time
from datetime import timedelta
from decimal import Decimal

from django.core.management.base import BaseCommand, CommandError
from django.db import connection
from django.utils import timezone

from catalog.choices import AcceleratorKind, Interconnect, ServiceKind, SliceKind
from catalog.models import AcceleratorModel, Image, ResourceSpec, Service, SliceProfile, Vendor
from metering.choices import Grouping
from metering.periods import add_months, first_of_month, midnight
from metering.selectors import usage_report
from metering.services import telemetry_rollup
from requests.models import ResourceRequest
from scheduling.models import Allocation, AllocationDevice, Device, Node
from tenancy.models import Project, User
from tenancy.services import project_create, tenant_create

MODELS = [("bench-h100", 80), ("bench-a100", 40), ("bench-l40s", 48)]
NODES_PER_MODEL, CARDS_PER_NODE, TENANTS, PROJECTS = 100, 8, 8, 40
COUNTS = [1, 2, 4, 8]  # whole-card specs per model, plus one half-card share
RUNNING_EVERY = 50  # one allocation in 50 is still running
SAMPLES_PER_BINDING = 60


class Command(BaseCommand):
    help = __doc__

    def add_arguments(self, parser):
        parser.add_argument("--samples", type=int, default=1_000_000)
        parser.add_argument("--allocations", type=int, default=100_000)
        parser.add_argument("--json", action="store_true", dest="as_json", help="Print one JSON object.")
        parser.add_argument("--force", action="store_true", help="Run on a database not named *_bench.")

    def handle(self, *args, samples: int, allocations: int, as_json: bool, force: bool, **options):
        if connection.vendor != "postgresql":
            raise CommandError("The benchmark generates its data with PostgreSQL's generate_series.")
        if not force and not str(connection.settings_dict["NAME"]).endswith("_bench"):
            raise CommandError("This adds a million rows: point DATABASE_URL at a *_bench database or pass --force.")
        month = add_months(first_of_month(timezone.now().date()), -1)
        world = _world()
        _generate(world, month, allocations, samples)
        started = time.perf_counter()
        telemetry_rollup(first_day=month, now=timezone.now())
        rollup_seconds = time.perf_counter() - started
        started = time.perf_counter()
        rows = usage_report(
            user=world["viewer"],
            first_month=month,
            last_month=month,
            group_by=[Grouping.PROJECT, Grouping.TENANT, Grouping.ACCELERATOR_MODEL, Grouping.SPEC, Grouping.MONTH],
        )
        report_seconds = time.perf_counter() - started
        report = {
            "samples": samples,
            "allocations": allocations,
            "report_seconds": round(report_seconds, 3),
            "rollup_seconds": round(rollup_seconds, 3),
            "groups": len(rows),
        }
        self.stdout.write(
            json.dumps(report) if as_json else "\n".join(f"{key:>15}: {value}" for key, value in report.items())
        )


def _world() -> dict:
    """Catalog, projects and nodes the generated rows refer to (made once; reused by a second run)."""
    viewer, _ = User.objects.get_or_create(username="bench-metering", defaults={"is_superuser": True})
    nvidia = Vendor.objects.get(slug="nvidia")
    image, _ = Image.objects.get_or_create(
        name="bench-metering",
        version="1",
        defaults={"reference": "bench", "os": "linux", "runtime": "cuda", "approved": True},
    )
    service, _ = Service.objects.get_or_create(
        slug="bench-metering",
        defaults={
            "name": "Bench metering",
            "kind": ServiceKind.COMPUTE,
            "description": "benchmark",
            "default_duration_hours": 24,
            "max_duration_hours": 720,
        },
    )
    specs, nodes = [], []
    for slug, memory in MODELS:
        model, _ = AcceleratorModel.objects.get_or_create(
            slug=slug,
            defaults={
                "vendor": nvidia,
                "name": slug,
                "kind": AcceleratorKind.GPU,
                "memory_gb": memory,
                "interconnect": Interconnect.NVLINK,
            },
        )
        share, _ = SliceProfile.objects.get_or_create(
            accelerator=model,
            name="0.5",
            defaults={
                "kind": SliceKind.SHARE,
                "compute_fraction": Decimal("0.5"),
                "memory_gb": memory // 2,
                "max_per_device": 2,
            },
        )
        for count in [*COUNTS, None]:
            spec, _ = ResourceSpec.objects.get_or_create(
                slug=f"{slug}-{count or 'half'}",
                defaults={
                    "name": f"{slug} {count or 'half'}",
                    "accelerator_count": count or 1,
                    "cpu_cores": 8 * (count or 1),
                    "memory_gb": 64 * (count or 1),
                    "hourly_price": Decimal("2.50"),
                    "max_duration_hours": 720,
                    "slice_profile": None if count else share,
                },
            )
            spec.accelerator_models.set([model])
            specs.append(spec)
        nodes.append(_nodes(slug, model))
    service.specs.set(specs)
    return {
        "viewer": viewer,
        "image": image,
        "service": service,
        "specs": specs,
        "nodes": nodes,
        "projects": _projects(viewer),
    }


def _nodes(prefix: str, model: AcceleratorModel) -> list[int]:
    names = [f"{prefix}-node-{n:03d}" for n in range(NODES_PER_MODEL)]
    Node.objects.bulk_create(
        [Node(name=name, serial_number=f"SN-{name}", cpu_milli=128_000, memory_mib=2_097_152) for name in names],
        ignore_conflicts=True,
    )
    ids = dict(Node.objects.filter(name__in=names).values_list("name", "id"))
    Device.objects.bulk_create(
        [
            Device(node_id=ids[name], index=index, uuid=f"GPU-{name}-{index}", model=model, memory_gb=model.memory_gb)
            for name in names
            for index in range(CARDS_PER_NODE)
        ],
        ignore_conflicts=True,
    )
    return [ids[name] for name in names]


def _projects(lead: User) -> list[Project]:
    projects = list(Project.objects.filter(slug__startswith="bench-metering-").order_by("pk"))
    for n in range(len(projects), PROJECTS):
        tenant = (
            tenant_create(name=f"Bench metering tenant {n}", slug=f"bench-metering-t{n}", actor=None)
            if n < TENANTS
            else projects[n % TENANTS].tenant
        )
        projects.append(
            project_create(
                tenant=tenant,
                name=f"Bench metering {n}",
                slug=f"bench-metering-{n}",
                lead=lead,
                cost_centre="BENCH",
                actor=None,
            )
        )
    return projects


_REQUESTS = """
INSERT INTO {requests} (tenant_id, project_id, requester_id, service_id, spec_id, image_id, duration_hours, priority,
    justification, parameters, state, gpu_equivalents, accelerator_count, accelerator_memory_gb, cpu_cores, memory_gb,
    card_hours, hourly_cost, cost_estimate, quota_exception, quota_reasons, approved_spec_hash, queue_reason,
    queue_estimate, idempotency_key, order_fingerprint, created_at, updated_at)
SELECT (%(tenants)s::bigint[])[1 + i %% %(projects_n)s], (%(projects)s::bigint[])[1 + i %% %(projects_n)s],
       %(requester)s, %(service)s, (%(specs)s::bigint[])[1 + i %% %(specs_n)s], %(image)s, 1 + i %% 48, 'standard',
       '', '{{}}'::jsonb, CASE WHEN i %% {running} = 0 THEN 'active' ELSE 'released' END,
       (%(cards)s::numeric[])[1 + i %% %(specs_n)s], (%(counts)s::int[])[1 + i %% %(specs_n)s], 80, 8, 64,
       (%(cards)s::numeric[])[1 + i %% %(specs_n)s] * (1 + i %% 48), (%(prices)s::numeric[])[1 + i %% %(specs_n)s],
       (%(prices)s::numeric[])[1 + i %% %(specs_n)s] * (1 + i %% 48), false, '[]'::jsonb, '', '{{}}'::jsonb,
       '{{}}'::jsonb, '', '', %(month)s, %(month)s
FROM generate_series(0, %(allocations)s - 1) AS i
"""

# One allocation per request, started somewhere in the month (i * a prime spreads them), on a node of its spec's model
# (the specs come five per model, the nodes NODES_PER_MODEL per model, in the same order).
_ALLOCATIONS = """
INSERT INTO {allocations} (request_id, node_id, state, cpu_milli, memory_mib, priority, preemptible, started_at,
    term_started_at, released_at, release_reason)
SELECT r.id, (%(nodes)s::bigint[])[1 + r.i %% %(per_model)s + %(per_model)s * r.model],
       CASE WHEN r.state = 'active' THEN 'active' ELSE 'released' END, 8000, 65536, 50, false, starts.at, starts.at,
       CASE WHEN r.state = 'active' THEN NULL ELSE starts.at + make_interval(hours => r.duration_hours) END,
       CASE WHEN r.state = 'active' THEN '' ELSE 'bench' END
FROM (SELECT id, state, duration_hours, row_number() OVER (ORDER BY id) - 1 AS i,
             (array_position(%(specs)s::bigint[], spec_id) - 1) / {specs_per_model} AS model
      FROM {requests} WHERE project_id = ANY(%(projects)s)
      AND NOT EXISTS (SELECT 1 FROM {allocations} a WHERE a.request_id = {requests}.id)) r
CROSS JOIN LATERAL (SELECT %(month)s::timestamptz + make_interval(secs => (r.i * 7919) %% %(seconds)s) AS at) starts
"""

_BINDINGS = """
INSERT INTO {bindings} (allocation_id, device_id, milli)
SELECT a.id, d.id, CASE WHEN s.slice_profile_id IS NULL THEN 1000 ELSE 500 END
FROM {allocations} a JOIN {requests} r ON r.id = a.request_id JOIN {specs} s ON s.id = r.spec_id
JOIN {devices} d ON d.node_id = a.node_id AND d.index < s.accelerator_count
WHERE r.project_id = ANY(%(projects)s) AND NOT EXISTS (SELECT 1 FROM {bindings} b WHERE b.allocation_id = a.id)
"""

# One-minute samples from the start of the first bindings' allocations.
_SAMPLES = """
INSERT INTO metering_telemetrysample (allocation_id, device_id, sampled_at, utilization_pct, memory_used_mb, power_w)
SELECT b.allocation_id, b.device_id, b.started_at + make_interval(mins => n), round((random() * 100)::numeric, 2),
       (random() * 40000)::int, 60 + random() * 600
FROM (SELECT ad.allocation_id, ad.device_id, a.started_at FROM {bindings} ad JOIN {allocations} a
      ON a.id = ad.allocation_id JOIN {requests} r ON r.id = a.request_id WHERE r.project_id = ANY(%(projects)s)
      ORDER BY ad.id LIMIT %(binding_count)s) b
CROSS JOIN generate_series(0, {per_binding} - 1) AS n
LIMIT %(samples)s
ON CONFLICT DO NOTHING
"""


def _generate(world: dict, month, allocations: int, samples: int) -> None:
    specs = world["specs"]
    start = midnight(month)
    tables = {
        "requests": ResourceRequest._meta.db_table,
        "allocations": Allocation._meta.db_table,
        "bindings": AllocationDevice._meta.db_table,
        "specs": ResourceSpec._meta.db_table,
        "devices": Device._meta.db_table,
        "running": RUNNING_EVERY,
        "per_binding": SAMPLES_PER_BINDING,
        "specs_per_model": len(COUNTS) + 1,
    }
    projects = world["projects"]
    params = {
        "tenants": [project.tenant_id for project in projects],
        "projects": [project.pk for project in projects],
        "projects_n": len(projects),
        "requester": world["viewer"].pk,
        "service": world["service"].pk,
        "image": world["image"].pk,
        "specs": [spec.pk for spec in specs],
        "specs_n": len(specs),
        "cards": [spec.gpu_equivalents for spec in specs],
        "counts": [spec.accelerator_count for spec in specs],
        "prices": [spec.hourly_cost for spec in specs],
        "month": start,
        "allocations": allocations,
        "nodes": [node for nodes in world["nodes"] for node in nodes],
        "per_model": NODES_PER_MODEL,
        "seconds": int((midnight(add_months(month, 1)) - start - timedelta(hours=1)).total_seconds()),
        "binding_count": -(-samples // SAMPLES_PER_BINDING),
        "samples": samples,
    }
    with connection.cursor() as cursor:
        for statement in (_REQUESTS, _ALLOCATIONS, _BINDINGS, _SAMPLES):
            cursor.execute(statement.format(**tables), params)
        cursor.execute("ANALYZE")
