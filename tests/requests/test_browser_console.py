"""The operator console's home and the approval inbox in headless Chromium (Debian's package, driven by Playwright):
the dashboard's counts, the dry run of the approval policies, bulk decisions with select-all, and no horizontal
scroll at 390 px on the catalog, order, request and inbox pages."""

from decimal import Decimal

import pytest
from django.utils import timezone

from requests import services
from requests.choices import ApprovalMode, ApproverSource, RequestState
from requests.models import ResourceRequest
from tests.requests.conftest import approval_rule, approver_stage, make_order
from tests.requests.test_browser import (  # noqa: F401 (the fixture)
    LAPTOP,
    PHONE,
    browser,
    horizontal_overflow,
    signed_in,
)

OPERATORS_STAGE = (ApproverSource.OPERATORS, ApprovalMode.ANY, {})


@pytest.mark.django_db(transaction=True, serialized_rollback=True)
def test_the_operator_lands_on_a_dashboard_whose_counts_lead_to_the_work(browser, live_server, shop, team):  # noqa: F811
    from metering.choices import BudgetLevel
    from metering.models import BudgetAlert
    from scheduling import services as scheduling_services
    from tests.provisioning.conftest import add_node

    approval_rule(OPERATORS_STAGE)
    for _ in range(3):
        services.request_submit(order=make_order(shop, team.project, spec=shop.sliced), requester=team.developer)
    node = add_node(shop.accelerator, cards=2)
    scheduling_services.device_isolate(device=node.devices.first(), reason="ECC errors", actor=team.operator)
    BudgetAlert.objects.create(
        project=team.project,
        month=timezone.now().date().replace(day=1),
        level=BudgetLevel.WARNING,
        card_hours=Decimal(85),
        limit=Decimal(100),
    )

    page = signed_in(browser, live_server, team.operator)
    assert page.url.endswith("/admin/")  # the operator's landing page is the console's home
    assert page.get_attribute("#panel-approvals [data-count]", "data-count") == "3"
    assert page.get_attribute("#panel-devices [data-count]", "data-count") == "1"
    assert page.get_attribute("#panel-budgets [data-count]", "data-count") == "1"
    assert page.get_attribute("#panel-failed_runs [data-count]", "data-count") == "0"
    assert "ECC errors" in page.inner_text("#panel-devices")
    assert page.locator("#panel-capacity a:text-is('Capacity page')").count() == 1

    page.click("#panel-approvals >> text=Open your approval inbox")
    page.wait_for_selector("#inbox")
    assert page.locator("#inbox tbody tr").count() == 3
    page.check("#select-all")  # ticks every row
    assert page.locator("#inbox tbody input[name=task]:checked").count() == 3
    page.click("text=Approve selected")
    page.wait_for_selector("text=Approved 3 items.")
    states = set(ResourceRequest.objects.values_list("state", flat=True))
    assert states and RequestState.PENDING_APPROVAL not in states  # approved: queued, or placed on the free card
    page.click("nav.tabs >> text=Decided")
    assert page.locator("#decided tbody tr").count() == 3


@pytest.mark.django_db(transaction=True, serialized_rollback=True)
def test_the_dry_run_shows_the_matching_rule_and_its_stages(browser, live_server, shop, team):  # noqa: F811
    rule = approval_rule(approver_stage(), OPERATORS_STAGE, min_accelerator_count=2)
    page = signed_in(browser, live_server, team.operator)
    page.goto(f"{live_server.url}/admin/requests/approvalpolicy/")
    page.click("#dry-run-link")
    page.select_option("#id_project", str(team.project.pk))
    page.select_option("#id_requester", str(team.developer.pk))
    page.select_option("#id_service", str(shop.service.pk))
    page.select_option("#id_spec", str(shop.whole.pk))
    page.select_option("#id_image", str(shop.image.pk))
    page.fill("#id_parameters", '{"environment": "development"}')
    page.click("#dry-run-submit")
    page.wait_for_selector("#dry-run-result")
    assert "When at least 2 accelerators" in page.inner_text("#dry-run-rule")
    stages = page.inner_text("#dry-run-stages")
    assert f"any one of {team.approver.username}" in stages and f"any one of {team.operator.username}" in stages
    assert not ResourceRequest.objects.exists()

    page.select_option("#id_spec", str(shop.sliced.pk))  # one slice: below the rule's two accelerators
    page.click("#dry-run-submit")
    page.wait_for_selector("#dry-run-stages >> text=approved automatically")

    page.goto(f"{live_server.url}/admin/requests/approvalpolicy/{rule.policy_id}/change/")  # rules as sentences
    page.wait_for_selector("#rules-group")
    assert "When at least 2 accelerators: 1. Stage 1" in page.inner_text("#rules-group")
    assert horizontal_overflow(page) == 0, "policy page"


@pytest.mark.django_db(transaction=True, serialized_rollback=True)
def test_catalog_order_request_and_inbox_pages_fit_a_phone(browser, live_server, shop, team):  # noqa: F811
    approval_rule(approver_stage(), approver_stage(mode=ApprovalMode.ALL))
    earlier = services.request_submit(order=make_order(shop, team.project), requester=team.developer)
    developer = signed_in(browser, live_server, team.developer, viewport=PHONE)
    assert horizontal_overflow(developer) == 0, "catalog"
    assert developer.evaluate("document.querySelector('header.top nav').scrollWidth <= window.innerWidth"), "nav"
    developer.goto(f"{live_server.url}/order/{shop.service.slug}/?spec={shop.whole.pk}")
    developer.wait_for_selector("#preview-cost")
    assert horizontal_overflow(developer) == 0, "order"
    developer.fill("#id_justification", "A long justification " * 20)
    developer.click("text=Submit request")
    developer.wait_for_selector("#request-state >> text=Pending approval")
    assert horizontal_overflow(developer) == 0, "request"

    approver = signed_in(browser, live_server, team.approver, viewport=PHONE)
    assert approver.url.endswith("/approvals/")  # approvers who cannot order land on their inbox
    approver.wait_for_selector(f"#inbox a:text-is('#{earlier.pk}')")
    assert approver.locator("#inbox tbody tr").count() == 2
    assert horizontal_overflow(approver) == 0, "inbox"
    approver.goto(f"{live_server.url}/")
    assert approver.locator(".error-box, .messages li.error").count() == 0, "no red box on the catalog"
    assert horizontal_overflow(approver) == 0, "approver's catalog"
