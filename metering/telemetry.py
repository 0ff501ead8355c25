"""Telemetry drivers: what each device bound to a running allocation is doing (utilization, memory, power).

A driver reads every binding at one instant and returns a Reading per binding it could measure, plus the errors of
the nodes it could not. `simulated` (the embedded default) draws plausible, repeatable curves per workload, seeded
by allocation, device and time. `dcgm` scrapes NVIDIA dcgm-exporter's Prometheus text endpoint on each node over
HTTP (parsed with prometheus_client's parser, as health ingestion does) and matches samples to devices by UUID.

Which driver reads a card is chosen per vendor or per node (METERING_TELEMETRY_SOURCES, e.g. NVIDIA cards through
dcgm, Ascend cards through their own exporter), the rest through METERING_TELEMETRY_DRIVER: a mixed fleet is
metered each vendor its own way (`telemetry_driver`, `RoutedDriver`).

A card shared by several allocations (milli < 1000) reports for the whole card; each allocation is attributed its
share of the card's memory and power, and the card's utilization as measured. A card whose exporter reports a number
no card can have (NaN, infinite, negative, or beyond the card) gets no sample that round, and the collection says so.
"""

import math
import random
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

import httpx
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from prometheus_client.parser import text_string_to_metric_families

from catalog.choices import ServiceKind
from metering.choices import TelemetryDriver
from scheduling.engine import MILLI
from scheduling.inventory.health import parse_dcgm_text

UTILIZATION, MEMORY_USED, POWER = "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_POWER_USAGE"
# No accelerator board draws 5 kW (a GB200 superchip peaks near 2.7 kW): a larger reading is a broken exporter.
MAX_BOARD_POWER_W = 5_000.0


@dataclass(frozen=True)
class Binding:
    allocation_id: int
    device_id: int
    device_uuid: str
    node: str
    position: int  # the device's place within its allocation, 0 first
    memory_gb: int
    milli: int
    service_kind: str
    workload: str = ""  # what the order declared (parameter "workload"), if anything
    gi_id: int | None = None  # the GPU instance the allocation holds on this card (MIG), if any
    vendor: str = ""  # the card's vendor (catalog.Vendor.slug): which telemetry source reads it

    @property
    def share(self) -> float:
        return self.milli / MILLI


@dataclass(frozen=True)
class Reading:
    allocation_id: int
    device_id: int
    utilization_pct: float
    memory_used_mb: int
    power_w: float


@dataclass
class DriverResult:
    readings: list[Reading] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def _percentage(value: float) -> float:
    return min(100.0, max(0.0, value))


# --- simulated ------------------------------------------------------------------------------------------------

TRAINING, INFERENCE, INTERACTIVE, UNDERUSED = "training", "inference", "interactive", "underused"


WORKLOADS = (TRAINING, INFERENCE, INTERACTIVE, UNDERUSED)


def workload_of(binding: Binding) -> str:
    """The workload the order declared; else serving follows the day, bare metal trains, and a compute allocation
    gets one of three habits by its id."""
    if binding.workload in WORKLOADS:
        return binding.workload
    if binding.service_kind == ServiceKind.MODEL_SERVING:
        return INFERENCE
    if binding.service_kind == ServiceKind.BARE_METAL:
        return TRAINING
    return random.Random(f"workload:{binding.allocation_id}").choices(
        [TRAINING, INTERACTIVE, UNDERUSED], weights=[4, 3, 3]
    )[0]


def _utilization_and_memory(workload: str, binding: Binding, at: datetime, rng: random.Random) -> tuple[float, float]:
    """(utilization %, share of the card's memory in use)."""
    if workload == TRAINING:
        return rng.uniform(86, 98), rng.uniform(0.8, 0.92)
    if workload == INFERENCE:
        daylight = (1 + math.sin(2 * math.pi * (at.hour + at.minute / 60 - 8) / 24)) / 2
        return 15 + 50 * daylight + rng.uniform(-5, 5), rng.uniform(0.55, 0.6)
    if workload == INTERACTIVE:
        burst = random.Random(f"burst:{binding.allocation_id}:{int(at.timestamp()) // 600}").random() < 0.25
        return (rng.uniform(40, 75), rng.uniform(0.2, 0.3)) if burst else (rng.uniform(0, 4), rng.uniform(0.1, 0.12))
    if binding.position == 0:  # underused: one busy card, the rest idle
        return rng.uniform(70, 95), rng.uniform(0.25, 0.3)
    return 0.0, 0.0


def _peak_power_w(memory_gb: int) -> float:
    """Board power grows with the card's class: a 16 GB card draws ~260 W at most, an 80 GB one ~710 W."""
    return min(150 + 7 * memory_gb, 750)


class SimulatedDriver:
    name = TelemetryDriver.SIMULATED

    def read(self, bindings: list[Binding], at: datetime) -> DriverResult:
        result = DriverResult()
        for binding in bindings:
            rng = random.Random(f"{binding.allocation_id}:{binding.device_id}:{int(at.timestamp())}")
            utilization, memory = _utilization_and_memory(workload_of(binding), binding, at, rng)
            utilization = _percentage(utilization)
            peak = _peak_power_w(binding.memory_gb)
            power = (0.1 * peak + 0.9 * peak * utilization / 100) * binding.share
            result.readings.append(
                Reading(
                    binding.allocation_id,
                    binding.device_id,
                    round(utilization, 2),
                    int(memory * binding.memory_gb * 1024 * binding.share),
                    round(power, 2),
                )
            )
        return result


# --- dcgm-exporter ---------------------------------------------------------------------------------------------


def dcgm_device_values(text: str) -> dict[str, dict[str, float]]:
    """{device UUID: {metric: value}} of the utilization, memory and power samples in dcgm-exporter output."""
    values: dict[str, dict[str, float]] = defaultdict(dict)
    for sample in parse_dcgm_text(text):
        if sample.signal in (UTILIZATION, MEMORY_USED, POWER) and sample.device_uuid:
            values[sample.device_uuid][sample.signal] = float(sample.value)
    return values


ENGINE_ACTIVE = "DCGM_FI_PROF_GR_ENGINE_ACTIVE"  # per MIG instance, a ratio (GPU_UTIL is not reported for MIG)


def dcgm_instance_values(text: str) -> dict[tuple[str, str], dict[str, float]]:
    """{(card UUID, GPU_I_ID): {metric: value}} of the samples dcgm-exporter labels with a MIG GPU instance: memory
    used, and utilization from the graphics engine activity (GPU_UTIL where the exporter gives it per instance)."""
    values: dict[tuple[str, str], dict[str, float]] = defaultdict(dict)
    try:
        families = list(text_string_to_metric_families(text))
    except (ValueError, IndexError, KeyError, TypeError) as exc:
        raise ValueError(f"Not Prometheus text exposition format: {exc or type(exc).__name__}.") from exc
    for family in families:
        for sample in family.samples:
            uuid, gi = sample.labels.get("UUID", ""), sample.labels.get("GPU_I_ID", "")
            if not uuid or gi == "":
                continue
            if sample.name == ENGINE_ACTIVE:
                values[(uuid, gi)].setdefault(UTILIZATION, float(sample.value) * 100)
            elif sample.name == UTILIZATION:
                values[(uuid, gi)][UTILIZATION] = float(sample.value)
            elif sample.name == MEMORY_USED:
                values[(uuid, gi)][MEMORY_USED] = float(sample.value)
    return values


def _dcgm_problem(device: dict[str, float], binding: Binding) -> str | None:
    """Why a card's dcgm values cannot be stored, or None. dcgm reports memory in MiB and utilization in percent."""
    limits = {UTILIZATION: 100.0, MEMORY_USED: binding.memory_gb * 1024.0, POWER: MAX_BOARD_POWER_W}
    for metric, most in limits.items():
        value = device[metric]
        if not 0 <= value <= most:  # false for NaN and the infinities too
            return f"{metric}={value:g} is not within 0..{most:g}"
    return None


class DcgmDriver:
    name = TelemetryDriver.DCGM

    def __init__(self, *, url_template: str, timeout: float):
        self.url_template, self.timeout = url_template, timeout

    def read(self, bindings: list[Binding], at: datetime) -> DriverResult:
        by_node: dict[str, list[Binding]] = defaultdict(list)
        for binding in bindings:
            by_node[binding.node].append(binding)
        result = DriverResult()
        with httpx.Client(timeout=self.timeout) as client:
            for node, node_bindings in sorted(by_node.items()):
                self._read_node(client, node, node_bindings, result)
        return result

    def _read_node(self, client: httpx.Client, node: str, bindings: list[Binding], result: DriverResult) -> None:
        url = self.url_template.format(node=node)
        try:
            response = client.get(url)
            response.raise_for_status()
            values = dcgm_device_values(response.text)
            instances = dcgm_instance_values(response.text) if any(b.gi_id is not None for b in bindings) else {}
        except (httpx.HTTPError, ValueError) as error:
            result.errors.append(f"{node}: {url} gave no readings ({error})")
            return
        for binding in bindings:
            device = values.get(binding.device_uuid, {})
            if binding.gi_id is not None:  # a MIG instance: its own utilization and memory, the card's power by share
                own = instances.get((binding.device_uuid, str(binding.gi_id)), {})
                if not {UTILIZATION, MEMORY_USED} <= own.keys() or POWER not in device:
                    result.errors.append(
                        f"{node}: no utilization, memory and power for GPU instance {binding.gi_id} of "
                        f"{binding.device_uuid}"
                    )
                    continue
                sample = {**own, POWER: device[POWER]}
                if problem := _dcgm_problem(sample, binding):
                    result.errors.append(f"{node}: dropped the sample of {binding.device_uuid}: {problem}")
                    continue
                result.readings.append(
                    Reading(
                        binding.allocation_id,
                        binding.device_id,
                        round(sample[UTILIZATION], 2),
                        int(sample[MEMORY_USED]),
                        round(sample[POWER] * binding.share, 3),
                    )
                )
                continue
            whole_card_reading(binding, device, result)


def whole_card_reading(binding: Binding, device: dict[str, float], result: DriverResult) -> None:
    """A whole card's (or a shared card's) dcgm values as the binding's reading, or an error saying why not."""
    if not {UTILIZATION, MEMORY_USED, POWER} <= device.keys():
        result.errors.append(f"{binding.node}: no utilization, memory and power for {binding.device_uuid}")
        return
    if problem := _dcgm_problem(device, binding):
        result.errors.append(f"{binding.node}: dropped the sample of {binding.device_uuid}: {problem}")
        return
    result.readings.append(
        Reading(
            binding.allocation_id,
            binding.device_id,
            device[UTILIZATION],
            int(device[MEMORY_USED] * binding.share),
            round(device[POWER] * binding.share, 3),
        )
    )


def agent_readings(bindings: list[Binding], readings: dict[int, dict[str, float]]) -> DriverResult:
    """What node agents pushed (dcgm lines or JSON events, by device id) as readings of the bindings on those
    devices, checked as scraped ones are. MIG instances are left to the collector: an agent's card-wide numbers are
    not an instance's."""
    result = DriverResult()
    for binding in bindings:
        if binding.gi_id is None and binding.device_id in readings:
            whole_card_reading(binding, readings[binding.device_id], result)
    return result


def _dcgm_driver() -> DcgmDriver:
    return DcgmDriver(url_template=settings.METERING_DCGM_URL_TEMPLATE, timeout=settings.METERING_DCGM_TIMEOUT_SECONDS)


# The telemetry drivers keyed by their enum: a new source is one TelemetryDriver member and one entry here
# (docs/adding-an-accelerator.md).
TELEMETRY_DRIVERS: dict[str, Callable[[], object]] = {
    TelemetryDriver.SIMULATED: SimulatedDriver,
    TelemetryDriver.DCGM: _dcgm_driver,
}


def driver_for(name: str | None = None):
    name = name or settings.METERING_TELEMETRY_DRIVER
    factory = TELEMETRY_DRIVERS.get(name)
    if factory is None:
        raise ImproperlyConfigured(
            f"A telemetry driver must be one of {', '.join(TelemetryDriver.values)}; got {name!r} "
            "(METERING_TELEMETRY_DRIVER, METERING_TELEMETRY_SOURCES)."
        )
    return factory()


NODE_PREFIX = "node:"


def source_of(binding: Binding, sources: dict[str, str], default: str) -> str:
    """The telemetry driver that reads `binding`: its node's (key "node:<name>"), else its vendor's (key: the vendor's
    slug), else the default."""
    return sources.get(NODE_PREFIX + binding.node) or sources.get(binding.vendor) or default


class RoutedDriver:
    """Reads each binding through the driver its node or vendor is mapped to, and merges what they return."""

    def __init__(self, *, sources: dict[str, str], default: str):
        for name in {default, *sources.values()}:
            if name not in TELEMETRY_DRIVERS:
                driver_for(name)  # raises ImproperlyConfigured, naming the known drivers
        self.sources, self.default = sources, default

    def read(self, bindings: list[Binding], at: datetime) -> DriverResult:
        by_source: dict[str, list[Binding]] = defaultdict(list)
        for binding in bindings:
            by_source[source_of(binding, self.sources, self.default)].append(binding)
        result = DriverResult()
        for name, routed in sorted(by_source.items()):
            part = driver_for(name).read(routed, at)
            result.readings.extend(part.readings)
            result.errors.extend(part.errors)
        return result


def telemetry_driver():
    """The collector's driver: METERING_TELEMETRY_DRIVER for every card, unless METERING_TELEMETRY_SOURCES maps some
    vendors or nodes to other drivers."""
    sources = settings.METERING_TELEMETRY_SOURCES
    if not sources:
        return driver_for()
    return RoutedDriver(sources=dict(sources), default=settings.METERING_TELEMETRY_DRIVER)
