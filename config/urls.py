from django.contrib import admin
from django.urls import include, path
from django.views.generic import RedirectView
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView
from rest_framework.authtoken.views import obtain_auth_token

from config.views import healthz

api_v1 = [
    path("auth/token/", obtain_auth_token, name="auth-token"),
    path("catalog/", include("catalog.api.urls")),
    path("", include("tenancy.api.urls")),
]

urlpatterns = [
    path("", RedirectView.as_view(url="/api/v1/catalog/services/", permanent=False), name="home"),
    path("admin/", admin.site.urls),
    path("api/v1/", include(api_v1)),
    path("api/schema/", SpectacularAPIView.as_view(), name="api-schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="api-schema"), name="api-docs"),
    path("healthz", healthz, name="healthz"),
]

handler404 = "config.views.not_found"
handler500 = "config.views.server_failure"
