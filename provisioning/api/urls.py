from django.urls import path

from provisioning.api import views

urlpatterns = [
    path("installer-callback/", views.InstallerCallbackView.as_view(), name="provisioning-installer-callback"),
    path("runs/<int:pk>/retry/", views.RunRetryView.as_view(), name="provisioning-run-retry"),
]
