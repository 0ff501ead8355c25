"""Driver registry: the BMC driver for bare metal, the workload driver of a node's execution backend, the in-band
driver for a bare-metal server's post-install steps, and the serving driver for inference replicas."""

from django.conf import settings

from provisioning.drivers.base import BmcDriver, InBandDriver, ServingDriver, WorkloadDriver


def bmc_driver(name: str | None = None) -> BmcDriver:
    name = name or settings.PROVISIONING_BMC_DRIVER
    if name == "redfish":
        from provisioning.drivers.redfish import RedfishBmc

        return RedfishBmc()
    if name == "simulated":
        from provisioning.drivers.simulated import SimulatedBmc

        return SimulatedBmc()
    raise ValueError(f"Unknown BMC driver {name!r}; use 'simulated' or 'redfish'.")


def workload_driver(backend: str) -> WorkloadDriver:
    """The workload driver of a node's execution backend (scheduling.choices.ExecutionBackend)."""
    if backend == "slurm":
        from provisioning.drivers.slurm import SlurmWorkloads

        return SlurmWorkloads()
    if backend == "container":
        from provisioning.drivers.container import ContainerWorkloads

        return ContainerWorkloads()
    if backend == "simulated":
        from provisioning.drivers.simulated import SimulatedHost

        return SimulatedHost()
    raise ValueError(f"Unknown execution backend {backend!r}; use 'simulated', 'slurm' or 'container'.")


def in_band_driver(name: str | None = None, *, timeout: float | None = None) -> InBandDriver:
    """The bare-metal post-install steps' driver (PROVISIONING_IN_BAND_DRIVER): "simulated" or "ansible" (playbooks
    over SSH, each run limited to the step's `timeout`)."""
    name = name or settings.PROVISIONING_IN_BAND_DRIVER
    if name == "ansible":
        from provisioning.drivers.ansible import AnsibleHost

        return AnsibleHost(timeout=timeout)
    if name == "simulated":
        from provisioning.drivers.simulated import SimulatedHost

        return SimulatedHost()
    raise ValueError(f"Unknown in-band driver {name!r}; use 'simulated' or 'ansible'.")


def serving_driver(runtime: str = "simulated") -> ServingDriver:
    """The driver of a serving template's runtime: `llamacpp` runs llama.cpp's server per replica; `simulated` (and,
    until they have drivers of their own, vllm, tgi, triton, mindie) the project's stand-in OpenAI-compatible server."""
    if runtime == "llamacpp":
        from provisioning.drivers.llamacpp import LlamaCppServing

        return LlamaCppServing()
    from provisioning.drivers.simulated import SimulatedHost

    return SimulatedHost()
