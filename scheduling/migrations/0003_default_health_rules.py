"""Default health rules; operators edit or deactivate them in the admin. Reversing removes only these rows."""

from django.db import migrations

DEFAULT_RULES = [
    # name, source, signal, comparison, threshold, action
    ("Double-bit ECC error isolates", "dcgm", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "gt", "0", "isolate"),
    ("Fatal XID (48, 63, 64, 79) isolates", "dcgm", "DCGM_FI_DEV_XID_ERRORS", "in", "48,63,64,79", "isolate"),
    ("GPU temperature 90 C or more degrades", "dcgm", "DCGM_FI_DEV_GPU_TEMP", "gte", "90", "degrade"),
    ("BMC health Critical isolates", "bmc", "Status.Health", "eq", "Critical", "isolate"),
    ("BMC health Warning degrades", "bmc", "Status.Health", "eq", "Warning", "degrade"),
]


def add_rules(apps, schema_editor):
    HealthRule = apps.get_model("scheduling", "HealthRule")
    for name, source, signal, comparison, threshold, action in DEFAULT_RULES:
        HealthRule.objects.get_or_create(name=name, defaults={
            "source": source, "signal": signal, "comparison": comparison, "threshold": threshold, "action": action})


def remove_rules(apps, schema_editor):
    HealthRule = apps.get_model("scheduling", "HealthRule")
    HealthRule.objects.filter(name__in=[rule[0] for rule in DEFAULT_RULES]).delete()


class Migration(migrations.Migration):
    dependencies = [("scheduling", "0002_allocation_expiry_warning")]

    operations = [migrations.RunPython(add_rules, remove_rules)]
