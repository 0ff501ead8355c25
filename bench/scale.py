"""Benchmark fleets and workloads in the database: the openb node list K times, requests from the trace's pod shapes.

`bench.fleet` (pure) says what the fleet and the workload are; this module writes them with bulk statements
so a 12,130-node fleet and 100,000 queued requests load in seconds. Used by `python -m bench scheduler --scale K`
(one cycle, and `--steady MINUTES`), and by the scheduling tests that check a cycle's queries do not grow with the
queue. Benchmark data only: run it on a scratch database.
"""

import uuid
from datetime import datetime
from decimal import Decimal
from pathlib import Path

from django.utils import timezone

from bench import fleet
from catalog.choices import ServiceKind, SliceKind
from catalog.models import AcceleratorModel, Image, ResourceSpec, Service, SliceProfile, Vendor
from requests.choices import RequestState
from requests.models import ResourceRequest
from requests.models.request import snapshot_hash
from requests.services import approved_snapshot
from scheduling.inventory.formats import OPENB_MODELS, DeviceRecord, NodeRecord, device_uuid
from scheduling.inventory.importer import inventory_import
from tenancy.models import Project, ProjectQuota, Tenant, User

OPENB_CODE_TO_SLUG = {code: slug for code, (slug, *_rest) in OPENB_MODELS.items()}


def import_fleet(nodes_csv: str | Path, scale: int) -> dict:
    """The openb node list `scale` times into the inventory (sites site-00.., topology domains of 64 nodes)."""
    records = [
        NodeRecord(
            name=node.name,
            serial_number=node.name,
            cpu_milli=node.cpu_milli,
            memory_mib=node.memory_mib,
            devices=[
                DeviceRecord(index=i, model=OPENB_CODE_TO_SLUG[node.model], uuid=device_uuid(node.name, i))
                for i in range(node.gpus)
            ],
            site=node.site,
            rack=node.topology_domain.rsplit("/", 1)[1],
            topology_domain=node.topology_domain,
            where=node.name,
        )
        for node in fleet.replicate(fleet.read_openb_nodes(nodes_csv), scale)
    ]
    inventory_import(records, actor=None, create_openb_models=True)
    return {"nodes": len(records), "gpus": sum(len(record.devices) for record in records)}


class Workload:
    """The catalog entries, projects and quotas a trace workload needs, created once; then requests in bulk."""

    def __init__(self, shapes: list[fleet.PodShape], *, projects: int = 200, mix: fleet.Mix = fleet.MIX):
        self.mix = mix
        self.requester, _ = User.objects.get_or_create(username="bench-requester")
        self.image, _ = Image.objects.get_or_create(
            name="bench",
            version="1",
            defaults={"reference": "bench", "os": "linux", "runtime": "cuda", "approved": True},
        )
        self.image.compatible_vendors.set(Vendor.objects.all())
        self.service, _ = Service.objects.get_or_create(
            slug="bench-trace",
            defaults={
                "name": "Bench (openb trace)",
                "kind": ServiceKind.COMPUTE,
                "description": "benchmark",
                "default_duration_hours": 24,
                "max_duration_hours": 720,
            },
        )
        self.models = {model.slug: model for model in AcceleratorModel.objects.filter(devices__isnull=False).distinct()}
        self.specs = self._specs({shape.key for shape in shapes})
        self.service.specs.add(*self.specs.values())
        self.projects = self._projects(projects)
        self._templates: dict = {}

    def _profiles(self, millis: set[int]) -> dict[int, SliceProfile]:
        """A share profile `share-<milli>` on every model, for the trace's fractional-GPU pods."""
        wanted = [
            SliceProfile(
                accelerator=model,
                name=f"share-{milli}",
                kind=SliceKind.SHARE,
                compute_fraction=Decimal(milli) / 1000,
                memory_gb=max(1, model.memory_gb * milli // 1000),
                max_per_device=max(1, 1000 // milli),
            )
            for milli in sorted(millis)
            for model in self.models.values()
        ]
        SliceProfile.objects.bulk_create(wanted, ignore_conflicts=True)
        first = next(iter(self.models.values()))
        return {
            int(profile.name.removeprefix("share-")): profile
            for profile in SliceProfile.objects.filter(accelerator=first, name__startswith="share-")
        }

    def _specs(self, keys: set[tuple]) -> dict[tuple, ResourceSpec]:
        profiles = self._profiles({milli for _count, milli, *_ in keys if milli < 1000})
        ordered = sorted(keys)
        existing = {spec.slug: spec for spec in ResourceSpec.objects.filter(slug__startswith="trace-")}
        new = []
        for key in ordered:
            slug = _spec_slug(key)
            if slug in existing:
                continue
            count, milli, cpu, memory, _models = key
            new.append(
                ResourceSpec(
                    slug=slug,
                    name=slug,
                    accelerator_count=count,
                    slice_profile=profiles.get(milli) if milli < 1000 else None,
                    cpu_cores=cpu,
                    memory_gb=memory,
                    hourly_price=Decimal("1.00"),
                    max_duration_hours=720,
                )
            )
        ResourceSpec.objects.bulk_create(new)
        specs = {spec.slug: spec for spec in ResourceSpec.objects.filter(slug__startswith="trace-")}
        through = ResourceSpec.accelerator_models.through
        by_slug = {_spec_slug(key): key for key in ordered}
        rows = []
        for spec in new:
            models = by_slug[spec.slug][4]
            slugs = [OPENB_CODE_TO_SLUG[code] for code in models] if models else list(self.models)
            rows += [
                through(resourcespec_id=specs[spec.slug].pk, acceleratormodel_id=self.models[slug].pk)
                for slug in slugs
                if slug in self.models
            ]
        through.objects.bulk_create(rows, ignore_conflicts=True)
        return {key: specs[_spec_slug(key)] for key in ordered}

    def _projects(self, count: int) -> list[Project]:
        tenants = []
        for t in range((count + self.mix.tenant_size - 1) // self.mix.tenant_size):
            tenants.append(Tenant(name=f"Bench tenant {t:03d}", slug=f"bench-t{t:03d}"))
        Tenant.objects.bulk_create(tenants, ignore_conflicts=True)
        tenant_ids = dict(Tenant.objects.filter(slug__startswith="bench-t").values_list("slug", "pk"))
        projects = [
            Project(
                tenant_id=tenant_ids[f"bench-t{p // self.mix.tenant_size:03d}"],
                name=f"Bench project {p:03d}",
                slug=f"bench-p{p:03d}",
                lead=self.requester,
                cost_centre="BENCH",
            )
            for p in range(count)
        ]
        Project.objects.bulk_create(projects, ignore_conflicts=True)
        by_slug = {project.slug: project for project in Project.objects.filter(slug__startswith="bench-p")}
        ordered = [by_slug[f"bench-p{p:03d}"] for p in range(count)]
        quotas = []
        for p, project in enumerate(ordered):
            concurrent, card_hours = fleet.project_limits(p, self.mix)
            quotas.append(
                ProjectQuota(
                    project=project,
                    concurrent_tasks=concurrent,
                    monthly_card_hours=Decimal(card_hours),
                    max_priority="critical",
                )
            )
        ProjectQuota.objects.bulk_create(quotas, ignore_conflicts=True)
        return ordered

    def _template(self, spec: ResourceSpec) -> ResourceRequest:
        """A request for the spec, its snapshot worked out once per spec with the catalog's queries."""
        template = self._templates.get(spec.pk)
        if template is None:
            template = queued_row(spec, self.projects[0], self.requester, self.service, self.image)
            self._templates[spec.pk] = template
            template.approved_spec = approved_snapshot(template)
        return template

    def queue(self, requests: list[fleet.SyntheticRequest], *, created_at: datetime | None = None) -> list[int]:
        """Bulk-create approved, queued requests whose snapshots are what submission would have frozen; their ids."""
        now = created_at or timezone.now()
        rows = []
        for synthetic in requests:
            spec = self.specs[synthetic.shape.key]
            project = self.projects[synthetic.project]
            template = self._template(spec)
            request = queued_row(spec, project, self.requester, self.service, self.image)
            request.priority = synthetic.priority
            request.duration_hours = synthetic.duration_hours
            request.card_hours = spec.gpu_equivalents * synthetic.duration_hours
            request.cost_estimate = spec.hourly_cost * synthetic.duration_hours
            freeze_like(request, template.approved_spec)
            request.created_at = request.approved_at = now
            rows.append(request)
        created = ResourceRequest.objects.bulk_create(rows, batch_size=5000)
        return [request.pk for request in created]


def freeze_like(request: ResourceRequest, template_snapshot: dict) -> None:
    """Give the request the snapshot submission would freeze, from one frozen for a request of the same spec and
    image: only the request's own fields differ (its id, tenant, project, priority, duration, card-hours, cost)."""
    request.approved_spec = {
        **template_snapshot,
        "request": request.pk,
        "tenant": request.project.tenant_id,
        "project": request.project.slug,
        "priority": request.priority,
        "duration_hours": request.duration_hours,
        "demand": {**template_snapshot["demand"], "card_hours": str(request.card_hours)},
        "cost_estimate": str(request.cost_estimate),
    }
    request.approved_spec_hash = snapshot_hash(request.approved_spec)


def _spec_slug(key: tuple) -> str:
    count, milli, cpu, memory, _models = key
    return f"trace-{uuid.uuid5(uuid.NAMESPACE_OID, repr(key)).hex[:12]}-{count}x{milli}-{cpu}c{memory}g"[:60]


def queued_row(spec, project, requester, service, image, parameters=None) -> ResourceRequest:
    """An unsaved queued request for the spec over 24 h, without its snapshot (callers freeze or copy one)."""
    return ResourceRequest(
        parameters=parameters or {},
        tenant_id=project.tenant_id,
        project=project,
        requester=requester,
        service=service,
        spec=spec,
        image=image,
        duration_hours=24,
        gpu_equivalents=spec.gpu_equivalents,
        accelerator_count=spec.accelerator_count,
        accelerator_memory_gb=spec.accelerator_memory_gb,
        cpu_cores=spec.cpu_cores,
        memory_gb=spec.memory_gb,
        card_hours=spec.gpu_equivalents * 24,
        hourly_cost=spec.hourly_cost,
        cost_estimate=spec.hourly_cost * 24,
        state=RequestState.QUEUED,
    )
