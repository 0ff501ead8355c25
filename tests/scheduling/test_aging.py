"""Aging: a low-priority request under a steady stream of higher-priority work is placed eventually."""

from datetime import timedelta

import pytest
import time_machine
from django.utils import timezone

from requests.choices import PriorityClass, RequestState
from requests.models import ResourceRequest
from requests.services import request_release
from scheduling import cycle, reclaim
from tests.scheduling.test_cycle import add_node, queued, shop, team  # noqa: F401 - fixtures

pytestmark = pytest.mark.django_db
TICK = timedelta(minutes=30)


def ticks_until_placed(shop, team, ticks: int) -> int | None:  # noqa: F811
    """One two-card node; a batch request for both cards, then every tick the running work ends and two new
    standard one-card requests arrive before the cycle. The tick the batch request was placed at, or None."""
    add_node(shop.accelerator, cards=2)
    start = timezone.now()
    with time_machine.travel(start, tick=False) as clock:
        low = queued(shop, team, priority=PriorityClass.BATCH, spec=None)
        for tick in range(1, ticks + 1):
            clock.move_to(start + tick * TICK)
            running = list(ResourceRequest.objects.filter(state=RequestState.ALLOCATED).values_list("pk", flat=True))
            for pk in running:
                request_release(request=ResourceRequest.objects.get(pk=pk), actor=None, reason="ended")
            reclaim.allocation_free(request_ids=running, reason="ended")
            for _ in range(2):
                queued(shop, team, spec=shop.one_card)
            if low.pk in cycle.run_cycle().allocated:
                return tick
    return None


@pytest.fixture
def one_card(shop):  # noqa: F811
    from tests import factories

    shop.one_card = factories.ResourceSpecFactory(
        accelerator_models=[shop.accelerator], accelerator_count=1, cpu_cores=4, memory_gb=32
    )
    shop.service.specs.add(shop.one_card)
    return shop


def test_without_aging_the_stream_starves_the_batch_request(one_card, team, settings):  # noqa: F811
    settings.SCHEDULER_AGING_MINUTES = 0
    assert ticks_until_placed(one_card, team, ticks=6) is None


def test_with_aging_the_batch_request_is_placed_within_the_bound(one_card, team, settings):  # noqa: F811
    settings.SCHEDULER_AGING_MINUTES = 60
    # Batch -> standard after 60 minutes (tick 2): older than every standard request then, so first in order.
    assert ticks_until_placed(one_card, team, ticks=6) == 2


def test_aged_rank_climbs_one_class_per_step_up_to_high(settings):
    settings.SCHEDULER_AGING_MINUTES = 60
    now = timezone.now()
    ranks = [cycle.aged_rank(PriorityClass.BATCH, now - timedelta(minutes=m), now) for m in (0, 59, 60, 120, 600)]
    assert ranks == [10, 10, 50, 80, 80]
    assert cycle.aged_rank(PriorityClass.CRITICAL, now - timedelta(days=1), now) == 100
