"""The approval inbox for deciding fast: quota bars with what is in use apart from what awaits approval, age, sort,
filters, earlier stages' comments, warnings, bulk decisions with errors on their rows, the Decided tab, the role
matrix and constant query counts."""

from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from requests import approvals, services
from requests.choices import ApprovalMode, ApproverSource, Decision, RequestState
from requests.models import Approval, ApprovalAssignment, ResourceRequest
from tenancy.choices import Role
from tenancy.services import quota_set
from tests import factories
from tests.metering.conftest import eight_cards, world  # noqa: F401 (fixtures)
from tests.queries import queries_for
from tests.requests.conftest import GENEROUS_QUOTA, approval_rule, approver_stage, make_order

pytestmark = pytest.mark.django_db


def _task(request, approver) -> ApprovalAssignment:
    return ApprovalAssignment.objects.get(stage__approval__subject_id=request.pk, approver=approver, decision="")


def _submit(shop, team, **overrides):
    return services.request_submit(order=make_order(shop, team.project, **overrides), requester=team.developer)


def _limit_gpus(team, gpus):
    quota_set(quota=team.project.quota, limits={**GENEROUS_QUOTA, "gpus": Decimal(gpus)}, actor=None, reason="test")


def _inbox(client, user, query=""):
    client.force_login(user)
    response = client.get(f"/approvals/{query}")
    assert response.status_code == 200
    return response.content.decode()


def test_used_does_not_silently_include_other_pending_requests(client, shop, team):
    _limit_gpus(team, 7)
    approved = _submit(shop, team)  # no rule yet: approved automatically, 2 cards in use
    assert approved.state == RequestState.QUEUED
    approval_rule(approver_stage())
    first, second = _submit(shop, team), _submit(shop, team)
    page = _inbox(client, team.approver)
    # Each row: 2 in use, 2 of the other request awaiting approval, 2 this request, of 7 (6/7 is near the limit).
    assert page.count("GPUs (whole-card equivalents): 2 in use + 2 awaiting approval + 2 this request of 7") == 2
    assert "in use: approved, queued and running requests" in page  # what "used" counts, said once
    assert f'id="task-{_task(first, team.approver).pk}"' in page and f"#{second.pk}" in page
    assert "Concurrent tasks" not in page  # 3 of 10: well within, no bar
    assert "5 other limits well within" in page


def test_a_dimension_over_the_limit_says_so_and_one_over_only_with_the_others_approved_says_that(client, shop, team):
    _submit(shop, team)  # no rule yet: 2 cards in use
    approval_rule(approver_stage())
    _submit(shop, team)
    _submit(shop, team)
    _limit_gpus(team, 5)  # each pending row: 2 in use + 2 this request fits; with the other one awaiting, 6 > 5
    page = _inbox(client, team.approver)
    assert page.count('data-verdict="over if the others are approved"') == 2
    assert 'data-verdict="over"' not in page
    _limit_gpus(team, 3)  # 2 in use + 2 this request > 3
    page = _inbox(client, team.approver)
    assert page.count('data-verdict="over"') == 2
    assert f"#{ResourceRequest.objects.order_by('pk').last().pk}<" in _inbox(client, team.approver, "?flag=over")


def test_age_sort_and_filters(client, shop, team):
    approval_rule(approver_stage())
    old = _submit(shop, team, spec=shop.sliced)
    new = _submit(shop, team)
    Approval.objects.filter(subject_id=old.pk).update(created_at=timezone.now() - timedelta(days=2))
    other_project = factories.project(quota=GENEROUS_QUOTA)
    factories.member(other_project, Role.APPROVER, user=team.approver)
    outsider = factories.member(other_project)
    elsewhere = services.request_submit(order=make_order(shop, other_project), requester=outsider)

    page = _inbox(client, team.approver)
    assert "2\xa0days" in page  # the age column
    assert page.index(f"#{old.pk}<") < page.index(f"#{new.pk}<")  # waiting longest first
    page = _inbox(client, team.approver, "?sort=newest")
    assert page.index(f"#{new.pk}<") < page.index(f"#{old.pk}<")
    page = _inbox(client, team.approver, "?sort=cost")
    assert page.index(f"#{new.pk}<") < page.index(f"#{old.pk}<")  # 80.00 before 5.00
    page = _inbox(client, team.approver, f"?project={other_project.pk}")
    assert f"#{elsewhere.pk}<" in page and f"#{old.pk}<" not in page
    page = _inbox(client, team.approver, "?kind=quota")
    assert "Nothing here matches these filters; 3 items wait for you." in page


def test_a_later_stage_sees_the_earlier_stages_decisions_and_comments(client, shop, team):
    approval_rule(approver_stage(), approver_stage(Role.LEAD))
    created = _submit(shop, team)
    approvals.approval_decide(
        assignment=_task(created, team.approver),
        decision=Decision.APPROVE,
        comment="Budget checked",
        actor=team.approver,
    )
    page = _inbox(client, team.lead)
    assert f"{team.approver.username} approved: “Budget checked”" in page
    assert "Stage 2: Stage 2" in page


def test_a_request_no_node_could_hold_is_marked(client, shop, team):
    from tests.provisioning.conftest import add_node

    add_node(shop.accelerator, cards=1)
    approval_rule(approver_stage())
    _submit(shop, team)  # two cards: no node has two
    page = _inbox(client, team.approver)
    assert "can&#x27;t place" in page or "can't place" in page
    assert "?flag=never_fits" not in page
    assert "can't place" in _inbox(client, team.approver, "?flag=never_fits").replace("&#x27;", "'")


def test_rightsizing_advice_is_shown_on_the_row(client, world, eight_cards):  # noqa: F811
    from tests.metering.conftest import rolled_up

    today = timezone.now().date()
    for days_ago in (2, 5, 9):
        rolled_up(world, eight_cards.eight, day=today - timedelta(days=days_ago), busy=0.38, memory_gb=20, mean_pct=4.5)
    quota_set(quota=world.project.quota, limits={**GENEROUS_QUOTA, "gpus": Decimal(64)}, actor=None, reason="test")
    approver = factories.member(world.project, Role.APPROVER)
    approval_rule(approver_stage())
    order = make_order(world, world.project, spec=eight_cards.eight)
    services.request_submit(order=order, requester=world.developer)
    page = _inbox(client, approver, "?flag=rightsizing")
    assert "rightsizing</span> 8x Test H100 80GB requested 3 times" in page


def test_bulk_reject_with_a_comment_and_errors_on_their_rows(client, shop, team):
    approval_rule(approver_stage())
    created = [_submit(shop, team, spec=shop.sliced) for _ in range(3)]
    tasks = [_task(request, team.approver) for request in created]
    client.force_login(team.approver)
    response = client.post("/approvals/bulk/", {"task": [t.pk for t in tasks[:2]], "decision": "reject"})
    assert response.status_code == 302
    page = client.get(response.url).content.decode()
    assert page.count('class="errorlist row-error"') == 2  # a rejection needs a comment: each row says so
    assert "Say why you reject it" in page
    assert set(ResourceRequest.objects.values_list("state", flat=True)) == {RequestState.PENDING_APPROVAL}

    response = client.post(
        "/approvals/bulk/",
        {"task": [t.pk for t in tasks[:2]], "decision": "reject", "comment": "Too big", "back": "sort=cost"},
    )
    assert response.url == "/approvals/?sort=cost"  # back to the inbox as it was
    states = dict(ResourceRequest.objects.values_list("pk", "state"))
    assert [states[r.pk] for r in created] == [
        RequestState.REJECTED,
        RequestState.REJECTED,
        RequestState.PENDING_APPROVAL,
    ]
    assert created[0].events.filter(message__contains="Too big").exists()


def test_a_single_refusal_is_shown_on_its_row(client, shop, team):
    approval_rule(approver_stage())
    created = _submit(shop, team)
    task = _task(created, team.approver)
    client.force_login(team.approver)
    client.post(f"/approvals/{task.pk}/decide/", {"decision": "reject"})
    page = client.get("/approvals/").content.decode()
    assert f'<tr id="task-{task.pk}" data-kind="request" class="has-error">' in page


def test_the_decided_tab_lists_the_approvers_decisions_with_their_outcome(client, shop, team):
    approval_rule(approver_stage())
    approved, rejected = _submit(shop, team), _submit(shop, team)
    approvals.approval_decide(
        assignment=_task(approved, team.approver), decision=Decision.APPROVE, comment="ok", actor=team.approver
    )
    approvals.approval_decide(
        assignment=_task(rejected, team.approver), decision=Decision.REJECT, comment="Too big", actor=team.approver
    )
    page = _inbox(client, team.approver, "?tab=decided")
    assert f"#{approved.pk}<" in page and f"#{rejected.pk}<" in page
    assert "“Too big”" in page and ">Rejected<" in page and ">Approved<" in page
    assert page.index(f"#{rejected.pk}<") < page.index(f"#{approved.pk}<")  # newest first
    assert "Nothing is waiting for your decision." in _inbox(client, team.approver)
    assert "You have not decided anything yet." in _inbox(client, team.developer, "?tab=decided")


def test_role_matrix(client, shop, team):
    """Anonymous people sign in first; each role sees only the tasks that are theirs, on both tabs."""
    approval_rule(
        approver_stage(),
        (ApproverSource.OPERATORS, ApprovalMode.ANY, {}),
    )
    created = _submit(shop, team)
    assert client.get("/approvals/").status_code == 302
    assert client.get("/approvals/?tab=decided").status_code == 302
    stranger = factories.member(factories.project())
    expectations = [(stranger, False), (team.developer, False), (team.approver, True), (team.lead, False)]
    for user, sees in expectations:
        assert (f"#{created.pk}<" in _inbox(client, user)) is sees, user
    assert f"#{created.pk}<" not in _inbox(client, team.operator)  # the operators' stage has not opened yet
    approvals.approval_decide(
        assignment=_task(created, team.approver), decision=Decision.APPROVE, comment="", actor=team.approver
    )
    assert f"#{created.pk}<" in _inbox(client, team.operator)
    assert f"#{created.pk}<" in _inbox(client, team.approver, "?tab=decided")
    assert f"#{created.pk}<" not in _inbox(client, stranger, "?tab=decided")


@pytest.mark.parametrize("query", ["", "?sort=cost&flag=over", "?tab=decided"])
def test_constant_queries_however_many_rows(client, shop, team, query):
    approval_rule(approver_stage(), approver_stage(Role.LEAD))
    client.force_login(team.lead)

    def add(count):
        for _ in range(count):
            created = _submit(shop, team, spec=shop.sliced)
            approvals.approval_decide(
                assignment=_task(created, team.approver), decision=Decision.APPROVE, comment="ok", actor=team.approver
            )
            task = _task(created, team.lead)
            if query == "?tab=decided":
                approvals.approval_decide(assignment=task, decision=Decision.APPROVE, comment="", actor=team.lead)

    add(2)
    few = queries_for(client, f"/approvals/{query}")
    add(5)
    assert queries_for(client, f"/approvals/{query}") == few
