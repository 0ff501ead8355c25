"""Portal actions of provisioning: a deployment's API keys, and a workload's connect secrets, from its request page."""

from django.urls import path

from provisioning import views as connect_views
from provisioning.serving import views

urlpatterns = [
    path("requests/<int:pk>/api-keys/", views.key_create, name="serving-key-create"),
    path("api-keys/<int:pk>/rotate/", views.key_rotate, name="serving-key-rotate"),
    path("api-keys/<int:pk>/revoke/", views.key_revoke, name="serving-key-revoke"),
    path(
        "requests/<int:pk>/connect-secrets/<slug:name>/rotate/",
        connect_views.connect_secret_rotate_page,
        name="connect-secret-rotate",
    ),
]
