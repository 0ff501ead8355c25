"""The cycle places slices of MIG-capable models geometry-true: a request gets a GPU instance at a valid
placement (created by repartitioning, or a free one of a pinned layout), its record names the instance, a slice that
no placement can take waits with a `fragmentation` reason in MIG terms, and release destroys what was created."""

from datetime import timedelta
from decimal import Decimal
from types import SimpleNamespace

import pytest
import time_machine
from django.utils import timezone

from catalog.models import MigGeometry
from requests import services
from requests.choices import PriorityClass, RequestState
from scheduling import cycle
from scheduling.allocations import allocation_details
from scheduling.mig import SEEDED, layout_problems
from scheduling.mig import services as mig_services
from scheduling.models import Allocation, Device, MigInstance, Node
from tests import factories
from tests.module_data import shared_by_module
from tests.scheduling import test_cycle
from tests.scheduling.fake_nvidia_smi import FakeGpu, FakeHost
from tests.scheduling.inventory_helpers import active_request, allocate
from tests.scheduling.test_cycle import queued

pytestmark = pytest.mark.django_db
team = test_cycle.team  # the project, developer and approver of the cycle tests


@shared_by_module
def shop():
    accelerator = factories.AcceleratorModelFactory(memory_gb=80)
    accelerator.mig_geometry = MigGeometry.objects.get(name="H100 80GB")
    accelerator.save()
    specs = {}
    for name, fraction, memory, per_card in (("3g.40gb", "0.4286", 40, 2), ("4g.40gb", "0.5714", 40, 1)):
        profile = factories.SliceProfileFactory(
            accelerator=accelerator,
            name=name,
            kind="mig",
            compute_fraction=Decimal(fraction),
            memory_gb=memory,
            max_per_device=per_card,
        )
        specs[name] = factories.ResourceSpecFactory(
            accelerator_models=[accelerator], accelerator_count=1, slice_profile=profile, cpu_cores=2, memory_gb=8
        )
    whole = factories.ResourceSpecFactory(
        accelerator_models=[accelerator], accelerator_count=1, cpu_cores=2, memory_gb=8
    )
    image = factories.ImageFactory()
    service = factories.ServiceFactory(specs=[*specs.values(), whole], images=[image], max_duration_hours=168)
    return SimpleNamespace(service=service, whole=whole, specs=specs, image=image, accelerator=accelerator)


def h100_node(shop, cards=1, name="n7"):
    node = Node.objects.create(name=name, serial_number=f"sn-{name}", cpu_milli=64_000, memory_mib=512 * 1024)
    for index in range(cards):
        Device.objects.create(node=node, index=index, uuid=f"GPU-{name}-{index}", model=shop.accelerator, memory_gb=80)
    return node


def held_1g_at_0_and_4(shop):
    """One H100 whose 1g.10gb instances at memory slices 0 and 4 are held by running work: 6 slices and 5 compute
    slices free, 0.716 of the card by milli-share, yet no 3g.40gb placement (starts 0 or 4) is free."""
    node = h100_node(shop)
    device = node.devices.get()
    mig_services.device_mig_layout_report(
        device=device,
        mig_mode=True,
        instances=[{"profile": "1g.10gb", "start": 0, "gi_id": 1}, {"profile": "1g.10gb", "start": 4, "gi_id": 2}],
        source="nvidia-smi",
        actor=None,
    )
    holder = allocate(active_request(), [device], milli=284)
    MigInstance.objects.filter(device=device).update(allocation=holder)


def test_slices_get_valid_instances_and_the_record_names_them(shop, team, django_capture_on_commit_callbacks):
    h100_node(shop)
    three = queued(shop, team, spec=shop.specs["3g.40gb"])
    cycle.run_cycle()
    three.refresh_from_db()
    assert three.state != RequestState.QUEUED
    (instance,) = MigInstance.objects.all()
    # 3g.40gb at 4, not 0: 4g.40gb can only start at 0 and the workload may ask for it
    assert (instance.profile.name, instance.start, instance.size, instance.created_by_scheduler) == (
        "3g.40gb",
        4,
        4,
        True,
    )
    assert instance.allocation.request_id == three.pk
    assert Device.objects.get().mig_mode
    event = three.events.filter(code="allocated").get()
    assert "MIG 3g.40gb on gpu 0 of n7, memory slices 4–7, created for it by repartitioning" in event.message  # noqa: RUF001
    assert event.data["mig_instance"]["start"] == 4
    details = allocation_details(three)
    assert details["devices"][0]["mig_instance"]["profile"] == "3g.40gb"
    assert details["devices"][0]["milli"] == 428
    # a 4g.40gb fits next to it; then a whole card does not (the card holds running instances)
    four = queued(shop, team, spec=shop.specs["4g.40gb"])
    whole = queued(shop, team, spec=shop.whole)
    cycle.run_cycle()
    four.refresh_from_db()
    whole.refresh_from_db()
    assert four.state != RequestState.QUEUED and whole.state == RequestState.QUEUED
    assert sorted(MigInstance.objects.values_list("profile__name", "start")) == [("3g.40gb", 4), ("4g.40gb", 0)]
    assert Device.objects.get().allocated_milli == 999
    # release destroys the instance the scheduler made
    with django_capture_on_commit_callbacks(execute=True):
        services.request_release(request=three, actor=team.developer, reason="done")
    three.refresh_from_db()
    assert three.state == RequestState.RELEASED
    assert list(MigInstance.objects.values_list("profile__name", flat=True)) == ["4g.40gb"]


def test_no_valid_placement_waits_with_a_mig_reason(shop, team):
    held_1g_at_0_and_4(shop)
    waiting = queued(shop, team, spec=shop.specs["3g.40gb"])
    cycle.run_cycle()
    waiting.refresh_from_db()
    assert waiting.state == RequestState.QUEUED
    assert waiting.queue_reason["code"] == "fragmentation"
    assert waiting.queue_reason["numbers"]["free_memory_slices"] == [1, 2, 3, 5, 6, 7]
    assert waiting.queue_reason["message"] == (
        "needs 3g.40gb; gpu 0 on node n7 has free memory slices 1–3 and 5–7, no valid 3g placement (starts 0 or 4)"  # noqa: RUF001
    )


def test_a_pinned_layout_is_used_as_it_is(shop, team):
    node = h100_node(shop)
    mig_services.device_mig_layout_report(
        device=node.devices.get(),
        mig_mode=True,
        instances=[{"profile": "3g.40gb", "start": 0, "gi_id": 2, "uuid": "MIG-pinned-0"}],
        source="nvidia-smi",
        actor=None,
    )
    mig_services.node_mig_pin(node=node, reason="fixed inference layout", actor=None)
    four = queued(shop, team, spec=shop.specs["4g.40gb"])
    three = queued(shop, team, spec=shop.specs["3g.40gb"])
    cycle.run_cycle()
    four.refresh_from_db()
    three.refresh_from_db()
    assert four.state == RequestState.QUEUED  # no 4g instance exists and none is created on a pinned node
    assert three.state != RequestState.QUEUED
    (instance,) = MigInstance.objects.all()
    assert instance.uuid == "MIG-pinned-0" and instance.allocation.request_id == three.pk
    assert not instance.created_by_scheduler


def test_provisioning_creates_the_instance_and_binds_the_work_to_its_mig_uuid(
    shop, team, django_capture_on_commit_callbacks
):
    h100_node(shop)
    request = queued(shop, team, spec=shop.specs["3g.40gb"])
    with django_capture_on_commit_callbacks(execute=True):
        cycle.run_cycle()
    request.refresh_from_db()
    assert request.state == RequestState.ACTIVE
    instance = MigInstance.objects.get()
    assert instance.uuid.startswith("MIG-") and (instance.gi_id, instance.ci_id) == (5, 0)
    start = request.provisioning_runs.get().steps.get(name="start_workload")
    assert start.output["devices"] == [instance.uuid]  # NVIDIA_VISIBLE_DEVICES / the MIG GRES bind this
    (created,) = start.output["mig_instances"]
    assert created["commands"] == [  # the card was in whole mode: MIG mode first, then the instance
        ["nvidia-smi", "-i", "0", "-mig", "1"],
        ["nvidia-smi", "mig", "-i", "0", "-cgi", "9:4", "-C"],
        ["nvidia-smi", "-L"],
    ]
    host = FakeHost(FakeGpu(0, SEEDED["H100 80GB"]))
    host.run_all(created["commands"])
    assert host.gpus[0].layout() == [("3g.40gb", 4, 4)]
    assert allocation_details(request)["devices"][0]["mig_instance"]["uuid"] == instance.uuid


def test_a_slice_over_instances_left_by_earlier_work_destroys_them_before_creating(
    shop, team, django_capture_on_commit_callbacks
):
    """1g.10gb instances at memory slices 0-6 left by earlier work, the one at 0 running. A 2g.20gb order goes to
    start 2 or 4: the host's plan destroys the two idle 1g instances there (by GPU instance id) before it creates
    the 2g, and the stored layout never holds both. The plan runs on a fake card that refuses what a real one does."""
    device = h100_node(shop).devices.get()
    mig_services.device_mig_layout_report(
        device=device,
        mig_mode=True,
        instances=[{"profile": "1g.10gb", "start": s, "gi_id": s + 1, "ci_id": 0} for s in range(7)],
        source="nvidia-smi",
        actor=None,
    )
    holder = allocate(active_request(), [device], milli=142)
    MigInstance.objects.filter(device=device, start=0).update(allocation=holder)
    host = FakeHost(FakeGpu(0, SEEDED["H100 80GB"], mig_mode=True))
    for s in range(7):
        host.add_instance(0, "1g.10gb", s, gi_id=s + 1, processes=1 if s == 0 else 0)
    profile = factories.SliceProfileFactory(
        accelerator=shop.accelerator,
        name="2g.20gb",
        kind="mig",
        compute_fraction=Decimal("0.2857"),
        memory_gb=20,
        max_per_device=3,
    )
    spec = factories.ResourceSpecFactory(
        accelerator_models=[shop.accelerator], accelerator_count=1, slice_profile=profile, cpu_cores=2, memory_gb=8
    )
    shop.service.specs.add(spec)
    request = queued(shop, team, spec=spec)
    with django_capture_on_commit_callbacks(execute=True):
        cycle.run_cycle()
    request.refresh_from_db()
    assert request.state == RequestState.ACTIVE, request.queue_reason
    start = MigInstance.objects.get(allocation__request=request).start
    assert start in (2, 4)
    stored = sorted(MigInstance.objects.filter(device=device).values_list("profile__name", "start", "size"))
    assert stored == sorted(
        [*(("1g.10gb", s, 1) for s in range(7) if s not in (start, start + 1)), ("2g.20gb", start, 2)]
    )
    assert layout_problems(SEEDED["H100 80GB"], stored) == []
    (done,) = request.provisioning_runs.get().steps.get(name="start_workload").output["mig_instances"]
    assert [gone["gi_id"] for gone in done["destroyed"]] == [start + 1, start + 2]
    host.run_all(done["commands"])
    assert host.gpus[0].layout() == stored


def test_a_spec_of_two_slices_gets_two_instances_on_two_cards(shop, team):
    h100_node(shop, cards=2)
    profile = shop.specs["3g.40gb"].slice_profile
    pair = factories.ResourceSpecFactory(
        accelerator_models=[shop.accelerator], accelerator_count=2, slice_profile=profile, cpu_cores=2, memory_gb=8
    )
    shop.service.specs.add(pair)
    request = queued(shop, team, spec=pair)
    cycle.run_cycle()
    request.refresh_from_db()
    assert request.state != RequestState.QUEUED, request.queue_reason
    rows = list(MigInstance.objects.order_by("device__index").values_list("device__index", "profile__name", "start"))
    assert [(gpu, name) for gpu, name, _start in rows] == [(0, "3g.40gb"), (1, "3g.40gb")]
    event = request.events.filter(code="allocated").get()
    assert len(event.data["mig_instances"]) == 2


def test_a_high_priority_slice_preempts_the_batch_slice_whose_instance_frees_its_placement(shop, team):
    """Two batch 3g.40gb on one H100 (at 4, then 0). A high 4g.40gb can start only at 0 and needs 4 compute slices:
    evicting the 3g at 0 frees both; the 3g at 4 would free as much memory and compute but no 4g start."""
    h100_node(shop)
    first, second = (queued(shop, team, spec=shop.specs["3g.40gb"], priority=PriorityClass.BATCH) for _ in "12")
    cycle.run_cycle()
    starts = dict(MigInstance.objects.values_list("allocation__request_id", "start"))
    assert starts == {first.pk: 4, second.pk: 0}
    start = timezone.now()
    high = queued(shop, team, spec=shop.specs["4g.40gb"], priority=PriorityClass.HIGH)
    with time_machine.travel(start, tick=False):
        result = cycle.run_cycle()
    assert result.waiting[high.pk] == "preemption_pending"
    scheduled = Allocation.objects.filter(state="active", preempt_at__isnull=False)
    assert list(scheduled.values_list("request_id", "preempted_for_id")) == [(second.pk, high.pk)]
    with time_machine.travel(start + timedelta(seconds=601), tick=False):  # the high-over-batch rule's grace
        result = cycle.run_cycle()
    assert result.preempted == [second.pk] and high.pk in result.allocated
    assert dict(MigInstance.objects.values_list("allocation__request_id", "profile__name")) == {
        first.pk: "3g.40gb",
        high.pk: "4g.40gb",
    }
    assert MigInstance.objects.get(allocation__request=high).start == 0


def test_slices_and_whole_cards_are_placed_in_one_priority_order(shop, team):
    """One H100: a batch 3g.40gb queued first and a high whole card after it. The high one goes first (MIG slices
    used to be placed before every other demand); the slice then finds the card taken."""
    h100_node(shop)
    slice_request = queued(shop, team, spec=shop.specs["3g.40gb"], priority=PriorityClass.BATCH)
    whole = queued(shop, team, spec=shop.whole, priority=PriorityClass.HIGH)
    result = cycle.run_cycle()
    assert result.allocated == [whole.pk]
    assert result.waiting == {slice_request.pk: "capacity_in_use"}
    assert not MigInstance.objects.exists() and not Device.objects.get().mig_mode


def test_slices_leave_an_empty_card_to_the_whole_card_request_waiting_behind_them(shop, team):
    """Two H100s, three 3g.40gb orders and then a whole-card order. Placed as they come, the slices would partition
    both cards and the whole card would wait. While whole-card work waits, the partition budget gives the slices
    their share of the waiting demand (1.3 of 2.3 cards): one card; the third slice waits, saying why."""
    h100_node(shop, cards=2)
    slices = [queued(shop, team, spec=shop.specs["3g.40gb"]) for _ in range(3)]
    whole = queued(shop, team, spec=shop.whole)
    cycle.run_cycle()
    for request in [*slices, whole]:
        request.refresh_from_db()
    assert whole.state != RequestState.QUEUED
    assert [request.state != RequestState.QUEUED for request in slices] == [True, True, False]
    reason = slices[2].queue_reason
    assert reason["code"] == "capacity_in_use" and "partition budget 1" in reason["message"], reason
    assert reason["numbers"]["partitioned"] == 1


def test_with_no_whole_card_request_waiting_slices_take_every_card(shop, team):
    h100_node(shop, cards=2)
    slices = [queued(shop, team, spec=shop.specs["3g.40gb"]) for _ in range(4)]
    cycle.run_cycle()
    for request in slices:
        request.refresh_from_db()
    assert all(request.state != RequestState.QUEUED for request in slices)
