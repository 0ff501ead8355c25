"""Reads of the catalog. Developers see what can be ordered now; operators (view permission) see everything."""

from django.db.models import Model, Prefetch, Q, QuerySet

from catalog.choices import SpecStatus, Visibility
from catalog.models import (
    AcceleratorModel,
    BareMetalProfile,
    Image,
    ResourceSpec,
    Service,
    ServingModel,
    ServingTemplate,
)
from tenancy.models import User
from tenancy.selectors import project_list_visible_to

# What "orderable" means for each catalog model; retired rows stay for history but leave the catalog.
_ORDERABLE = {
    ResourceSpec: Q(status=SpecStatus.ACTIVE),
    Image: Q(approved=True),
    BareMetalProfile: Q(active=True),
    ServingModel: Q(approved=True),
    ServingTemplate: Q(active=True),
    Service: Q(active=True),
}


def sees_whole_catalog(user: User, model: type[Model]) -> bool:
    """Operators with the model's view permission also see deprecated, unapproved and hidden entries."""
    return user.has_perm(f"{model._meta.app_label}.view_{model._meta.model_name}")


def _visible(queryset: QuerySet, user: User) -> QuerySet:
    if sees_whole_catalog(user, queryset.model):
        return queryset
    return queryset.filter(_ORDERABLE[queryset.model])


def _accelerators() -> QuerySet[AcceleratorModel]:
    return AcceleratorModel.objects.select_related("vendor")


def spec_list(*, user: User) -> QuerySet[ResourceSpec]:
    queryset = ResourceSpec.objects.select_related("slice_profile__accelerator__vendor").prefetch_related(
        Prefetch("accelerator_models", queryset=_accelerators())
    )
    return _visible(queryset, user)


def image_list(*, user: User) -> QuerySet[Image]:
    return _visible(Image.objects.prefetch_related("compatible_vendors"), user)


def bare_metal_profile_list(*, user: User) -> QuerySet[BareMetalProfile]:
    queryset = BareMetalProfile.objects.select_related("accelerator_model__vendor", "os_image")
    return _visible(queryset, user)


def serving_template_list(*, user: User) -> QuerySet[ServingTemplate]:
    return _visible(ServingTemplate.objects.select_related("spec"), user)


def serving_model_list(*, user: User) -> QuerySet[ServingModel]:
    return _visible(
        ServingModel.objects.prefetch_related(Prefetch("templates", queryset=serving_template_list(user=user))),
        user,
    )


def _services_visible_to(queryset: QuerySet[Service], user: User) -> QuerySet[Service]:
    projects = project_list_visible_to(user=user)
    audience = (
        Q(visibility=Visibility.ALL)
        | Q(visible_projects__in=projects.values("pk"))
        | Q(visible_tenants__in=projects.values("tenant_id"))
    )
    matching = Service.objects.filter(_ORDERABLE[Service], audience).values("pk")
    return queryset.filter(pk__in=matching)


def service_list(*, user: User, detailed: bool = True) -> QuerySet[Service]:
    """Services the user may order from (all of them for catalog operators), with what each one offers.

    `detailed=False` loads only the offerings' own rows (enough to name and price them), for list pages.
    """
    if detailed:
        offerings = {
            "specs": spec_list(user=user),
            "images": image_list(user=user),
            "bare_metal_profiles": bare_metal_profile_list(user=user),
            "serving_models": serving_model_list(user=user),
        }
    else:
        offerings = {
            "specs": _visible(ResourceSpec.objects.select_related("slice_profile"), user),
            "images": _visible(Image.objects.all(), user),
            "bare_metal_profiles": _visible(BareMetalProfile.objects.all(), user),
            "serving_models": _visible(ServingModel.objects.all(), user),
        }
    queryset = Service.objects.prefetch_related(*(Prefetch(field, queryset=rows) for field, rows in offerings.items()))
    if sees_whole_catalog(user, Service):
        return queryset
    return _services_visible_to(queryset, user)
