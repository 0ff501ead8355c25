"""Portal pages: who may open what, the order flow with its refusals, the inbox, and query-count bounds."""

from decimal import Decimal

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from requests import services
from requests.choices import RequestState
from requests.models import ApprovalAssignment, ResourceRequest
from tenancy.choices import Role
from tenancy.services import quota_set
from tests import factories
from tests.requests.conftest import approval_rule, approver_stage, make_order, order_post

PAGES = ["/", "/requests/", "/approvals/", "/projects/"]


@pytest.mark.django_db
@pytest.mark.parametrize("path", [*PAGES, "/requests/1/", "/projects/1/quota/", "/order/any/"])
def test_anonymous_visitors_are_sent_to_sign_in(client, path):
    response = client.get(path)
    assert response.status_code == 302
    assert response["Location"].startswith("/accounts/login/")


@pytest.mark.parametrize("path", PAGES)
def test_every_role_can_open_the_main_pages(client, team, path):
    for user in (team.developer, team.approver, team.lead, team.operator):
        client.force_login(user)
        assert client.get(path).status_code == 200


def test_catalog_shows_the_service_with_prices_and_quota_fit(client, shop, team):
    client.force_login(team.developer)
    body = client.get("/").content.decode()
    assert shop.service.name in body and shop.whole.name in body
    assert "8.00" in body  # 2 cards x 4.00 per hour
    assert "fits" in body


def test_order_submits_and_lands_on_the_request_page(client, shop, team):
    client.force_login(team.developer)
    response = client.post(f"/order/{shop.service.slug}/", order_post(shop, team.project))
    created = ResourceRequest.objects.get()
    assert response.status_code == 302 and response["Location"] == f"/requests/{created.pk}/"
    assert created.parameters == {"environment": "development"}
    assert created.state == RequestState.QUEUED  # no policy: approved automatically


def test_order_over_quota_is_refused_with_every_reason_and_stores_nothing(client, shop, team):
    quota_set(quota=team.project.quota, limits={"gpus": Decimal(1), "cpu_cores": 8}, actor=None)
    client.force_login(team.developer)
    response = client.post(f"/order/{shop.service.slug}/", order_post(shop, team.project))
    body = response.content.decode()
    assert response.status_code == 422
    assert "quota_exceeded" in body and "GPUs" in body and "CPU cores" in body
    assert not ResourceRequest.objects.exists()


def test_order_form_renders_a_field_per_declared_parameter(client, shop, team):
    shop.service.parameter_schema = [
        {"name": "batch_size", "type": "int", "min": 1, "max": 65536, "label": "Global batch size"},
        {"name": "environment", "type": "enum", "choices": ["development", "production"], "default": "development"},
        {"name": "jupyter", "type": "bool", "default": True},
        {"name": "note", "type": "string", "max_length": 40},
    ]
    shop.service.save()
    client.force_login(team.developer)
    body = client.get(f"/order/{shop.service.slug}/").content.decode()
    assert 'name="batch_size"' in body and 'min="1"' in body and 'max="65536"' in body and "Global batch size" in body
    assert 'name="jupyter"' in body and 'type="checkbox"' in body and 'maxlength="40"' in body
    assert 'name="parameters"' not in body  # no free-form key=value any more: unknown keys are refused


@pytest.mark.parametrize(
    ("field", "value", "sentence"),
    [
        ("batch_size", "100000", "batch_size must be at most 65536"),
        ("batch_size", "0", "at least 1"),
        ("environment", "staging", "Select a valid choice"),
        ("note", "x" * 41, "at most 40"),
    ],
)
def test_order_with_a_parameter_the_schema_refuses_is_a_form_error(client, shop, team, field, value, sentence):
    shop.service.parameter_schema = [
        {"name": "batch_size", "type": "int", "min": 1, "max": 65536},
        {"name": "environment", "type": "enum", "choices": ["development", "production"], "default": "development"},
        {"name": "note", "type": "string", "max_length": 40},
    ]
    shop.service.save()
    client.force_login(team.developer)
    response = client.post(f"/order/{shop.service.slug}/", order_post(shop, team.project, **{field: value}))
    assert response.status_code == 400
    assert sentence in response.content.decode()
    assert not ResourceRequest.objects.exists()


def test_order_form_stores_the_declared_parameters_with_their_defaults(client, shop, team):
    shop.service.parameter_schema = [
        {"name": "batch_size", "type": "int", "min": 1, "max": 65536},
        {"name": "jupyter", "type": "bool", "default": True},
    ]
    shop.service.save()
    client.force_login(team.developer)
    response = client.post(
        f"/order/{shop.service.slug}/", order_post(shop, team.project, batch_size="512", jupyter="on")
    )
    assert response.status_code == 302
    created = ResourceRequest.objects.get()
    assert created.parameters == {"batch_size": 512, "jupyter": True}
    assert created.approved_spec["parameters"] == {"batch_size": 512, "jupyter": True}


def test_order_for_a_project_the_user_cannot_order_on_is_refused(client, shop, team):
    outsider_project = factories.project()
    client.force_login(team.developer)
    response = client.post(f"/order/{shop.service.slug}/", order_post(shop, outsider_project))
    assert response.status_code == 400
    assert not ResourceRequest.objects.exists()


def test_live_preview_returns_cost_quota_and_route(client, shop, team):
    approval_rule(approver_stage())
    client.force_login(team.developer)
    response = client.post(f"/order/{shop.service.slug}/preview/", order_post(shop, team.project))
    body = response.content.decode()
    assert response.status_code == 200
    assert "80.00" in body and "Stage 1" in body and team.approver.username in body
    assert not ResourceRequest.objects.exists()


def test_request_detail_is_hidden_from_other_projects(client, shop, team):
    created = services.request_submit(order=make_order(shop, team.project), requester=team.developer)
    stranger = factories.member(factories.project())
    client.force_login(stranger)
    assert client.get(f"/requests/{created.pk}/").status_code == 404
    assert client.post(f"/requests/{created.pk}/cancel/").status_code == 404
    assert client.get(f"/projects/{team.project.pk}/quota/").status_code == 404
    client.force_login(team.developer2)  # same project: may look, may not cancel someone else's
    assert client.get(f"/requests/{created.pk}/").status_code == 200
    client.post(f"/requests/{created.pk}/cancel/")
    created.refresh_from_db()
    assert created.state == RequestState.QUEUED


def test_requester_cancels_from_the_detail_page(client, shop, team):
    created = services.request_submit(order=make_order(shop, team.project), requester=team.developer)
    client.force_login(team.developer)
    client.post(f"/requests/{created.pk}/cancel/", {"reason": "Not needed"})
    created.refresh_from_db()
    assert created.state == RequestState.CANCELLED
    assert created.events.filter(code="cancelled", message__contains="Not needed").exists()


def test_approver_approves_from_the_inbox(client, shop, team):
    approval_rule(approver_stage())
    created = services.request_submit(order=make_order(shop, team.project), requester=team.developer)
    client.force_login(team.approver)
    inbox = client.get("/approvals/").content.decode()
    assert f"#{created.pk}" in inbox and "80.00" in inbox
    task = created_task(created)
    client.post(f"/approvals/{task.pk}/decide/", {"decision": "approve", "comment": "ok"})
    created.refresh_from_db()
    assert created.state == RequestState.QUEUED


def test_reject_without_comment_is_refused_and_changes_nothing(client, shop, team):
    approval_rule(approver_stage())
    created = services.request_submit(order=make_order(shop, team.project), requester=team.developer)
    client.force_login(team.approver)
    response = client.post(f"/approvals/{created_task(created).pk}/decide/", {"decision": "reject"}, follow=True)
    assert "Say why you reject it" in response.content.decode()
    created.refresh_from_db()
    assert created.state == RequestState.PENDING_APPROVAL


@pytest.mark.parametrize("decision, comment, shown", [("approve", "ok", "approved"), ("reject", "too big", "rejected")])
def test_the_request_page_says_how_each_approver_decided(client, shop, team, decision, comment, shown):
    approval_rule(approver_stage())
    created = services.request_submit(order=make_order(shop, team.project), requester=team.developer)
    client.force_login(team.approver)
    client.post(f"/approvals/{created_task(created).pk}/decide/", {"decision": decision, "comment": comment})
    client.force_login(team.developer)
    page = client.get(f"/requests/{created.pk}/").content.decode()
    assert f"{team.approver.username}: {shown} — “{comment}”" in page


def test_someone_elses_approval_task_is_not_found(client, shop, team):
    approval_rule(approver_stage())
    created = services.request_submit(order=make_order(shop, team.project), requester=team.developer)
    client.force_login(team.developer2)
    assert client.post(f"/approvals/{created_task(created).pk}/decide/", {"decision": "approve"}).status_code == 404


def test_bulk_approve(client, shop, team):
    approval_rule(approver_stage())
    created = [
        services.request_submit(order=make_order(shop, team.project, spec=shop.sliced), requester=team.developer)
        for _ in range(3)
    ]
    client.force_login(team.approver)
    client.post("/approvals/bulk-approve/", {"task": [created_task(r).pk for r in created]})
    assert set(ResourceRequest.objects.values_list("state", flat=True)) == {RequestState.QUEUED}


def test_lead_asks_for_a_quota_change_from_the_quota_panel(client, team):
    client.force_login(team.lead)
    response = client.post(f"/projects/{team.project.pk}/quota/", {"gpus": "24", "justification": "New model"})
    assert response.status_code == 302
    assert team.project.quota_change_requests.get().limits == {"gpus": "24"}
    client.force_login(team.developer)
    page = client.get(f"/projects/{team.project.pk}/quota/").content.decode()
    assert "Only the project lead" in page


def created_task(request) -> ApprovalAssignment:
    return ApprovalAssignment.objects.get(stage__approval__subject_id=request.pk, decision="")


def _query_count(client, path) -> int:
    with CaptureQueriesContext(connection) as queries:
        assert client.get(path).status_code == 200
    return len(queries)


@pytest.mark.parametrize("path", ["/requests/?mine=0", "/approvals/", "/", "/projects/"])
def test_list_pages_run_a_constant_number_of_queries(client, shop, team, path):
    approval_rule(approver_stage())
    client.force_login(team.approver)

    def add_requests(count):
        for _ in range(count):
            services.request_submit(order=make_order(shop, team.project, spec=shop.sliced), requester=team.developer)
        factories.ServiceFactory(specs=[shop.whole], images=[shop.image])

    def served_query_count() -> int:
        """A served page's count: the second call's, the first filling what a process keeps (content types, the
        catalog it rebuilds when a service was added) once."""
        _query_count(client, path)
        return _query_count(client, path)

    add_requests(2)
    few = served_query_count()
    add_requests(6)
    assert served_query_count() == few


def test_role_matrix_for_a_pending_request(client, shop, team):
    """Who sees a pending request's page, its inbox entry, and may decide it."""
    approval_rule(approver_stage())
    created = services.request_submit(order=make_order(shop, team.project), requester=team.developer)
    other_project = factories.project()
    expectations = [  # user, sees detail, has it in the inbox
        (team.developer, True, False),
        (team.approver, True, True),
        (team.operator, True, False),
        (factories.member(other_project), False, False),
        (factories.member(other_project, Role.APPROVER), False, False),
    ]
    for user, sees_detail, in_inbox in expectations:
        client.force_login(user)
        assert client.get(f"/requests/{created.pk}/").status_code == (200 if sees_detail else 404), user
        assert (f"#{created.pk}" in client.get("/approvals/").content.decode()) is in_inbox, user


def test_the_request_list_keeps_failed_and_finished_rows_quiet(client, shop, team):
    """FAILED left TERMINAL_STATES (an operator may retry it), but its list row stays as quiet as before."""
    moving = services.request_submit(order=make_order(shop, team.project), requester=team.developer)
    services.record_event(request=moving, actor=None, code="note", message="still-moving-note")
    failed = services.request_submit(order=make_order(shop, team.project), requester=team.developer)
    services._transition(failed, "allocate", actor=None, code="allocated", message="allocated")
    services.request_fail(request=failed, failure={"step": "boot"}, message="failed-at-boot-note", data={})
    client.force_login(team.developer)
    page = client.get("/requests/").content.decode()
    assert "still-moving-note" in page
    assert "failed-at-boot-note" not in page
