from django.apps import AppConfig

_INVENTORY = ["site", "block", "rack", "node", "device", "healthrule"]


class SchedulingConfig(AppConfig):
    name = "scheduling"
    verbose_name = "Scheduling and inventory"
    operator_permissions = [
        *[f"scheduling.{verb}_{model}" for model in _INVENTORY for verb in ("view", "add", "change")],
        "scheduling.view_allocation",
        "scheduling.view_backendstatus",
        "scheduling.view_allocationdevice",
        "scheduling.view_healthevent",
        "scheduling.delete_healthrule",
        "scheduling.view_isolationclearance",
        *[f"scheduling.{verb}_preemptionrule" for verb in ("view", "add", "change", "delete")],
        # Node agents' tokens: issue (add), revoke (change), list (view); never delete (the audit trail).
        *[f"scheduling.{verb}_agenttoken" for verb in ("view", "add", "change")],
    ]
    # Not for operators: scheduling.clear_device_isolation is granted person by person (four eyes).

    def ready(self):
        from scheduling import wiring

        wiring.connect()
