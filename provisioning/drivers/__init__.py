"""Driver registry: which BMC driver runs bare metal, and which host driver runs in-band work on a node."""

from django.conf import settings

from provisioning.drivers.base import BmcDriver, HostDriver


def bmc_driver(name: str | None = None) -> BmcDriver:
    name = name or settings.PROVISIONING_BMC_DRIVER
    if name == "redfish":
        from provisioning.drivers.redfish import RedfishBmc

        return RedfishBmc()
    if name == "simulated":
        from provisioning.drivers.simulated import SimulatedBmc

        return SimulatedBmc()
    raise ValueError(f"Unknown BMC driver {name!r}; use 'simulated' or 'redfish'.")


def host_driver(backend: str) -> HostDriver:
    """The host driver of a node's execution backend (scheduling.choices.ExecutionBackend)."""
    if backend == "slurm":
        from provisioning.drivers.slurm import SlurmHost

        return SlurmHost()
    if backend == "container":
        from provisioning.drivers.container import ContainerHost

        return ContainerHost()
    if backend == "simulated":
        from provisioning.drivers.simulated import SimulatedHost

        return SimulatedHost()
    raise ValueError(f"Unknown execution backend {backend!r}; use 'simulated', 'slurm' or 'container'.")
