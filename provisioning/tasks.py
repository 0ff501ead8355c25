"""django-q2 entry points: take ids, call one service."""

import time

from provisioning import engine, services
from provisioning.serving.deployments import serving_replicas_check


def run_step(step_id: int) -> None:
    engine.step_execute(step_id=step_id)


def start_runs(request_ids: list[int]) -> int:
    return len(services.runs_start(request_ids=request_ids))


def start_stranded_runs() -> dict[str, list[int]]:
    return services.runs_start_stranded()


def teardown_after_preemption(request_id: int) -> bool:
    return services.teardown_after_preemption(request_id=request_id)


def resume_due_steps() -> int:
    return engine.steps_resume_due()


def check_replicas() -> int:
    return serving_replicas_check()


def simulated_installer(token: str, seconds: float) -> None:
    """The simulated OS installer: it installs for a while, then reports to the callback like a real one."""
    time.sleep(seconds)
    services.installer_report(token=token, status="succeeded", detail="Simulated installer finished.")
