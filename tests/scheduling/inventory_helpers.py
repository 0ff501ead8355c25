"""Inventory builders for the inventory, admin, clearance and API tests."""

from datetime import timedelta
from decimal import Decimal
from itertools import count

from django.contrib.auth.models import Permission
from django.db.models import F

from catalog.models import Vendor
from requests.choices import RequestState
from requests.orders import Order
from scheduling.models import Allocation, AllocationDevice, Device, Node, Rack, Site
from tests import factories
from tests.requests.lifecycle import stored_request

_n = count(1)


def accelerator(name: str | None = None, memory_gb: int = 80):
    n = next(_n)
    return factories.AcceleratorModelFactory(name=name or f"Inv GPU {n}", slug=f"inv-gpu-{n}", memory_gb=memory_gb)


def node(*, devices: int = 2, model=None, rack: Rack | None = None, name: str | None = None) -> Node:
    n = next(_n)
    name = name or f"node-{n:04d}"
    node = Node.objects.create(
        name=name,
        serial_number=f"SN-{name}",
        cpu_milli=64_000,
        memory_mib=262_144,
        rack=rack,
        topology_domain=f"island-{n % 3}",
    )
    model = model or accelerator()
    Device.objects.bulk_create(
        Device(node=node, index=i, uuid=f"GPU-{name}-{i}", model=model, memory_gb=model.memory_gb)
        for i in range(devices)
    )
    return node


def rack(site_name: str = "dc1", name: str | None = None) -> Rack:
    site, _ = Site.objects.get_or_create(name=site_name)
    return Rack.objects.create(site=site, name=name or f"rack-{next(_n)}")


def active_request(*, project=None, requester=None):
    """A stored ACTIVE resource request (no approval, no snapshot) for allocation tests."""
    project = project or factories.project()
    requester = requester or factories.member(project)
    nvidia = Vendor.objects.get(slug="nvidia")
    model = factories.AcceleratorModelFactory(vendor=nvidia)
    spec = factories.ResourceSpecFactory(
        accelerator_models=[model], accelerator_count=1, cpu_cores=8, memory_gb=64, hourly_price=Decimal("2.00")
    )
    image = factories.ImageFactory(compatible_vendors=[nvidia])
    service = factories.ServiceFactory(specs=[spec], images=[image])
    order = Order(service=service, project=project, duration_hours=4, spec=spec, image=image)
    return stored_request(order, requester, RequestState.ACTIVE)


def allocate(request, devices: list[Device], milli: int = 1000) -> Allocation:
    allocation = Allocation.objects.create(
        request=request,
        node=devices[0].node,
        cpu_milli=8000,
        memory_mib=65536,
        priority=50,
    )
    for device in devices:
        AllocationDevice.objects.create(allocation=allocation, device=device, milli=milli)
        Device.objects.filter(pk=device.pk).update(allocated_milli=F("allocated_milli") + milli)
    return allocation


def end_terms_at(moment) -> None:
    """Every allocation's term ends at `moment`: its start moves, since the end is derived from the duration."""
    for allocation in Allocation.objects.select_related("request"):
        started = moment - timedelta(hours=allocation.request.duration_hours)
        Allocation.objects.filter(pk=allocation.pk).update(term_started_at=started)


def grant(user, codename: str = "clear_device_isolation"):
    user.user_permissions.add(Permission.objects.get(content_type__app_label="scheduling", codename=codename))
    return type(user).objects.get(pk=user.pk)  # fresh: permission caches are per instance


def clearance_holder(**kwargs):
    """An operator who also holds the dedicated clearance permission."""
    return grant(factories.operator(**kwargs))
