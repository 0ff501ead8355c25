"""How long an order may run: the smallest of the maxima of the service and of what is ordered from it.

One function answers it for the order form (its default, validator, `max` and hint), the preview, the catalog
API and the order's validation, so that no page promises hours that submission then refuses.
"""

from catalog.choices import ServiceKind
from catalog.models import BareMetalProfile, ResourceSpec, Service, ServingTemplate


def duration_limits(
    service: Service,
    *,
    spec: ResourceSpec | None = None,
    serving_template: ServingTemplate | None = None,
    bare_metal_profile: BareMetalProfile | None = None,
) -> dict[str, int]:
    """Each maximum that applies, by where it comes from (service, spec, serving_template, bare_metal_profile)."""
    limits = {"service": service.max_duration_hours}
    if spec is not None:
        limits["spec"] = spec.max_duration_hours
    if serving_template is not None:  # a template runs each replica on its own spec
        limits["serving_template"] = serving_template.spec.max_duration_hours
    if bare_metal_profile is not None:
        limits["bare_metal_profile"] = bare_metal_profile.max_duration_hours
    return limits


def max_duration_hours(service: Service, **offering) -> int:
    return min(duration_limits(service, **offering).values())


def default_duration_hours(service: Service, **offering) -> int:
    """The service's default, never above what may be ordered."""
    return min(service.default_duration_hours, max_duration_hours(service, **offering))


def offering_durations(service: Service) -> list[dict]:
    """The maximum and default per spec or profile the service offers (from prefetched relations)."""
    offers = [("bare_metal_profile", profile) for profile in service.bare_metal_profiles.all()]
    if service.kind != ServiceKind.BARE_METAL:
        offers = [("spec", spec) for spec in service.specs.all()]
    return [
        {
            "kind": kind,
            "id": offer.pk,
            "name": offer.name,
            "max_duration_hours": max_duration_hours(service, **{kind: offer}),
            "default_duration_hours": default_duration_hours(service, **{kind: offer}),
        }
        for kind, offer in offers
    ]


def longest_duration_hours(service: Service) -> int:
    """The longest any order of the service may run: the service's maximum capped by its longest offering."""
    return max((row["max_duration_hours"] for row in offering_durations(service)), default=service.max_duration_hours)
