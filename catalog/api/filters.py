"""Query filters for the catalog API: by vendor, accelerator model, kind and lifecycle."""

import django_filters
from django.db.models import Q

from catalog.choices import AcceleratorKind, Runtime, ServiceKind, ServingRuntime, SpecStatus
from catalog.models import BareMetalProfile, Image, ResourceSpec, Service, ServingModel


def _any_of(*lookups: str):
    """A filter method matching when any of the lookups equals the value (across M2M paths)."""

    def method(queryset, _name, value):
        condition = Q()
        for lookup in lookups:
            condition |= Q(**{lookup: value})
        return queryset.filter(condition).distinct()

    return method


class ResourceSpecFilter(django_filters.FilterSet):
    vendor = django_filters.CharFilter(field_name="accelerator_models__vendor__slug", distinct=True)
    model = django_filters.CharFilter(field_name="accelerator_models__slug", distinct=True)
    kind = django_filters.ChoiceFilter(
        field_name="accelerator_models__kind", choices=AcceleratorKind.choices, distinct=True
    )
    slice = django_filters.BooleanFilter(field_name="slice_profile", lookup_expr="isnull", exclude=True)
    status = django_filters.ChoiceFilter(choices=SpecStatus.choices)

    class Meta:
        model = ResourceSpec
        fields = ["vendor", "model", "kind", "slice", "status"]


class ImageFilter(django_filters.FilterSet):
    vendor = django_filters.CharFilter(field_name="compatible_vendors__slug", distinct=True)
    runtime = django_filters.ChoiceFilter(choices=Runtime.choices)

    class Meta:
        model = Image
        fields = ["vendor", "runtime", "approved"]


class BareMetalProfileFilter(django_filters.FilterSet):
    vendor = django_filters.CharFilter(field_name="accelerator_model__vendor__slug")
    model = django_filters.CharFilter(field_name="accelerator_model__slug")
    kind = django_filters.ChoiceFilter(field_name="accelerator_model__kind", choices=AcceleratorKind.choices)

    class Meta:
        model = BareMetalProfile
        fields = ["vendor", "model", "kind", "active"]


class ServingModelFilter(django_filters.FilterSet):
    runtime = django_filters.ChoiceFilter(
        field_name="templates__runtime", choices=ServingRuntime.choices, distinct=True
    )
    vendor = django_filters.CharFilter(field_name="templates__spec__accelerator_models__vendor__slug", distinct=True)

    class Meta:
        model = ServingModel
        fields = ["runtime", "vendor", "approved"]


class ServiceFilter(django_filters.FilterSet):
    kind = django_filters.ChoiceFilter(choices=ServiceKind.choices)
    vendor = django_filters.CharFilter(
        method=_any_of(
            "specs__accelerator_models__vendor__slug", "bare_metal_profiles__accelerator_model__vendor__slug"
        )
    )
    model = django_filters.CharFilter(
        method=_any_of("specs__accelerator_models__slug", "bare_metal_profiles__accelerator_model__slug")
    )

    class Meta:
        model = Service
        fields = ["kind", "vendor", "model"]
