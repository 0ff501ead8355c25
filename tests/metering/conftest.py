"""A metered world: a project with a card-hour budget, whole-card and half-card specs, a node, and allocations
bound over chosen intervals (the scheduler's own bookkeeping is not needed to meter them)."""

from datetime import UTC, date, datetime
from decimal import Decimal
from types import SimpleNamespace

import pytest
import time_machine
from django.db.models import F

from catalog.choices import SliceKind
from catalog.models import Vendor
from metering import services
from metering.models import DailyUsage
from requests.choices import EventCode, RequestState
from requests.models import RequestEvent
from requests.orders import Order
from scheduling.choices import AllocationState
from scheduling.models import Allocation, AllocationDevice, Device
from tenancy.services import quota_set
from tests import factories
from tests.requests.lifecycle import stored_request
from tests.scheduling.inventory_helpers import node


def at(text: str) -> datetime:
    """ "2026-11-30 10:00" as an aware UTC datetime."""
    return datetime.strptime(text, "%Y-%m-%d %H:%M").replace(tzinfo=UTC)


NOW = at("2026-11-20 12:00")


@pytest.fixture
def frozen():
    """The clock stands still at 2026-11-20 12:00 UTC."""
    with time_machine.travel(NOW, tick=False):
        yield NOW


@pytest.fixture
def world(db):
    """Project `project` (budget 100 card-hours a month, developer `developer`) and `other_project`; an 80 GB model
    with a half-card share; spec `whole` (2 cards at 4.00 per card and hour) and `half` (one half card at 0.50 per
    hour); one node of four such cards."""
    nvidia = Vendor.objects.get(slug="nvidia")
    model = factories.AcceleratorModelFactory(vendor=nvidia, memory_gb=80, name="Test H100 80GB")
    half_profile = factories.SliceProfileFactory(
        accelerator=model,
        name="0.5",
        kind=SliceKind.SHARE,
        compute_fraction=Decimal("0.5"),
        memory_gb=40,
        max_per_device=2,
    )
    whole = factories.ResourceSpecFactory(
        accelerator_models=[model],
        accelerator_count=2,
        cpu_cores=16,
        memory_gb=128,
        hourly_price=Decimal("4.00"),
        max_duration_hours=720,
    )
    half = factories.ResourceSpecFactory(
        accelerator_models=[model],
        accelerator_count=1,
        slice_profile=half_profile,
        cpu_cores=4,
        memory_gb=32,
        hourly_price=Decimal("0.50"),
        max_duration_hours=720,
    )
    image = factories.ImageFactory(compatible_vendors=[nvidia])
    service = factories.ServiceFactory(specs=[whole, half], images=[image], max_duration_hours=720)
    project = factories.project(quota={"monthly_card_hours": Decimal(100)})
    other_project = factories.project()
    return SimpleNamespace(
        model=model,
        whole=whole,
        half=half,
        image=image,
        service=service,
        project=project,
        developer=factories.member(project),
        other_project=other_project,
        node=node(devices=4, model=model),
    )


def bound(
    world,
    *,
    started: datetime,
    released: datetime | None = None,
    spec=None,
    project=None,
    hours: int = 24,
    devices: list | None = None,
) -> Allocation:
    """A request of `spec` (default: the whole-card spec) holding an allocation from `started` until `released`
    (or still running): released requests end RELEASED, running ones are ACTIVE."""
    spec = spec or world.whole
    project = project or world.project
    order = Order(service=world.service, project=project, duration_hours=hours, spec=spec, image=world.image)
    request = stored_request(order, project.lead, RequestState.RELEASED if released else RequestState.ACTIVE)
    cards = devices or list(world.node.devices.order_by("index"))[: spec.accelerator_count]
    allocation = Allocation.objects.create(
        request=request,
        node=cards[0].node,
        cpu_milli=spec.cpu_cores * 1000,
        memory_mib=spec.memory_gb * 1024,
        priority=50,
    )
    milli = int(spec.slice_profile.compute_fraction * 1000) if spec.slice_profile else 1000
    AllocationDevice.objects.bulk_create(
        AllocationDevice(allocation=allocation, device=device, milli=milli) for device in cards
    )
    Allocation.objects.filter(pk=allocation.pk).update(
        started_at=started,
        term_started_at=started,
        released_at=released,
        state=AllocationState.RELEASED if released else AllocationState.ACTIVE,
    )
    if released is None:
        Device.objects.filter(pk__in=[device.pk for device in cards]).update(
            allocated_milli=F("allocated_milli") + milli
        )
    allocation.refresh_from_db()
    return allocation


def rolled_up(world, spec, *, day: date, busy: float, memory_gb: float, mean_pct: float, project=None) -> DailyUsage:
    """A request of `spec` used for most of `day`, as the daily rollup summarised it: p95 busy cards, p95 memory in
    use (GB), mean utilization per card (%)."""
    allocation = bound(world, spec=spec, project=project, started=at(f"{day} 00:00"), released=at(f"{day} 23:00"))
    return DailyUsage.objects.create(
        allocation=allocation,
        day=day,
        accelerator_model=world.model,
        samples=1380,
        device_samples=1380 * 8,
        utilization_sum=mean_pct * 1380 * 8,
        busy_cards_p95=busy,
        memory_sum_mb=1380 * memory_gb * 512,
        memory_p95_mb=memory_gb * 1024,
        memory_max_mb=memory_gb * 1100,
        energy_kwh=12.5,
        updated_at=at(f"{day} 23:00"),
    )


@pytest.fixture
def eight_cards(world):
    """Next to the world's specs: 8 and 1 whole cards, and a 3g.40gb MIG slice, of the same model."""
    mig = factories.SliceProfileFactory(
        accelerator=world.model,
        name="3g.40gb",
        kind=SliceKind.MIG,
        compute_fraction=Decimal("0.4286"),
        memory_gb=40,
        max_per_device=2,
    )
    specs = SimpleNamespace(
        eight=factories.ResourceSpecFactory(
            accelerator_models=[world.model], accelerator_count=8, hourly_price=Decimal("3.90"), max_duration_hours=720
        ),
        one=factories.ResourceSpecFactory(
            accelerator_models=[world.model], accelerator_count=1, hourly_price=Decimal("3.90")
        ),
        mig=factories.ResourceSpecFactory(
            accelerator_models=[world.model], accelerator_count=1, slice_profile=mig, hourly_price=Decimal("1.70")
        ),
    )
    world.service.specs.add(specs.eight, specs.one, specs.mig)
    return specs


def delivered(world, when: str, *, service=None, project=None, state=RequestState.ACTIVE):
    """A request that became active at `when` (its timeline says so)."""
    project = project or world.project
    order = Order(
        service=service or world.service, project=project, duration_hours=4, spec=world.whole, image=world.image
    )
    request = stored_request(order, project.lead, state)
    event = RequestEvent.objects.create(
        request=request,
        from_state=RequestState.PROVISIONING,
        to_state=RequestState.ACTIVE,
        code=EventCode.ACTIVE,
        message="Ready.",
    )
    RequestEvent.objects.filter(pk=event.pk).update(created_at=at(when))
    return request


def use(world, project, eight_cards, service):
    """Card-hours, a budget with alerts, rightsizing evidence and a delivered request for `project`."""
    bound(world, project=project, started=at("2026-11-10 08:00"), released=at("2026-11-10 10:00"))  # 4 card-hours
    quota_set(quota=project.quota, limits={"monthly_card_hours": Decimal("4.5")}, actor=None)
    for day in (25, 27, 29):  # in October, within the 30 days rightsizing looks back
        rolled_up(
            world, eight_cards.eight, project=project, day=date(2026, 10, day), busy=0.4, memory_gb=20, mean_pct=5
        )
    delivered(world, "2026-11-12 09:00", project=project, service=service)


@pytest.fixture
def usage(frozen, world, roles, eight_cards):
    """The role matrix's two projects, each with usage of every kind (the other one through its own service)."""
    roles.other_service = factories.ServiceFactory(specs=[world.whole], images=[world.image])
    use(world, roles.project, eight_cards, world.service)
    use(world, roles.other_project, eight_cards, roles.other_service)
    roles.world = world
    services.usage_refresh()
    return roles
