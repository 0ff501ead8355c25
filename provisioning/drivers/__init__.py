"""Driver registry: which BMC driver runs bare metal, and the host agent for in-band work."""

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


def host_driver() -> HostDriver:
    from provisioning.drivers.simulated import SimulatedHost

    return SimulatedHost()
