"""Inventory API: capacity per accelerator model (anyone signed in), nodes and devices (operators)."""

from rest_framework import serializers

from config.api import ModelSerializer
from scheduling.engine import MILLI
from scheduling.models import Device, MigInstance, Node


class MigCapacitySerializer(serializers.Serializer):
    profile = serializers.CharField()
    total = serializers.IntegerField()
    held = serializers.IntegerField()
    free = serializers.IntegerField()


class MigInstanceSerializer(ModelSerializer):
    profile = serializers.CharField(source="profile.name", read_only=True)
    profile_id = serializers.IntegerField(source="profile.profile_id", read_only=True)

    class Meta:
        model = MigInstance
        fields = ["profile", "profile_id", "start", "size", "gi_id", "ci_id", "uuid", "allocation"]


class CapacitySerializer(serializers.Serializer):
    """Cards per accelerator model; allocated counts milli-shares (1000 = one card), free counts unallocated
    shares on devices the scheduler may use (not isolated, not unhealthy, on a schedulable node)."""

    model_id = serializers.IntegerField()
    slug = serializers.CharField()
    name = serializers.CharField()
    vendor = serializers.CharField()
    memory_gb = serializers.IntegerField()
    total = serializers.IntegerField(help_text="Devices of this model.")
    healthy = serializers.IntegerField()
    isolated = serializers.IntegerField()
    allocated = serializers.DecimalField(max_digits=12, decimal_places=3, help_text="Cards allocated.")
    free = serializers.DecimalField(max_digits=12, decimal_places=3, help_text="Cards free to place on.")
    mig_mode_devices = serializers.IntegerField(help_text="Cards of this model in MIG mode.")
    mig_instances = MigCapacitySerializer(many=True, help_text="GPU instances per profile (MIG-mode cards).")


class NodeSerializer(ModelSerializer):
    site = serializers.CharField(source="rack.site.name", default="", read_only=True)
    rack = serializers.CharField(source="rack.name", default="", read_only=True)
    cpu_cores = serializers.SerializerMethodField()
    memory_gib = serializers.SerializerMethodField()
    device_count = serializers.IntegerField(read_only=True)
    allocated_cards = serializers.SerializerMethodField()
    free_cards = serializers.SerializerMethodField()

    class Meta:
        model = Node
        fields = [
            "id",
            "name",
            "serial_number",
            "site",
            "rack",
            "topology_domain",
            "execution_backend",
            "cpu_milli",
            "cpu_cores",
            "memory_mib",
            "memory_gib",
            "schedulable",
            "cordon_reason",
            "cordoned_at",
            "device_count",
            "allocated_cards",
            "free_cards",
            "bmc_address",
            "updated_at",
        ]

    def get_cpu_cores(self, node) -> float:
        return node.cpu_milli / 1000

    def get_memory_gib(self, node) -> float:
        return node.memory_mib / 1024

    def get_allocated_cards(self, node) -> float:
        return node.allocated_milli / MILLI

    def get_free_cards(self, node) -> float:
        return (node.free_milli if node.schedulable else 0) / MILLI


class DeviceSerializer(ModelSerializer):
    node = serializers.CharField(source="node.name", read_only=True)
    model = serializers.CharField(source="model.slug", read_only=True)
    model_name = serializers.CharField(source="model.name", read_only=True)
    vendor = serializers.CharField(source="model.vendor.slug", read_only=True)
    mig_instances = MigInstanceSerializer(many=True, read_only=True)

    class Meta:
        model = Device
        fields = [
            "id",
            "uuid",
            "node",
            "index",
            "model",
            "model_name",
            "vendor",
            "memory_gb",
            "health",
            "health_detail",
            "isolated",
            "isolation_reason",
            "isolated_at",
            "allocated_milli",
            "mig_mode",
            "mig_instances",
            "updated_at",
        ]
