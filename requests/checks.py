"""System checks of the request workflow: every declared hook whose provider app is installed is registered
(requests.E001)."""

from django.apps import apps
from django.core.checks import Error

from config import hooks


def check_hooks_registered(app_configs=None, **_kwargs) -> list[Error]:
    """A hook whose provider app is installed but never registered it would make pages silently show less."""
    return [
        Error(
            f"The {hook.name} hook is not registered.",
            hint=f"The {hook.provider} app must register it in its ready() with "
            f"requests.hooks.register(hooks.{hook.name.upper()}, ...).",
            obj=hook.protocol,
            id="requests.E001",
        )
        for hook in hooks.DECLARED
        if apps.is_installed(hook.provider) and hooks.get(hook) is None
    ]
