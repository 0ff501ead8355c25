"""/api/v1/requests/, /approvals/ and /quota-change-requests/: who may do what, what the bodies say, what a
refusal leaves behind (nothing), and what a page costs in queries."""

from decimal import Decimal
from types import SimpleNamespace

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from catalog import services as catalog_services
from requests import services
from requests.choices import ApprovalState, Decision, RequestState
from requests.models import Approval, ApprovalAssignment, QuotaChangeRequest, RequestEvent, ResourceRequest
from requests.orders import ProjectUnknown
from tenancy import services as tenancy_services
from tenancy.choices import Role
from tenancy.models import Project
from tests import factories
from tests.module_data import shared_by_module
from tests.requests.conftest import GENEROUS_QUOTA, approval_rule, approver_stage, make_order, project_team

pytestmark = pytest.mark.django_db

REQUESTS = "/api/v1/requests/"
PREVIEW = f"{REQUESTS}preview/"
APPROVALS = "/api/v1/approvals/"
BULK_APPROVE = f"{APPROVALS}bulk-approve/"
QUOTA_CHANGES = "/api/v1/quota-change-requests/"
ERROR_KEYS = {"code", "message", "details"}
OUTSIDERS = ["other_developer", "other_approver", "operator"]


@shared_by_module
def people():
    """The team's project and roles (tests/requests/conftest.py), plus a second project with its own developer and
    approver."""
    team = project_team()
    elsewhere = factories.project(quota=GENEROUS_QUOTA)
    return SimpleNamespace(
        **vars(team),
        other_project=elsewhere,
        other_developer=factories.member(elsewhere),
        other_approver=factories.member(elsewhere, Role.APPROVER),
    )


@pytest.fixture
def review(people):
    """Resource requests go to the project's approvers."""
    return approval_rule(approver_stage())


def order_body(shop, project, **overrides) -> dict:
    body = {
        "service": shop.service.pk,
        "project": project.pk,
        "spec": shop.whole.pk,
        "image": shop.image.pk,
        "duration_hours": 10,
    }
    return {**body, **overrides}


def submit(shop, people, **overrides) -> ResourceRequest:
    """A request from the team's developer, made through the service as the portal would."""
    return services.request_submit(order=make_order(shop, people.project, **overrides), requester=people.developer)


def task_of(resource_request, approver) -> ApprovalAssignment:
    return ApprovalAssignment.objects.get(stage__approval__subject_id=resource_request.pk, approver=approver)


def stored_rows() -> tuple[int, ...]:
    return (
        ResourceRequest.objects.count(),
        RequestEvent.objects.count(),
        Approval.objects.count(),
        QuotaChangeRequest.objects.count(),
    )


def state_of(resource_request) -> str:
    return ResourceRequest.objects.get(pk=resource_request.pk).state


def refused(response, status: int, code: str) -> dict:
    assert response.status_code == status, response.content
    body = response.json()
    assert set(body) == ERROR_KEYS
    assert body["code"] == code
    return body


def ids(response) -> set[int]:
    assert response.status_code == 200, response.content
    return {row["id"] for row in response.json()["results"]}


def query_count(client, path: str) -> int:
    with CaptureQueriesContext(connection) as queries:
        response = client.get(path)
    assert response.status_code == 200, response.content
    return len(queries)


# --- Anonymous ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("get", REQUESTS),
        ("post", REQUESTS),
        ("post", PREVIEW),
        ("get", "{request}"),
        ("post", "{request}cancel/"),
        ("get", APPROVALS),
        ("get", "{task}"),
        ("post", "{task}approve/"),
        ("post", "{task}reject/"),
        ("post", BULK_APPROVE),
        ("get", QUOTA_CHANGES),
        ("post", QUOTA_CHANGES),
    ],
)
def test_anonymous_gets_401_in_the_error_shape_and_changes_nothing(api, shop, people, review, method, path):
    pending = submit(shop, people)
    path = path.format(request=f"{REQUESTS}{pending.pk}/", task=f"{APPROVALS}{task_of(pending, people.approver).pk}/")
    before = stored_rows()

    response = getattr(api, method)(path, {"ids": [1], "comment": "ok"} if method == "post" else None)

    refused(response, 401, "not_authenticated")
    assert stored_rows() == before
    assert state_of(pending) == RequestState.PENDING_APPROVAL


# --- Role matrix: requests ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("who", "sees"),
    [
        ("developer", True),
        ("approver", True),
        ("lead", True),
        ("other_developer", False),
        ("other_approver", False),
        ("operator", True),
    ],
)
def test_request_list_shows_only_what_the_caller_may_see(api_as, shop, people, who, sees):
    mine = submit(shop, people)

    assert ids(api_as(getattr(people, who)).get(REQUESTS)) == ({mine.pk} if sees else set())


@pytest.mark.parametrize(
    ("who", "status"),
    [("developer", 200), ("approver", 200), ("other_developer", 404), ("other_approver", 404), ("operator", 200)],
)
def test_request_detail_is_404_outside_the_callers_projects(api_as, shop, people, who, status):
    response = api_as(getattr(people, who)).get(f"{REQUESTS}{submit(shop, people).pk}/")

    assert response.status_code == status
    if status == 404:
        refused(response, 404, "not_found")


@pytest.mark.parametrize("who", ["approver", "operator"])
def test_submit_without_request_permission_on_a_project_one_sees_is_422_and_stores_nothing(api_as, shop, people, who):
    before = stored_rows()

    response = api_as(getattr(people, who)).post(REQUESTS, order_body(shop, people.project))

    refused(response, 422, "not_permitted_on_project")
    assert stored_rows() == before


@pytest.mark.parametrize("who", ["approver", "operator"])
def test_preview_without_request_permission_is_422(api_as, shop, people, who):
    response = api_as(getattr(people, who)).post(PREVIEW, order_body(shop, people.project))

    refused(response, 422, "not_permitted_on_project")


def _unknown_project_id() -> int:
    return (Project.objects.order_by("-pk").values_list("pk", flat=True).first() or 0) + 1000


@pytest.mark.parametrize("path", [REQUESTS, PREVIEW])
@pytest.mark.parametrize("who", ["other_developer", "other_approver"])
def test_ordering_for_a_project_one_cannot_see_is_answered_as_for_one_that_does_not_exist(
    api_as, shop, people, who, path
):
    """Same status, code and message (the id is the caller's own input): nothing says the project exists."""
    client, before = api_as(getattr(people, who)), stored_rows()
    hidden, missing = people.project.pk, _unknown_project_id()

    refusals = [
        client.post(path, order_body(shop, people.project)),
        client.post(path, {**order_body(shop, people.project), "project": missing}),
    ]

    bodies = [refused(answer, 400, "validation_error") for answer in refusals]
    assert [body["message"] for body in bodies] == [f"project: No project with id {pk}." for pk in (hidden, missing)]
    assert bodies[0]["details"] == {"project": [f"No project with id {hidden}."]}
    assert (
        people.project.name not in refusals[0].content.decode()
        and people.project.slug not in refusals[0].content.decode()
    )
    assert stored_rows() == before


def test_a_service_asked_to_order_for_a_project_the_requester_cannot_see_refuses_as_the_api_does(shop, people):
    with pytest.raises(ProjectUnknown) as refusal:
        services.request_preview(order=make_order(shop, people.project), requester=people.other_developer)

    assert (refusal.value.status_code, refusal.value.code, refusal.value.message) == (
        400,
        "validation_error",
        f"project: No project with id {people.project.pk}.",
    )


@pytest.mark.parametrize(
    ("who", "status"),
    [
        ("developer", 200),
        ("lead", 200),
        ("operator", 200),
        ("approver", 403),
        ("developer2", 403),
        ("other_developer", 404),
        ("other_approver", 404),
    ],
)
def test_cancel_by_requester_lead_or_operator_only(api_as, shop, people, who, status):
    queued = submit(shop, people)

    response = api_as(getattr(people, who)).post(f"{REQUESTS}{queued.pk}/cancel/", {"reason": "not needed"})

    assert response.status_code == status, response.content
    if status == 200:
        assert response.json()["state"] == RequestState.CANCELLED
    else:
        refused(response, status, "permission_denied" if status == 403 else "not_found")
        assert state_of(queued) == RequestState.QUEUED


# --- Role matrix: approvals --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("who", "sees"),
    [
        ("approver", True),
        ("developer", False),
        ("other_developer", False),
        ("other_approver", False),
        ("operator", False),
    ],
)
def test_inbox_holds_only_the_callers_own_tasks(api_as, shop, people, review, who, sees):
    task = task_of(submit(shop, people), people.approver)

    assert ids(api_as(getattr(people, who)).get(APPROVALS)) == ({task.pk} if sees else set())


@pytest.mark.parametrize(
    ("who", "status"),
    [("approver", 200), ("developer", 404), ("other_developer", 404), ("other_approver", 404), ("operator", 404)],
)
def test_task_detail_only_for_its_approver(api_as, shop, people, review, who, status):
    task = task_of(submit(shop, people), people.approver)

    assert api_as(getattr(people, who)).get(f"{APPROVALS}{task.pk}/").status_code == status


@pytest.mark.parametrize("who", ["developer", *OUTSIDERS])
@pytest.mark.parametrize("decision", ["approve", "reject"])
def test_deciding_someone_elses_task_is_404_and_changes_nothing(api_as, shop, people, review, who, decision):
    pending = submit(shop, people)
    task = task_of(pending, people.approver)

    response = api_as(getattr(people, who)).post(f"{APPROVALS}{task.pk}/{decision}/", {"comment": "mine now"})

    refused(response, 404, "not_found")
    assert state_of(pending) == RequestState.PENDING_APPROVAL
    assert ApprovalAssignment.objects.get(pk=task.pk).decision == ""


@pytest.mark.parametrize("who", ["developer", *OUTSIDERS])
def test_bulk_approve_reports_other_peoples_tasks_as_not_found(api_as, shop, people, review, who):
    pending = submit(shop, people)
    task = task_of(pending, people.approver)

    response = api_as(getattr(people, who)).post(BULK_APPROVE, {"ids": [task.pk]})

    assert response.json()["results"] == [
        {"id": task.pk, "ok": False, "code": "not_found", "message": "No such approval task."}
    ]
    assert state_of(pending) == RequestState.PENDING_APPROVAL


# --- Role matrix: quota change requests --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("who", "sees"),
    [
        ("lead", True),
        ("developer", True),
        ("approver", True),
        ("other_developer", False),
        ("other_approver", False),
        ("operator", True),
    ],
)
def test_quota_change_list_shows_only_visible_projects(api_as, people, who, sees):
    api_as(people.lead).post(
        QUOTA_CHANGES, {"project": people.project.pk, "limits": {"gpus": 32}, "justification": "Training run"}
    )
    change = QuotaChangeRequest.objects.get()

    assert ids(api_as(getattr(people, who)).get(QUOTA_CHANGES)) == ({change.pk} if sees else set())


def test_quota_change_as_lead_is_201_pending_with_previous_limits(api_as, people):
    response = api_as(people.lead).post(
        QUOTA_CHANGES,
        {"project": people.project.pk, "limits": {"gpus": "32", "cpu_cores": None}, "justification": "Training run"},
    )

    assert response.status_code == 201, response.content
    body = response.json()
    assert body["state"] == "pending_approval"
    assert body["limits"] == {"gpus": "32.00", "cpu_cores": None}
    assert body["previous_limits"] == {"gpus": "16.00", "cpu_cores": "256"}
    assert body["requested_by"] == people.lead.username


@pytest.mark.parametrize("who", ["developer", "approver", "operator"])
def test_quota_change_by_anyone_but_the_lead_is_403(api_as, people, who):
    response = api_as(getattr(people, who)).post(
        QUOTA_CHANGES, {"project": people.project.pk, "limits": {"gpus": 32}, "justification": "More"}
    )

    refused(response, 403, "not_project_lead")
    assert not QuotaChangeRequest.objects.exists()


@pytest.mark.parametrize("who", ["other_developer", "other_approver"])
def test_quota_change_for_a_project_one_cannot_see_is_answered_as_for_one_that_does_not_exist(api_as, people, who):
    client = api_as(getattr(people, who))
    bodies = [
        refused(
            client.post(QUOTA_CHANGES, {"project": pk, "limits": {"gpus": 32}, "justification": "More"}),
            400,
            "validation_error",
        )
        for pk in (people.project.pk, _unknown_project_id())
    ]

    assert [body["details"] for body in bodies] == [
        {"project": [f"No project with id {pk}."]} for pk in (people.project.pk, _unknown_project_id())
    ]
    assert not QuotaChangeRequest.objects.exists()


def test_quota_change_reaches_the_operators_inbox_with_old_and_new_limits(api_as, people):
    api_as(people.lead).post(
        QUOTA_CHANGES, {"project": people.project.pk, "limits": {"gpus": 32}, "justification": "Training run"}
    )

    row = api_as(people.operator).get(APPROVALS).json()["results"][0]

    assert row["request"] is None
    assert row["quota_change"]["limits"] == {"gpus": "32.00"}
    assert row["quota_change"]["previous_limits"] == {"gpus": "16.00"}


def test_operator_approving_a_quota_change_applies_it(api_as, people):
    api_as(people.lead).post(
        QUOTA_CHANGES, {"project": people.project.pk, "limits": {"gpus": 32}, "justification": "Training run"}
    )
    task = ApprovalAssignment.objects.get(approver=people.operator)

    api_as(people.operator).post(f"{APPROVALS}{task.pk}/approve/")

    change = api_as(people.lead).get(f"{QUOTA_CHANGES}{QuotaChangeRequest.objects.get().pk}/").json()
    assert change["state"] == "applied"
    assert api_as(people.lead).get(f"/api/v1/projects/{people.project.pk}/").json()["quota"]["gpus"] == "32.00"


def test_quota_change_list_filters_by_project_and_state(api_as, people):
    api_as(people.lead).post(
        QUOTA_CHANGES, {"project": people.project.pk, "limits": {"gpus": 32}, "justification": "Training run"}
    )
    change = QuotaChangeRequest.objects.get()
    client = api_as(people.operator)

    assert ids(client.get(QUOTA_CHANGES, {"project": people.project.pk, "state": "pending_approval"})) == {change.pk}
    assert ids(client.get(QUOTA_CHANGES, {"project": people.other_project.pk})) == set()
    assert ids(client.get(QUOTA_CHANGES, {"state": "applied"})) == set()


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        ({"limits": {"gpus": "lots"}, "justification": "x"}, 400, "validation_error"),
        ({"limits": {"gpus": "10000000000"}, "justification": "x"}, 400, "validation_error"),
        ({"limits": ["gpus"], "justification": "x"}, 400, "validation_error"),
        ({"limits": {"parking_spaces": 3}, "justification": "x"}, 422, "unknown_quota_dimension"),
        ({"limits": {"cpu_cores": "1.5"}, "justification": "x"}, 422, "invalid_quota_value"),
        ({"limits": {"gpus": 32}, "justification": " "}, 422, "justification_required"),
        ({"limits": {"gpus": "16"}, "justification": "x"}, 422, "no_change"),
    ],
)
def test_bad_quota_change_is_refused_with_a_code(api_as, people, body, status, code):
    response = api_as(people.lead).post(QUOTA_CHANGES, {"project": people.project.pk, **body})

    refused(response, status, code)
    assert not QuotaChangeRequest.objects.exists()


# --- Submission --------------------------------------------------------------------------------------------


def test_submit_without_a_policy_is_201_queued_with_a_frozen_snapshot(api_as, shop, people):
    parameters = {"environment": "staging", "workload": "fine-tuning"}
    response = api_as(people.developer).post(REQUESTS, order_body(shop, people.project, parameters=parameters))

    assert response.status_code == 201, response.content
    body = response.json()
    assert (body["state"], body["state_label"]) == ("queued", "Queued")
    assert body["tenant"]["slug"] == people.project.tenant.slug
    assert body["requester"] == people.developer.username
    assert body["spec"] == {"id": shop.whole.pk, "name": shop.whole.name}
    assert body["cost_estimate"] == "80.00"  # 2 cards x 4.00 per hour x 10 hours
    assert body["parameters"] == {"environment": "staging", "workload": "fine-tuning"}
    assert len(body["approved_spec_hash"]) == 64 and body["approved_spec"]["request"] == body["id"]
    assert body["approval"] is None
    assert [event["code"] for event in body["timeline"]] == ["submitted", "admitted", "auto_approved", "queued"]
    assert all(body[key] is None for key in ("allocation", "provisioning", "endpoint", "usage"))
    # queued, but no scheduling cycle has looked at it yet: no position, no reason
    assert body["queue"] == {
        "position": None,
        "code": None,
        "message": None,
        "numbers": None,
        "updated_at": None,
        "expected_start": None,
    }


def test_submit_with_a_policy_waits_for_the_approver(api_as, shop, people, review):
    body = api_as(people.developer).post(REQUESTS, order_body(shop, people.project)).json()

    assert body["state"] == "pending_approval"
    stage = body["approval"]["stages"][0]
    assert (stage["state"], stage["mode"]) == ("pending", "any")
    assert stage["assignments"] == [
        {"approver": people.approver.username, "decision": "", "comment": "", "decided_at": None}
    ]


@pytest.mark.parametrize(
    ("over_quota", "policy", "state"),
    [
        ("reject", False, RequestState.QUEUED),  # approved automatically
        ("reject", True, RequestState.PENDING_APPROVAL),
        ("wait", False, RequestState.WAITING_FOR_QUOTA),
        ("exception", False, RequestState.PENDING_APPROVAL),
    ],
)
def test_the_submission_answers_with_the_detail_it_would_read_back(api_as, shop, people, over_quota, policy, state):
    """The answer is built from what the submission wrote, reading nothing: it must be the request's detail."""
    if policy:
        approval_rule(approver_stage())
    if over_quota != "reject":  # 2 cards over a limit of 1, which a 2-card order alone does not pass when waiting
        limit = Decimal(3) if over_quota == "wait" else Decimal(1)
        tenancy_services.quota_set(quota=people.project.quota, limits={"gpus": limit}, actor=None)
        if over_quota == "wait":
            assert api_as(people.developer).post(REQUESTS, order_body(shop, people.project)).status_code == 201
    api = api_as(people.developer)

    answer = api.post(REQUESTS, order_body(shop, people.project, over_quota=over_quota, justification="Deadline"))

    assert (answer.status_code, answer.json()["state"]) == (201, state), answer.content
    assert answer.json() == api.get(f"{REQUESTS}{answer.json()['id']}/").json()


def test_a_submission_costs_the_same_queries_whatever_the_history(api_as, shop, people):
    api = api_as(people.developer)
    api.post(REQUESTS, order_body(shop, people.project))  # the process keeps the catalog and the rules now
    with CaptureQueriesContext(connection) as first:
        assert api.post(REQUESTS, order_body(shop, people.project)).status_code == 201
    for _ in range(3):
        api.post(REQUESTS, order_body(shop, people.project, spec=shop.sliced.pk))
    with CaptureQueriesContext(connection) as later:
        assert api.post(REQUESTS, order_body(shop, people.project)).status_code == 201
    # 18: the 16th counts the open orders the caps bound (one statement), the 17th asks whether the caller may see
    # the project named (before ordering), the 18th writes the submission's moves to the shared audit trail (one
    # INSERT for all of them)
    assert len(later) == len(first) <= 18


def _deprecated(shop):
    catalog_services.spec_deprecate(spec=shop.whole, reason="End of life", actor=None)
    return {}


def _foreign_spec(shop):
    return {"spec": factories.ResourceSpecFactory().pk}


def _incompatible_image(shop):
    image = factories.ImageFactory(compatible_vendors=[factories.vendor("amd")])
    shop.service.images.add(image)
    return {"image": image.pk}


@pytest.mark.parametrize(
    ("change", "code"),
    [
        (_foreign_spec, "spec_not_offered"),
        (_deprecated, "spec_deprecated"),
        (_incompatible_image, "image_incompatible"),
        (lambda shop: {"duration_hours": 169}, "duration_out_of_range"),
        (lambda shop: {"duration_hours": 0}, "duration_out_of_range"),
    ],
)
def test_orders_the_catalog_does_not_allow_are_422_with_their_code(api_as, shop, people, change, code):
    body = order_body(shop, people.project, **change(shop))
    before = stored_rows()

    refused(api_as(people.developer).post(REQUESTS, body), 422, code)
    assert stored_rows() == before


def test_order_for_an_inactive_project_is_422_project_inactive(api_as, shop, people):
    tenancy_services.project_update(project=people.project, active=False, actor=None)

    refused(api_as(people.developer).post(REQUESTS, order_body(shop, people.project)), 422, "project_inactive")
    assert not ResourceRequest.objects.exists()


def test_restricted_service_cannot_be_ordered_for_a_project_it_is_not_offered_to(api_as, shop, people):
    shop.service.visibility = "restricted"
    shop.service.save(update_fields=["visibility"])
    shop.service.visible_projects.set([people.other_project])

    response = api_as(people.developer).post(REQUESTS, order_body(shop, people.project))

    refused(response, 422, "service_not_offered_to_project")


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("service", 999999),
        ("project", 999999),
        ("spec", 999999),
        ("image", 999999),
        ("serving_template", 999999),
        ("project", "ten"),
        ("duration_hours", "long"),
        ("over_quota", "maybe"),
        ("priority", "urgent"),
        ("parameters", {"nested": {"a": 1}}),
        ("parameters", {"list": [1]}),
        ("parameters", ["a"]),
    ],
)
def test_malformed_order_is_400_validation_error_naming_the_field(api_as, shop, people, field, value):
    response = api_as(people.developer).post(REQUESTS, {**order_body(shop, people.project), field: value})

    assert field in refused(response, 400, "validation_error")["details"]
    assert not ResourceRequest.objects.exists()


def test_missing_fields_are_400(api_as, people):
    body = refused(api_as(people.developer).post(REQUESTS, {}), 400, "validation_error")

    assert {"service", "project", "duration_hours"} <= set(body["details"])


def test_over_quota_is_409_with_one_reason_per_dimension_and_nothing_stored(api_as, shop, people):
    tenancy_services.quota_set(quota=people.project.quota, limits={"gpus": Decimal(1), "cpu_cores": 8}, actor=None)
    before = stored_rows()

    body = refused(api_as(people.developer).post(REQUESTS, order_body(shop, people.project)), 409, "quota_exceeded")

    reasons = {reason["dimension"]: reason for reason in body["details"]["reasons"]}
    assert set(reasons) == {"gpus", "cpu_cores"}
    assert reasons["cpu_cores"] == {
        "code": "quota_exceeded",
        "scope": "project",
        "dimension": "cpu_cores",
        "requested": 16,
        "used": 0,
        "limit": 8,
        "message": reasons["cpu_cores"]["message"],
    }
    assert Decimal(reasons["gpus"]["requested"]) == 2 and Decimal(reasons["gpus"]["limit"]) == 1
    assert "over the limit" in reasons["gpus"]["message"]
    assert stored_rows() == before


def test_over_quota_with_wait_is_201_waiting_for_quota_with_reasons(api_as, shop, people):
    tenancy_services.quota_set(quota=people.project.quota, limits={"gpus": Decimal(3)}, actor=None)
    assert api_as(people.developer).post(REQUESTS, order_body(shop, people.project)).status_code == 201  # 2 of 3

    response = api_as(people.developer).post(REQUESTS, order_body(shop, people.project, over_quota="wait"))

    assert response.status_code == 201, response.content
    assert response.json()["state"] == "waiting_for_quota"
    assert [reason["dimension"] for reason in response.json()["quota_reasons"]] == ["gpus"]


def test_over_quota_with_wait_beyond_the_limit_itself_is_409_exceeds_limit(api_as, shop, people):
    tenancy_services.quota_set(quota=people.project.quota, limits={"gpus": Decimal(1)}, actor=None)
    before = stored_rows()

    response = api_as(people.developer).post(REQUESTS, order_body(shop, people.project, over_quota="wait"))

    assert response.status_code == 409, response.content
    assert response.json()["code"] == "exceeds_limit"
    assert [reason["dimension"] for reason in response.json()["details"]["reasons"]] == ["gpus"]
    assert stored_rows() == before


def test_over_quota_exception_with_justification_goes_to_approval(api_as, shop, people):
    tenancy_services.quota_set(quota=people.project.quota, limits={"gpus": Decimal(1)}, actor=None)
    body = order_body(shop, people.project, over_quota="exception", justification="Deadline on Friday")

    response = api_as(people.developer).post(REQUESTS, body)

    assert response.status_code == 201, response.content
    assert (response.json()["state"], response.json()["quota_exception"]) == ("pending_approval", True)


def test_over_quota_exception_without_justification_is_422(api_as, shop, people):
    tenancy_services.quota_set(quota=people.project.quota, limits={"gpus": Decimal(1)}, actor=None)

    response = api_as(people.developer).post(REQUESTS, order_body(shop, people.project, over_quota="exception"))

    refused(response, 422, "justification_required")
    assert not ResourceRequest.objects.exists()


# --- Preview -----------------------------------------------------------------------------------------------


def test_preview_answers_cost_quota_and_route_and_stores_nothing(api_as, shop, people, review):
    before = stored_rows()

    response = api_as(people.developer).post(PREVIEW, order_body(shop, people.project))

    assert response.status_code == 200, response.content
    body = response.json()
    assert body["cost"] == {"hourly": "8.00", "duration_hours": 10, "total": "80.00", "currency": "USD"}
    assert body["fits_quota"] is True and body["quota_reasons"] == []
    assert {row["dimension"] for row in body["quota"]} == {
        "gpus",
        "accelerator_memory_gb",
        "cpu_cores",
        "memory_gb",
        "concurrent_tasks",
        "monthly_card_hours",
    }
    assert body["approval_route"]["automatic"] is False
    assert body["approval_route"]["stages"][0]["approvers"] == [people.approver.username]
    assert stored_rows() == before


def test_preview_over_quota_names_the_exceeded_dimension(api_as, shop, people):
    tenancy_services.quota_set(quota=people.project.quota, limits={"gpus": Decimal(1)}, actor=None)

    body = api_as(people.developer).post(PREVIEW, order_body(shop, people.project)).json()

    assert body["fits_quota"] is False
    assert [reason["dimension"] for reason in body["quota_reasons"]] == ["gpus"]
    assert not ResourceRequest.objects.exists()


def test_preview_of_an_invalid_order_is_422(api_as, shop, people):
    refused(
        api_as(people.developer).post(PREVIEW, order_body(shop, people.project, duration_hours=500)),
        422,
        "duration_out_of_range",
    )


# --- Reading requests --------------------------------------------------------------------------------------


def test_request_list_filters_by_state_project_and_service_kind(api_as, shop, people, review):
    pending = submit(shop, people)
    cancelled = services.request_cancel(request=submit(shop, people), actor=people.developer)
    client = api_as(people.operator)

    assert ids(client.get(REQUESTS, {"state": "pending_approval"})) == {pending.pk}
    assert ids(client.get(REQUESTS, {"state": "cancelled"})) == {cancelled.pk}
    assert ids(client.get(REQUESTS, {"project": people.project.pk})) == {pending.pk, cancelled.pk}
    assert ids(client.get(REQUESTS, {"project": people.other_project.pk})) == set()
    assert ids(client.get(REQUESTS, {"service_kind": "compute"})) == {pending.pk, cancelled.pk}
    assert ids(client.get(REQUESTS, {"service_kind": "bare_metal"})) == set()
    refused(client.get(REQUESTS, {"state": "bogus"}), 400, "validation_error")


def test_detail_of_an_unknown_or_malformed_id_is_404(api_as, people):
    client = api_as(people.developer)

    refused(client.get(f"{REQUESTS}999999/"), 404, "not_found")
    refused(client.get(f"{REQUESTS}abc/"), 404, "not_found")


def test_request_list_query_count_does_not_grow_with_rows(api_as, shop, people):
    client = api_as(people.developer)
    submit(shop, people)
    client.get(REQUESTS)  # warm per-process caches (content types) before measuring

    few = query_count(client, REQUESTS)
    for _ in range(8):
        submit(shop, people, spec=shop.sliced, duration_hours=5)
    many = query_count(client, REQUESTS)

    assert client.get(REQUESTS).json()["count"] == 9
    assert few == many


def test_queue_detail_and_operator_pages_query_counts_do_not_grow_with_rows_or_events(api_as, shop, people):
    """The pages the API load benchmark drives (bench/report/api_load.py) at a few rows and at more rows with
    a long timeline: the same queries."""
    first = submit(shop, people)  # no approval policy: approved on submission and queued
    pages = [
        (people.developer, "/api/v1/queue/"),
        (people.developer, f"{REQUESTS}{first.pk}/"),
        (people.operator, REQUESTS),
        (people.operator, "/api/v1/queue/"),
    ]
    for user, path in pages:
        api_as(user).get(path)  # warm per-process caches (content types) before measuring

    few = [query_count(api_as(user), path) for user, path in pages]
    for _ in range(8):
        submit(shop, people, spec=shop.sliced, duration_hours=5)
        services.request_submit(order=make_order(shop, people.other_project), requester=people.other_developer)
    waits = [RequestEvent(request=first, code="queue_reason", message="Waiting.", data={"n": n}) for n in range(40)]
    RequestEvent.objects.bulk_create(waits)
    many = [query_count(api_as(user), path) for user, path in pages]

    assert api_as(people.developer).get("/api/v1/queue/").json()["count"] == 9
    assert len(api_as(people.developer).get(f"{REQUESTS}{first.pk}/").json()["timeline"]) > 40
    assert api_as(people.operator).get(REQUESTS).json()["count"] == 17
    assert few == many


# --- Cancelling --------------------------------------------------------------------------------------------


def test_cancel_puts_the_reason_on_the_timeline_and_withdraws_the_approval(api_as, shop, people, review):
    pending = submit(shop, people)

    body = api_as(people.developer).post(f"{REQUESTS}{pending.pk}/cancel/", {"reason": "Plans changed"}).json()

    assert body["state"] == "cancelled"
    assert body["timeline"][-1]["code"] == "cancelled" and "Plans changed" in body["timeline"][-1]["message"]
    assert body["approval"]["state"] == ApprovalState.CANCELLED
    assert ids(api_as(people.approver).get(APPROVALS)) == set()


def test_cancelling_twice_is_409_illegal_transition_with_the_current_state(api_as, shop, people):
    queued = submit(shop, people)
    client = api_as(people.developer)
    client.post(f"{REQUESTS}{queued.pk}/cancel/")
    events = RequestEvent.objects.count()

    body = refused(client.post(f"{REQUESTS}{queued.pk}/cancel/"), 409, "illegal_transition")

    assert body["details"]["state"] == "cancelled"
    assert RequestEvent.objects.count() == events


# --- Deciding ----------------------------------------------------------------------------------------------


def test_approve_moves_the_request_to_queued_with_its_snapshot_hash(api_as, shop, people, review):
    pending = submit(shop, people)
    task = task_of(pending, people.approver)

    response = api_as(people.approver).post(f"{APPROVALS}{task.pk}/approve/", {"comment": "Fine"})

    assert response.status_code == 200, response.content
    assert (response.json()["decision"], response.json()["approval_state"]) == ("approve", "approved")
    detail = api_as(people.developer).get(f"{REQUESTS}{pending.pk}/").json()
    assert detail["state"] == "queued"
    assert len(detail["approved_spec_hash"]) == 64 and detail["approved_at"]
    assert detail["approval"]["stages"][0]["assignments"][0]["decision"] == Decision.APPROVE


def test_reject_moves_the_request_to_rejected_with_the_comment_on_its_timeline(api_as, shop, people, review):
    pending = submit(shop, people)
    task = task_of(pending, people.approver)

    api_as(people.approver).post(f"{APPROVALS}{task.pk}/reject/", {"comment": "Use the slice spec"})

    detail = api_as(people.developer).get(f"{REQUESTS}{pending.pk}/").json()
    assert detail["state"] == "rejected"
    last = detail["timeline"][-1]
    assert (last["code"], last["actor"], last["data"]) == (
        "rejected",
        people.approver.username,
        {"comment": "Use the slice spec"},
    )


def test_reject_without_a_comment_is_422_and_changes_nothing(api_as, shop, people, review):
    pending = submit(shop, people)
    task = task_of(pending, people.approver)

    refused(api_as(people.approver).post(f"{APPROVALS}{task.pk}/reject/", {"comment": "  "}), 422, "comment_required")
    assert state_of(pending) == RequestState.PENDING_APPROVAL


def test_deciding_twice_is_409(api_as, shop, people, review):
    task = task_of(submit(shop, people), people.approver)
    client = api_as(people.approver)
    client.post(f"{APPROVALS}{task.pk}/approve/")

    refused(client.post(f"{APPROVALS}{task.pk}/reject/", {"comment": "changed my mind"}), 409, "already_decided")


def test_requester_cannot_approve_their_own_request(api_as, shop, people, review):
    """Routing never assigns requesters; an assignment added by hand (say in the admin) still cannot be used."""
    pending = submit(shop, people)
    own = ApprovalAssignment.objects.create(stage=task_of(pending, people.approver).stage, approver=people.developer)

    refused(api_as(people.developer).post(f"{APPROVALS}{own.pk}/approve/"), 403, "self_approval")
    assert state_of(pending) == RequestState.PENDING_APPROVAL


def test_bulk_approve_approves_what_it_can_and_reports_the_rest(api_as, shop, people, review):
    first, second = submit(shop, people), submit(shop, people, spec=shop.sliced)
    foreign = services.request_submit(order=make_order(shop, people.other_project), requester=people.other_developer)
    done = task_of(first, people.approver)
    client = api_as(people.approver)
    client.post(f"{APPROVALS}{done.pk}/approve/")
    ask = [done.pk, task_of(second, people.approver).pk, task_of(foreign, people.other_approver).pk]

    results = client.post(BULK_APPROVE, {"ids": ask, "comment": "Batch"}).json()["results"]

    assert [(row["id"], row["ok"], row["code"]) for row in results] == [
        (ask[0], False, "already_decided"),
        (ask[1], True, None),
        (ask[2], False, "not_found"),
    ]
    assert (state_of(second), state_of(foreign)) == (RequestState.QUEUED, RequestState.PENDING_APPROVAL)


@pytest.mark.parametrize("body", [{}, {"ids": []}, {"ids": ["x"]}, {"ids": 3}])
def test_bulk_approve_needs_a_list_of_ids(api_as, people, body):
    refused(api_as(people.approver).post(BULK_APPROVE, body), 400, "validation_error")


# --- The inbox ---------------------------------------------------------------------------------------------


def test_inbox_row_shows_the_request_and_quota_impact_counting_it_once(api_as, shop, people, review):
    tenancy_services.quota_set(quota=people.project.quota, limits={"gpus": Decimal(2)}, actor=None)
    pending = submit(shop, people)  # exactly fills the GPU quota; it already counts as used

    row = api_as(people.approver).get(APPROVALS).json()["results"][0]

    assert (row["requester"], row["project"]["id"], row["stage"]["name"]) == (
        people.developer.username,
        people.project.pk,
        "Stage 1",
    )
    assert row["route"].endswith("/ rule") and row["summary"].startswith(shop.service.name)
    request = row["request"]
    assert (request["id"], request["cost_estimate"], request["duration_hours"]) == (pending.pk, "80.00", 10)
    gpus = next(impact for impact in request["quota_impact"] if impact["dimension"] == "gpus")
    assert (Decimal(gpus["used"]), Decimal(gpus["requested"]), gpus["fits"]) == (0, 2, True)


def test_inbox_query_count_does_not_grow_with_tasks_or_projects(api_as, shop, people, review):
    client = api_as(people.approver)

    def another_project_with_a_pending_request():
        project = factories.project(quota=GENEROUS_QUOTA)
        tenant_quota = tenancy_services.tenant_quota_ensure(tenant=project.tenant, actor=None)
        tenancy_services.quota_set(quota=tenant_quota, limits={"gpus": Decimal(100)}, actor=None)
        factories.member(project, Role.APPROVER, user=people.approver)
        services.request_submit(order=make_order(shop, project), requester=factories.member(project))

    another_project_with_a_pending_request()
    client.get(APPROVALS)

    few = query_count(client, APPROVALS)
    for _ in range(5):
        another_project_with_a_pending_request()
        submit(shop, people)
    many = query_count(client, APPROVALS)

    assert client.get(APPROVALS).json()["count"] == 11
    assert few == many


# --- Parameters against the service's schema (issue 12 item 4) ----------------------------------------------


@pytest.mark.parametrize(
    ("parameters", "code", "rule"),
    [
        ({"batch": 1e16}, "parameter_unknown", "unknown"),
        ({"k" * 10_000: "v"}, "parameter_unknown", "unknown"),
        ({f"key{number}": 1 for number in range(5000)}, "parameters_too_large", "max_keys"),
        ({"workload": "x" * 200_000}, "parameter_invalid", "max_length"),
        ({"environment": "dev"}, "parameter_invalid", "type"),
    ],
)
@pytest.mark.parametrize("endpoint", [REQUESTS, f"{REQUESTS}preview/"])
def test_parameters_outside_the_schema_are_422_at_submission_and_preview(
    api_as, shop, people, parameters, code, rule, endpoint
):
    response = api_as(people.developer).post(endpoint, order_body(shop, people.project, parameters=parameters))

    body = refused(response, 422, code)
    assert (body["details"]["field"], body["details"]["rule"]) == ("parameters", rule)
    assert not ResourceRequest.objects.exists()


def test_the_catalog_api_shows_each_service_s_parameter_schema(api_as, shop, people):
    body = api_as(people.developer).get(f"/api/v1/catalog/services/{shop.service.pk}/").json()

    assert [entry["name"] for entry in body["parameter_schema"]] == ["environment", "workload"]
