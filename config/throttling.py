"""API throttles (settings API_THROTTLE_*): every throttle counts callers by `config.client_address`, so a rotated
X-Forwarded-For is one client unless a trusted proxy wrote it. Counters live in the default cache (Redis when
REDIS_URL is set, shared by every web process; per process in the demo)."""

from django.conf import settings
from rest_framework.throttling import SimpleRateThrottle

from config.client_address import client_address


class ClientAddressThrottle(SimpleRateThrottle):
    """A rate-limited throttle of anonymous callers, counted per client address; `rate_setting` names the setting
    holding its rate ("120/min"; empty: unlimited), read when the throttle is made so it can change at run time."""

    rate_setting = ""

    def get_rate(self):
        return getattr(settings, self.rate_setting) or None

    def get_ident(self, request):
        return client_address(request) or "unknown"

    def get_cache_key(self, request, view):
        return self.cache_format % {"scope": self.scope, "ident": self.get_ident(request)}


class UserThrottle(ClientAddressThrottle):
    """The default for every API view (REST_FRAMEWORK DEFAULT_THROTTLE_CLASSES): each signed-in user at
    API_THROTTLE_USER_RATE. Calls without a user (node agents, OS installers, the token endpoint) are bounded by
    their own views' throttles and tokens instead."""

    scope = "user"
    rate_setting = "API_THROTTLE_USER_RATE"

    def get_cache_key(self, request, view):
        if not request.user or not request.user.is_authenticated:
            return None
        return self.cache_format % {"scope": self.scope, "ident": request.user.pk}


class SignInThrottle(ClientAddressThrottle):
    """POST /api/v1/auth/token/ per client address, on top of the sign-in lockout (django-axes), which counts only
    failures: this bounds how fast one address can try at all."""

    scope = "sign_in"
    rate_setting = "API_THROTTLE_SIGN_IN_RATE"


class InstallerThrottle(ClientAddressThrottle):
    """The OS installers' unauthenticated endpoints (network boot files, completion callback), per address."""

    scope = "installer"
    rate_setting = "API_THROTTLE_INSTALLER_RATE"


class DeviceSignInThrottle(ClientAddressThrottle):
    """`cc login`'s device sign-in (asking for codes and polling for the token), per client address, on top of the
    slow_down each device code answers when polled faster than its interval."""

    scope = "device_sign_in"
    rate_setting = "API_THROTTLE_DEVICE_RATE"
