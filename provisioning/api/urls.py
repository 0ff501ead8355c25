from django.urls import path

from provisioning.api import views
from provisioning.api.connect import ConnectSecretRotateView

urlpatterns = [
    path(
        "provisioning/installer-callback/",
        views.InstallerCallbackView.as_view(),
        name="provisioning-installer-callback",
    ),
    path(
        "provisioning/pxe/boot.ipxe",
        views.NetbootView.as_view(document="ipxe"),
        name="provisioning-netboot-script",
    ),
    path(
        "provisioning/pxe/user-data",
        views.NetbootView.as_view(document="user-data"),
        name="provisioning-netboot-user-data",
    ),
    path(
        "provisioning/pxe/meta-data",
        views.NetbootView.as_view(document="meta-data"),
        name="provisioning-netboot-meta-data",
    ),
    path("provisioning/runs/<int:pk>/retry/", views.RunRetryView.as_view(), name="provisioning-run-retry"),
    path(
        "provisioning/runs/<int:pk>/force-release/",
        views.ForceReleaseView.as_view(),
        name="provisioning-run-force-release",
    ),
    path(
        "requests/<int:pk>/connect-secrets/<slug:name>/rotate/",
        ConnectSecretRotateView.as_view(),
        name="api-connect-secret-rotate",
    ),
]
