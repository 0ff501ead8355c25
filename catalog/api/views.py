from rest_framework import viewsets

from catalog import selectors
from catalog.api import filters, serializers


class CatalogViewSet(viewsets.ReadOnlyModelViewSet):
    """Read-only catalog endpoint; `selector` decides what the caller may see."""

    selector = None
    search_fields = ["name"]
    ordering_fields = ["name", "id"]

    def get_queryset(self):
        return self.selector(user=self.request.user)


class ServiceViewSet(CatalogViewSet):
    """Catalog entries the caller may order from, each with the specs, images, profiles and models it offers."""

    selector = staticmethod(selectors.service_list)
    serializer_class = serializers.ServiceSerializer
    filterset_class = filters.ServiceFilter
    search_fields = ["name", "description"]

    def get_queryset(self):
        return selectors.service_list(user=self.request.user, detailed=self.action != "list")

    def get_serializer_class(self):
        return serializers.ServiceSummarySerializer if self.action == "list" else serializers.ServiceSerializer


class ResourceSpecViewSet(CatalogViewSet):
    """Standard resource specs; deprecated ones are listed only for operators."""

    selector = staticmethod(selectors.spec_list)
    serializer_class = serializers.ResourceSpecSerializer
    filterset_class = filters.ResourceSpecFilter
    ordering_fields = ["name", "hourly_price", "accelerator_count", "id"]


class ImageViewSet(CatalogViewSet):
    """Approved software images and the accelerator vendors they support."""

    selector = staticmethod(selectors.image_list)
    serializer_class = serializers.ImageSerializer
    filterset_class = filters.ImageFilter


class BareMetalProfileViewSet(CatalogViewSet):
    """Whole-server profiles: hardware class, OS image, driver, agent and target cluster."""

    selector = staticmethod(selectors.bare_metal_profile_list)
    serializer_class = serializers.BareMetalProfileSerializer
    filterset_class = filters.BareMetalProfileFilter


class ServingModelViewSet(CatalogViewSet):
    """Approved models that can be served, with their serving templates."""

    selector = staticmethod(selectors.serving_model_list)
    serializer_class = serializers.ServingModelSerializer
    filterset_class = filters.ServingModelFilter
