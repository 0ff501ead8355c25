from rest_framework.routers import SimpleRouter

from catalog.api import views

router = SimpleRouter()
router.register("services", views.ServiceViewSet, basename="catalog-service")
router.register("specs", views.ResourceSpecViewSet, basename="catalog-spec")
router.register("images", views.ImageViewSet, basename="catalog-image")
router.register("bare-metal-profiles", views.BareMetalProfileViewSet, basename="catalog-bare-metal-profile")
router.register("serving-models", views.ServingModelViewSet, basename="catalog-serving-model")

urlpatterns = router.urls
