"""Operator console for the catalog. Saves and lifecycle actions go through catalog services (audited)."""

from django import forms
from django.conf import settings
from django.contrib import admin
from django.db.models import Count, Prefetch

from catalog import services
from catalog.choices import ServiceKind
from catalog.models import (
    AcceleratorModel,
    BareMetalProfile,
    Image,
    MigGeometry,
    MigProfile,
    ResourceSpec,
    Service,
    ServingModel,
    ServingTemplate,
    SliceProfile,
    Vendor,
)
from config.admin_actions import action_with_reason, related_list_filter
from tenancy.audited_admin import AuditedAdminMixin

AUDIT_FIELDS = ["created_at", "updated_at"]


@admin.display(description="Hourly price", ordering="hourly_price")
def price(obj) -> str:
    """Every price with its currency, as the portal shows it."""
    return f"{obj.hourly_price:.2f} {settings.CATALOG_CURRENCY}/h"


def availability_actions(noun: str, on: tuple[str, str], off: tuple[str, str]):
    """A pair of admin actions that put entries in or out of the catalog with a reason."""

    def make(available: bool, verb: str, label: str):
        return action_with_reason(
            name=f"{label.lower()}_{noun}",
            description=f"{label} selected {noun}",
            verb=verb,
            permission="change",
            change=lambda entry, reason, actor: services.catalog_entry_set_available(
                entry=entry, available=available, reason=reason, actor=actor
            ),
        )

    return make(True, *on), make(False, *off)


@admin.register(Vendor)
class VendorAdmin(AuditedAdminMixin, admin.ModelAdmin):
    list_display = ["name", "slug", "software_stack"]
    search_fields = ["name", "slug"]
    prepopulated_fields = {"slug": ["name"]}


class MigProfileInline(admin.TabularInline):
    model = MigProfile
    fields = ["name", "profile_id", "compute_slices", "memory_slices", "memory_gb", "max_instances", "placements"]
    extra = 0


@admin.register(MigGeometry)
class MigGeometryAdmin(AuditedAdminMixin, admin.ModelAdmin):
    """NVIDIA's MIG tables per card: operators correct or extend them; every profile row is validated against the
    card (placements inside its memory slices, sizes equal to the profile's, instance limits reachable)."""

    list_display = ["name", "compute_slices", "memory_slices", "profile_count", "source"]
    search_fields = ["name"]
    inlines = [MigProfileInline]

    def get_queryset(self, request):
        return super().get_queryset(request).annotate(profile_count=Count("profiles"))

    @admin.display(ordering="profile_count", description="Profiles")
    def profile_count(self, geometry):
        return geometry.profile_count


class SliceProfileInline(admin.TabularInline):
    model = SliceProfile
    fields = ["name", "kind", "compute_fraction", "memory_gb", "max_per_device"]
    extra = 0


@admin.register(AcceleratorModel)
class AcceleratorModelAdmin(AuditedAdminMixin, admin.ModelAdmin):
    ordering = ["vendor__name", "name"]
    list_display = [
        "name",
        "vendor",
        "kind",
        "memory_gb",
        "interconnect",
        "mig_geometry",
        "slice_profile_count",
        "active",
    ]
    list_filter = ["vendor", "kind", "interconnect", "active"]
    list_select_related = ["vendor", "mig_geometry"]
    search_fields = ["name", "slug", "vendor__name"]
    prepopulated_fields = {"slug": ["name"]}
    inlines = [SliceProfileInline]

    def get_queryset(self, request):
        return super().get_queryset(request).annotate(slice_profile_count=Count("slice_profiles"))

    @admin.display(ordering="slice_profile_count", description="Slice profiles")
    def slice_profile_count(self, model):
        return model.slice_profile_count


@admin.register(SliceProfile)
class SliceProfileAdmin(AuditedAdminMixin, admin.ModelAdmin):
    """Listed for search and autocomplete; slice profiles are edited inline on their accelerator model."""

    list_display = ["name", "accelerator", "kind", "compute_fraction", "memory_gb", "max_per_device"]
    list_filter = ["kind", "accelerator__vendor"]
    list_select_related = ["accelerator__vendor"]
    search_fields = ["name", "accelerator__name"]

    def has_module_permission(self, request):
        return False


class ResourceSpecForm(forms.ModelForm):
    """Admin form (the admin supplies model and fields)."""

    def clean(self):
        cleaned = super().clean()
        profile, models = cleaned.get("slice_profile"), cleaned.get("accelerator_models")
        if profile is not None and models is not None and set(models) != {profile.accelerator}:
            raise forms.ValidationError(
                f"A slice spec runs on one model: choose only {profile.accelerator} for {profile.name}."
            )
        return cleaned


@admin.register(ResourceSpec)
class ResourceSpecAdmin(AuditedAdminMixin, admin.ModelAdmin):
    form = ResourceSpecForm
    list_display = [
        "name",
        "accelerators",
        "accelerator_count",
        "slice_profile",
        "cpu_cores",
        "memory_gb",
        "node_count",
        "topology_level",
        price,
        "max_duration_hours",
        "status",
    ]
    list_filter = [
        "status",
        "accelerator_models__vendor",
        ("accelerator_models", related_list_filter("vendor")),
        "slice_profile__kind",
    ]
    list_select_related = ["slice_profile__accelerator"]
    search_fields = ["name", "slug", "accelerator_models__name"]
    prepopulated_fields = {"slug": ["name"]}
    filter_horizontal = ["accelerator_models"]
    readonly_fields = ["status", "deprecated_at", "deprecation_reason", *AUDIT_FIELDS]

    def get_queryset(self, request):
        return (
            super()
            .get_queryset(request)
            .prefetch_related(Prefetch("accelerator_models", queryset=AcceleratorModel.objects.only("id", "name")))
        )

    @admin.display(description="Accelerators")
    def accelerators(self, spec):
        return ", ".join(model.name for model in spec.accelerator_models.all())

    deprecate_specs = action_with_reason(
        name="deprecate_specs",
        description="Deprecate selected specs (hide from new orders)",
        verb="Deprecated",
        permission="change",
        change=lambda spec, reason, actor: services.spec_deprecate(spec=spec, reason=reason, actor=actor),
    )
    reactivate_specs = action_with_reason(
        name="reactivate_specs",
        description="Reactivate selected specs",
        verb="Reactivated",
        permission="change",
        change=lambda spec, reason, actor: services.spec_reactivate(spec=spec, reason=reason, actor=actor),
    )
    actions = ["deprecate_specs", "reactivate_specs"]


@admin.register(Image)
class ImageAdmin(AuditedAdminMixin, admin.ModelAdmin):
    list_display = ["name", "version", "os", "runtime", "runtime_version", "driver_version", "vendors", "approved"]
    list_filter = ["approved", "runtime", "compatible_vendors"]
    search_fields = ["name", "version", "reference", "os"]
    filter_horizontal = ["compatible_vendors"]
    readonly_fields = ["approved", *AUDIT_FIELDS]
    approve_images, withdraw_images = availability_actions(
        "images", on=("Approved", "Approve"), off=("Withdrew", "Withdraw")
    )
    actions = ["approve_images", "withdraw_images"]

    def get_queryset(self, request):
        return super().get_queryset(request).prefetch_related("compatible_vendors")

    @admin.display(description="Vendors")
    def vendors(self, image):
        return ", ".join(vendor.name for vendor in image.compatible_vendors.all())


@admin.register(BareMetalProfile)
class BareMetalProfileAdmin(AuditedAdminMixin, admin.ModelAdmin):
    list_display = [
        "name",
        "server_class",
        "accelerator_model",
        "accelerator_count",
        "os_image",
        "boot_method",
        "slurm_membership",
        "target_cluster",
        price,
        "active",
    ]
    list_filter = ["active", "boot_method", "slurm_membership", "accelerator_model__vendor", "target_cluster"]
    list_select_related = ["accelerator_model__vendor", "os_image"]
    search_fields = ["name", "slug", "server_class", "target_cluster"]
    prepopulated_fields = {"slug": ["name"]}
    autocomplete_fields = ["accelerator_model", "os_image"]
    readonly_fields = AUDIT_FIELDS


@admin.register(ServingTemplate)
class ServingTemplateAdmin(AuditedAdminMixin, admin.ModelAdmin):
    list_display = ["name", "runtime", "replicas", "context_length", "max_tokens", "spec", "active"]
    list_filter = ["runtime", "active"]
    list_select_related = ["spec"]
    search_fields = ["name"]
    autocomplete_fields = ["spec"]


@admin.register(ServingModel)
class ServingModelAdmin(AuditedAdminMixin, admin.ModelAdmin):
    list_display = [
        "name",
        "version",
        "family",
        "parameters_billion",
        "license",
        "max_context_length",
        "template_count",
        "approved",
    ]
    list_filter = ["approved", "family", "templates__runtime"]
    search_fields = ["name", "family", "artifact_uri"]
    filter_horizontal = ["templates"]
    readonly_fields = ["approved", *AUDIT_FIELDS]
    approve_models, withdraw_models = availability_actions(
        "models", on=("Approved", "Approve"), off=("Withdrew", "Withdraw")
    )
    actions = ["approve_models", "withdraw_models"]

    def get_queryset(self, request):
        return super().get_queryset(request).annotate(template_count=Count("templates"))

    @admin.display(ordering="template_count", description="Templates")
    def template_count(self, model):
        return model.template_count


# What a service of each kind must offer before it can be ordered from.
_REQUIRED_OFFERINGS = {
    ServiceKind.COMPUTE: ("specs", "images"),
    ServiceKind.BARE_METAL: ("bare_metal_profiles",),
    ServiceKind.MODEL_SERVING: ("serving_models",),
}


class ServiceForm(forms.ModelForm):
    """Admin form (the admin supplies model and fields). The parameter schema is checked by the model's clean
    (catalog.parameters.schema_problems), one sentence per problem."""

    def clean_parameter_schema(self):
        schema = self.cleaned_data.get("parameter_schema")
        return [] if schema in (None, "") else schema  # an emptied field: the service takes no parameters

    def clean(self):
        cleaned = super().clean()
        missing = [field for field in _REQUIRED_OFFERINGS.get(cleaned.get("kind"), ()) if not cleaned.get(field)]
        for field in missing:
            self.add_error(field, "A service of this kind needs at least one.")
        return cleaned


@admin.register(Service)
class ServiceAdmin(AuditedAdminMixin, admin.ModelAdmin):
    form = ServiceForm
    list_display = [
        "name",
        "kind",
        "visibility",
        "default_duration_hours",
        "max_duration_hours",
        "offering_count",
        "active",
    ]
    list_filter = ["kind", "visibility", "active"]
    search_fields = ["name", "slug", "description"]
    prepopulated_fields = {"slug": ["name"]}
    filter_horizontal = ["specs", "images", "bare_metal_profiles", "serving_models"]
    autocomplete_fields = ["visible_tenants", "visible_projects"]
    readonly_fields = ["active", *AUDIT_FIELDS]
    open_services, close_services = availability_actions("services", on=("Opened", "Open"), off=("Closed", "Close"))
    actions = ["open_services", "close_services"]

    def get_queryset(self, request):
        return (
            super()
            .get_queryset(request)
            .annotate(
                offering_count=Count("specs", distinct=True)
                + Count("bare_metal_profiles", distinct=True)
                + Count("serving_models", distinct=True)
            )
        )

    @admin.display(ordering="offering_count", description="Offerings")
    def offering_count(self, service):
        return service.offering_count
