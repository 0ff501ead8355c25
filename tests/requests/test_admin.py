"""The request workflow's operator console: pages, query counts, read-only requests, actions, policy editing."""

import pytest
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.messages import WARNING
from django.db import connection
from django.test.utils import CaptureQueriesContext

from requests import approvals, services
from requests.choices import ApprovalState, ApproverSource, Decision, EventCode, RequestState, StageState
from requests.models import ApprovalPolicy, ApprovalRule, ResourceRequest
from requests.quota_changes import quota_change_request_submit
from requests.selectors import approval_of
from tenancy.choices import Role
from tests import factories
from tests.requests.conftest import GENEROUS_QUOTA, approval_rule, approver_stage, make_order

pytestmark = pytest.mark.django_db

CHANGELISTS = ["resourcerequest", "approval", "approvalpolicy", "approvalrule", "quotachangerequest"]


@pytest.fixture
def console(client, team):
    client.force_login(team.operator)
    return client


@pytest.fixture
def routed(db):
    """Resource requests need the project's approver from now on."""
    return approval_rule(approver_stage())


def _url(model: str, suffix: str = "") -> str:
    return f"/admin/requests/{model}/{suffix}"


def _submit(shop, project, requester) -> ResourceRequest:
    return services.request_submit(order=make_order(shop, project), requester=requester)


def _request_in_new_project(shop) -> ResourceRequest:
    project = factories.project(quota=GENEROUS_QUOTA)
    factories.member(project, Role.APPROVER)
    return _submit(shop, project, factories.member(project))


def _quota_change_in_new_project():
    project = factories.project(quota=GENEROUS_QUOTA)
    return quota_change_request_submit(
        project=project, limits={"gpus": 32}, justification="Bigger training runs", actor=project.lead
    )


def _policy_with_two_rules():
    rule = approval_rule(approver_stage(), (ApproverSource.OPERATORS, "any", {}))
    ApprovalRule.objects.create(
        policy=rule.policy, name="second rule", min_accelerator_count=8, tenant=factories.tenant()
    )
    return rule.policy


ROW_MAKERS = {
    "resourcerequest": _request_in_new_project,
    "approval": lambda shop: approval_of(_request_in_new_project(shop)),
    "approvalpolicy": lambda shop: _policy_with_two_rules(),
    "approvalrule": lambda shop: _policy_with_two_rules().rules.first(),
    "quotachangerequest": lambda shop: _quota_change_in_new_project(),
}


# --- pages and query counts -----------------------------------------------------------------------------


@pytest.mark.parametrize("model", CHANGELISTS)
def test_operator_opens_changelist_and_change_page(console, shop, routed, model):
    row = ROW_MAKERS[model](shop)

    assert console.get(_url(model)).status_code == 200
    assert console.get(_url(model, f"{row.pk}/change/")).status_code == 200


@pytest.mark.parametrize("model", ["approvalpolicy", "approvalrule"])
def test_operator_opens_policy_add_pages(console, model):
    assert console.get(_url(model, "add/")).status_code == 200


def _changelist_queries(console, model: str) -> int:
    with CaptureQueriesContext(connection) as queries:
        response = console.get(_url(model))
    assert response.status_code == 200
    return len(queries)


@pytest.mark.parametrize("model", CHANGELISTS)
def test_changelist_query_count_does_not_grow_with_rows(console, shop, routed, model):
    for _ in range(2):
        ROW_MAKERS[model](shop)
    console.get(_url(model))  # warm per-process caches (content types, permissions)
    few = _changelist_queries(console, model)
    for _ in range(8):
        ROW_MAKERS[model](shop)
    many = _changelist_queries(console, model)

    assert many == few, f"{model}: {few} queries with few rows, {many} with many"


@pytest.mark.parametrize("term", ["abc", "user", "1"])
def test_request_search_accepts_any_term(console, shop, team, term):
    _submit(shop, team.project, team.developer)

    assert console.get(_url("resourcerequest"), {"q": term}).status_code == 200


@pytest.mark.parametrize(
    "model_name, field_name",
    [
        ("approvalrulestage", "users"),
        ("approvalrule", "policy"),
        ("approvalrule", "vendor"),
        ("approvalrule", "spec"),
        ("approvalrule", "accelerator_model"),
        ("approvalrule", "tenant"),
        ("approvalrule", "project"),
    ],
)
def test_operator_can_use_the_policy_autocompletes(console, shop, routed, model_name, field_name):
    params = {"app_label": "requests", "model_name": model_name, "field_name": field_name, "term": ""}

    response = console.get("/admin/autocomplete/", params)

    assert response.status_code == 200
    assert response.json()["results"]


def test_developer_is_redirected_to_login(client, team):
    client.force_login(team.developer)

    response = client.get(_url("resourcerequest"))

    assert response.status_code == 302
    assert response.url.startswith("/admin/login/")


def test_request_page_shows_snapshot_approval_and_timeline(console, shop, team, routed):
    request = _submit(shop, team.project, team.developer)
    assignment = approval_of(request).stages.get().assignments.get()
    approvals.approval_decide(assignment=assignment, decision=Decision.APPROVE, comment="Fine", actor=team.approver)

    page = console.get(_url("resourcerequest", f"{request.pk}/change/")).content.decode()

    assert "<pre>{\n  &quot;bare_metal_profile&quot;: null," in page  # the approved snapshot, indented
    assert f"{team.approver.username}: Approve — Fine" in page
    assert "Approved spec frozen; waiting for the scheduler." in page


# --- requests are read-only -----------------------------------------------------------------------------


def test_operator_cannot_edit_a_request(console, shop, team):
    request = _submit(shop, team.project, team.developer)
    url = _url("resourcerequest", f"{request.pk}/change/")

    page = console.get(url).content.decode()
    response = console.post(url, {"state": RequestState.ACTIVE, "priority": "critical"})

    assert 'name="state"' not in page
    assert 'name="_save"' not in page
    assert response.status_code == 403
    request.refresh_from_db()
    assert (request.state, request.priority) == (RequestState.QUEUED, "standard")


def test_operator_cannot_add_or_delete_requests(console, shop, team):
    request = _submit(shop, team.project, team.developer)

    assert console.get(_url("resourcerequest", "add/")).status_code == 403
    assert console.post(_url("resourcerequest", f"{request.pk}/delete/"), {"post": "yes"}).status_code == 403
    assert b"delete_selected" not in console.get(_url("resourcerequest")).content
    assert ResourceRequest.objects.filter(pk=request.pk).exists()


# --- actions --------------------------------------------------------------------------------------------


def _run_action(console, action: str, requests: list[ResourceRequest], reason: str | None = None):
    data = {"action": action, ACTION_CHECKBOX_NAME: [request.pk for request in requests]}
    if reason is not None:
        data.update(apply="Confirm", reason=reason)
    return console.post(_url("resourcerequest"), data, follow=True)


def test_cancel_action_asks_for_a_reason_then_cancels(console, shop, team):
    request = _submit(shop, team.project, team.developer)

    form = _run_action(console, "cancel_requests", [request])
    request.refresh_from_db()
    assert 'name="reason"' in form.content.decode()
    assert request.state == RequestState.QUEUED

    _run_action(console, "cancel_requests", [request], reason="Rack maintenance")
    request.refresh_from_db()
    event = request.events.last()
    assert request.state == RequestState.CANCELLED
    assert (event.code, event.actor, event.from_state, event.to_state) == (
        EventCode.CANCELLED,
        team.operator,
        RequestState.QUEUED,
        RequestState.CANCELLED,
    )
    assert event.data == {"reason": "Rack maintenance"}


def test_reject_action_rejects_and_cancels_the_approval(console, shop, team, routed):
    request = _submit(shop, team.project, team.developer)
    assert request.state == RequestState.PENDING_APPROVAL

    _run_action(console, "reject_requests", [request], reason="Wrong project")

    request.refresh_from_db()
    approval = approval_of(request)
    event = request.events.last()
    assert request.state == RequestState.REJECTED
    assert approval.state == ApprovalState.CANCELLED
    assert {stage.state for stage in approval.stages.all()} == {StageState.CANCELLED}
    assert (event.code, event.actor, event.data) == (EventCode.REJECTED, team.operator, {"comment": "Wrong project"})


@pytest.mark.parametrize("action, cancel_first", [("reject_requests", False), ("cancel_requests", True)])
def test_action_in_illegal_state_warns_and_changes_nothing(console, shop, team, action, cancel_first):
    request = _submit(shop, team.project, team.developer)
    if cancel_first:
        services.request_cancel(request=request, actor=team.developer)
    state, event_count = ResourceRequest.objects.get(pk=request.pk).state, request.events.count()

    response = _run_action(console, action, [request], reason="Policy mistake")

    assert response.status_code == 200
    messages = [(message.level, message.message) for message in response.context["messages"]]
    assert len(messages) == 1
    assert messages[0][0] == WARNING
    assert messages[0][1].startswith(f"{request}: Request #{request.pk} is {state.replace('_', ' ')}")
    request.refresh_from_db()
    assert (request.state, request.events.count()) == (state, event_count)


def test_action_reports_each_row(console, shop, team):
    cancellable, cancelled = (_submit(shop, team.project, team.developer) for _ in range(2))
    services.request_cancel(request=cancelled, actor=team.developer)

    response = _run_action(console, "cancel_requests", [cancellable, cancelled], reason="Cleanup")

    levels = sorted(message.level_tag for message in response.context["messages"])
    assert levels == ["success", "warning"]
    cancellable.refresh_from_db()
    assert cancellable.state == RequestState.CANCELLED


# --- policy editing -------------------------------------------------------------------------------------


def _inline(prefix: str, rows: list[dict]) -> dict:
    data = {
        f"{prefix}-TOTAL_FORMS": len(rows),
        f"{prefix}-INITIAL_FORMS": 0,
        f"{prefix}-MIN_NUM_FORMS": 0,
        f"{prefix}-MAX_NUM_FORMS": 1000,
    }
    for index, row in enumerate(rows):
        data.update({f"{prefix}-{index}-{field}": value for field, value in row.items()})
    return data


def test_operator_creates_a_policy_then_a_rule_with_its_conditions_and_stages_on_one_page(console, shop, team):
    data = {"name": "GPU governance", "subject": "resource_request", "description": "", "order": 10, "active": "on"}
    data.update(_inline("rules", []))
    assert console.post(_url("approvalpolicy", "add/"), data).status_code == 302
    policy = ApprovalPolicy.objects.get(name="GPU governance")
    rule = {
        "policy": policy.pk,
        "order": 1,
        "name": "Big orders",
        "vendor": shop.accelerator.vendor_id,
        "spec": shop.whole.pk,
        "min_accelerator_count": 8,
        "quota_exception": "unknown",
        **_inline("stages", [{"order": 1, "name": "Operators", "mode": "any", "source": "operators"}]),
    }

    response = console.post(_url("approvalrule", "add/"), rule)

    assert response.status_code == 302, response.context and response.context["errors"]
    saved = policy.rules.get()
    assert (saved.name, saved.spec, saved.min_accelerator_count, saved.quota_exception) == (
        "Big orders",
        shop.whole,
        8,
        None,
    )
    page = console.get(_url("approvalpolicy", f"{policy.pk}/change/")).content.decode()
    assert (
        f"When the vendor is {shop.accelerator.vendor.name} and the spec is {shop.whole} and at least 8 accelerators: "
        "1. Operators — any one operator." in page
    )
    assert 'name="rules-0-min_cost_estimate"' not in page  # conditions live on the rule's page, not in columns here


def _rule_post(policy: ApprovalPolicy, stage: dict) -> dict:
    return {
        "policy": policy.pk,
        "order": 1,
        "name": "Every order",
        "quota_exception": "unknown",
        **_inline("stages", [{"order": 1, "name": "Operators", "mode": "any", **stage}]),
    }


def test_operator_creates_rule_with_inline_operators_stage_that_routes(console, shop, team):
    policy = ApprovalPolicy.objects.create(name="Everything", subject="resource_request")

    response = console.post(_url("approvalrule", "add/"), _rule_post(policy, {"source": ApproverSource.OPERATORS}))

    assert response.status_code == 302, response.context and response.context["errors"]
    stage = policy.rules.get().stages.get()
    assert (stage.name, stage.source) == ("Operators", ApproverSource.OPERATORS)
    request = _submit(shop, team.project, team.developer)
    assert request.state == RequestState.PENDING_APPROVAL
    assert approval_of(request).stages.get().assignments.get().approver == team.operator


def test_operator_gives_a_rule_a_priority_condition_that_routes_only_that_class_and_above(console, shop, team):
    policy = ApprovalPolicy.objects.create(name="Urgent work", subject="resource_request")
    post = {**_rule_post(policy, {"source": ApproverSource.OPERATORS}), "min_priority": "high"}

    response = console.post(_url("approvalrule", "add/"), post)

    assert response.status_code == 302, response.context and response.context["errors"]
    assert policy.rules.get().min_priority == "high"
    assert _submit(shop, team.project, team.developer).state == RequestState.QUEUED  # standard: not routed
    page = console.get(_url("approvalrule", f"{policy.rules.get().pk}/change/"))
    assert 'name="min_priority"' in page.content.decode()


@pytest.mark.parametrize(
    "source, field",
    [(ApproverSource.GROUP, "group"), (ApproverSource.USERS, "users"), (ApproverSource.PROJECT_ROLE, "project_role")],
)
def test_stage_without_its_approvers_is_a_form_error(console, source, field):
    policy = ApprovalPolicy.objects.create(name="Everything", subject="resource_request")

    response = console.post(_url("approvalrule", "add/"), _rule_post(policy, {"source": source}))

    assert response.status_code == 200
    stage_errors = response.context["inline_admin_formsets"][0].formset.errors[0]
    assert list(stage_errors) == [field]
    assert not ApprovalRule.objects.exists()
