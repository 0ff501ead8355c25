"""Portal actions of provisioning: a workload's connect secrets, from its request page."""

from django.urls import path

from provisioning import views as connect_views

urlpatterns = [
    path(
        "requests/<int:pk>/connect-secrets/<slug:name>/rotate/",
        connect_views.connect_secret_rotate_page,
        name="connect-secret-rotate",
    ),
]
