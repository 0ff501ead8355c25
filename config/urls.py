from django.contrib import admin
from django.urls import include, path, re_path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView

from config.metrics import metrics
from config.views import healthz, not_found
from metering.idle import urls as idle_urls
from requests.views import SignInView
from serving import relay
from tenancy.api.views import DeviceAuthorizationView, DeviceTokenView, TokenObtainView
from tenancy.directory.views import SignInCallback, SignInStart, SignOut

api_v1 = [
    path("auth/token/", TokenObtainView.as_view(), name="auth-token"),
    path("auth/device/", DeviceAuthorizationView.as_view(), name="auth-device"),
    path("auth/device/token/", DeviceTokenView.as_view(), name="auth-device-token"),
    path("catalog/", include("catalog.api.urls")),
    path("", include("tenancy.api.urls")),
    path("", include("requests.api.urls")),
    path("inventory/", include("scheduling.api.urls")),
    path("health/", include("scheduling.api.health_urls")),
    path("", include("serving.api.urls")),
    path("", include("provisioning.api.urls")),
    path("usage/", include("metering.api.urls")),
    path("requests/<int:pk>/idle/", include(idle_urls.api_urlpatterns)),
]

urlpatterns = [
    path("", include("requests.urls")),
    path("", include("serving.urls")),
    path("", include("provisioning.urls")),
    path("", include("tenancy.urls")),
    path("usage/", include("metering.urls")),
    path("requests/<int:pk>/idle/", include(idle_urls.urlpatterns)),
    path("accounts/login/", SignInView.as_view(), name="login"),  # before Django's own: each role lands on its page
    path("accounts/logout/", SignOut.as_view(), name="logout"),  # before Django's own: also ends the IdP's session
    path("oidc/authenticate/", SignInStart.as_view(), name="oidc_authentication_init"),
    path("oidc/callback/", SignInCallback.as_view(), name="oidc_authentication_callback"),
    path("accounts/", include("django.contrib.auth.urls")),
    path("admin/", admin.site.urls),
    path("api/v1/", include(api_v1)),
    path("api/schema/", SpectacularAPIView.as_view(), name="api-schema"),
    path("api/docs/", SpectacularSwaggerSplitView.as_view(url_name="api-schema"), name="api-docs"),
    re_path(r"^serve/(?P<slug>[-\w]+)/v1/(?P<path>.*)$", relay.serve, name="serving-gateway"),
    path("healthz", healthz, name="healthz"),
    path("metrics", metrics, name="metrics"),
    re_path(r"^api/", not_found),  # unknown API paths answer in the API's error shape, DEBUG or not
]

handler403 = "config.views.forbidden"
handler404 = "config.views.not_found"
handler500 = "config.views.server_failure"
