"""Every app's periodic work is scheduled after migrate, once."""

import pytest
from django.core.management import call_command
from django_q.models import Schedule

pytestmark = pytest.mark.django_db

TASKS = {
    "scheduling.tasks.run_cycle",
    "scheduling.tasks.reclaim_allocations",
    "scheduling.tasks.import_from_slurm",
    "scheduling.tasks.refresh_slurm_node_states",
    "provisioning.tasks.resume_due_steps",
    "serving.tasks.check_replicas",
    "provisioning.tasks.reconcile_workloads",
    "requests.tasks.remind_pending_approvals",
    "metering.tasks.collect_telemetry",
    "metering.tasks.refresh_usage",
    "metering.tasks.refresh_telemetry",
    "metering.tasks.sweep_idle",
    "metering.tasks.read_slurm_books",
}


def test_each_periodic_task_has_one_repeating_schedule():
    call_command("migrate", verbosity=0)  # post_migrate again: still one schedule each
    schedules = Schedule.objects.filter(func__in=TASKS)
    assert sorted(schedules.values_list("func", flat=True)) == sorted(TASKS)
    assert set(schedules.values_list("repeats", flat=True)) == {-1}
