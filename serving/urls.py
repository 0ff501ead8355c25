"""Portal actions of serving: a deployment's API keys, from its request page."""

from django.urls import path

from serving import views

urlpatterns = [
    path("requests/<int:pk>/api-keys/", views.key_create, name="serving-key-create"),
    path("api-keys/<int:pk>/rotate/", views.key_rotate, name="serving-key-rotate"),
    path("api-keys/<int:pk>/revoke/", views.key_revoke, name="serving-key-revoke"),
]
