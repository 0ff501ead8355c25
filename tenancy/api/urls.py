from rest_framework.routers import SimpleRouter

from tenancy.api.views import ProjectViewSet, SshKeyViewSet

router = SimpleRouter()
router.register("projects", ProjectViewSet, basename="project")
router.register("ssh-keys", SshKeyViewSet, basename="ssh-key")

urlpatterns = router.urls
