"""What a benchmark orders from: one compute service offering its specs with one approved image."""

from catalog.choices import ServiceKind
from catalog.models import AcceleratorModel, Image, ResourceSpec, Service


def bench_service(
    *,
    name: str,
    slug: str,
    specs: list[ResourceSpec],
    accelerator: AcceleratorModel,
    max_duration_hours: int,
    image_reference: str = "bench",
) -> tuple[Service, Image]:
    """The service and its image (compatible with the accelerator's vendor), both named by `slug`."""
    image = Image.objects.create(
        name=slug, version="1", reference=image_reference, os="linux", runtime="cuda", approved=True
    )
    image.compatible_vendors.set([accelerator.vendor])
    service = Service.objects.create(
        name=name,
        slug=slug,
        kind=ServiceKind.COMPUTE,
        description="benchmark",
        default_duration_hours=1,
        max_duration_hours=max_duration_hours,
    )
    service.specs.set(specs)
    service.images.set([image])
    return service, image
