"""Issue 39 item 2: a failed request is not a dead end. Its page and `GET /api/v1/requests/{id}/` say what went
wrong in one plain sentence (one table per failure code, requests/failures.py, never the code, the step's name or
"attempt(s)"), that operators were told (at the time of the real mail) and can retry it, and offer "Order again":
the order form with the same options, previewed; the API gives the same order's submit body."""

import re
import subprocess
from html import unescape
from pathlib import Path

import pytest

from requests.choices import EventCode, NotificationKind, RequestState
from requests.failures import SENTENCES, STEP_SENTENCES, failure_of, failure_sentence
from requests.models import NotificationDelivery, ResourceRequest

pytestmark = pytest.mark.django_db

REPO = Path(__file__).resolve().parents[2]


def visible_text(html: str) -> str:
    """What a person reads: the page without its tags, attributes and the disclosed-on-demand details."""
    html = re.sub(r"<details>.*?</details>", " ", html, flags=re.S)
    html = re.sub(r"<(script|style)\b.*?</\1>", " ", html, flags=re.S)
    return re.sub(r"\s+", " ", unescape(re.sub(r"<[^>]+>", " ", html)))


@pytest.fixture
def failed(compute, settings):
    """A compute order whose workload the node's runtime refuses: it fails at "Start the workload"."""
    settings.PROVISIONING_FAULTS = [
        {"op": "start_workload", "code": "container_exited", "message": "OCI runtime error: exec format error"}
    ]
    request = compute.order(duration_hours=6, parameters={"environment": "staging"})
    assert request.state == RequestState.FAILED
    return request


def test_the_page_says_what_went_wrong_in_words_and_that_operators_were_told(client, failed, compute):
    told = NotificationDelivery.objects.filter(kind=NotificationKind.OPERATOR_RUN_FAILED).earliest("created_at")
    told = told.created_at
    client.force_login(compute.team.developer)
    page = client.get(f"/requests/{failed.pk}/").content.decode()
    text = visible_text(page)
    assert SENTENCES["container_exited"] in text
    assert f"Operators were told at {told:%H:%M} UTC and can retry it; it is not retried by itself." in text
    assert "Failed at “Start the workload with the devices bound” after 4 attempts" in text
    for raw in ("container_exited", "start_workload", "attempt(s)"):
        assert raw not in text, raw
    details = re.search(r'<section class="card error-box" id="failure".*?</section>', page, re.S).group(0)
    assert "exec format error" in details  # the backend's own words, one click away


def test_order_again_opens_the_form_with_the_same_options_and_previews_them(client, failed, compute):
    client.force_login(compute.team.developer)
    page = client.get(f"/requests/{failed.pk}/").content.decode()
    link = unescape(re.search(r'id="order-again" href="([^"]+)"', page).group(1))
    form = client.get(link).content.decode()
    for name, value in (
        ("spec", compute.shop.whole.pk),
        ("image", compute.shop.image.pk),
        ("project", compute.team.project.pk),
    ):
        assert re.search(rf'<select name="{name}"[^>]*>.*?<option value="{value}" selected>', form, re.S), name
    assert 'name="duration_hours" value="6"' in form
    assert re.search(r'<option value="staging" selected>', form)
    assert 'id="preview-cost"' in form and "was left out" not in form


def test_the_api_says_the_same_and_gives_the_body_to_order_again(api_as, failed, compute):
    api = api_as(compute.team.developer)
    body = api.get(f"/api/v1/requests/{failed.pk}/").json()
    failure = body["failure"]
    assert (failure["code"], failure["sentence"], failure["step"], failure["attempts"]) == (
        "container_exited",
        SENTENCES["container_exited"],
        "start_workload",
        4,
    )
    assert failure["operators_told_at"] is not None and failure["operators_can_retry"] is True
    assert failure["next_step"].startswith("Operators were told at ")
    again = body["order_again"]
    assert again["url"].startswith("http://testserver/order/") and f"spec={compute.shop.whole.pk}" in again["url"]
    assert again["body"]["parameters"] == {"environment": "staging"} and again["body"]["duration_hours"] == 6
    created = api.post("/api/v1/requests/", again["body"], format="json")
    assert created.status_code == 201, created.json()
    assert ResourceRequest.objects.get(pk=created.json()["id"]).spec == compute.shop.whole


def test_without_a_mail_the_page_says_operators_see_it_on_their_dashboard(client, failed, compute):
    NotificationDelivery.objects.all().delete()
    failure = failure_of(failed)
    assert failure.operators_told_at is None
    assert failure.next_step.startswith("Operators see it on their dashboard and can retry it")


def test_a_workload_that_failed_by_itself_is_not_offered_as_an_operator_retry(failed):
    event = failed.events.get(code=EventCode.FAILED)
    event.data = {**event.data, "operator_retry": False}
    event.save(update_fields=["data"])
    assert failure_of(failed).next_step == "It will not be retried; order again to try once more."


def test_someone_who_may_not_order_on_the_project_is_not_offered_order_again(client, failed, compute):
    client.force_login(compute.team.approver)  # sees the request, orders nothing
    page = client.get(f"/requests/{failed.pk}/").content.decode()
    assert 'id="failure"' in page and 'id="order-again"' not in page


def test_every_failure_code_the_drivers_raise_has_its_sentence():
    """A new code without a sentence would show the general one: this lists the codes in the source."""
    source = subprocess.run(
        ["grep", "-rhozP", r'(StepError|_isolating_error)\(\s*"[a-z_]+"', "provisioning", "scheduling"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    codes = set(re.findall(r'"([a-z_]+)"', source)) | {"podman_failed", "podman_unreachable", "workload_failed"}
    assert len(codes) > 40
    assert sorted(codes - set(SENTENCES)) == []
    unknown = failure_sentence("oci_runtime_error", "start_workload")
    assert unknown == STEP_SENTENCES["start_workload"]
