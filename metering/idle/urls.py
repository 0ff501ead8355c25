from django.urls import path

from metering.idle import api, views

urlpatterns = [path("snooze/", views.snooze, name="idle-snooze")]

api_urlpatterns = [
    path("", api.IdleStatusView.as_view(), name="request-idle"),
    path("snooze/", api.IdleSnoozeView.as_view(), name="request-idle-snooze"),
]
