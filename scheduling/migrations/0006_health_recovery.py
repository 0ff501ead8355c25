"""Degraded cards recover: rule settings for when, the device's recovery clock, defaults for the seeded rules."""

import django.core.validators
import django.db.models.deletion
from django.db import migrations, models


# name of a seeded degrade rule (0003) -> (recovery threshold, minutes the signal must read clear)
RECOVERY_DEFAULTS = {
    "GPU temperature 90 C or more degrades": ("85", 10),
    "BMC health Warning degrades": ("", 10),
}


def add_recovery_defaults(apps, schema_editor):
    """Seeded rules an operator has not given recovery settings get these; cards degraded today learn their rule."""
    HealthRule = apps.get_model("scheduling", "HealthRule")
    for name, (threshold, minutes) in RECOVERY_DEFAULTS.items():
        HealthRule.objects.filter(name=name, action="degrade", recover_after_minutes__isnull=True).update(
            recovery_threshold=threshold, recover_after_minutes=minutes)
    Device, HealthEvent = apps.get_model("scheduling", "Device"), apps.get_model("scheduling", "HealthEvent")
    for device in Device.objects.filter(health="degraded", degraded_by__isnull=True):
        latest = HealthEvent.objects.filter(device=device, action="degrade", rule__isnull=False).order_by(
            "-received_at", "-id").first()
        if latest is not None:
            Device.objects.filter(pk=device.pk).update(degraded_by=latest.rule_id)


class Migration(migrations.Migration):

    dependencies = [
        ('catalog', '0003_alter_baremetalprofile_hourly_price_and_more'),
        ('scheduling', '0005_default_preemption_rules'),
    ]

    operations = [
        migrations.AddField(
            model_name='device',
            name='clear_since',
            field=models.DateTimeField(blank=True, help_text='Since when the degrading signal has read clear (the recovery clock).', null=True),
        ),
        migrations.AddField(
            model_name='device',
            name='degraded_by',
            field=models.ForeignKey(blank=True, help_text='The rule whose signal last degraded the card; its recovery settings say when the card is healthy.', null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to='scheduling.healthrule'),
        ),
        migrations.AddField(
            model_name='healthrule',
            name='recover_after_minutes',
            field=models.PositiveIntegerField(blank=True, help_text='Degrade rules: the card returns to healthy once the signal has read clear this long (0: at the first clear reading). Empty: only an operator marks it healthy.', null=True, validators=[django.core.validators.MaxValueValidator(10080)]),
        ),
        migrations.AddField(
            model_name='healthrule',
            name='recovery_threshold',
            field=models.CharField(blank=True, help_text='> and ≥ rules: readings count as clear only below this number (e.g. degrade at ≥ 90, clear below 85). Empty: any reading that does not meet the rule is clear.', max_length=40),
        ),
        migrations.AddConstraint(
            model_name='device',
            constraint=models.CheckConstraint(condition=models.Q(('health', 'degraded'), models.Q(('clear_since__isnull', True), ('degraded_by__isnull', True)), _connector='OR'), name='only_degraded_device_recovers'),
        ),
        migrations.AddConstraint(
            model_name='healthrule',
            constraint=models.CheckConstraint(condition=models.Q(('action', 'degrade'), models.Q(('recover_after_minutes__isnull', True), ('recovery_threshold', '')), _connector='OR'), name='only_degrade_rules_recover'),
        ),
        migrations.RunPython(add_recovery_defaults, migrations.RunPython.noop),
    ]
