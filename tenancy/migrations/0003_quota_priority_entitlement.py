"""Each project's priority entitlement; existing projects get `standard`, which keeps standard and batch work
self-service while high and critical need an operator's entitlement or an approved exception."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('tenancy', '0002_tenant_admins_and_usage_ledger'),
    ]

    operations = [
        migrations.AddField(
            model_name='projectquota',
            name='max_priority',
            field=models.CharField(choices=[('batch', 'Batch (preemptible)'), ('standard', 'Standard'), ('high', 'High'), ('critical', 'Critical')], default='standard', help_text='Highest priority class the project may order without approval; a higher one is refused, or routed to approval as an exception when the requester asks for one.', max_length=12, verbose_name='priority entitlement'),
        ),
        migrations.AddConstraint(
            model_name='projectquota',
            constraint=models.CheckConstraint(condition=models.Q(('max_priority__in', ['batch', 'standard', 'high', 'critical'])), name='project_quota_max_priority_valid'),
        ),
    ]
