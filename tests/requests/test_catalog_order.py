"""From the catalog into a ready order: links with the option chosen, prefill from the query string, filters with
constant query counts, options no node could hold, refusals at their field with next steps, role landing pages."""

import re
from decimal import Decimal
from html import unescape

import pytest
from django.conf import settings
from django.db import connection
from django.test.utils import CaptureQueriesContext

from catalog.choices import ServiceKind
from catalog.models import Vendor
from requests.forms import OrderForm
from requests.models import ResourceRequest
from requests.refusals import rightsized_steps
from scheduling.models import Device, Node
from tenancy.services import quota_set
from tests import factories
from tests.requests.conftest import order_post


def _page(client, path) -> str:
    response = client.get(path)
    assert response.status_code == 200, response.status_code
    return unescape(response.content.decode())


def _selected(body: str, name: str) -> str:
    """The value of the option selected in the select `name` (the first option when none is marked)."""
    select = re.search(rf'<select name="{name}"[^>]*>(.*?)</select>', body, re.S).group(1)
    chosen = re.search(r'<option value="([^"]*)"[^>]*selected', select) or re.search(r'<option value="([^"]*)"', select)
    return chosen.group(1)


def _add_node(accelerator, name, cards=4, cpu_cores=64, memory_gb=512) -> Node:
    node = Node.objects.create(
        name=name, serial_number=f"sn-{name}", cpu_milli=cpu_cores * 1000, memory_mib=memory_gb * 1024
    )
    for index in range(cards):
        Device.objects.create(node=node, index=index, uuid=f"GPU-{name}-{index}", model=accelerator, memory_gb=80)
    return node


# --- catalog links and prefill ----------------------------------------------------------------------------------


def test_each_catalog_option_links_to_the_order_form_with_it_chosen(client, shop, team):
    client.force_login(team.developer)
    body = _page(client, "/")
    for spec in (shop.whole, shop.sliced):
        assert f'href="/order/{shop.service.slug}/?project={team.project.pk}&spec={spec.pk}"' in body
    assert f"8.00 {settings.CATALOG_CURRENCY}" in body  # 2 cards x 4.00, with the currency


def test_the_order_form_takes_its_choices_from_the_query_string_and_previews_them_on_load(client, shop, team):
    client.force_login(team.developer)
    query = f"project={team.project.pk}&spec={shop.sliced.pk}&duration=20&priority=batch"
    body = _page(client, f"/order/{shop.service.slug}/?{query}")
    assert _selected(body, "spec") == str(shop.sliced.pk)
    assert _selected(body, "priority") == "batch"
    assert 'name="duration_hours" value="20"' in body
    preview = body[body.index('id="preview-cost"') :]
    assert "for 20 h" in preview and "10.00" in preview  # 1 slice x 0.50 x 20 h, shown before any change
    assert "left out" not in body


@pytest.mark.parametrize(
    ("query", "notice"),
    [
        ("spec=999999", "resource spec was left out"),
        ("spec=abc", "resource spec was left out"),
        ("duration=abc", "duration (hours) was left out"),
        ("duration=100000", "duration (hours) was left out: Ensure this value is less than or equal to 168"),
        ("priority=urgent", "priority was left out"),
        ("project=999999", "project was left out"),
        ("colour=blue", "“colour” is not an option"),
    ],
)
def test_values_the_form_cannot_take_are_left_out_with_a_notice(client, shop, team, query, notice):
    client.force_login(team.developer)
    body = _page(client, f"/order/{shop.service.slug}/?{query}")
    assert notice in body
    assert _selected(body, "spec") == str(shop.whole.pk)  # the defaults stand
    assert 'id="preview-cost"' in body  # and are previewed


def test_the_duration_limit_follows_the_chosen_spec(client, shop, team):
    """The spec's own maximum is below the service's: the link's duration is checked against the smaller one."""
    shop.sliced.max_duration_hours = 24
    shop.sliced.save(update_fields=["max_duration_hours"])
    client.force_login(team.developer)
    body = _page(client, f"/order/{shop.service.slug}/?spec={shop.sliced.pk}&duration=48")
    assert "less than or equal to 24" in body
    assert 'max="24"' in body and "Up to 24 hours" in body
    assert _page(client, "/").count(">24 h<") == 1  # the catalog says the same for that option


# --- filters ------------------------------------------------------------------------------------------------------


@pytest.fixture
def amd_spec(shop):
    amd = Vendor.objects.get_or_create(slug="amd", defaults={"name": "AMD"})[0]
    card = factories.AcceleratorModelFactory(vendor=amd, memory_gb=192, name="MI300X")
    spec = factories.ResourceSpecFactory(
        accelerator_models=[card], accelerator_count=1, cpu_cores=8, memory_gb=64, hourly_price=Decimal("6.00")
    )
    shop.service.specs.add(spec)
    return spec


def _offers(body: str) -> set[str]:
    return set(re.findall(r'data-offer="([^"]+)"', body))


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("", {"whole", "sliced", "amd"}),
        ("vendor=amd", {"amd"}),
        ("vendor=nvidia", {"whole", "sliced"}),
        ("min_accelerator_memory=160", {"whole", "amd"}),  # 2 x 80 GiB, 192 GiB; the slice has 10 GiB
        ("max_hourly_price=6", {"sliced", "amd"}),  # 8.00 for the two cards
        ("fits_quota=on", {"whole", "sliced"}),  # 192 GiB is over the 160 GiB quota set below
        ("q=mi300x", {"amd"}),
        ("vendor=nosuch", {"whole", "sliced", "amd"}),  # a value the form cannot take is no filter
    ],
)
def test_catalog_filters(client, shop, team, amd_spec, query, expected):
    quota_set(quota=team.project.quota, limits={"accelerator_memory_gb": 160}, actor=None)
    slugs = {"whole": shop.whole.slug, "sliced": shop.sliced.slug, "amd": amd_spec.slug}
    client.force_login(team.developer)
    assert _offers(_page(client, f"/?{query}")) == {slugs[name] for name in expected}


def test_a_filter_nothing_matches_says_so_and_offers_the_whole_catalog(client, shop, team):
    client.force_login(team.developer)
    body = _page(client, "/?q=nothing-like-this")
    assert "Nothing in the catalog matches these filters" in body and "No services are open" not in body


def _catalog_queries(client, query: str) -> int:
    with CaptureQueriesContext(connection) as queries:
        assert client.get(f"/?{query}").status_code == 200
    return len(queries)


@pytest.mark.parametrize("query", ["", "vendor=nvidia&min_accelerator_memory=10&max_hourly_price=9&fits_quota=on&q=x"])
def test_catalog_queries_do_not_grow_with_the_catalog_or_the_inventory(client, shop, team, query):
    client.force_login(team.developer)
    _catalog_queries(client, query)  # warm the per-process caches (content types, sessions)
    # Each count is the first page after an inventory change: the never-fits check reads the node types again then.
    _add_node(shop.accelerator, "n1")
    before = _catalog_queries(client, query)
    for count in (1, 2, 4):
        spec = factories.ResourceSpecFactory(accelerator_models=[shop.accelerator], accelerator_count=count)
        other = factories.ServiceFactory(specs=[spec], images=[shop.image])
        other.specs.add(shop.sliced)
        _add_node(shop.accelerator, f"extra-{count}")
    assert _catalog_queries(client, query) == before


# --- never fits -------------------------------------------------------------------------------------------------


def test_an_option_no_node_could_hold_is_marked_and_says_why_in_words(client, shop, team):
    big = factories.ResourceSpecFactory(accelerator_models=[shop.accelerator], accelerator_count=2, cpu_cores=128)
    shop.service.specs.add(big)
    _add_node(shop.accelerator, "n1", cpu_cores=64)
    client.force_login(team.developer)
    body = _page(client, "/")
    row = body[body.index(f'data-offer="{big.slug}"') :].split("</tr>")[0]
    text = re.sub(r"<[^>]+>", "", row)  # what people read; the code stays in a data attribute
    assert "cannot run here" in text and "no node has 128 cores" in text and "no_matching_spec" not in text
    fitting = body[body.index(f'data-offer="{shop.whole.slug}"') :].split("</tr>")[0]
    assert "cannot run here" not in fitting


# --- refusals at their field, next steps --------------------------------------------------------------------------


def test_a_service_refusal_is_shown_at_its_field_and_in_a_summary_that_links_there(client, shop, team):
    client.force_login(team.developer)
    response = client.post(f"/order/{shop.service.slug}/", order_post(shop, team.project, over_quota="exception"))
    body = unescape(response.content.decode())
    assert response.status_code == 422
    summary = body[body.index('id="error-summary"') : body.index("</div>", body.index('id="error-summary"'))]
    assert 'href="#id_justification"' in summary and "A quota exception needs a justification." in summary
    assert 'data-code="justification_required"' in summary and ">justification_required" not in summary
    field = body[body.index('id="id_justification"') :]
    assert field.index("A quota exception needs a justification.") < field.index("<label")  # right under the field
    assert not ResourceRequest.objects.exists()


def test_an_over_quota_refusal_offers_the_lead_a_prefilled_quota_change_and_an_exception(client, shop, team):
    quota_set(quota=team.project.quota, limits={"gpus": Decimal(1)}, actor=None)
    client.force_login(team.lead)
    body = unescape(client.post(f"/order/{shop.service.slug}/", order_post(shop, team.project)).content.decode())
    steps = body[body.index('id="next-steps"') :].split("</ul>")[0]
    change = re.search(r'data-kind="quota_change"><a href="([^"]+)"', steps).group(1)
    assert change.startswith(f"/projects/{team.project.pk}/quota/?gpus=2&")  # 0 used + 2 cards ordered
    exception = re.search(r'data-kind="exception"><a href="([^"]+)"', steps).group(1)
    assert "over_quota=exception" in exception and f"spec={shop.whole.pk}" in exception
    quota_page = _page(client, change)
    assert 'name="gpus" value="2"' in quota_page and "Room for" in quota_page
    exception_page = _page(client, exception)
    assert re.search(r'value="exception"[^>]*checked', exception_page)


def test_a_developer_is_told_which_lead_to_ask_for_more_quota(client, shop, team):
    quota_set(quota=team.project.quota, limits={"gpus": Decimal(1)}, actor=None)
    client.force_login(team.developer)
    body = unescape(client.post(f"/order/{shop.service.slug}/", order_post(shop, team.project)).content.decode())
    step = re.search(r'data-kind="quota_change">([^<]+)<', body).group(1)
    assert team.lead.username in step or team.lead.get_full_name() in step
    assert f"/projects/{team.project.pk}/quota/" not in body.split('id="next-steps"')[1].split("</ul>")[0]


# --- each role, each screen ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("role", "landing"), [("developer", "/"), ("lead", "/"), ("approver", "/approvals/"), ("operator", "/admin/")]
)
def test_each_role_lands_on_its_page_after_sign_in(client, team, role, landing):
    user = getattr(team, role)
    response = client.post("/accounts/login/", {"username": user.username, "password": factories.PASSWORD})
    assert response.status_code == 302 and response["Location"] == landing
    assert client.get(landing).status_code == 200


def test_sign_in_still_follows_next(client, team):
    response = client.post(
        "/accounts/login/?next=/requests/", {"username": team.approver.username, "password": factories.PASSWORD}
    )
    assert response["Location"] == "/requests/"


def test_people_who_cannot_order_browse_the_catalog_without_an_error(client, shop, team):
    for user in (team.approver, team.operator):
        client.force_login(user)
        body = _page(client, "/")
        assert "error-box" not in body and shop.whole.name in body
        assert "/order/" not in body  # nothing to order for


@pytest.mark.parametrize(
    ("user", "query", "sentence"),
    [
        ("developer", "", "No requests yet."),
        ("developer", "?state=active", "No requests match these filters."),
        ("approver", "", "Ordering needs membership of a project"),
    ],
)
def test_the_request_list_says_why_it_is_empty(client, team, user, query, sentence):
    client.force_login(getattr(team, user))
    body = _page(client, f"/requests/{query}")
    assert sentence in body


def test_a_refusal_offers_the_spec_rightsizing_suggests_when_the_service_offers_it(shop, team):
    form = OrderForm(order_post(shop, team.project), user=team.developer, service=shop.service)
    assert form.is_valid(), form.errors
    advice = [{"message": "…", "suggestions": [{"spec": shop.sliced.slug}, {"spec": "not-offered-here"}]}]
    (step,) = rightsized_steps(form, advice)
    assert step["label"] == f"Use the rightsized spec: {shop.sliced.name}"
    assert step["url"].startswith(f"/order/{shop.service.slug}/?") and f"spec={shop.sliced.pk}" in step["url"]
    assert f"project={team.project.pk}" in step["url"] and "duration_hours=10" in step["url"]


def test_bare_metal_profiles_and_served_models_link_to_their_order_too(client, shop, team):
    profile = factories.BareMetalProfileFactory(accelerator_model=shop.accelerator)
    bare_metal = factories.ServiceFactory(kind=ServiceKind.BARE_METAL, specs=[], images=[])
    bare_metal.bare_metal_profiles.add(profile)
    template = factories.ServingTemplateFactory(spec=shop.whole)
    first, second = (
        factories.ServingModelFactory(templates=[template]),
        factories.ServingModelFactory(templates=[template]),
    )
    serving = factories.ServiceFactory(kind=ServiceKind.MODEL_SERVING, specs=[shop.whole], images=[])
    serving.serving_models.set([first, second])
    client.force_login(team.developer)
    body = _page(client, "/")
    profile_link = f"/order/{bare_metal.slug}/?project={team.project.pk}&profile={profile.pk}"
    model_link = f"/order/{serving.slug}/?project={team.project.pk}&model={second.pk}"
    assert f'href="{profile_link}"' in body and f'href="{model_link}"' in body
    assert _selected(_page(client, profile_link), "bare_metal_profile") == str(profile.pk)
    assert _selected(_page(client, model_link), "serving_model") == str(second.pk)
