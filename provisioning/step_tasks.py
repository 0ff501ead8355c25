"""Handing steps to the workers: one django-q2 task per batch of runs' current steps. A leaf module: the services,
the step engine and the outage watch all hand steps over through it, so none of them imports another for it."""

from django_q.tasks import async_task

STEP_TASK = "provisioning.tasks.run_step"


def step_task(step_ids: list[int]) -> None:
    """One task for a batch of runs' current steps (provisioning/engine.py). Its success is not saved as a
    django-q2 result (a failure still is): the steps' own rows record every attempt, and the monitor's saving
    (pruning to the save limit under a lock, then an insert) costs more than most steps."""
    async_task(STEP_TASK, step_ids, save=False)
