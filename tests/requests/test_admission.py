"""Quota admission: per dimension, per scope, which states count, over-quota choices, and readmission."""

from datetime import timedelta
from decimal import Decimal

import pytest

from config.errors import DomainError
from requests import services
from requests.choices import EventCode, OverQuota, RequestState
from requests.models import Approval, RequestEvent, ResourceRequest
from requests.quota import month_start
from requests.services import QuotaExceeded
from tenancy import services as tenancy_services
from tenancy.models import MonthlyUsage, ProjectQuota
from tests import factories
from tests.requests.conftest import GENEROUS_QUOTA, approval_rule, make_order
from tests.requests.lifecycle import stored_request

S = RequestState
pytestmark = pytest.mark.django_db


def limit(project, **limits):
    ProjectQuota.objects.filter(project=project).update(**limits)


def submit(shop, team, *, requester=None, over_quota=OverQuota.REJECT, **overrides):
    return services.request_submit(
        order=make_order(shop, team.project, **overrides), requester=requester or team.developer, over_quota=over_quota
    )


def assert_nothing_stored():
    assert not ResourceRequest.objects.exists()
    assert not RequestEvent.objects.exists()
    assert not Approval.objects.exists()


def refusal_of(shop, team, **overrides) -> QuotaExceeded:
    with pytest.raises(QuotaExceeded) as refusal:
        submit(shop, team, **overrides)
    return refusal.value


def numbers(reason: dict) -> tuple:
    return tuple(Decimal(str(reason[key])) for key in ("requested", "used", "limit"))


# The whole-card spec of the shop, for 10 hours: 2 cards, 160 GB accelerator memory, 16 cores, 128 GB, 20 card-h.
DIMENSIONS = [
    ("gpus", Decimal(2), Decimal("1.99")),
    ("accelerator_memory_gb", 160, 159),
    ("cpu_cores", 16, 15),
    ("memory_gb", 128, 127),
    ("concurrent_tasks", 1, 0),
    ("monthly_card_hours", Decimal(20), Decimal("19.99")),
]


@pytest.mark.parametrize(("dimension", "fits", "over"), DIMENSIONS, ids=[row[0] for row in DIMENSIONS])
def test_submission_that_just_fits_is_admitted(shop, team, dimension, fits, over):
    limit(team.project, **{dimension: fits})
    assert submit(shop, team).state == S.QUEUED


@pytest.mark.parametrize(("dimension", "fits", "over"), DIMENSIONS, ids=[row[0] for row in DIMENSIONS])
def test_submission_over_one_dimension_is_refused_with_that_reason_and_nothing_stored(
    shop, team, dimension, fits, over
):
    limit(team.project, **{dimension: over})
    refusal = refusal_of(shop, team)
    assert (refusal.status_code, refusal.code) == (409, "quota_exceeded")
    [reason] = refusal.details["reasons"]
    assert set(reason) == {"code", "scope", "dimension", "requested", "used", "limit", "message"}
    assert (reason["code"], reason["scope"], reason["dimension"]) == ("quota_exceeded", "project", dimension)
    assert numbers(reason) == (Decimal(fits), 0, Decimal(over))
    assert "over the limit" in reason["message"]
    assert_nothing_stored()


def test_every_exceeded_dimension_gets_its_own_reason(shop, team):
    limit(team.project, gpus=1, cpu_cores=8, concurrent_tasks=0)
    reasons = refusal_of(shop, team).details["reasons"]
    assert [reason["dimension"] for reason in reasons] == ["gpus", "cpu_cores", "concurrent_tasks"]


def test_slices_count_as_fractions_so_seven_fit_one_card_where_a_whole_card_does_not(shop, team):
    one_card = factories.ResourceSpecFactory(accelerator_models=[shop.accelerator], accelerator_count=1)
    shop.service.specs.add(one_card)
    limit(team.project, gpus=1)
    for _ in range(6):
        assert submit(shop, team, spec=shop.sliced).state == S.QUEUED
    [reason] = refusal_of(shop, team, spec=one_card).details["reasons"]
    assert numbers(reason) == (1, Decimal("0.8574"), 1)
    assert submit(shop, team, spec=shop.sliced).state == S.QUEUED
    [reason] = refusal_of(shop, team, spec=shop.sliced).details["reasons"]
    assert reason["dimension"] == "gpus"
    assert ResourceRequest.objects.filter(state=S.QUEUED).count() == 7


def test_monthly_card_hours_add_this_months_metered_usage_to_committed_projections(shop, team):
    limit(team.project, monthly_card_hours=100)
    this_month = month_start()
    MonthlyUsage.objects.create(project=team.project, month=this_month, card_hours=60)
    MonthlyUsage.objects.create(
        project=team.project, month=(this_month - timedelta(days=1)).replace(day=1), card_hours=5000
    )
    submit(shop, team)  # 20 card-hours committed
    assert submit(shop, team).state == S.QUEUED  # 60 + 20 + 20 = 100
    [reason] = refusal_of(shop, team).details["reasons"]
    assert (reason["dimension"], *numbers(reason)) == ("monthly_card_hours", 20, 100, 100)


def test_previous_months_usage_does_not_count(shop, team):
    limit(team.project, monthly_card_hours=20)
    MonthlyUsage.objects.create(
        project=team.project, month=(month_start() - timedelta(days=1)).replace(day=1), card_hours=5000
    )
    assert submit(shop, team).state == S.QUEUED


def test_tenant_quota_caps_the_sum_of_its_projects(shop, team):
    sibling = factories.project(tenant_obj=team.project.tenant, quota=GENEROUS_QUOTA)
    stored_request(make_order(shop, sibling), sibling.lead, S.ACTIVE)
    quota = tenancy_services.tenant_quota_ensure(tenant=team.project.tenant, actor=None)
    tenancy_services.quota_set(quota=quota, limits={"gpus": Decimal(3)}, actor=None)
    [reason] = refusal_of(shop, team).details["reasons"]
    assert (reason["scope"], reason["dimension"], *numbers(reason)) == ("tenant", "gpus", 2, 2, 3)
    assert not ResourceRequest.objects.filter(project=team.project).exists()


COUNTED = {S.PENDING_APPROVAL, S.APPROVED, S.QUEUED, S.ALLOCATED, S.PROVISIONING, S.ACTIVE, S.RELEASING}


@pytest.mark.parametrize("state", list(S), ids=[state.value for state in S])
def test_which_states_hold_quota(shop, team, state):
    stored_request(make_order(shop, team.project), team.developer, state)
    limit(team.project, concurrent_tasks=1)
    if state in COUNTED:
        [reason] = refusal_of(shop, team).details["reasons"]
        assert numbers(reason) == (1, 1, 1)
    else:
        assert submit(shop, team).state == S.QUEUED


# --- what the requester asked for when it does not fit ------------------------------------------------------


def test_over_quota_wait_stores_a_waiting_request_with_reasons_and_an_event(shop, team):
    limit(team.project, gpus=3)
    submit(shop, team)  # 2 of the 3 GPUs: the next 2 must wait for them
    request = submit(shop, team, over_quota=OverQuota.WAIT)
    stored = ResourceRequest.objects.get(pk=request.pk)
    assert stored.state == S.WAITING_FOR_QUOTA
    assert [reason["dimension"] for reason in stored.quota_reasons] == ["gpus"]
    event = stored.events.get(code=EventCode.QUOTA_EXCEEDED)
    assert (event.from_state, event.to_state) == (S.SUBMITTED, S.WAITING_FOR_QUOTA)
    assert event.data["reasons"] == stored.quota_reasons
    assert not Approval.objects.exists()


@pytest.mark.parametrize("scope", ["project", "tenant"])
def test_over_quota_wait_is_refused_when_the_request_alone_passes_the_limit(shop, team, scope):
    """Waiting can never help: nothing that frees up makes a 2-GPU request fit a 1-GPU limit."""
    if scope == "tenant":
        quota = tenancy_services.tenant_quota_ensure(tenant=team.project.tenant, actor=None)
        tenancy_services.quota_set(quota=quota, limits={"gpus": Decimal(1)}, actor=None)
    else:
        limit(team.project, gpus=1)
    with pytest.raises(QuotaExceeded) as refusal:
        submit(shop, team, over_quota=OverQuota.WAIT)
    assert (refusal.value.status_code, refusal.value.code) == (409, "exceeds_limit")
    assert [(reason["code"], reason["scope"], reason["dimension"]) for reason in refusal.value.details["reasons"]] == [
        ("exceeds_limit", scope, "gpus")
    ]
    assert "waiting for quota to free up can never admit it" in refusal.value.message
    assert_nothing_stored()


def test_over_quota_exception_needs_a_justification(shop, team):
    limit(team.project, gpus=1)
    with pytest.raises(DomainError) as refusal:
        submit(shop, team, over_quota=OverQuota.EXCEPTION)
    assert refusal.value.code == "justification_required"
    assert_nothing_stored()


def test_over_quota_exception_goes_to_operators_when_no_policy_matches(shop, team):
    limit(team.project, gpus=1)
    request = submit(shop, team, over_quota=OverQuota.EXCEPTION, justification="Deadline for the paper")
    assert request.state == S.PENDING_APPROVAL
    assert request.quota_exception is True
    assert request.events.filter(code=EventCode.QUOTA_EXCEPTION).exists()
    [stage] = Approval.objects.get(subject_id=request.pk).stages.all()
    assert stage.source == "operators"
    assert [a.approver for a in stage.assignments.all()] == [team.operator]


def test_over_quota_exception_is_never_approved_automatically_even_by_a_rule_without_stages(shop, team):
    approval_rule()  # matches everything and approves automatically
    limit(team.project, gpus=1)
    request = submit(shop, team, over_quota=OverQuota.EXCEPTION, justification="Deadline for the paper")
    assert request.state == S.PENDING_APPROVAL
    assert not request.events.filter(code=EventCode.AUTO_APPROVED).exists()
    [stage] = Approval.objects.get(subject_id=request.pk).stages.all()
    assert [a.approver for a in stage.assignments.all()] == [team.operator]


def test_over_quota_exception_within_quota_is_an_ordinary_admission(shop, team):
    request = submit(shop, team, over_quota=OverQuota.EXCEPTION, justification="Just in case")
    assert (request.state, request.quota_exception) == (S.QUEUED, False)


# --- readmission --------------------------------------------------------------------------------------------


def test_cancelling_a_queued_request_readmits_the_first_waiting_one(shop, team, django_capture_on_commit_callbacks):
    limit(team.project, concurrent_tasks=1)
    running = submit(shop, team)
    first = submit(shop, team, over_quota=OverQuota.WAIT)
    second = submit(shop, team, over_quota=OverQuota.WAIT)
    with django_capture_on_commit_callbacks(execute=True):
        services.request_cancel(request=running, actor=team.developer)
    first, second = (ResourceRequest.objects.get(pk=r.pk) for r in (first, second))
    assert (first.state, second.state) == (S.QUEUED, S.WAITING_FOR_QUOTA)
    assert first.events.filter(code=EventCode.READMITTED, from_state=S.WAITING_FOR_QUOTA).exists()
    assert first.quota_reasons == []


def test_a_later_smaller_request_does_not_jump_ahead_of_an_earlier_one(shop, team, django_capture_on_commit_callbacks):
    limit(team.project, gpus=3, concurrent_tasks=2)
    submit(shop, team)
    small_running = submit(shop, team, spec=shop.sliced)
    big = submit(shop, team, over_quota=OverQuota.WAIT)
    small = submit(shop, team, spec=shop.sliced, over_quota=OverQuota.WAIT)
    with django_capture_on_commit_callbacks(execute=True):
        services.request_cancel(request=small_running, actor=team.developer)
    big, small = (ResourceRequest.objects.get(pk=r.pk) for r in (big, small))
    assert (big.state, small.state) == (S.WAITING_FOR_QUOTA, S.WAITING_FOR_QUOTA)
    assert [reason["dimension"] for reason in big.quota_reasons] == ["gpus"]
    assert not RequestEvent.objects.filter(code=EventCode.READMITTED).exists()


def test_raising_the_limit_readmits_waiting_requests(shop, team, django_capture_on_commit_callbacks):
    limit(team.project, concurrent_tasks=1)
    submit(shop, team)
    waiting = [submit(shop, team, over_quota=OverQuota.WAIT) for _ in range(2)]
    with django_capture_on_commit_callbacks(execute=True):
        tenancy_services.quota_set(quota=team.project.quota, limits={"concurrent_tasks": 3}, actor=team.operator)
    states = [ResourceRequest.objects.get(pk=request.pk).state for request in waiting]
    assert states == [S.QUEUED, S.QUEUED]
    assert RequestEvent.objects.filter(code=EventCode.READMITTED).count() == 2
