from django.urls import path
from rest_framework.routers import SimpleRouter

from scheduling.api import views

router = SimpleRouter()
router.register("nodes", views.NodeViewSet, basename="inventory-node")
router.register("devices", views.DeviceViewSet, basename="inventory-device")

urlpatterns = [path("capacity/", views.CapacityView.as_view(), name="inventory-capacity"), *router.urls]
