"""Issue 12 item 4: what an order is accepted with must be usable, and an allocation whose provisioning never
started is started or released by the sweeper, never held for ever."""

from datetime import timedelta

import pytest
from django.utils import timezone

from provisioning import services
from provisioning.choices import RunKind
from provisioning.models import ProvisioningRun
from requests.choices import EventCode, RequestState
from requests.models import ResourceRequest
from scheduling import cycle
from scheduling.models import Device
from tests import factories
from tests.requests.conftest import make_order

pytestmark = pytest.mark.django_db

BATCH = {"name": "batch", "type": "number"}


def order_body(shop, project, **parameters) -> dict:
    return {
        "service": shop.service.pk,
        "project": project.pk,
        "spec": shop.whole.pk,
        "image": shop.image.pk,
        "duration_hours": 10,
        "parameters": parameters,
    }


def declare(service, *entries) -> None:
    service.parameter_schema = [*service.parameter_schema, *entries]
    service.save(update_fields=["parameter_schema"])


@pytest.mark.parametrize("releaser", ["requester", "operator"])
def test_an_order_with_1e16_is_provisioned_and_both_releases_answer_200(compute, api_as, run_on_commit, releaser):
    """Before: 201, allocated, never provisioned, and release answered 500 (the reloaded snapshot read
    10000000000000000 where 1e+16 had been hashed, so every save was refused as tampering)."""
    shop, team = compute.shop, compute.team
    declare(shop.service, BATCH)
    response = run_on_commit(
        api_as(team.developer).post, "/api/v1/requests/", order_body(shop, team.project, batch=1e16), format="json"
    )
    assert response.status_code == 201, response.content
    request = ResourceRequest.objects.get(pk=response.json()["id"])
    run_on_commit(cycle.run_cycle)
    request.refresh_from_db()
    assert request.state == RequestState.ACTIVE
    assert request.approved_spec["parameters"]["batch"] == 10**16 and request.snapshot_intact

    actor = team.developer if releaser == "requester" else team.operator
    response = run_on_commit(
        api_as(actor).post, f"/api/v1/requests/{request.pk}/release/", {"reason": "done"}, format="json"
    )
    assert response.status_code == 200, response.content
    request.refresh_from_db()
    assert request.state == RequestState.RELEASED
    assert set(Device.objects.values_list("allocated_milli", flat=True)) == {0}


def test_a_value_outside_the_declared_range_is_refused_at_submission_and_nothing_is_held(compute, api_as):
    shop, team = compute.shop, compute.team
    declare(shop.service, {"name": "batch", "type": "int", "min": 1, "max": 65536})
    response = api_as(team.developer).post(
        "/api/v1/requests/", order_body(shop, team.project, batch=1e16), format="json"
    )
    assert response.status_code == 422, response.content
    body = response.json()
    assert body["code"] == "parameter_invalid"
    assert body["details"] == {"field": "parameters", "parameter": "batch", "rule": "max", "maximum": 65536}
    assert not ResourceRequest.objects.exists()


# --- The sweeper --------------------------------------------------------------------------------------------


def stranded(compute, *, minutes_ago: int) -> ResourceRequest:
    """Allocated, but the start task never ran (as when a worker dies between the scheduler's commit and it)."""
    from requests import services as request_services

    request = request_services.request_submit(
        order=make_order(compute.shop, compute.team.project), requester=compute.team.developer
    )
    cycle.run_cycle()  # after-commit work is not run: provisioning never hears of the allocation
    ResourceRequest.objects.filter(pk=request.pk).update(updated_at=timezone.now() - timedelta(minutes=minutes_ago))
    request.refresh_from_db()
    assert request.state == RequestState.ALLOCATED and not request.provisioning_runs.exists()
    return request


def test_the_sweeper_starts_provisioning_that_never_started(compute, run_on_commit, settings):
    settings.PROVISIONING_START_GRACE_SECONDS = 120
    late, recent = stranded(compute, minutes_ago=5), stranded(compute, minutes_ago=0)

    outcome = run_on_commit(services.runs_start_stranded)

    assert outcome == {"started": [late.pk], "released": [], "failed": []}
    late.refresh_from_db()
    assert late.state == RequestState.ACTIVE
    event = late.events.get(code=EventCode.PROVISIONING_RECOVERED)
    assert event.data == {"run": ProvisioningRun.objects.get(request=late, kind=RunKind.PROVISION).pk}
    recent.refresh_from_db()
    assert recent.state == RequestState.ALLOCATED  # still within the grace period: its start may be on its way
    assert run_on_commit(services.runs_start_stranded) == {"started": [], "released": [], "failed": []}


def test_the_sweeper_releases_with_the_reason_what_cannot_start(compute, run_on_commit, monkeypatch):
    request = stranded(compute, minutes_ago=5)

    def broken_driver(*_args, **_kwargs):  # fault injection: starting a run fails for a reason nobody foresaw
        raise RuntimeError("no driver for this pool")

    monkeypatch.setattr(services, "_create_runs", broken_driver)
    outcome = run_on_commit(services.runs_start_stranded)

    assert outcome == {"started": [], "released": [request.pk], "failed": []}
    request.refresh_from_db()
    assert request.state == RequestState.RELEASED
    event = request.events.get(code=EventCode.PROVISIONING_NOT_STARTED)
    assert event.data == {
        "code": "start_failed",
        "message": "Starting provisioning failed: RuntimeError.",
        "details": {"error": "no driver for this pool"},
    }
    assert set(Device.objects.values_list("allocated_milli", flat=True)) == {0}
    assert not ProvisioningRun.objects.exists()


def test_the_sweeper_is_scheduled_every_minute():
    from django_q.models import Schedule

    from provisioning.wiring import STRANDED_TASK, ensure_schedules

    ensure_schedules()
    assert Schedule.objects.filter(func=STRANDED_TASK, schedule_type=Schedule.MINUTES, minutes=1).count() == 1


def test_operator_release_of_a_stranded_request_answers_200(compute, api_as, run_on_commit):
    request = stranded(compute, minutes_ago=5)
    operator = factories.operator()
    response = run_on_commit(
        api_as(operator).post, f"/api/v1/requests/{request.pk}/release/", {"reason": "stuck"}, format="json"
    )
    assert response.status_code == 200, response.content
    request.refresh_from_db()
    assert request.state == RequestState.RELEASED
