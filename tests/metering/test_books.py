"""The usage report's reserved-but-idle hours (advance reservations held with nothing running) and Slurm's books
against the platform's meter: the figures, who sees what (role matrix over both endpoints and the page), and query
counts that do not grow with the rows. Reading Slurm's books from a real slurmdbd is in
tests/provisioning/test_slurm_books.py."""

import re
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from metering.books.services import platform_card_hours, slurm_books_reconcile
from metering.models import SlurmBooks
from requests.models import ResourceRequest
from scheduling.models import Allocation
from tests import factories
from tests.metering.conftest import at, bound

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("frozen")]

BOOKS, RESERVED_IDLE, PAGE = "/api/v1/usage/slurm-books/", "/api/v1/usage/reserved-idle/", "/usage/"
ENDPOINTS = [BOOKS, RESERVED_IDLE]


def reservation(world, project, *, start: str, released: str | None, workload_started: str | None = None):
    """An advance reservation of the whole-card spec (2 cards) for a window starting at `start`, bound then (as the
    scheduler binds it at the window's start), its workload started at `workload_started` (never: a no-show) and
    released at `released` (still held: None)."""
    allocation = bound(world, project=project, started=at(start), released=at(released) if released else None)
    ResourceRequest.objects.filter(pk=allocation.request_id).update(reserved_start=at(start))
    Allocation.objects.filter(pk=allocation.pk).update(
        workload_started_at=at(workload_started) if workload_started else None
    )
    return allocation


def books_of(allocation: Allocation, *, slurm: float, platform: float, job_id: int = 4242) -> SlurmBooks:
    Allocation.objects.filter(pk=allocation.pk).update(slurm_job_id=job_id)
    return SlurmBooks.objects.create(
        request_id=allocation.request_id,
        jobs=[{"job_id": job_id, "state": "COMPLETED", "gpus": 2}],
        slurm_card_hours=slurm,
        platform_card_hours=platform,
        difference_card_hours=round(slurm - platform, 4),
        final=True,
        read_at=timezone.now(),
    )


def kept_books(world, project) -> None:
    """What each project of the role matrix holds: a no-show reservation, and a request Slurm's books were read for."""
    reservation(world, project, start="2026-11-10 10:00", released="2026-11-10 10:30")
    books_of(
        bound(world, project=project, started=at("2026-11-11 08:00"), released=at("2026-11-11 09:00")),
        slurm=2.0,
        platform=2.0,
    )


def test_reserved_but_idle_hours_of_a_no_show_and_of_a_late_start(api_as, world):
    reservation(world, world.project, start="2026-11-10 10:00", released="2026-11-10 10:30")  # no-show: released
    reservation(  # its workload started a quarter of an hour into the window, held until noon
        world, world.project, start="2026-11-10 11:00", released="2026-11-10 12:00", workload_started="2026-11-10 11:15"
    )
    bound(world, started=at("2026-11-10 08:00"), released=at("2026-11-10 09:00"))  # no reservation: not counted
    body = api_as(world.project.lead).get(RESERVED_IDLE, {"from": "2026-11"}).json()
    assert body == [
        {
            "project": world.project.slug,
            "reservations": 2,
            "reserved_card_hours": 3.0,  # 2 cards x (0.5 h + 1 h)
            "reserved_idle_card_hours": 1.5,  # 2 cards x (0.5 h + 0.25 h)
        }
    ]
    assert api_as(world.project.lead).get(RESERVED_IDLE, {"from": "2026-10", "to": "2026-10"}).json() == []


def test_a_no_show_still_held_counts_as_idle_up_to_now(api_as, world, frozen):
    reservation(world, world.project, start="2026-11-20 11:00", released=None)
    [row] = api_as(world.project.lead).get(RESERVED_IDLE).json()
    assert (row["reserved_card_hours"], row["reserved_idle_card_hours"]) == (2.0, 2.0)  # 1 h x 2 cards until noon


def test_slurm_books_per_request_with_the_difference(api_as, world):
    request = books_of(
        bound(world, started=at("2026-11-11 08:00"), released=at("2026-11-11 09:00")), slurm=1.5, platform=2.0
    ).request
    assert api_as(world.project.lead).get(BOOKS, {"from": "2026-11"}).json() == [
        {
            "request": request.pk,
            "project": world.project.slug,
            "jobs": [4242],
            "slurm_card_hours": 1.5,
            "platform_card_hours": 2.0,
            "difference_card_hours": -0.5,
            "final": True,
            "read_at": "2026-11-20T12:00:00Z",
        }
    ]
    assert api_as(world.project.lead).get(BOOKS, {"from": "2026-09", "to": "2026-10"}).json() == []


def cells(page: str, table: str) -> list[list[str]]:
    [body] = re.findall(rf'<table id="{table}".*?<tbody>(.*?)</tbody>', page, re.S)
    return [re.findall(r"<td[^>]*>(.*?)</td>", row, re.S) for row in re.findall(r"<tr[^>]*>(.*?)</tr>", body, re.S)]


def test_the_usage_page_shows_reserved_idle_per_project_and_the_books_per_request(client, world):
    reservation(world, world.project, start="2026-11-10 10:00", released="2026-11-10 10:30")
    books = books_of(
        bound(world, started=at("2026-11-11 08:00"), released=at("2026-11-11 09:00")), slurm=2.75, platform=2.0
    )
    client.force_login(world.project.lead)
    page = client.get(PAGE).content.decode()
    assert cells(page, "reserved-idle-by-project") == [[str(world.project), "1", "1", "1"]]
    [row] = cells(page, "slurm-books-by-request")
    assert row[0] == f'<a href="/requests/{books.request_id}/">#{books.request_id}</a>'
    assert row[2:7] == ["4242", "2.7500", "2.0000", "0.7500", "2026-11-20 12:00"]


def test_the_operator_console_shows_the_books_largest_difference_first(client, world):
    small = books_of(bound(world, started=at("2026-11-11 08:00"), released=at("2026-11-11 09:00")), slurm=2, platform=2)
    large = books_of(bound(world, started=at("2026-11-12 08:00"), released=at("2026-11-12 09:00")), slurm=1, platform=2)
    client.force_login(factories.operator())
    listing = client.get("/admin/metering/slurmbooks/").content.decode()
    assert listing.index(f"#{large.request_id}") < listing.index(f"#{small.request_id}")
    assert "-1.0000" in listing
    report = client.get("/admin/metering/dailyusage/report/").content.decode()
    assert 'id="slurm-books-by-request"' in report and 'id="reserved-idle-by-project"' in report


# --- who sees what ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("url", ENDPOINTS)
def test_anonymous_is_refused_in_the_error_shape(api, url):
    response = api.get(url)
    assert response.status_code == 401
    assert set(response.json()) == {"code", "message", "details"}


MATRIX = [
    ("developer", ["home"]),
    ("approver", ["home"]),
    ("other_developer", ["other"]),
    ("operator", ["home", "other"]),
    ("outsider", []),
]


@pytest.fixture
def both(world, roles):
    kept_books(world, roles.project)
    kept_books(world, roles.other_project)
    return roles


@pytest.mark.parametrize("url", ENDPOINTS)
@pytest.mark.parametrize(("who", "sees"), MATRIX, ids=[who for who, _ in MATRIX])
def test_each_role_sees_only_the_projects_it_may_view(api_as, both, url, who, sees):
    slugs = {"home": both.project.slug, "other": both.other_project.slug}
    response = api_as(getattr(both, who)).get(url)
    assert response.status_code == 200
    assert sorted(row["project"] for row in response.json()) == sorted(slugs[name] for name in sees)


@pytest.mark.parametrize("who", ["developer", "approver", "outsider"])
def test_only_operators_get_the_books_in_the_console(client, both, who):
    client.force_login(getattr(both, who))
    response = client.get("/admin/metering/slurmbooks/")
    assert response.status_code == 302 and response["Location"].startswith("/admin/login/")


@pytest.mark.parametrize(("who", "sees"), MATRIX, ids=[who for who, _ in MATRIX])
def test_each_role_sees_only_its_projects_on_the_page(client, both, who, sees):
    client.force_login(getattr(both, who))
    page = client.get(PAGE).content.decode()
    shown = {
        name
        for name, project in (("home", both.project), ("other", both.other_project))
        if f">{project}</td>" in page[page.index('id="reserved-idle"') :]
    }
    assert shown == set(sees)


@pytest.mark.parametrize("url", [*ENDPOINTS, PAGE])
def test_bad_months_are_refused_with_the_reason(client, api_as, roles, url):
    if url == PAGE:
        client.force_login(roles.developer)
        assert client.get(url, {"from": "2026-13"}).status_code == 400
        return
    response = api_as(roles.developer).get(url, {"from": "2026-13"})
    assert response.status_code == 400 and set(response.json()) == {"code", "message", "details"}


@pytest.mark.parametrize("url", [*ENDPOINTS, PAGE])
def test_query_count_does_not_grow_with_rows(client, api_as, world, roles, url):
    if url == PAGE:
        client.force_login(roles.developer)
    else:
        client = api_as(roles.developer)
    kept_books(world, roles.project)
    client.get(url)  # warm per-process caches (content types, permissions)

    def measured() -> int:
        with CaptureQueriesContext(connection) as queries:
            assert client.get(url).status_code == 200
        return len(queries)

    few = measured()
    for _ in range(4):
        project = factories.project()
        factories.member(project, user=roles.developer)
        kept_books(world, project)
        kept_books(world, roles.project)
    assert measured() == few


def test_the_reserved_idle_window_is_cut_at_the_months(api_as, world):
    """A no-show held across the month's end counts in each month for its part."""
    reservation(world, world.project, start="2026-10-31 23:00", released="2026-11-01 01:00")
    client = api_as(world.project.lead)
    [october] = client.get(RESERVED_IDLE, {"from": "2026-10", "to": "2026-10"}).json()
    [november] = client.get(RESERVED_IDLE, {"from": "2026-11", "to": "2026-11"}).json()
    assert october["reserved_idle_card_hours"] == november["reserved_idle_card_hours"] == 2.0


def test_a_sacct_that_cannot_run_is_refused_and_writes_nothing(settings, world):
    settings.SLURM_SACCT = "/nonexistent/sacct"
    allocation = bound(world, started=at("2026-11-11 08:00"), released=at("2026-11-11 09:00"))
    Allocation.objects.filter(pk=allocation.pk).update(slurm_job_id=7, metered_from_workload=False)
    outcome = slurm_books_reconcile()
    assert outcome.read == [] and not outcome.waiting and "could not run" in outcome.refused
    assert not SlurmBooks.objects.exists()


def test_books_stay_open_until_final_and_open_again_when_the_request_is_bound_again(world, frozen):
    cards = list(world.node.devices.order_by("index"))
    first = bound(world, started=at("2026-11-11 08:00"), released=at("2026-11-11 09:00"))
    running = bound(world, started=at("2026-11-20 11:00"), devices=cards[:2])
    books_of(running, slurm=2, platform=2)
    SlurmBooks.objects.filter(request=running.request).update(final=False)  # read while it ran
    never_read = bound(world, started=at("2026-11-20 10:00"), devices=cards[2:])
    Allocation.objects.filter(pk=never_read.pk).update(slurm_job_id=9)
    books = books_of(first, slurm=2, platform=2)  # final
    assert set(platform_card_hours(now=frozen)) == {running.request_id, never_read.request_id}
    # Preempted and placed again after its final reading: a new job, read again with the first one.
    again = Allocation.objects.create(
        request=first.request, node=first.node, cpu_milli=1000, memory_mib=1024, priority=50, slurm_job_id=4243
    )
    Allocation.objects.filter(pk=again.pk).update(started_at=books.read_at + timedelta(minutes=5))
    metered = platform_card_hours(now=frozen)
    assert set(metered) == {first.request_id, running.request_id, never_read.request_id}
    assert metered[first.request_id] == (2.0, 1)  # the whole request: the released hour, and the new one running
