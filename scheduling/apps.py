from django.apps import AppConfig

_INVENTORY = ["site", "rack", "node", "device", "healthrule"]


class SchedulingConfig(AppConfig):
    name = "scheduling"
    verbose_name = "Scheduling and inventory"
    operator_permissions = [
        *[f"scheduling.{verb}_{model}" for model in _INVENTORY for verb in ("view", "add", "change")],
        "scheduling.view_allocation", "scheduling.view_allocationdevice", "scheduling.view_healthevent",
        "scheduling.delete_healthrule",
    ]
