from django.urls import path

from scheduling.api.health_views import HealthEventsView

urlpatterns = [
    path("events/", HealthEventsView.as_view(), name="health-events"),
]
