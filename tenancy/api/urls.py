from rest_framework.routers import SimpleRouter

from tenancy.api.views import ProjectViewSet

router = SimpleRouter()
router.register("projects", ProjectViewSet, basename="project")

urlpatterns = router.urls
