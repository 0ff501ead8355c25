"""The pipelines: which steps, in which order, for each kind of service and run."""

from collections.abc import Callable
from dataclasses import dataclass

from provisioning import drivers, steps
from provisioning.choices import Pipeline, RunKind


@dataclass(frozen=True)
class StepDefinition:
    name: str
    label: str
    handler: Callable[[steps.StepContext], dict]
    timeout: int  # seconds for one attempt; for a polling step, for the whole wait
    survives_cleanup: bool = False  # a retry after the failure cleanup need not run it again
    polls: bool = False  # each call is a quick check of something that happens elsewhere (power, installer)
    # It calls nothing, only computes from what the steps before it recorded (publishing access): the engine does
    # it in the transaction that records the step before it (or claims it, for a run's first step).
    computed: bool = False
    # Computed on the runs of the drivers this answers True for (Slurm has no image to pull).
    computed_on: Callable[[str], bool] | None = None
    # The same work for several runs at once ([context] -> [output or the exception of each]), asking the backend
    # once for all of them; the engine uses it for a batch of runs at this step.
    batch_handler: Callable[[list[steps.StepContext]], list[dict | Exception]] | None = None

    def computed_for(self, run) -> bool:
        """Whether the step calls nothing on this run (a ProvisioningRun: its driver)."""
        return self.computed or (self.computed_on is not None and self.computed_on(run.driver))


COMPUTE = [
    StepDefinition(
        "prepare_image",
        "Prepare the approved image",
        steps.prepare_image,
        1800,
        survives_cleanup=True,
        batch_handler=steps.prepare_images,
        computed_on=drivers.prepares_images_without_calls,
    ),
    StepDefinition(
        "start_workload",
        "Start the workload with the devices bound",
        steps.start_workload,
        600,
        batch_handler=steps.start_workloads,
    ),
    StepDefinition(
        "readiness_check",
        "Readiness check",
        steps.readiness_check,
        600,
        polls=True,
        batch_handler=steps.readiness_checks,
    ),
    StepDefinition("publish_access", "Publish access details", steps.publish_compute_access, 60, computed=True),
]
COMPUTE_TEARDOWN = [
    StepDefinition("stop_workload", "Stop the workload", steps.stop_workload, 600),
]
BARE_METAL = [
    StepDefinition("validate_hardware", "Hardware validation", steps.validate_hardware, 300, survives_cleanup=True),
    StepDefinition("boot_installer", "One-time boot from the OS image", steps.boot_installer, 300),
    StepDefinition("power_cycle", "Power cycle", steps.power_cycle, 120),
    StepDefinition("wait_power_on", "Wait for power on", steps.wait_power_on, 300, polls=True),
    StepDefinition("wait_for_install", "Wait for the OS installer", steps.wait_for_install, 3600, polls=True),
    StepDefinition("install_gpu_driver", "Install the GPU driver", steps.install_gpu_driver, 1800),
    StepDefinition("install_monitoring_agent", "Install the monitoring agent", steps.install_monitoring_agent, 600),
    StepDefinition("register_cluster", "Join Slurm as the profile says", steps.register_cluster, 600),
    StepDefinition("grant_access", "Grant the requester access (root as the profile says)", steps.grant_access, 600),
    StepDefinition("health_check", "Post-install health check", steps.post_install_health_check, 1800),
    StepDefinition("publish_access", "Publish access details", steps.publish_bare_metal_access, 60),
]
BARE_METAL_TEARDOWN = [
    StepDefinition("deregister_cluster", "Deregister from the cluster", steps.deregister_cluster, 600),
    StepDefinition("power_off", "Power off", steps.power_off, 120),
    StepDefinition("wait_power_off", "Wait for power off", steps.wait_power_off, 300, polls=True),
    StepDefinition("eject_media", "Eject virtual media", steps.eject_media, 120),
    StepDefinition("mark_for_cleaning", "Mark the server for cleaning", steps.mark_for_cleaning, 300),
]
MODEL_SERVING = [
    StepDefinition("start_replicas", "Start one inference instance per replica", steps.start_replicas, 600),
    StepDefinition(
        "wait_replicas_ready", "Wait for the replicas' readiness", steps.wait_replicas_ready, 600, polls=True
    ),
    StepDefinition("register_routes", "Register the upstreams in the gateway", steps.register_routes, 60),
    StepDefinition("publish_endpoint", "Publish the endpoint", steps.publish_endpoint, 60),
]
MODEL_SERVING_TEARDOWN = [
    StepDefinition("unregister_routes", "Remove the gateway routes", steps.unregister_routes, 60),
    StepDefinition("stop_replicas", "Stop the inference instances", steps.stop_replicas, 300),
]
RETURN_CAPACITY = StepDefinition("return_capacity", "Return the capacity", steps.return_capacity, 120)

_BUILD = {Pipeline.COMPUTE: COMPUTE, Pipeline.BARE_METAL: BARE_METAL, Pipeline.MODEL_SERVING: MODEL_SERVING}
_TEARDOWN = {
    Pipeline.COMPUTE: COMPUTE_TEARDOWN,
    Pipeline.BARE_METAL: BARE_METAL_TEARDOWN,
    Pipeline.MODEL_SERVING: MODEL_SERVING_TEARDOWN,
}


def pipeline_for(service_kind: str) -> str | None:
    return service_kind if service_kind in _BUILD else None


def definition_of(pipeline: str, kind: str, position: int) -> StepDefinition:
    return steps_for(pipeline, kind)[position]


def steps_for(pipeline: str, kind: str) -> list[StepDefinition]:
    if kind == RunKind.PROVISION:
        return _BUILD[pipeline]
    if kind == RunKind.TEARDOWN:  # after preemption the scheduler has already taken the devices back
        return _TEARDOWN[pipeline]
    return [*_TEARDOWN[pipeline], RETURN_CAPACITY]


def restart_position(pipeline: str, failed_position: int) -> int:
    """Where a retry after the failure cleanup starts: the failed step, or the first earlier step whose effect the
    cleanup undid (a stopped workload must be started again before its readiness can be checked)."""
    build = _BUILD[pipeline]
    return next(
        (position for position, definition in enumerate(build[:failed_position]) if not definition.survives_cleanup),
        failed_position,
    )
