from django.urls import path

from provisioning.api import views
from provisioning.api.connect import ConnectSecretRotateView
from provisioning.serving import views as serving_views

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
    path("projects/<int:project_id>/api-keys/", serving_views.ProjectKeysView.as_view(), name="api-key-list"),
    path("api-keys/<int:pk>/rotate/", serving_views.KeyRotateView.as_view(), name="api-key-rotate"),
    path("api-keys/<int:pk>/revoke/", serving_views.KeyRevokeView.as_view(), name="api-key-revoke"),
    path(
        "requests/<int:pk>/connect-secrets/<slug:name>/rotate/",
        ConnectSecretRotateView.as_view(),
        name="api-connect-secret-rotate",
    ),
]
