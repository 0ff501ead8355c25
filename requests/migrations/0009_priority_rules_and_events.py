"""Approval rules get a priority condition; the timeline gets the priority exception event."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('requests', '0008_event_intervention_and_retry'),
    ]

    operations = [
        migrations.AddField(
            model_name='approvalrule',
            name='min_priority',
            field=models.CharField(blank=True, choices=[('batch', 'Batch (preemptible)'), ('standard', 'Standard'), ('high', 'High'), ('critical', 'Critical')], help_text='Only orders of this priority class or a higher one; empty: any.', max_length=12, verbose_name='priority at least'),
        ),
        migrations.AlterField(
            model_name='requestevent',
            name='code',
            field=models.CharField(choices=[('submitted', 'Submitted'), ('admitted', 'Admitted within quota'), ('quota_exceeded', 'Over quota'), ('quota_exception', 'Quota exception requested'), ('priority_exception', 'Priority exception requested'), ('readmitted', 'Re-admitted'), ('approval_routed', 'Routed for approval'), ('auto_approved', 'Approved automatically'), ('stage_vote', 'Approval recorded'), ('stage_approved', 'Approval stage passed'), ('approved', 'Approved'), ('rejected', 'Rejected'), ('approval_reminder', 'Approval reminder'), ('queued', 'Queued for scheduling'), ('queue_reason', 'Waiting in the queue'), ('extension_requested', 'Extension requested'), ('extended', 'Extended'), ('extension_rejected', 'Extension rejected'), ('expiry_warning', 'Expiry warning'), ('cancelled', 'Cancelled'), ('allocated', 'Allocated'), ('provisioning', 'Provisioning'), ('active', 'Active'), ('releasing', 'Releasing'), ('released', 'Released'), ('failed', 'Failed'), ('preempted', 'Preempted'), ('preemption_scheduled', 'Preemption scheduled'), ('preemption_called_off', 'Preemption called off'), ('device_isolated', 'Device isolated'), ('provisioning_step_failed', 'Provisioning step failed'), ('provisioning_retried', 'Provisioning retried'), ('cleaned_up', 'Cleaned up')], max_length=40),
        ),
    ]
