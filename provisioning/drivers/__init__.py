"""Driver registries: one per concern, each keyed by its enum, so a new backend is one enum member and one
`register(...)` line here (docs/adding-a-backend.md).

- `WORKLOAD_DRIVERS`: the workload driver of a node's execution backend (scheduling.choices.ExecutionBackend);
- `BMC_DRIVERS`: bare metal's out-of-band driver (provisioning.choices.BmcDriverName, PROVISIONING_BMC_DRIVER);
- `IN_BAND_DRIVERS`: bare metal's post-install steps (provisioning.choices.InBandDriverName,
  PROVISIONING_IN_BAND_DRIVER);
- `SERVING_DRIVERS`: a serving template's runtime (catalog.choices.ServingRuntime).

Drivers are registered by dotted path ("module:Class") and imported on first use, so a process that never runs
Ansible never imports it. The system check `provisioning.E010` (provisioning/checks.py) fails when a member of an
enum has no driver.
"""

from collections.abc import Callable
from importlib import import_module

from django.conf import settings
from django.db.models import TextChoices

from catalog.choices import ServingRuntime
from provisioning.choices import BmcDriverName, InBandDriverName
from provisioning.drivers.base import BmcDriver, InBandDriver, ServingDriver, WorkloadDriver
from scheduling.choices import ExecutionBackend


class DriverRegistry:
    """Drivers of one concern keyed by the members of `enum`. A factory is a dotted path "module:Class" (called
    with the options `create` passes) or a callable returning the driver."""

    def __init__(self, kind: str, enum: type[TextChoices]):
        self.kind, self.enum = kind, enum
        self._factories: dict[str, str | Callable] = {}

    def register(self, key: str, factory: str | Callable) -> None:
        if key not in self.enum.values:
            raise ValueError(
                f"{key!r} is not a {self.enum.__name__}: add the member to the enum first (docs/adding-a-backend.md)."
            )
        self._factories[str(key)] = factory

    def keys(self) -> list[str]:
        return list(self._factories)

    def __contains__(self, key: object) -> bool:
        return str(key) in self._factories

    def missing(self) -> list[str]:
        """The enum's members that have no driver."""
        return [value for value in self.enum.values if value not in self._factories]

    def create(self, key: str, **options):
        factory = self._factories.get(str(key))
        if factory is None:
            raise ValueError(f"Unknown {self.kind} {key!r}; use one of {', '.join(map(repr, self.keys()))}.")
        if isinstance(factory, str):
            module, _, name = factory.partition(":")
            factory = getattr(import_module(module), name)
        return factory(**options)


def _simulated_host(**_options):
    """The simulated host plays every part (workload, in-band, serving) and takes no options."""
    from provisioning.drivers.simulated import SimulatedHost

    return SimulatedHost()


WORKLOAD_DRIVERS = DriverRegistry("execution backend", ExecutionBackend)
WORKLOAD_DRIVERS.register(ExecutionBackend.SIMULATED, _simulated_host)
WORKLOAD_DRIVERS.register(ExecutionBackend.SLURM, "provisioning.drivers.slurm:SlurmWorkloads")
WORKLOAD_DRIVERS.register(ExecutionBackend.CONTAINER, "provisioning.drivers.container:ContainerWorkloads")

BMC_DRIVERS = DriverRegistry("BMC driver", BmcDriverName)
BMC_DRIVERS.register(BmcDriverName.SIMULATED, "provisioning.drivers.simulated:SimulatedBmc")
BMC_DRIVERS.register(BmcDriverName.REDFISH, "provisioning.drivers.redfish:RedfishBmc")

IN_BAND_DRIVERS = DriverRegistry("in-band driver", InBandDriverName)
IN_BAND_DRIVERS.register(InBandDriverName.SIMULATED, _simulated_host)
IN_BAND_DRIVERS.register(InBandDriverName.ANSIBLE, "provisioning.drivers.ansible:AnsibleHost")

SERVING_DRIVERS = DriverRegistry("serving runtime", ServingRuntime)
SERVING_DRIVERS.register(ServingRuntime.SIMULATED, _simulated_host)
SERVING_DRIVERS.register(ServingRuntime.LLAMACPP, "provisioning.drivers.llamacpp:LlamaCppServing")
# Until they have drivers of their own, these runtimes are served by the project's stand-in OpenAI-compatible server.
for _runtime in (ServingRuntime.VLLM, ServingRuntime.TGI, ServingRuntime.TRITON, ServingRuntime.MINDIE):
    SERVING_DRIVERS.register(_runtime, _simulated_host)

REGISTRIES = (WORKLOAD_DRIVERS, BMC_DRIVERS, IN_BAND_DRIVERS, SERVING_DRIVERS)


def bmc_driver(name: str | None = None) -> BmcDriver:
    return BMC_DRIVERS.create(name or settings.PROVISIONING_BMC_DRIVER)


def workload_driver(backend: str) -> WorkloadDriver:
    """The workload driver of a node's execution backend (scheduling.choices.ExecutionBackend)."""
    return WORKLOAD_DRIVERS.create(backend)


def prepares_images_without_calls(backend: str) -> bool:
    """Whether the backend's workload driver prepares an image without calling anything (Slurm: nothing to pull),
    so that its runs' image step is computed (provisioning/pipelines.py)."""
    return backend in WORKLOAD_DRIVERS and not workload_driver(backend).image_step_calls


def in_band_driver(name: str | None = None, *, timeout: float | None = None) -> InBandDriver:
    """The bare-metal post-install steps' driver (PROVISIONING_IN_BAND_DRIVER): "simulated" or "ansible" (playbooks
    over SSH, each run limited to the step's `timeout`)."""
    return IN_BAND_DRIVERS.create(name or settings.PROVISIONING_IN_BAND_DRIVER, timeout=timeout)


def serving_driver(runtime: str = ServingRuntime.SIMULATED) -> ServingDriver:
    """The driver of a serving template's runtime; a runtime the catalog does not know is served by the stand-in."""
    if runtime not in SERVING_DRIVERS:
        runtime = ServingRuntime.SIMULATED
    return SERVING_DRIVERS.create(runtime)
