from django.urls import path

from serving import views

urlpatterns = [
    path("projects/<int:project_id>/api-keys/", views.ProjectKeysView.as_view(), name="api-key-list"),
    path("api-keys/<int:pk>/rotate/", views.KeyRotateView.as_view(), name="api-key-rotate"),
    path("api-keys/<int:pk>/revoke/", views.KeyRevokeView.as_view(), name="api-key-revoke"),
]
