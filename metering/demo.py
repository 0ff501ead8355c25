"""Demo usage history: a few weeks of released requests on the demo cluster, with one-minute telemetry from the
simulated driver, so that the usage page has card-hours, cost, energy, budgets, a rightsizing recommendation
(Computer Vision's 8x H100 runs keep one card busy) and a zero-touch figure to show. Written once (idempotent)."""

from datetime import timedelta

from django.utils import timezone

from catalog.models import Image, ResourceSpec, Service
from metering import selectors, services
from metering.models import TelemetrySample
from metering.telemetry import SimulatedDriver
from requests.choices import EventCode, RequestState
from requests.models import RequestEvent, ResourceRequest
from requests.orders import Order, size_order
from scheduling.choices import AllocationState
from scheduling.engine import MILLI
from scheduling.models import Allocation, AllocationDevice, Device, Node
from tenancy.models import Project

HISTORY = "Demo usage history"
# project, requester, spec, declared workload, node, days ago (starting 09:00 UTC), hours, released by an operator
RUNS = [
    *[("vision", "developer", "h100-8x", "underused", "hgx-h100-01", days, 6, False) for days in (4, 9, 16, 23)],
    *[
        ("llm-pretraining", "developer", "h100-8x", "training", "hgx-h100-02", days, 8, days == 10)
        for days in (3, 10, 18)
    ],
    *[("recommendations", "developer2", "l40s-1x", "inference", "l40s-01", days, 6, False) for days in (2, 5, 12)],
    ("vision", "developer", "h100-mig-3g", "interactive", "hgx-h100-01", 7, 4, False),
]


def _run(context: dict, project, requester, spec, workload, node, days, hours, by_operator) -> Allocation:
    """One released request: its allocation, device bindings and timeline, as the platform would have left them."""
    service, image = (
        Service.objects.get(slug="gpu-workspace"),
        Image.objects.get(name="pytorch", version="2.5-cuda12.4"),
    )
    project, spec = Project.objects.get(slug=project), ResourceSpec.objects.get(slug=spec)
    order = Order(
        service=service,
        project=project,
        duration_hours=hours,
        spec=spec,
        image=image,
        parameters={"environment": "development", "workload": workload},
    )
    start = (timezone.now() - timedelta(days=days)).replace(hour=9, minute=0, second=0, microsecond=0)
    end = start + timedelta(hours=hours)
    request = ResourceRequest.objects.create(
        tenant_id=project.tenant_id,
        project=project,
        requester=context["users"][requester],
        service=service,
        spec=spec,
        image=image,
        duration_hours=hours,
        parameters=order.parameters,
        justification=HISTORY,
        state=RequestState.RELEASED,
        **size_order(order).request_fields(),
    )
    node = Node.objects.get(name=node)
    allocation = Allocation.objects.create(
        request=request,
        node=node,
        cpu_milli=spec.cpu_cores * MILLI,
        memory_mib=spec.memory_gb * 1024,
        priority=50,
        state=AllocationState.RELEASED,  # history: it is stored as it ended, not moved there
        term_started_at=start,
        released_at=end,
        release_reason="done",
    )
    Allocation.objects.filter(pk=allocation.pk).update(started_at=start)  # auto_now_add would say now
    share = int(spec.slice_profile.compute_fraction * MILLI) if spec.slice_profile else MILLI
    devices = Device.objects.filter(node=node).order_by("-index" if spec.slice_profile else "index")
    AllocationDevice.objects.bulk_create(
        AllocationDevice(allocation=allocation, device=device, milli=share)
        for device in devices[: spec.accelerator_count]
    )
    _timeline(request, start, end, context["users"]["operator"] if by_operator else None)
    return allocation


def _timeline(request: ResourceRequest, start, end, operator) -> None:
    steps = [
        (start - timedelta(minutes=12), "", RequestState.QUEUED, EventCode.QUEUED, "Approved and queued."),
        (start, RequestState.QUEUED, RequestState.ALLOCATED, EventCode.ALLOCATED, "Allocated."),
        (start + timedelta(minutes=4), RequestState.PROVISIONING, RequestState.ACTIVE, EventCode.ACTIVE, "Ready."),
        (
            end,
            RequestState.ACTIVE,
            RequestState.RELEASING,
            EventCode.RELEASING,
            f"Release started by {operator.username}: node maintenance" if operator else "Released early.",
        ),
        (end, RequestState.RELEASING, RequestState.RELEASED, EventCode.RELEASED, "Devices returned."),
    ]
    for when, before, after, code, message in steps:
        event = RequestEvent.objects.create(
            request=request,
            from_state=before,
            to_state=after,
            code=code,
            message=message,
            actor=operator if code == EventCode.RELEASING else None,
            intervention=operator is not None and code == EventCode.RELEASING,
        )
        RequestEvent.objects.filter(pk=event.pk).update(created_at=when)
    ResourceRequest.objects.filter(pk=request.pk).update(created_at=start - timedelta(minutes=15))


def _telemetry(allocation: Allocation) -> None:
    """A reading of every device each minute of the run, as the collector would have stored it."""
    allocation.refresh_from_db()
    bindings = selectors.bindings_of(Allocation.objects.filter(pk=allocation.pk))
    driver, at, samples = SimulatedDriver(), allocation.started_at, []
    while at <= allocation.released_at:
        samples += [services.sample_of(reading, at) for reading in driver.read(bindings, at).readings]
        at += timedelta(minutes=1)
    TelemetrySample.objects.bulk_create(samples, batch_size=5000)


def seed(context: dict) -> None:
    if ResourceRequest.objects.filter(justification=HISTORY).exists():
        return
    allocations = [_run(context, *run) for run in RUNS]
    for allocation in allocations:
        _telemetry(allocation)
    services.telemetry_rollup(first_day=min(allocation.started_at for allocation in allocations).date())
    services.usage_refresh()
