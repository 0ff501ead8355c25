from django_filters import rest_framework as filters
from drf_spectacular.utils import extend_schema
from rest_framework import permissions, viewsets
from rest_framework.response import Response
from rest_framework.views import APIView

from config.api import ErrorSerializer
from scheduling import selectors
from scheduling.api import serializers
from scheduling.choices import DeviceHealth
from scheduling.models import Device, Node


def operator_permission(permission: str) -> type[permissions.BasePermission]:
    """Staff holding a model permission; everyone else gets 403 (401 when not signed in)."""

    class IsOperatorWith(permissions.BasePermission):
        message = f"Operators only: needs staff status and {permission}."

        def has_permission(self, request, view):
            user = request.user
            return bool(user and user.is_authenticated and user.is_staff and user.has_perm(permission))

    return IsOperatorWith


class CapacityView(APIView):
    """Capacity per accelerator model: devices, healthy, isolated, allocated and free cards. Any signed-in user."""

    @extend_schema(responses={200: serializers.CapacitySerializer(many=True), 401: ErrorSerializer})
    def get(self, request):
        return Response(serializers.CapacitySerializer(selectors.capacity_by_model(), many=True).data)


class NodeFilter(filters.FilterSet):
    site = filters.CharFilter(field_name="rack__site__name")
    rack = filters.CharFilter(field_name="rack__name")

    class Meta:
        model = Node
        fields = ["schedulable", "site", "rack", "topology_domain", "execution_backend"]


class NodeViewSet(viewsets.ReadOnlyModelViewSet):
    """Nodes with device count and allocated/free cards. Operators only."""

    serializer_class = serializers.NodeSerializer
    permission_classes = [operator_permission("scheduling.view_node")]
    filterset_class = NodeFilter
    search_fields = ["name", "serial_number", "topology_domain"]
    ordering_fields = ["name", "id", "cpu_milli", "memory_mib"]
    ordering = ["name"]

    def get_queryset(self):
        return selectors.nodes_with_capacity()


class DeviceFilter(filters.FilterSet):
    node = filters.CharFilter(field_name="node__name")
    model = filters.CharFilter(field_name="model__slug")
    vendor = filters.CharFilter(field_name="model__vendor__slug")
    health = filters.ChoiceFilter(choices=DeviceHealth.choices)

    class Meta:
        model = Device
        fields = ["node", "model", "vendor", "health", "isolated"]


class DeviceViewSet(viewsets.ReadOnlyModelViewSet):
    """Devices with model, health, isolation and allocated milli-shares. Operators only."""

    serializer_class = serializers.DeviceSerializer
    permission_classes = [operator_permission("scheduling.view_device")]
    filterset_class = DeviceFilter
    search_fields = ["uuid", "node__name"]
    ordering_fields = ["id", "index", "allocated_milli"]
    ordering = ["node__name", "index"]

    def get_queryset(self):
        return selectors.devices_with_relations()
