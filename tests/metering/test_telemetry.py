"""Telemetry: the simulated driver's curves, the collector, and daily rollups (energy, percentiles) by hand."""

from datetime import date, timedelta

import pytest

from catalog.choices import ServiceKind
from metering import services
from metering.models import DailyUsage, TelemetrySample
from metering.telemetry import INTERACTIVE, TRAINING, UNDERUSED, Binding, SimulatedDriver, workload_of
from tests.metering.conftest import at, bound

pytestmark = pytest.mark.django_db


def binding(allocation_id=1, position=0, kind=ServiceKind.COMPUTE, milli=1000, workload="") -> Binding:
    return Binding(allocation_id, 10 + position, f"GPU-{position}", "node-1", position, 80, milli, kind, workload)


def allocation_of(workload: str) -> int:
    return next(n for n in range(1, 100) if workload_of(binding(allocation_id=n)) == workload)


def test_simulated_readings_repeat_for_the_same_binding_and_instant():
    driver, instant = SimulatedDriver(), at("2026-11-30 10:00")
    assert driver.read([binding()], instant).readings == driver.read([binding()], instant).readings
    assert driver.read([binding()], instant).readings != driver.read([binding()], at("2026-11-30 10:01")).readings


def test_simulated_workloads_look_like_their_habits():
    driver, instant = SimulatedDriver(), at("2026-11-30 10:00")
    [training] = driver.read([binding(allocation_of(TRAINING))], instant).readings
    assert training.utilization_pct > 80 and training.memory_used_mb > 0.75 * 80 * 1024
    underused = allocation_of(UNDERUSED)
    busy, idle = driver.read([binding(underused, 0), binding(underused, 1)], instant).readings
    assert busy.utilization_pct > 60 > 5 > idle.utilization_pct and idle.power_w < busy.power_w
    assert workload_of(binding(kind=ServiceKind.MODEL_SERVING)) == "inference"
    assert workload_of(binding(kind=ServiceKind.BARE_METAL)) == TRAINING
    assert INTERACTIVE in {workload_of(binding(allocation_id=n)) for n in range(1, 50)}


def test_a_workload_declared_on_the_order_is_followed():
    assert {workload_of(binding(allocation_id=n, workload=UNDERUSED)) for n in range(1, 20)} == {UNDERUSED}
    assert workload_of(binding(kind=ServiceKind.MODEL_SERVING, workload="nonsense")) == "inference"


def test_a_share_of_a_card_gets_its_share_of_memory_and_power():
    driver, instant = SimulatedDriver(), at("2026-11-30 10:00")
    [whole] = driver.read([binding(milli=1000)], instant).readings
    [half] = driver.read([binding(milli=500)], instant).readings
    assert half.utilization_pct == whole.utilization_pct
    assert half.power_w == pytest.approx(whole.power_w / 2, abs=0.01)
    assert half.memory_used_mb == pytest.approx(whole.memory_used_mb / 2, abs=1)


def test_collector_samples_every_running_binding_once_per_interval(world):
    running = bound(world, started=at("2026-11-30 09:00"))
    bound(world, spec=world.half, started=at("2026-11-29 09:00"), released=at("2026-11-29 10:00"))
    report = services.telemetry_collect(now=at("2026-11-30 10:00") + timedelta(seconds=17))
    assert (report.instant, report.samples, report.errors) == (at("2026-11-30 10:00"), 2, [])
    services.telemetry_collect(now=at("2026-11-30 10:00") + timedelta(seconds=42))  # same interval: nothing new
    samples = TelemetrySample.objects.order_by("device__index")
    assert [(sample.allocation_id, sample.sampled_at) for sample in samples] == [
        (running.pk, at("2026-11-30 10:00"))
    ] * 2


def sample(allocation, device, minute, *, utilization=0.0, memory=0, power=0.0, base="2026-11-30 10:00"):
    return TelemetrySample(
        allocation=allocation,
        device=device,
        sampled_at=at(base) + timedelta(minutes=minute),
        utilization_pct=utilization,
        memory_used_mb=memory,
        power_w=power,
    )


def test_rollup_adds_devices_per_instant_and_summarises_the_day(world):
    allocation = bound(world, started=at("2026-11-30 09:00"))
    first, second = world.node.devices.order_by("index")[:2]
    TelemetrySample.objects.bulk_create(
        [sample(allocation, first, i, utilization=i + 1, memory=1000 * (i + 1), power=300) for i in range(20)]
        + [sample(allocation, second, i, power=100) for i in range(20)]
    )
    assert services.telemetry_rollup(first_day=date(2026, 11, 30), now=at("2026-11-30 12:00")) == 1
    day = DailyUsage.objects.get()
    assert (day.day, day.accelerator_model_id, day.samples, day.device_samples) == (
        date(2026, 11, 30),
        world.model.pk,
        20,
        40,
    )
    assert day.mean_utilization_pct == 210 / 40
    assert day.busy_cards_p95 == pytest.approx(0.19)  # nearest rank: the 19th of 20 instants
    assert (day.memory_p95_mb, day.memory_max_mb, day.mean_memory_mb) == (19000, 20000, 10500)
    assert day.energy_kwh == pytest.approx((19 * 60 * 300 + 19 * 60 * 100) / 3.6e6)  # 19 one-minute trapezoids
    services.telemetry_rollup(first_day=date(2026, 11, 30), now=at("2026-11-30 12:00"))
    assert DailyUsage.objects.get().energy_kwh == day.energy_kwh  # recomputed, not added


def test_energy_between_two_days_goes_to_the_later_one_and_gaps_are_not_integrated(world):
    allocation = bound(world, spec=world.half, started=at("2026-11-29 09:00"))
    [device] = world.node.devices.order_by("index")[:1]
    TelemetrySample.objects.bulk_create(
        [
            sample(allocation, device, 0, power=360, base="2026-11-29 23:59"),
            sample(allocation, device, 1, power=360, base="2026-11-29 23:59"),  # midnight: 60 s x 360 W on the 30th
            sample(allocation, device, 45, power=500, base="2026-11-29 23:59"),  # 44 minutes later: a gap
        ]
    )
    services.telemetry_rollup(first_day=date(2026, 11, 29), now=at("2026-11-30 12:00"))
    energy = dict(DailyUsage.objects.values_list("day", "energy_kwh"))
    assert energy == {date(2026, 11, 29): 0, date(2026, 11, 30): pytest.approx(360 * 60 / 3.6e6)}


def test_prune_keeps_the_retention_and_never_less_than_two_days(world, settings):
    allocation = bound(world, spec=world.half, started=at("2026-11-01 00:00"))
    [device] = world.node.devices.order_by("index")[:1]
    TelemetrySample.objects.bulk_create(
        [sample(allocation, device, 0, base=f"2026-11-{day:02d} 10:00") for day in (20, 25, 28, 29)]
    )
    settings.METERING_SAMPLE_RETENTION_DAYS = 7
    assert services.telemetry_prune(now=at("2026-11-30 12:00")) == 1  # before Nov 23
    settings.METERING_SAMPLE_RETENTION_DAYS = 0
    assert services.telemetry_prune(now=at("2026-11-30 12:00")) == 1  # before Nov 28
    assert TelemetrySample.objects.count() == 2


def test_telemetry_refresh_rolls_up_yesterday_and_today_then_prunes(world):
    allocation = bound(world, spec=world.half, started=at("2026-11-01 00:00"))
    [device] = world.node.devices.order_by("index")[:1]
    TelemetrySample.objects.bulk_create(
        [sample(allocation, device, 0, base=f"2026-11-{day:02d} 10:00") for day in (1, 29, 30)]
    )
    assert services.telemetry_refresh(now=at("2026-11-30 12:00")) == {"rollup_rows": 2, "pruned": 1}
    assert sorted(DailyUsage.objects.values_list("day", flat=True)) == [date(2026, 11, 29), date(2026, 11, 30)]
