"""The dcgm driver against recorded dcgm-exporter output of an 8-GPU HGX node, served by a real local HTTP server;
and a mixed fleet whose vendors are read by different telemetry sources."""

import math
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

from catalog.choices import AcceleratorKind
from catalog.models import Vendor
from metering import selectors, services
from metering.models import TelemetrySample
from metering.telemetry import MEMORY_USED, POWER, UTILIZATION, SimulatedDriver, dcgm_device_values
from scheduling.models import Allocation, Device, Node
from tests.factories import AcceleratorModelFactory
from tests.metering.conftest import at, bound
from tests.scheduling.inventory_helpers import node

pytestmark = pytest.mark.django_db

OUTPUT = Path(__file__).parent / "fixtures" / "dcgm_exporter_hgx.txt"
NODE = "hgx-h100-07"
UUIDS = [
    "GPU-1f3c9a2e-6b4d-4e8a-9c07-5d2b8e1a7f01",
    "GPU-2a7e4b90-3c1f-4d6b-8e52-9f0a6c3d2b12",
    "GPU-3b8f5ca1-4d2a-4e7c-9f63-a01b7d4e3c23",
    "GPU-4c906db2-5e3b-4f8d-a074-b12c8e5f4d34",
    "GPU-5da17ec3-6f4c-409e-b185-c23d9f60a545",
    "GPU-6eb28fd4-705d-41af-c296-d34ea071b656",
    "GPU-7fc390e5-816e-42b0-d3a7-e45fb182c767",
    "GPU-80d4a1f6-927f-43c1-e4b8-f560c293d878",
]


def _serve(body: bytes):
    """http://127.0.0.1:<port>/hgx-h100-07/metrics answers with the body; other nodes get 404."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            if self.path != f"/{NODE}/metrics":
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()
    server.server_close()


@pytest.fixture
def exporter():
    """The recorded output of the HGX node."""
    yield from _serve(OUTPUT.read_bytes())


def _with_value(text: str, metric: str, uuid: str, value: str) -> str:
    """The recorded output with one sample's value replaced."""
    lines = [
        line.rsplit(" ", 1)[0] + f" {value}" if line.startswith(metric + "{") and uuid in line else line
        for line in text.splitlines()
    ]
    return "\n".join(lines) + "\n"


# Four cards report numbers no card can have; the other four are fine.
BROKEN = [
    (POWER, UUIDS[0], "NaN"),
    (UTILIZATION, UUIDS[1], "+Inf"),
    (MEMORY_USED, UUIDS[2], "1e308"),
    (POWER, UUIDS[3], "-5"),
]


@pytest.fixture
def broken_exporter():
    text = OUTPUT.read_text()
    for metric, uuid, value in BROKEN:
        text = _with_value(text, metric, uuid, value)
    yield from _serve(text.encode())


@pytest.fixture
def hgx(world):
    node = Node.objects.create(name=NODE, serial_number="SN-HGX-07", cpu_milli=112_000, memory_mib=2_097_152)
    Device.objects.bulk_create(
        Device(node=node, index=index, uuid=uuid, model=world.model, memory_gb=80) for index, uuid in enumerate(UUIDS)
    )
    return list(node.devices.order_by("index"))


def test_the_recorded_output_parses_to_utilization_memory_and_power_per_uuid():
    values = dcgm_device_values(OUTPUT.read_text())
    assert set(values) == set(UUIDS)
    assert values[UUIDS[2]] == {UTILIZATION: 97, MEMORY_USED: 71234, POWER: pytest.approx(689.224)}


def test_collector_scrapes_each_node_and_matches_devices_by_uuid(world, hgx, exporter, settings):
    settings.METERING_TELEMETRY_DRIVER = "dcgm"
    settings.METERING_DCGM_URL_TEMPLATE = exporter + "/{node}/metrics"
    training = bound(world, started=at("2026-11-30 08:00"), devices=[hgx[2], hgx[3]])
    serving = bound(world, spec=world.half, started=at("2026-11-30 09:00"), devices=[hgx[6]])
    report = services.telemetry_collect(now=at("2026-11-30 10:00"))
    assert (report.samples, report.errors) == (3, [])
    rows = {
        (sample.allocation_id, sample.device_id): (sample.utilization_pct, sample.memory_used_mb, sample.power_w)
        for sample in TelemetrySample.objects.all()
    }
    assert rows == {
        (training.pk, hgx[2].pk): (97, 71234, pytest.approx(689.224)),
        (training.pk, hgx[3].pk): (96, 71102, pytest.approx(676.87)),
        (serving.pk, hgx[6].pk): (41, 30412 // 2, pytest.approx(288.731 / 2, abs=0.001)),  # half the card
    }


def test_an_unreachable_exporter_is_reported_and_the_other_nodes_still_sampled(world, hgx, exporter, settings):
    settings.METERING_TELEMETRY_DRIVER = "dcgm"
    settings.METERING_DCGM_URL_TEMPLATE = exporter + "/{node}/metrics"
    bound(world, started=at("2026-11-30 08:00"), devices=[hgx[0], hgx[1]])
    elsewhere = bound(world, spec=world.half, started=at("2026-11-30 08:00"))  # world.node: no exporter there
    report = services.telemetry_collect(now=at("2026-11-30 10:00"))
    assert report.samples == 2
    [error] = report.errors
    assert error.startswith(f"{world.node.name}: ") and "404" in error
    assert not TelemetrySample.objects.filter(allocation=elsewhere).exists()


def test_a_device_missing_from_the_output_is_reported(world, hgx, exporter, settings):
    settings.METERING_TELEMETRY_DRIVER = "dcgm"
    settings.METERING_DCGM_URL_TEMPLATE = exporter + "/{node}/metrics"
    stranger = Device.objects.create(
        node=hgx[0].node, index=8, uuid="GPU-not-in-the-output", model=world.model, memory_gb=80
    )
    bound(world, spec=world.half, started=at("2026-11-30 08:00"), devices=[stranger])
    report = services.telemetry_collect(now=at("2026-11-30 10:00"))
    assert report.samples == 0 and report.errors == [
        f"{NODE}: no utilization, memory and power for GPU-not-in-the-output"
    ]


def test_unusable_numbers_drop_that_sample_with_a_reason_and_the_rest_is_stored(world, hgx, broken_exporter, settings):
    """Before the fix the infinite memory crashed the collection and a NaN power would have been stored."""
    settings.METERING_TELEMETRY_DRIVER = "dcgm"
    settings.METERING_DCGM_URL_TEMPLATE = broken_exporter + "/{node}/metrics"
    allocation = bound(world, started=at("2026-11-30 08:00"), devices=hgx)
    report = services.telemetry_collect(now=at("2026-11-30 10:00"))
    assert report.samples == 4
    assert len(report.errors) == 4
    for (metric, uuid, _value), error in zip(BROKEN, report.errors, strict=True):
        assert error.startswith(f"{NODE}: dropped the sample of {uuid}: {metric}=")
    stored = TelemetrySample.objects.filter(allocation=allocation)
    assert set(stored.values_list("device__uuid", flat=True)) == set(UUIDS[4:])
    assert all(math.isfinite(power) for power in stored.values_list("power_w", flat=True))


def _with_mig_instances(text: str, uuid: str, instances: list[tuple[str, str, float, int]]) -> str:
    """The recorded output with per-GPU-instance samples of one card, as dcgm-exporter prints MIG devices: memory
    used with GPU_I_ID/GPU_I_PROFILE labels next to the card's, and the graphics engine activity per instance."""
    lines = text.splitlines()
    last_fb = max(k for k, line in enumerate(lines) if line.startswith("DCGM_FI_DEV_FB_USED{"))
    labels = 'gpu="7",UUID="{uuid}",device="nvidia7",GPU_I_ID="{gi}",GPU_I_PROFILE="{profile}",Hostname="hgx-h100-07"'
    fb = [f"DCGM_FI_DEV_FB_USED{{{labels.format(uuid=uuid, gi=gi, profile=p)}}} {mb}" for gi, p, _a, mb in instances]
    lines[last_fb + 1 : last_fb + 1] = fb
    lines += [
        "# HELP DCGM_FI_PROF_GR_ENGINE_ACTIVE Ratio of time the graphics engine is active.",
        "# TYPE DCGM_FI_PROF_GR_ENGINE_ACTIVE gauge",
    ]
    lines += [
        f"DCGM_FI_PROF_GR_ENGINE_ACTIVE{{{labels.format(uuid=uuid, gi=gi, profile=p)}}} {active}"
        for gi, p, active, _mb in instances
    ]
    return "\n".join(lines) + "\n"


def test_mig_instance_samples_go_to_the_request_holding_the_instance(world, hgx, settings):
    from catalog.models import MigProfile
    from metering.telemetry import dcgm_instance_values
    from scheduling.models import MigInstance

    text = _with_mig_instances(
        OUTPUT.read_text(), UUIDS[7], [("1", "3g.40gb", 0.63, 20480), ("2", "3g.40gb", 0.2, 9000)]
    )
    assert dcgm_instance_values(text)[(UUIDS[7], "2")] == {UTILIZATION: pytest.approx(20.0), MEMORY_USED: 9000}
    card_power = dcgm_device_values(text)[UUIDS[7]][POWER]
    Device.objects.filter(pk=hgx[7].pk).update(mig_mode=True)
    profile = MigProfile.objects.get(geometry__name="H100 80GB", name="3g.40gb")
    first = bound(world, spec=world.half, started=at("2026-11-30 08:00"), devices=[hgx[7]])
    second = bound(world, spec=world.half, started=at("2026-11-30 08:00"), devices=[hgx[7]])
    MigInstance.objects.create(device=hgx[7], profile=profile, start=0, size=4, gi_id=2, allocation=first)
    MigInstance.objects.create(device=hgx[7], profile=profile, start=4, size=4, gi_id=1, allocation=second)
    for server in _serve(text.encode()):
        settings.METERING_TELEMETRY_DRIVER = "dcgm"
        settings.METERING_DCGM_URL_TEMPLATE = server + "/{node}/metrics"
        report = services.telemetry_collect(now=at("2026-11-30 10:00"))
    assert (report.samples, report.errors) == (2, [])
    rows = {
        sample.allocation_id: (sample.utilization_pct, sample.memory_used_mb, sample.power_w)
        for sample in TelemetrySample.objects.all()
    }
    assert rows == {
        first.pk: (pytest.approx(20.0), 9000, pytest.approx(card_power / 2, abs=0.001)),  # GPU_I_ID 2 is first's
        second.pk: (pytest.approx(63.0), 20480, pytest.approx(card_power / 2, abs=0.001)),
    }


def _samples(allocation) -> dict:
    return {
        sample.device_id: (sample.utilization_pct, sample.memory_used_mb, sample.power_w)
        for sample in TelemetrySample.objects.filter(allocation=allocation)
    }


@pytest.fixture
def ascend(world):
    """A node of two Huawei Ascend NPUs beside the NVIDIA HGX node."""
    model = AcceleratorModelFactory(
        vendor=Vendor.objects.get(slug="huawei-ascend"), kind=AcceleratorKind.NPU, memory_gb=64, name="Test 910B"
    )
    return list(node(devices=2, model=model, name="ascend-01").devices.order_by("index"))


def test_a_mixed_fleet_is_metered_each_vendor_by_its_own_source(world, hgx, ascend, exporter, settings):
    """NVIDIA cards through dcgm-exporter, the Ascend NPUs through another source (here the simulated driver), in one
    collection: the NPU node is never asked for dcgm output (it has none: the exporter answers 404 there)."""
    settings.METERING_TELEMETRY_DRIVER = "simulated"
    settings.METERING_TELEMETRY_SOURCES = {"nvidia": "dcgm"}
    settings.METERING_DCGM_URL_TEMPLATE = exporter + "/{node}/metrics"
    gpus = bound(world, started=at("2026-11-30 08:00"), devices=[hgx[2], hgx[3]])
    npus = bound(world, started=at("2026-11-30 08:00"), devices=ascend)
    report = services.telemetry_collect(now=at("2026-11-30 10:00"))
    assert (report.samples, report.errors) == (4, [])
    assert _samples(gpus) == {
        hgx[2].pk: (97, 71234, pytest.approx(689.224)),
        hgx[3].pk: (96, 71102, pytest.approx(676.87)),
    }
    bindings = selectors.bindings_of(Allocation.objects.filter(pk=npus.pk))
    assert {binding.vendor for binding in bindings} == {"huawei-ascend"}
    simulated = SimulatedDriver().read(bindings, report.instant).readings
    assert _samples(npus) == {
        reading.device_id: (reading.utilization_pct, reading.memory_used_mb, reading.power_w) for reading in simulated
    }


def test_a_node_mapped_to_a_source_overrides_its_vendor_s(world, hgx, ascend, exporter, settings):
    settings.METERING_TELEMETRY_DRIVER = "dcgm"
    settings.METERING_TELEMETRY_SOURCES = {"huawei-ascend": "simulated", f"node:{NODE}": "simulated"}
    settings.METERING_DCGM_URL_TEMPLATE = exporter + "/{node}/metrics"
    gpus = bound(world, started=at("2026-11-30 08:00"), devices=[hgx[2]], spec=world.half)
    report = services.telemetry_collect(now=at("2026-11-30 10:00"))
    assert report.errors == []
    bindings = selectors.bindings_of(Allocation.objects.filter(pk=gpus.pk))
    [reading] = SimulatedDriver().read(bindings, report.instant).readings
    assert _samples(gpus) == {hgx[2].pk: (reading.utilization_pct, reading.memory_used_mb, reading.power_w)}


def test_an_unknown_source_is_a_configuration_error_naming_the_known_ones(world, settings):
    settings.METERING_TELEMETRY_SOURCES = {"huawei-ascend": "npu-smi"}
    with pytest.raises(ImproperlyConfigured, match="one of simulated, dcgm; got 'npu-smi'"):
        services.telemetry_collect(now=at("2026-11-30 10:00"))
