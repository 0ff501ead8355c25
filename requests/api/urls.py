from rest_framework.routers import SimpleRouter

from requests.api import views

router = SimpleRouter()
router.register("requests", views.RequestViewSet, basename="request")
router.register("approvals", views.ApprovalTaskViewSet, basename="approval")
router.register("queue", views.QueueViewSet, basename="queue")
router.register("quota-change-requests", views.QuotaChangeRequestViewSet, basename="quota-change-request")

urlpatterns = router.urls
