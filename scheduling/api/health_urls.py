from django.urls import path

from scheduling.api.health_views import HealthEventsView
from scheduling.api.mig_views import MigLayoutReportsView
from scheduling.api.runtime_views import RuntimeReportsView

urlpatterns = [
    path("events/", HealthEventsView.as_view(), name="health-events"),
    path("runtime/", RuntimeReportsView.as_view(), name="health-runtime"),
    path("mig-layout/", MigLayoutReportsView.as_view(), name="health-mig-layout"),
]
