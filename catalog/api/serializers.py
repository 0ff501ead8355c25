from django.conf import settings
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from catalog.durations import longest_duration_hours, offering_durations
from catalog.models import (
    AcceleratorModel,
    BareMetalProfile,
    Image,
    ResourceSpec,
    Service,
    ServingModel,
    ServingTemplate,
    SliceProfile,
)
from config.api import MethodResultField, ModelSerializer


class PricedMixin(serializers.Serializer):
    currency = serializers.SerializerMethodField()

    def get_currency(self, _obj) -> str:
        return settings.CATALOG_CURRENCY


class AcceleratorModelSerializer(ModelSerializer):
    vendor = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    vendor_name = serializers.CharField(source="vendor.name", read_only=True)

    class Meta:
        model = AcceleratorModel
        fields = ["id", "slug", "name", "vendor", "vendor_name", "kind", "memory_gb", "interconnect"]


class SliceProfileSerializer(ModelSerializer):
    accelerator = serializers.SlugRelatedField(slug_field="slug", read_only=True)

    class Meta:
        model = SliceProfile
        fields = ["name", "kind", "accelerator", "compute_fraction", "memory_gb", "max_per_device"]


class ResourceSpecSerializer(PricedMixin, ModelSerializer):
    accelerator_models = AcceleratorModelSerializer(many=True, read_only=True)
    slice_profile = SliceProfileSerializer(read_only=True)
    gpu_equivalents = serializers.DecimalField(max_digits=8, decimal_places=4, read_only=True)
    accelerator_memory_gb = serializers.IntegerField(read_only=True)
    total_accelerator_count = serializers.IntegerField(
        read_only=True, help_text="Cards of every node: accelerator_count (per node) x node_count."
    )
    hourly_cost = serializers.DecimalField(
        max_digits=12,
        decimal_places=2,
        read_only=True,
        help_text="Whole spec per hour: hourly_price (per accelerator) x count x node_count.",
    )

    class Meta:
        model = ResourceSpec
        fields = [
            "id",
            "slug",
            "name",
            "description",
            "accelerator_models",
            "accelerator_count",
            "slice_profile",
            "node_count",
            "topology_level",
            "topology_mode",
            "total_accelerator_count",
            "gpu_equivalents",
            "accelerator_memory_gb",
            "cpu_cores",
            "memory_gb",
            "local_disk_gb",
            "hourly_price",
            "hourly_cost",
            "currency",
            "max_duration_hours",
            "status",
            "deprecated_at",
        ]


class ImageSerializer(ModelSerializer):
    compatible_vendors = serializers.SlugRelatedField(slug_field="slug", many=True, read_only=True)

    class Meta:
        model = Image
        fields = [
            "id",
            "name",
            "version",
            "reference",
            "os",
            "driver_version",
            "runtime",
            "runtime_version",
            "monitoring_agent",
            "configuration",
            "compatible_vendors",
            "approved",
        ]


class ImageSummarySerializer(ModelSerializer):
    class Meta:
        model = Image
        fields = ["id", "name", "version", "os"]


class BareMetalProfileSerializer(PricedMixin, ModelSerializer):
    accelerator_model = AcceleratorModelSerializer(read_only=True)
    os_image = ImageSummarySerializer(read_only=True)

    class Meta:
        model = BareMetalProfile
        fields = [
            "id",
            "slug",
            "name",
            "server_class",
            "accelerator_model",
            "accelerator_count",
            "cpu_cores",
            "memory_gb",
            "os_image",
            "boot_method",
            "driver_version",
            "monitoring_agent",
            "gpu_exporter",
            "slurm_membership",
            "target_cluster",
            "validation_suite",
            "hourly_price",
            "currency",
            "max_duration_hours",
            "active",
        ]


class ServingTemplateSerializer(ModelSerializer):
    spec = serializers.SlugRelatedField(slug_field="slug", read_only=True)

    class Meta:
        model = ServingTemplate
        fields = ["id", "name", "runtime", "replicas", "context_length", "max_tokens", "spec"]


class ServingModelSerializer(ModelSerializer):
    templates = ServingTemplateSerializer(many=True, read_only=True)

    class Meta:
        model = ServingModel
        fields = [
            "id",
            "name",
            "version",
            "family",
            "parameters_billion",
            "artifact_uri",
            "license",
            "max_context_length",
            "min_accelerator_memory_gb",
            "templates",
            "approved",
        ]


class SpecSummarySerializer(ModelSerializer):
    gpu_equivalents = serializers.DecimalField(max_digits=8, decimal_places=4, read_only=True)
    hourly_cost = serializers.DecimalField(max_digits=12, decimal_places=2, read_only=True)

    class Meta:
        model = ResourceSpec
        fields = ["id", "slug", "name", "accelerator_count", "gpu_equivalents", "hourly_price", "hourly_cost"]


class NamedSummarySerializer(serializers.Serializer):
    id = serializers.IntegerField()
    name = MethodResultField(source="__str__")


class OfferingDurationSerializer(serializers.Serializer):
    kind = serializers.CharField(help_text="spec or bare_metal_profile")
    id = serializers.IntegerField()
    name = serializers.CharField()
    max_duration_hours = serializers.IntegerField(
        help_text="The smallest of the service's and the offering's maxima: the longest an order of it may run."
    )
    default_duration_hours = serializers.IntegerField(help_text="The service's default, capped by that maximum.")


class ServiceSummarySerializer(ModelSerializer):
    """A list row: what the service offers, by name; the detail endpoint carries every field."""

    specs = SpecSummarySerializer(many=True, read_only=True)
    images = NamedSummarySerializer(many=True, read_only=True)
    bare_metal_profiles = NamedSummarySerializer(many=True, read_only=True)
    serving_models = NamedSummarySerializer(many=True, read_only=True)
    longest_duration_hours = serializers.SerializerMethodField(
        help_text="The longest any order of this service may run (max_duration_hours capped by its offerings)."
    )
    durations = serializers.SerializerMethodField(help_text="Maximum and default duration per offering.")
    parameter_schema = serializers.JSONField(read_only=True, help_text="The parameters an order may carry.")

    class Meta:
        model = Service
        fields = [
            "id",
            "slug",
            "name",
            "kind",
            "description",
            "default_duration_hours",
            "max_duration_hours",
            "longest_duration_hours",
            "durations",
            "parameter_schema",
            "visibility",
            "active",
            "specs",
            "images",
            "bare_metal_profiles",
            "serving_models",
        ]

    def get_longest_duration_hours(self, service) -> int:
        return longest_duration_hours(service)

    @extend_schema_field(OfferingDurationSerializer(many=True))
    def get_durations(self, service) -> list[dict]:
        return offering_durations(service)


class ServiceSerializer(ServiceSummarySerializer):
    specs = ResourceSpecSerializer(many=True, read_only=True)
    images = ImageSerializer(many=True, read_only=True)
    bare_metal_profiles = BareMetalProfileSerializer(many=True, read_only=True)
    serving_models = ServingModelSerializer(many=True, read_only=True)

    class Meta(ServiceSummarySerializer.Meta):
        pass
