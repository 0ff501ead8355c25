"""Words a person would use, wherever a person reads: the demo seeded, a few orders on their way (a MIG slice running,
a served model, NPUs and a big order waiting for approval), then every portal page of every demo role, the operator's
home and capacity page, and the mails sent meanwhile, read as text (tags, URLs and the raw snapshot left out) and
checked for what a person would not write: slugs, snake_case states, policy and rule names, "(s)", a vendor or
version said twice, "1x 1x", amounts with three or more decimals, a MIG slice shown as its parent card."""

import html
import re
from urllib.parse import urlencode

import pytest
from django.http import QueryDict
from django.urls import reverse

from catalog.models import AcceleratorModel, BareMetalProfile, ResourceSpec, Service, ServingModel, ServingTemplate
from requests import notifications
from requests.choices import RequestState
from requests.forms import OrderForm
from requests.models import ResourceRequest
from scheduling import cycle
from scheduling.models import MigInstance
from tenancy.models import Project, User

pytestmark = pytest.mark.django_db

STATES_WITH_UNDERSCORES = [state for state in RequestState.values if "_" in state]
UNWRITTEN = [
    (re.compile(r"\(s\)"), '"(s)" instead of a counted noun'),
    (re.compile(r"\b1x 1x\b"), "a replica count on a spec that counts its cards"),
    (re.compile(r"\b([A-Z][\w.]+) \1\b"), "a name said twice"),
    (re.compile(r"Resource requests /|Everything else|Quota changes /"), "a policy or rule name"),
    (re.compile(rf"\b({'|'.join(STATES_WITH_UNDERSCORES)})\b"), "a snake_case state"),
    (re.compile(r"(?<![\w.:-])\d+\.\d{3,}(?![\w.-])"), "an amount with three or more decimals"),
]


def visible_text(page: str, *, runs: bool = False) -> str:
    """What a person reads on a page: no tags, attributes, scripts or the raw approved snapshot (<pre>). With `runs`,
    each element's text on a line of its own (a word said twice is said twice within one text, not across a link and
    the next); else one line."""
    page = re.sub(r"(?s)<(script|style|pre|head)\b.*?</\1>", " ", page)
    page = re.sub(r"(?s)<[^>]+>", "\n" if runs else " ", page)
    text = html.unescape(page)
    return re.sub(r"[ \t]+", " ", text) if runs else re.sub(r"\s+", " ", text)


def problems(text: str, slugs: list[str]) -> list[str]:
    found = [f"{why}: {match.group(0)!r}" for pattern, why in UNWRITTEN for match in pattern.finditer(text)]
    found += [f"a slug: {slug!r}" for slug in slugs if re.search(rf"(?<![\w/-]){re.escape(slug)}(?![\w-])", text)]
    return found


@pytest.fixture
def demo(demo_once, settings, client, django_capture_on_commit_callbacks, mailbox):
    """The demo (seeded once for the module), with a MIG slice active, a served model queued or running and two
    orders waiting for approval."""
    settings.DEBUG = True
    developer = User.objects.get(username="developer")
    vision, pretraining = Project.objects.get(slug="vision"), Project.objects.get(slug="llm-pretraining")
    client.force_login(developer)
    with django_capture_on_commit_callbacks(execute=True):
        _order(client, "gpu-workspace", project=vision.pk, spec=ResourceSpec.objects.get(slug="h100-mig-1g").pk)
        _order(
            client,
            "llm-endpoint",
            project=pretraining.pk,
            spec=ResourceSpec.objects.get(slug="l40s-1x").pk,
            serving_model=ServingModel.objects.get(name="Mistral 7B Instruct").pk,
            serving_template=ServingTemplate.objects.get(name="vLLM on 1x L40S, 1 replica").pk,
        )
        _order(client, "ascend-npu-training", project=vision.pk)
        _order(client, "gpu-workspace", project=pretraining.pk, spec=ResourceSpec.objects.get(slug="h100-1x").pk)
        cycle.run_cycle()
    return developer


def _order(client, service_slug: str, **choices) -> None:
    """Submit the service's order form as the page shows it for these choices (its defaults for the rest)."""
    developer, service = User.objects.get(username="developer"), Service.objects.get(slug=service_slug)
    form, _notices = OrderForm.prefilled(QueryDict(urlencode(choices)), user=developer, service=service)
    response = client.post(f"/order/{service_slug}/", {**form.as_data(), "duration_hours": 8})
    assert response.status_code == 302, visible_text(response.content.decode())[:3000]


def _pages_of(role: str) -> list[str]:
    requests = [f"/requests/{pk}/" for pk in ResourceRequest.objects.values_list("pk", flat=True)]
    projects = [f"/projects/{pk}/quota/" for pk in Project.objects.values_list("pk", flat=True)]
    orders = [f"/order/{slug}/" for slug in Service.objects.values_list("slug", flat=True)]
    pages = ["/", "/requests/", "/requests/?mine=0", "/approvals/", "/approvals/?tab=decided", "/projects/", "/usage/"]
    console = ["/admin/", reverse("admin:scheduling_capacity")] if role == "operator" else []
    return pages + requests + projects + (orders if role == "developer" else []) + console


@pytest.mark.parametrize("role", ["developer", "approver", "lead", "operator"])
def test_no_page_of_a_demo_role_says_what_a_person_would_not_write(client, demo, role):
    slugs = [*AcceleratorModel.objects.values_list("slug", flat=True), *Project.objects.values_list("slug", flat=True)]
    slugs += [
        *BareMetalProfile.objects.values_list("slug", flat=True),
        *ResourceSpec.objects.values_list("slug", flat=True),
    ]
    client.force_login(User.objects.get(username=role))
    found = {}
    for path in _pages_of(role):
        response = client.get(path)
        if response.status_code in (403, 404):
            continue
        assert response.status_code == 200, path
        if issues := problems(visible_text(response.content.decode(), runs=True), slugs):
            found[path] = issues
    assert found == {}


def test_the_mails_say_it_in_words_too(demo, mailbox):
    slugs = [*AcceleratorModel.objects.values_list("slug", flat=True), *Project.objects.values_list("slug", flat=True)]
    assert notifications.approval_digests_send()  # the approvers' digests of the orders waiting above
    mails = mailbox.wait_for(3)  # the running slice's "ready", the digests of the project approver and the lead
    found = {}
    for mail in mails:
        text = mail.get_body(("plain",)).get_content() + visible_text(mail.get_body(("html",)).get_content(), runs=True)
        if issues := problems(text, slugs):
            found[mail["Subject"]] = issues
    assert found == {}
    digests = [mail for mail in mails if "waiting for your approval" in mail["Subject"]]
    assert digests and all("Dana Developer" in mail.get_body(("plain",)).get_content() for mail in digests)


def test_people_are_named_by_their_full_names_and_the_route_in_words(client, demo):
    client.force_login(User.objects.get(username="approver"))
    inbox = visible_text(client.get("/approvals/").content.decode())
    assert "Dana Developer" in inbox
    waiting = ResourceRequest.objects.get(state=RequestState.PENDING_APPROVAL, spec__slug="h100-1x")
    page = visible_text(client.get(f"/requests/{waiting.pk}/").content.decode())
    assert "Needs approval." in page and "Arjun Approver: waiting" in page
    assert "Dana Developer ordered 1x H100 80GB" in page
    assert "New → Submitted" in page and "Submitted → Pending approval" in page
    npus = ResourceRequest.objects.get(spec__slug="ascend-910b-1x")
    npu_page = visible_text(client.get(f"/requests/{npus.pk}/").content.decode())
    assert "Needs approval, since the vendor is Huawei Ascend." in npu_page and "Lena Lead" in npu_page


def test_a_mig_slice_is_shown_as_its_slice_not_as_its_parent_card(client, demo):
    slice_request = ResourceRequest.objects.get(spec__slug="h100-mig-1g")
    assert slice_request.state == RequestState.ACTIVE
    instance = MigInstance.objects.get(allocation__request=slice_request)
    client.force_login(User.objects.get(username="developer"))

    page = client.get(f"/requests/{slice_request.pk}/").content.decode()

    allocation = page[page.index('id="allocation"') :].split("</section>")[0]
    assert f"MIG 1g.10gb slice of {instance.device.model.name} #{instance.device.index}" in visible_text(allocation)
    assert instance.device.uuid not in allocation
    assert instance.uuid and instance.uuid in allocation  # the GPU instance's own UUID, which the work is bound by
    assert "Start Jupyter" in visible_text(page) and "jupyter=True" not in page
