"""The catalog as orders are checked against it, kept per process until a catalog table changes.

Every preview and submission reads the service, the spec with its accelerator models, the image, and whether the
service offers them (and to whom): eight queries an order, against a catalog that changes a few times a day. The
whole orderable catalog is a few hundred rows; a process builds it once and keeps it while the catalog's change
counter (config/versions.py, bumped by a trigger on every catalog table) stays put, so an order reads one row
instead. The instances are shared by every order of the process: read them, never change them.
"""

from dataclasses import dataclass

from django.db import models

from catalog.models import BareMetalProfile, Image, ResourceSpec, Service, ServingModel, ServingTemplate
from config.versions import KeptPerProcess

ORDERABLE = (Service, ResourceSpec, Image, BareMetalProfile, ServingModel, ServingTemplate)
# What a service offers, by its relation's name (the Service fields).
OFFERS = ("specs", "images", "bare_metal_profiles", "serving_models")


@dataclass(frozen=True)
class OrderableCatalog:
    items: dict[type[models.Model], dict[int, models.Model]]
    offered: dict[str, frozenset[tuple[int, int]]]  # relation -> {(service id, item id)}
    visible_to: frozenset[tuple[int, str, int]]  # (service id, "tenant" or "project", id)
    image_vendors: dict[int, frozenset[int]]
    model_templates: frozenset[tuple[int, int]]  # (serving model id, template id)

    def get(self, model: type[models.Model], pk: int) -> models.Model | None:
        return self.items[model].get(pk)

    def offers(self, service: Service, relation: str, item: models.Model) -> bool:
        return (service.pk, item.pk) in self.offered[relation]

    def visible(self, service: Service, *, tenant_id: int, project_id: int) -> bool:
        """Whether a restricted service names the tenant or the project (the caller checks the visibility)."""
        named = {(service.pk, "tenant", tenant_id), (service.pk, "project", project_id)}
        return not named.isdisjoint(self.visible_to)

    def vendors_of(self, image: Image) -> frozenset[int]:
        return self.image_vendors.get(image.pk, frozenset())

    def serves_with(self, model: ServingModel, template: ServingTemplate) -> bool:
        return (model.pk, template.pk) in self.model_templates


def _pairs(relation) -> frozenset[tuple[int, int]]:
    """The (owner id, item id) rows of a many-to-many relation's table."""
    through = relation.through
    owner, item = (field.attname for field in through._meta.fields if field.is_relation)
    return frozenset(through.objects.values_list(owner, item))


def _build() -> OrderableCatalog:
    specs = {spec.pk: spec for spec in ResourceSpec.objects.select_related("slice_profile").prefetch_related(
        "accelerator_models"
    )}  # fmt: skip
    templates = {template.pk: template for template in ServingTemplate.objects.all()}
    for template in templates.values():
        template.spec = specs[template.spec_id]  # one instance per spec, its models prefetched
    items = {
        Service: {service.pk: service for service in Service.objects.all()},
        ResourceSpec: specs,
        Image: {image.pk: image for image in Image.objects.all()},
        BareMetalProfile: {
            profile.pk: profile for profile in BareMetalProfile.objects.select_related("accelerator_model", "os_image")
        },
        ServingModel: {model.pk: model for model in ServingModel.objects.all()},
        ServingTemplate: templates,
    }
    visible_to = {(service, "tenant", tenant) for service, tenant in _pairs(Service.visible_tenants)}
    visible_to |= {(service, "project", project) for service, project in _pairs(Service.visible_projects)}
    image_vendors: dict[int, set[int]] = {}
    for image, vendor in _pairs(Image.compatible_vendors):
        image_vendors.setdefault(image, set()).add(vendor)
    return OrderableCatalog(
        items=items,
        offered={relation: _pairs(getattr(Service, relation)) for relation in OFFERS},
        visible_to=frozenset(visible_to),
        image_vendors={image: frozenset(vendors) for image, vendors in image_vendors.items()},
        model_templates=_pairs(ServingModel.templates),
    )


_kept = KeptPerProcess("catalog", _build)


def orderable_catalog() -> OrderableCatalog:
    """The current orderable catalog (one query while nothing in the catalog changed)."""
    return _kept.get()
