"""The hook registry: a hook an installed app must provide and did not is a start-up error (requests.E001), and an
implementation that cannot be called the way its protocol says is refused when it registers."""

import pytest
from django.core import checks
from django.core.management import CommandError, call_command

from config import hooks as registry
from requests import hooks


def _hook_errors() -> list[checks.CheckMessage]:
    return [message for message in checks.run_checks() if message.id == "requests.E001"]


def test_every_hook_of_the_installed_apps_is_registered():
    assert _hook_errors() == []
    assert all(hooks.get(hook) is not None for hook in registry.DECLARED)


def test_every_app_declares_its_hooks_in_the_one_registry():
    assert {hook.name for hook in registry.DECLARED} == {
        "allocation_details",
        "placement_estimate",
        "order_never_fits",
        "orders_never_fit",
        "provisioning_details",
        "endpoint_details",
        "connect_secrets",
        "rightsizing_advice",
        "request_usage",
        "project_usage",
        "open_work",
        "idle_status",
        "starts_if_approved",
        "held_ends",
        "earliest_window",
    }


@pytest.mark.parametrize("hook", list(registry.DECLARED), ids=lambda hook: hook.name)
def test_a_missing_hook_fails_the_system_check_naming_it_and_its_provider(monkeypatch, hook):
    monkeypatch.delitem(registry._registered, hook.name)
    [error] = _hook_errors()
    assert error.level == checks.ERROR
    assert f"The {hook.name} hook is not registered." == error.msg
    assert f"The {hook.provider} app must register it" in error.hint
    with pytest.raises(CommandError, match=r"requests\.E001"):
        call_command("check")


def test_a_hook_whose_provider_is_not_installed_may_stay_unregistered(monkeypatch):
    monkeypatch.setattr(registry, "DECLARED", list(registry.DECLARED))
    absent = hooks.Hook("absent_details", hooks.AllocationDetails, provider="absent")
    assert _hook_errors() == []
    assert hooks.ask(absent, object()) is None


def test_register_refuses_an_implementation_with_the_wrong_signature(monkeypatch):
    monkeypatch.setattr(registry, "_registered", dict(registry._registered))
    registered = hooks.get(hooks.PLACEMENT_ESTIMATE)
    with pytest.raises(TypeError, match=r"cannot serve the placement_estimate hook: it must accept \(order, sizing\)"):
        hooks.register(hooks.PLACEMENT_ESTIMATE, lambda order: None)
    with pytest.raises(TypeError, match="rightsizing_advice"):
        hooks.register(hooks.RIGHTSIZING_ADVICE, lambda user, project, spec, extra: [])
    assert hooks.get(hooks.PLACEMENT_ESTIMATE) is registered


def test_register_and_ask_go_through_the_protocol(monkeypatch):
    monkeypatch.setattr(registry, "_registered", dict(registry._registered))
    hooks.register(hooks.ALLOCATION_DETAILS, lambda resource_request, *, now=None: {"asked": resource_request})
    assert hooks.ask(hooks.ALLOCATION_DETAILS, "r") == {"asked": "r"}
