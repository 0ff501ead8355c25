"""What a failed request says to the person who ordered it: one plain sentence per failure code (the one table the
request page, the API and the mails use), who was told and when, and what happens next.

A failure is recorded on the request's `failed` event as `{step, code, message, attempts, details}` (provisioning
writes it; `message` is the backend's own words, kept for operators and shown to the requester only on demand).
"""

from dataclasses import dataclass
from datetime import datetime

from requests.choices import EventCode, NotificationKind, RequestState
from requests.models import NotificationDelivery, RequestEvent, ResourceRequest

# What went wrong, said as the requester would say it. Codes come from the provisioning drivers and steps; one not
# listed here gets GENERIC.
SENTENCES = {
    # Compute workloads and images
    "container_exited": "Your workload started but stopped at once, before it was ready.",
    "container_missing": "Your workload disappeared from its node while it was being started.",
    "workload_failed": "Your workload ended with an error on its node.",
    "image_pull_failed": "The software image could not be downloaded to the node.",
    "image_build_failed": "The software image could not be built.",
    "image_build_timeout": "Building the software image took too long.",
    "image_context_missing": "The software image is not available on the platform.",
    "image_digest_mismatch": "The software image on the node is not the approved one, so it was not started.",
    "podman_failed": "The node's container engine refused to start your workload.",
    "podman_unreachable": "The node's container engine could not be reached.",
    "podman_missing": "The platform cannot start containers: its container client is not installed.",
    "podman_timeout": "The node's container engine did not answer in time.",
    "ssh_public_key_missing": "The workspace needs an SSH public key to let you in: add yours on the SSH keys page.",
    "ssh_public_key_invalid": "The order's SSH public key is not one the platform can install, so nobody could log in.",
    "connect_secret_unsupported": "This kind of workload has no such sign-in secret to change.",
    # Slurm
    "slurm_unavailable": "The Slurm cluster could not be reached to start your job.",
    "slurm_refused": "The Slurm cluster refused your job (the details below give its reasons).",
    "slurm_job_missing": "Your Slurm job disappeared before it started.",
    "slurm_job_ended": "Your Slurm job ended before it was ready.",
    "slurm_node_unknown": "The Slurm cluster does not know the node your job was placed on.",
    "slurm_gang_partial": "Your multi-node Slurm job started on fewer nodes than it needs, so it was not used.",
    "slurm_gres_ambiguous": "The Slurm cluster could not tell which accelerators to give your job.",
    "slurm_slices_unsupported": "The Slurm cluster cannot give out accelerator slices of this kind.",
    "slurm_time_limit_refused": "The Slurm cluster refused the time limit of your order.",
    "slurm_reservation_refused": "The Slurm cluster refused to hold the nodes of your reservation.",
    "slurm_reservation_not_deleted": "The Slurm cluster did not give back the nodes of your reservation yet.",
    # Model serving
    "model_missing": "The model's weights are not on the host that was to serve them.",
    "model_checksum_mismatch": "The model's weights on the host are not the approved ones, so they were not served.",
    "artifact_unsupported": "The runtime cannot load the model from where its weights are kept.",
    # Bare metal: the server's controller, its installer and its checks
    "bmc_unreachable": "The server's management controller could not be reached.",
    "bmc_auth_failed": "The platform could not sign in to the server's management controller.",
    "bmc_credentials_missing": "The platform has no sign-in for the server's management controller.",
    "bmc_not_configured": "The server has no management controller address in the inventory.",
    "bmc_address_invalid": "The server's management controller address in the inventory is not valid.",
    "bmc_no_system": "The server's management controller reports no server to install.",
    "bmc_ambiguous_system": "The server's management controller reports more than one server.",
    "bmc_link_off_origin": "The server's management controller pointed the platform elsewhere, so it was stopped.",
    "bmc_bad_response": "The server's management controller gave an answer the platform could not read.",
    "bmc_error": "The server's management controller reported an error.",
    "bmc_rejected": "The server's management controller refused a request.",
    "boot_source_unsupported": "The server cannot boot the installer the way the profile asks.",
    "vmedia_unsupported": "The server cannot mount the installer image.",
    "power_action_unsupported": "The server cannot be powered on or off the way the platform asks.",
    "node_address_unknown": "The server's network address is not in the inventory, so it cannot boot the installer.",
    "node_address_unresolved": "The server's network address could not be looked up to boot the installer.",
    "netboot_not_configured": "The server's network boot is not set up on the platform.",
    "installer_image_not_bootable": "The operating system image cannot be booted by the server.",
    "installer_failed": "Installing the operating system failed.",
    "hardware_unhealthy": "The server reported a hardware fault, so it was taken out of service for an operator.",
    "processor_unhealthy": "The server reported faulty processors or accelerators, so it was taken out of service.",
    "inventory_mismatch": "The server's hardware does not match the inventory, so it was taken out of service.",
    "host_unreachable": "The installed server could not be reached over the network.",
    "host_key_mismatch": "The installed server identified itself differently than expected, so the platform stopped.",
    "ssh_credentials_missing": "The platform has no login for the installed server.",
    "driver_package_missing": "The accelerator driver for the server is not available on the platform.",
    "agent_not_reporting": "The server's monitoring agent did not report.",
    "gpu_exporter_not_reporting": "The server's accelerator metrics exporter did not report.",
    "cluster_not_configured": "The cluster the server should join is not set up on the platform.",
    "cluster_unknown": "The cluster the server should join is not known to the platform.",
    "cluster_unreachable": "The cluster the server should join could not be reached.",
    "shared_munge_key_on_tenant_server": "The server still held the shared cluster's key, so it was not handed over.",
    "cluster_deregistration_failed": "The server could not be taken out of its cluster.",
    "ansible_missing": "The platform cannot configure servers: its Ansible is not installed.",
    "playbook_missing": "The platform's setup scripts for this server profile are missing.",
    "playbook_error": "Setting up the installed server failed.",
    "playbook_task_failed": "A setup step on the installed server failed.",
    "playbook_timeout": "Setting up the installed server took too long.",
    # The platform itself
    "step_timeout": "A provisioning step took longer than it is allowed to.",
    "worker_lost": "The platform lost track of a provisioning step and stopped it.",
    "internal_error": "The platform hit an unexpected error.",
}
# A code the table does not know (a new driver's, an injected fault's) is said by the step it stopped.
STEP_SENTENCES = {
    "prepare_image": "The software image could not be prepared on the node.",
    "start_workload": "Your workload could not be started on its node.",
    "readiness_check": "Your workload started but never became reachable.",
    "publish_access": "Your workload runs, but how to reach it could not be published.",
    "validate_hardware": "The server failed its hardware checks, so it was taken out of service.",
    "boot_installer": "The server could not be booted from the operating system image.",
    "power_cycle": "The server could not be restarted.",
    "wait_power_on": "The server did not power on.",
    "wait_for_install": "Installing the operating system did not finish.",
    "install_gpu_driver": "The accelerator driver could not be installed on the server.",
    "install_monitoring_agent": "The monitoring agent could not be installed on the server.",
    "register_cluster": "The server could not join its cluster.",
    "health_check": "The installed server failed its health checks, so it was taken out of service.",
    "start_replicas": "The model's servers could not be started.",
    "wait_replicas_ready": "The model's servers started but never became ready.",
    "register_routes": "The endpoint could not be registered in the gateway.",
    "publish_endpoint": "The endpoint runs, but its address could not be published.",
    "workload": "Your workload ended with an error on its node.",
}
GENERIC = "Setting up your order failed."


def failure_sentence(code: str, step: str = "") -> str:
    """The plain sentence for a failure code; for a code this table does not know, the step's; else a general one."""
    return SENTENCES.get(code) or STEP_SENTENCES.get(step, GENERIC)


@dataclass(frozen=True)
class FailureNotice:
    """A failed request's failure as its requester reads it."""

    code: str
    sentence: str
    message: str  # the backend's own words, for the curious and for operators
    step: str
    attempts: int
    at: datetime
    operators_told_at: datetime | None  # the first mail to an operator about it; None: none went out
    operators_can_retry: bool

    @property
    def next_step(self) -> str:
        """What happens now, in one sentence."""
        if not self.operators_can_retry:
            return "It will not be retried; order again to try once more."
        told = (
            f"Operators were told at {self.operators_told_at:%H:%M} UTC"
            if self.operators_told_at
            else "Operators see it on their dashboard"
        )
        return f"{told} and can retry it; it is not retried by itself. You can also order again."

    def as_data(self) -> dict:
        return {
            "code": self.code,
            "sentence": self.sentence,
            "message": self.message,
            "step": self.step,
            "attempts": self.attempts,
            "at": self.at,
            "operators_told_at": self.operators_told_at,
            "operators_can_retry": self.operators_can_retry,
            "next_step": self.next_step,
        }


def failure_of(request: ResourceRequest) -> FailureNotice | None:
    """The failure of a request that is failed now (two queries), else None."""
    if request.state != RequestState.FAILED:
        return None
    event = request.events.filter(code=EventCode.FAILED).order_by("-created_at", "-id").first()
    if event is None:
        return None
    failure = event.data.get("failure") or {}
    code = failure.get("code", "")
    return FailureNotice(
        code=code,
        sentence=failure_sentence(code, failure.get("step", "")),
        message=failure.get("message", event.message),
        step=failure.get("step", ""),
        attempts=failure.get("attempts", 0),
        at=event.created_at,
        operators_told_at=_operators_told_at(event),
        # An operator retries a failed provisioning from its failed step; a workload that failed by itself once it
        # ran has no failed step to retry.
        operators_can_retry=event.data.get("operator_retry", True),
    )


def _operators_told_at(event: RequestEvent) -> datetime | None:
    return (
        NotificationDelivery.objects.filter(kind=NotificationKind.OPERATOR_RUN_FAILED, key=f"event:{event.pk}")
        .order_by("created_at")
        .values_list("created_at", flat=True)
        .first()
    )
