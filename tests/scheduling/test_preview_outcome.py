"""The order preview estimates against what the last cycle left, not by placing the whole queue again."""

import copy
import json
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from requests.choices import RequestState
from requests.models import ResourceRequest
from scheduling import cycle, estimate
from scheduling.models import CycleOutcome
from tenancy.choices import PriorityClass
from tests.scheduling import test_cycle
from tests.scheduling.test_cycle import add_node, queued

pytestmark = pytest.mark.django_db
shop, team = test_cycle.shop, test_cycle.team  # the fixtures of the cycle's tests
PREVIEW = "/api/v1/requests/preview/"


def order_body(shop, team, spec=None, duration_hours=10) -> dict:
    return {
        "service": shop.service.pk,
        "project": team.project.pk,
        "spec": (spec or shop.whole).pk,
        "image": shop.image.pk,
        "duration_hours": duration_hours,
    }


def copies(request: ResourceRequest, count: int) -> None:
    """`count` more queued requests like `request` (same frozen snapshot), in one statement."""
    template = ResourceRequest.objects.get(pk=request.pk)
    rows = []
    for _ in range(count):
        row = copy.copy(template)
        row.pk, row.queue_position, row.queue_reason = None, None, {}  # not seen by a cycle yet
        rows.append(row)
    ResourceRequest.objects.bulk_create(rows)


def still_queued() -> ResourceRequest:
    return ResourceRequest.objects.filter(state=RequestState.QUEUED).first()


@pytest.fixture
def placed_demands(monkeypatch):
    """The queued requests the preview turned into engine demands (its work, whatever the clock says)."""
    seen = []
    original = estimate.demand_of

    def counting(request):
        seen.append(request.pk)
        return original(request)

    monkeypatch.setattr(estimate, "demand_of", counting)
    return seen


def test_the_preview_does_not_place_again_what_the_last_cycle_saw(shop, team, api_as, placed_demands):
    add_node(shop.accelerator, name="only", cards=2)
    first = queued(shop, team)  # takes both cards
    copies(first, 300)  # wait
    cycle.run_cycle()
    copies(still_queued(), 1)  # queued after the cycle: the preview places it ahead of the order
    newcomer = ResourceRequest.objects.get(state=RequestState.QUEUED, queue_position__isnull=True)
    preview = api_as(team.developer).post(PREVIEW, order_body(shop, team), format="json").json()["placement"]
    assert placed_demands == [newcomer.pk]
    assert (preview["fits_now"], preview["code"], preview["queued_ahead"]) == (False, "capacity_in_use", 301)


def test_a_process_reads_the_rows_queued_since_the_cycle_once(shop, team, api_as):
    """While a backlog waits for the next cycle every preview places the same requests: the first preview reads
    their rows (the frozen snapshots), the next ones only their ids, priorities and times from the index."""
    add_node(shop.accelerator, name="only", cards=2)
    queued(shop, team), queued(shop, team)
    cycle.run_cycle()  # the first holds both cards, the second waits
    copies(still_queued(), 3)
    client = api_as(team.developer)

    def preview_and_snapshots_read():
        with CaptureQueriesContext(connection) as captured:
            answer = client.post(PREVIEW, order_body(shop, team), format="json").json()["placement"]
        answer.pop("age_seconds")
        return answer, sum('"approved_spec"' in query["sql"] for query in captured.captured_queries)

    first, snapshots_first = preview_and_snapshots_read()
    second, snapshots_second = preview_and_snapshots_read()
    assert (snapshots_first, snapshots_second) == (1, 0)
    assert second == first and first["queued_ahead"] == 4


def test_a_kept_unseen_row_is_read_again_when_its_priority_or_time_is_not_the_kept_one(shop, team):
    add_node(shop.accelerator, name="only", cards=2)
    queued(shop, team), queued(shop, team)
    cycle.run_cycle()
    copies(still_queued(), 1)
    newcomer = ResourceRequest.objects.get(state=RequestState.QUEUED, queue_position__isnull=True)
    rows = estimate.UnseenRows()
    assert rows.rows([(newcomer.pk, newcomer.priority, newcomer.created_at)])[0].priority == PriorityClass.STANDARD
    ResourceRequest.objects.filter(pk=newcomer.pk).update(priority=PriorityClass.HIGH)
    assert rows.rows([(newcomer.pk, PriorityClass.HIGH, newcomer.created_at)])[0].priority == PriorityClass.HIGH
    later = newcomer.created_at + timedelta(seconds=1)  # the id used again by another request (a flushed database)
    ResourceRequest.objects.filter(pk=newcomer.pk).update(created_at=later)
    assert rows.rows([(newcomer.pk, PriorityClass.HIGH, later)])[0].created_at == later
    assert rows.rows([(newcomer.pk + 1, PriorityClass.HIGH, later)]) == []  # gone since its id was read
    ResourceRequest.objects.filter(pk=newcomer.pk).delete()  # gone, its kept row under an older priority
    assert rows.rows([(newcomer.pk, PriorityClass.CRITICAL, later)]) == []


def test_the_preview_says_how_old_its_picture_is(shop, team, api_as, client):
    add_node(shop.accelerator, name="only", cards=2)
    body = order_body(shop, team)
    before = api_as(team.developer).post(PREVIEW, body, format="json").json()["placement"]
    assert (before["fits_now"], before["as_of"], before["age_seconds"]) == (True, None, None)  # no cycle yet
    cycle.run_cycle()
    CycleOutcome.objects.update(finished_at=timezone.now() - timedelta(seconds=42))
    after = api_as(team.developer).post(PREVIEW, body, format="json").json()["placement"]
    assert after["fits_now"] is True and after["node"] == "only"
    assert 42 <= after["age_seconds"] < 60 and after["as_of"]
    client.force_login(team.developer)
    form = {**body, "priority": "standard", "environment": "development", "justification": "", "over_quota": "reject"}
    page = client.post(f"/order/{shop.service.slug}/preview/", form).content.decode()
    assert "as of the last cycle, 4" in page  # 42 s or a little more


def test_the_preview_counts_what_the_cycle_placed(shop, team, api_as):
    add_node(shop.accelerator, name="only", cards=2)
    queued(shop, team)
    cycle.run_cycle()  # the request now holds both cards
    preview = api_as(team.developer).post(PREVIEW, order_body(shop, team), format="json").json()["placement"]
    assert (preview["fits_now"], preview["code"], preview["queued_ahead"]) == (False, "capacity_in_use", 0)


def test_the_preview_respects_the_head_of_line_reservation(shop, team, api_as):
    """Two cards, one slice running for 5 hours: a two-card request waits for it (the head holds the node from
    then on); a 10-hour slice would still run then, a 1-hour one would not."""
    add_node(shop.accelerator, name="only", cards=2)
    queued(shop, team, spec=shop.sliced, duration_hours=5)
    cycle.run_cycle()
    queued(shop, team)  # two cards: waits for the slice
    cycle.run_cycle()
    assert CycleOutcome.objects.get().reservation["node"] == "only"
    long, short = (
        api_as(team.developer)
        .post(PREVIEW, order_body(shop, team, spec=shop.sliced, duration_hours=hours), format="json")
        .json()["placement"]
        for hours in (10, 1)
    )
    assert (long["fits_now"], long["code"], long["details"]["node"]) == (False, "higher_priority_ahead", "only")
    assert short["fits_now"] is True


def test_a_preview_leaves_the_cycle_outcome_as_it_was(shop, team, api_as):
    """Six cards: the cycle placed one request (2), one queued since takes 2 more in the preview, the order fits on
    the last 2. Had the first preview kept what it placed, the second would find no room for the order."""
    add_node(shop.accelerator, name="only", cards=6)
    queued(shop, team)
    cycle.run_cycle()
    queued(shop, team)  # since the cycle
    client = api_as(team.developer)
    answers = [client.post(PREVIEW, order_body(shop, team), format="json").json()["placement"] for _ in range(2)]
    assert (answers[0]["fits_now"], answers[0]["queued_ahead"]) == (True, 1)
    assert answers[1] == answers[0]


def test_the_preview_picks_up_the_next_cycle_outcome(shop, team, api_as):
    """After a new cycle the preview starts from its outcome, not from the one this process read before."""
    add_node(shop.accelerator, name="only", cards=6)
    queued(shop, team)
    cycle.run_cycle()
    client = api_as(team.developer)
    before = client.post(PREVIEW, order_body(shop, team), format="json").json()["placement"]
    queued(shop, team), queued(shop, team)
    cycle.run_cycle()  # both placed: all six cards in use
    after = client.post(PREVIEW, order_body(shop, team), format="json").json()["placement"]
    assert (before["fits_now"], before["queued_ahead"]) == (True, 0)
    assert (after["fits_now"], after["code"], after["queued_ahead"]) == (False, "capacity_in_use", 0)
    assert after["as_of"] > before["as_of"]


@pytest.mark.parametrize("waiting", [2, 1000])
def test_preview_query_count_does_not_grow_with_the_queue(shop, team, api_as, waiting, django_assert_max_num_queries):
    add_node(shop.accelerator, name="only", cards=2)
    first = queued(shop, team)
    copies(first, waiting)
    cycle.run_cycle()
    copies(still_queued(), 1)  # one queued since the cycle
    client = api_as(team.developer)
    with django_assert_max_num_queries(PREVIEW_QUERIES):
        response = client.post(PREVIEW, order_body(shop, team), format="json")
    assert response.status_code == 200 and response.json()["placement"]["queued_ahead"] == waiting + 1


PREVIEW_QUERIES = 26  # the whole API preview (auth, catalog, quota, route, placement): the same at 3 or 1,001 queued


def test_the_outcome_writes_each_make_of_node_once_and_reads_back_the_cluster_the_cycle_left():
    from scheduling import outcome
    from scheduling.engine import Binding, DeviceView, NodeView, PlacementEngine, RunningAllocation, Snapshot

    h100 = tuple(DeviceView(i, "H100", memory_mib=81920, slice_profiles={"1g.10gb": 143}) for i in range(2))
    nodes = [
        NodeView("a1", 32000, 262144, h100),
        NodeView("a2", 32000, 262144, h100),
        NodeView("b", 16000, 131072, (DeviceView(0, "A10", memory_mib=24576),), schedulable=False),
    ]
    running = RunningAllocation("7", "a1", ((0, 500),), 1000, 2048)
    placed = Binding("8", "a2", ((1, 1000),), 2000, 4096)
    stored = json.loads(json.dumps(outcome._in_use(Snapshot(nodes, [running]), [placed])))
    assert len(stored["kinds"]) == 2 and len(stored["nodes"]) == 3

    engine = outcome._decode(CycleOutcome(finished_at=timezone.now(), nodes=stored, waiting={})).engine
    held = RunningAllocation("8", "a2", placed.devices, placed.cpu_milli, placed.memory_mib)
    built = PlacementEngine(Snapshot(nodes, [running, held]))
    assert engine.nodes == nodes
    assert (engine.cpu, engine.mem, engine.free) == (built.cpu, built.mem, built.free)
