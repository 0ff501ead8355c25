"""The operator console's home (a dashboard of what needs an operator), action buttons on request and run pages that
go through services behind a confirmation, and the approval policies read as sentences with a dry run."""

from decimal import Decimal

import pytest
from django.utils import timezone

from metering.choices import BudgetLevel
from metering.models import BudgetAlert
from provisioning.choices import RunKind, RunState
from provisioning.models import ProvisioningRun
from requests import services as request_services
from requests.choices import ApprovalMode, ApproverSource, EventCode, RequestState
from requests.models import ApprovalAssignment, ResourceRequest
from scheduling import services as scheduling_services
from scheduling.models import Device
from tenancy.choices import Role
from tests import factories
from tests.provisioning.conftest import add_node
from tests.provisioning.test_lifecycle import failed_compute
from tests.queries import queries_for
from tests.requests.conftest import approval_rule, approver_stage, make_order

pytestmark = pytest.mark.django_db
OPERATORS_STAGE = (ApproverSource.OPERATORS, ApprovalMode.ANY, {})


def _count(page: str, panel: str) -> int:
    marker = f'id="panel-{panel}"'
    assert marker in page, panel
    section = page[page.index(marker) :]
    return int(section[section.index('data-count="') + len('data-count="') :].split('"', 1)[0])


def _home(client, user) -> str:
    client.force_login(user)
    response = client.get("/admin/")
    assert response.status_code == 200
    return response.content.decode()


def _world(shop, team, *, waiting_for_operators=1, queued=1, budget_projects=1, isolated=1):
    """Approvals waiting for operators, queued requests (no hardware for them), budget alerts, isolated cards."""
    approval_rule(OPERATORS_STAGE)
    for _ in range(waiting_for_operators):
        request_services.request_submit(order=make_order(shop, team.project), requester=team.developer)
    node = add_node(shop.accelerator, name=f"iso{Device.objects.count()}", cards=isolated)
    for device in node.devices.all():
        scheduling_services.device_isolate(device=device, reason="ECC errors", actor=team.operator)
    month = timezone.now().date().replace(day=1)
    for _ in range(budget_projects):
        project = factories.project()
        BudgetAlert.objects.create(
            project=project, month=month, level=BudgetLevel.WARNING, card_hours=Decimal(85), limit=Decimal(100)
        )
    return node


def test_the_console_home_counts_what_needs_an_operator(client, compute, settings, team, shop):
    failed_compute(compute, settings)  # one failed run waiting for a retry
    _world(shop, team, waiting_for_operators=3, budget_projects=2, isolated=2)
    page = _home(client, team.operator)
    assert _count(page, "approvals") == 3
    assert "3 for you" in page  # the operator is one of the operators
    assert _count(page, "failed_runs") == 1
    assert _count(page, "devices") == 2 and "2 isolated" in page
    assert _count(page, "budgets") == 2
    assert 'href="/approvals/"' in page  # linked to the inbox
    assert 'href="/admin/scheduling/node/capacity/"' in page and 'href="/admin/metering/dailyusage/report/"' in page
    assert "Pending approval" in page  # the queue panel lists requests waiting for approval beside the queue
    assert "Site administration" not in page and "Operator home" in page


def test_capacity_shows_queued_demand_per_model(client, shop, team):
    request_services.request_submit(order=make_order(shop, team.project), requester=team.developer)  # queued
    request_services.request_submit(order=make_order(shop, team.project, spec=shop.sliced), requester=team.developer)
    page = _home(client, team.operator)
    section = page[page.index('id="panel-capacity"') :]
    assert f"<td>{shop.accelerator.name}</td>" in section  # known only from the demand: no devices yet
    assert "2.143 cards (2 requests)" in section
    assert _count(page, "queue") == 2


@pytest.mark.parametrize("add", [1, 4])
def test_the_console_home_runs_a_constant_number_of_queries(client, shop, team, add):
    _world(shop, team)
    client.force_login(team.operator)
    few = queries_for(client, "/admin/")
    _world(shop, team, waiting_for_operators=add, budget_projects=add, isolated=add)
    assert queries_for(client, "/admin/") == few


def test_role_matrix_for_the_console_home_and_its_buttons(client, shop, team):
    approval_rule(OPERATORS_STAGE)
    created = request_services.request_submit(order=make_order(shop, team.project), requester=team.developer)
    change = f"/admin/requests/resourcerequest/{created.pk}/change/"
    approve = f"/admin/requests/resourcerequest/{created.pk}/act/approve/"
    assert client.get("/admin/").status_code == 302  # anonymous: sign in first
    assert client.get(approve).status_code == 302
    stranger = factories.member(factories.project())
    for user in (stranger, team.developer, team.approver, team.lead):
        client.force_login(user)
        assert client.get("/admin/").status_code == 302, user  # not staff: the console's sign-in
        assert client.get(approve).status_code == 302, user
    client.force_login(team.operator)
    assert client.get("/admin/").status_code == 200
    assert 'id="act-approve"' in client.get(change).content.decode()


def test_an_operator_approves_the_stage_waiting_for_them_from_the_request_page(client, shop, team):
    approval_rule(OPERATORS_STAGE)
    created = request_services.request_submit(order=make_order(shop, team.project), requester=team.developer)
    client.force_login(team.operator)
    url = f"/admin/requests/resourcerequest/{created.pk}/act/approve/"
    confirm = client.get(url)
    assert confirm.status_code == 200 and "Approve stage" in confirm.content.decode()
    created.refresh_from_db()
    assert created.state == RequestState.PENDING_APPROVAL  # asking changed nothing
    response = client.post(url, {"reason": "Capacity is there"})
    assert response.status_code == 302 and response.url.endswith(f"/resourcerequest/{created.pk}/change/")
    created.refresh_from_db()
    assert created.state == RequestState.QUEUED
    assert ApprovalAssignment.objects.get(approver=team.operator).comment == "Capacity is there"
    page = client.get(response.url).content.decode()
    assert 'id="act-approve"' not in page  # nothing waits for them any more
    assert client.get(url).status_code == 403


def test_cancel_from_the_request_page_needs_a_reason_and_goes_through_the_service(client, shop, team):
    created = request_services.request_submit(order=make_order(shop, team.project), requester=team.developer)
    client.force_login(team.operator)
    url = f"/admin/requests/resourcerequest/{created.pk}/act/cancel/"
    assert client.post(url, {"reason": ""}).status_code == 400
    assert client.post(url, {"reason": "Duplicate order"}).status_code == 302
    created.refresh_from_db()
    assert created.state == RequestState.CANCELLED
    assert created.events.filter(code=EventCode.CANCELLED, message__contains="Duplicate order").exists()


def test_retry_from_the_run_page(client, compute, settings, run_on_commit, django_capture_on_commit_callbacks):
    request, failed = failed_compute(compute, settings)
    client.force_login(compute.team.operator)
    page = client.get(f"/admin/provisioning/provisioningrun/{failed.pk}/change/").content.decode()
    assert 'id="act-retry"' in page
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(f"/admin/provisioning/provisioningrun/{failed.pk}/act/retry/", {"reason": "fixed"})
    assert response.status_code == 302
    request.refresh_from_db()
    assert request.state == RequestState.ACTIVE
    assert ProvisioningRun.objects.filter(retry_of=failed, kind=RunKind.PROVISION, state=RunState.SUCCEEDED).exists()
    page = client.get(f"/admin/provisioning/provisioningrun/{failed.pk}/change/").content.decode()
    assert 'id="act-retry"' not in page  # retried once: no second button


def test_a_dry_run_shows_which_rule_matches_and_the_stages_that_follow(client, shop, team):
    approval_rule(approver_stage(Role.LEAD), min_accelerator_count=8)
    big = approval_rule(approver_stage(), OPERATORS_STAGE, min_accelerator_count=2)
    client.force_login(team.operator)
    query = {
        "project": team.project.pk,
        "requester": team.developer.pk,
        "service": shop.service.pk,
        "spec": shop.whole.pk,
        "image": shop.image.pk,
        "duration_hours": 4,
        "priority": "standard",
        "over_quota": "reject",
        "parameters": '{"environment": "development"}',
    }
    page = client.get("/admin/requests/approvalpolicy/test/", query).content.decode()
    assert f'href="/admin/requests/approvalrule/{big.pk}/change/">rule</a>' in page
    assert (
        "When at least 2 accelerators: 1. Stage 1 — any one project approver; then 2. Stage 2 — any one operator."
        in page
    )
    assert f"Stage 1 — any one of {team.approver.username}" in page
    assert f"Stage 2 — any one of {team.operator.username}" in page
    assert not ResourceRequest.objects.exists()  # nothing stored
    page = client.get("/admin/requests/approvalpolicy/test/", {**query, "spec": shop.sliced.pk}).content.decode()
    assert "No stages: approved automatically on submission." in page
    page = client.get("/admin/requests/approvalpolicy/test/", {**query, "requester": factories.UserFactory().pk})
    assert f"No project with id {team.project.pk}." in page.content.decode()  # as the requester would be told


def test_the_dry_run_is_for_the_console_only(client, shop, team):
    url = "/admin/requests/approvalpolicy/test/"
    assert client.get(url).status_code == 302  # anonymous: the console's sign-in
    for user in (factories.member(factories.project()), team.developer, team.approver, team.lead):
        client.force_login(user)
        assert client.get(url).status_code == 302, user
    client.force_login(team.operator)
    assert client.get(url).status_code == 200
    assert 'id="dry-run-result"' not in client.get(url).content.decode()  # nothing to show before a test


def test_the_console_home_and_every_policy_read_well_on_the_demo_data(client, settings):
    from django.core.management import call_command

    from requests.models import ApprovalPolicy
    from tenancy.models import User

    settings.DEBUG = True
    call_command("seed_demo")
    page = _home(client, User.objects.get(username="operator"))
    assert _count(page, "queue") >= 0 and "Capacity per accelerator model" in page
    for policy in ApprovalPolicy.objects.all():
        page = client.get(f"/admin/requests/approvalpolicy/{policy.pk}/change/").content.decode()
        assert page.count("When ") + page.count("Every order:") >= policy.rules.count(), policy


def test_console_labels_are_words_people_use_and_floats_are_rounded(client, team):
    from metering.admin import rounded

    page = _home(client, team.operator)
    assert "API keys" in page and "Api keys" not in page
    quota = client.get(f"/admin/tenancy/projectquota/{team.project.quota.pk}/change/").content.decode()
    assert ">GPUs:<" in quota and "Gpus" not in quota and "Memory (GiB):" in quota

    class Sample:
        energy_kwh = 0.6837000000000001

    assert rounded("energy_kwh", 2, "Energy (kWh)")(None, Sample()) == "0.68"


def test_approvers_and_operators_see_no_error_on_the_catalog(client, shop, team):
    for user in (team.approver, team.operator):
        client.force_login(user)
        page = client.get("/").content.decode()
        assert "error-box" not in page and 'class="error"' not in page, user
        assert 'id="browse-only"' in page, user  # they may browse; ordering needs a project that may order
