"""The driver registries: every enum member has a driver, a new backend registers into its registry, and the system
check names a member left without one."""

import pytest
from django.core import checks
from django.db import models

from catalog.choices import ServingRuntime
from provisioning.checks import check_driver_registries
from provisioning.choices import BmcDriverName, InBandDriverName
from provisioning.drivers import (
    BMC_DRIVERS,
    IN_BAND_DRIVERS,
    REGISTRIES,
    SERVING_DRIVERS,
    WORKLOAD_DRIVERS,
    DriverRegistry,
    bmc_driver,
    in_band_driver,
    serving_driver,
    workload_driver,
)
from provisioning.drivers.ansible import AnsibleHost
from provisioning.drivers.base import BmcDriver, InBandDriver, ServingDriver, WorkloadDriver
from provisioning.drivers.container import ContainerWorkloads
from provisioning.drivers.llamacpp import LlamaCppServing
from provisioning.drivers.redfish import RedfishBmc
from provisioning.drivers.simulated import SimulatedBmc, SimulatedHost
from provisioning.drivers.slurm import SlurmWorkloads
from scheduling.choices import ExecutionBackend


@pytest.mark.parametrize(
    ("registry", "enum", "interface"),
    [
        (WORKLOAD_DRIVERS, ExecutionBackend, WorkloadDriver),
        (BMC_DRIVERS, BmcDriverName, BmcDriver),
        (IN_BAND_DRIVERS, InBandDriverName, InBandDriver),
        (SERVING_DRIVERS, ServingRuntime, ServingDriver),
    ],
)
def test_every_enum_member_has_a_driver_of_its_interface(registry, enum, interface):
    assert registry.missing() == []
    assert sorted(registry.keys()) == sorted(enum.values)
    for value in enum.values:
        assert isinstance(registry.create(value), interface), value


def test_the_lookups_return_the_registered_drivers(settings):
    assert type(workload_driver(ExecutionBackend.SLURM)) is SlurmWorkloads
    assert type(workload_driver(ExecutionBackend.CONTAINER)) is ContainerWorkloads
    assert type(workload_driver(ExecutionBackend.SIMULATED)) is SimulatedHost
    assert type(bmc_driver("redfish")) is RedfishBmc
    settings.PROVISIONING_BMC_DRIVER = "simulated"
    assert type(bmc_driver()) is SimulatedBmc
    ansible = in_band_driver("ansible", timeout=42)
    assert type(ansible) is AnsibleHost and ansible.timeout == 42
    assert type(in_band_driver("simulated", timeout=42)) is SimulatedHost
    assert type(serving_driver(ServingRuntime.LLAMACPP)) is LlamaCppServing
    assert type(serving_driver(ServingRuntime.VLLM)) is SimulatedHost  # the stand-in until vLLM has a driver
    assert type(serving_driver("not-a-runtime")) is SimulatedHost


def test_an_unknown_name_is_refused_with_the_known_ones():
    with pytest.raises(ValueError, match="Unknown execution backend 'kubernetes'; use one of 'simulated'"):
        workload_driver("kubernetes")
    with pytest.raises(ValueError, match="Unknown BMC driver 'ipmi'"):
        bmc_driver("ipmi")


class Backend(models.TextChoices):
    SIMULATED = "simulated", "Simulated"
    KUBERNETES = "kubernetes", "Kubernetes"


class KubernetesWorkloads(SimulatedHost):
    name = "kubernetes"


def test_a_new_backend_registers_into_its_registry_and_the_check_names_one_left_out():
    registry = DriverRegistry("execution backend", Backend)
    registry.register(Backend.SIMULATED, "provisioning.drivers.simulated:SimulatedHost")
    [error] = check_driver_registries(registries=[registry])
    assert error.id == "provisioning.E010" and error.level == checks.ERROR
    assert "'kubernetes' has no execution backend driver" in error.msg
    registry.register(Backend.KUBERNETES, KubernetesWorkloads)
    assert check_driver_registries(registries=[registry]) == []
    assert type(registry.create("kubernetes")) is KubernetesWorkloads
    with pytest.raises(ValueError, match="not a Backend"):
        registry.register("nomad", SimulatedHost)


def test_the_shipped_registries_pass_the_check():
    assert check_driver_registries() == []
    assert {registry.enum for registry in REGISTRIES} == {
        ExecutionBackend,
        BmcDriverName,
        InBandDriverName,
        ServingRuntime,
    }
