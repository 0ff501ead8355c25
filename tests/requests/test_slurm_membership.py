"""What a bare-metal order says about Slurm and root: the order form names each profile's membership, and the
request record (page and API) shows it, from the profile while the order waits and from the approved snapshot once
frozen, whatever the profile says later."""

import re
from html import unescape

import pytest

from catalog.choices import ServiceKind, SlurmMembership
from requests import approvals, services
from requests.models import ResourceRequest
from requests.orders import Order
from tests import factories
from tests.requests.conftest import approval_rule, approver_stage

pytestmark = pytest.mark.django_db


@pytest.fixture
def servers(shop):
    """A bare-metal service offering the same server two ways."""
    shared = factories.BareMetalProfileFactory(name="HGX shared", accelerator_model=shop.accelerator)
    own = factories.BareMetalProfileFactory(
        name="HGX own",
        accelerator_model=shop.accelerator,
        slurm_membership=SlurmMembership.TENANT_CLUSTER,
        target_cluster="",
    )
    service = factories.ServiceFactory(kind=ServiceKind.BARE_METAL, specs=[], images=[])
    service.bare_metal_profiles.set([shared, own])
    return service, shared, own


def submit(service, profile, team) -> ResourceRequest:
    order = Order(service=service, project=team.project, duration_hours=24, bare_metal_profile=profile)
    return services.request_submit(order=order, requester=team.developer)


def shown_membership(client, request) -> tuple[str, str]:
    page = client.get(f"/requests/{request.pk}/")
    assert page.status_code == 200
    found = re.search(r'<dd id="slurm-membership" data-membership="([^"]*)">([^<]*)</dd>', page.content.decode())
    return found.group(1), unescape(found.group(2))


def test_the_order_form_names_each_profiles_slurm_membership_and_root(client, team, servers):
    service, shared, own = servers
    client.force_login(team.developer)

    page = unescape(client.get(f"/order/{service.slug}/").content.decode())

    options = dict(re.findall(r'<option value="(\d+)"[^>]*>([^<]+)</option>', page))
    assert options[str(shared.pk)] == "HGX shared — Shared Slurm cluster, no root for the tenant"
    assert options[str(own.pk)] == "HGX own — Tenant's own Slurm cluster, with root"
    assert "in the shared cluster you get no root" in page


def test_the_record_shows_the_profiles_membership_then_the_frozen_one(client, api_as, team, servers):
    service, _, own = servers
    approval_rule(approver_stage())
    request = submit(service, own, team)
    client.force_login(team.developer)

    assert request.approved_spec is None
    assert shown_membership(client, request) == ("tenant_cluster", "Tenant's own Slurm cluster, with root")
    assert api_as(team.developer).get(f"/api/v1/requests/{request.pk}/").json()["slurm_membership"] == (
        "tenant_cluster"
    )

    [assignment] = approvals.approval_for(request).stages.get().assignments.all()
    approvals.approval_decide(assignment=assignment, decision="approve", comment="", actor=team.approver)
    own.slurm_membership, own.target_cluster = SlurmMembership.SHARED_CLUSTER_NO_ROOT, "cluster-a"
    own.save(update_fields=["slurm_membership", "target_cluster"])  # an edit after approval changes no contract

    request = ResourceRequest.objects.get(pk=request.pk)
    assert request.approved_spec["bare_metal_profile"]["slurm_membership"] == "tenant_cluster"
    assert shown_membership(client, request) == ("tenant_cluster", "Tenant's own Slurm cluster, with root")
    detail = api_as(team.developer).get(f"/api/v1/requests/{request.pk}/").json()
    assert detail["slurm_membership"] == "tenant_cluster"


def test_a_snapshot_from_before_profiles_said_reads_as_the_shared_cluster_without_root(client, team, servers):
    service, shared, _ = servers
    request = submit(service, shared, team)  # approved at once: the snapshot is frozen
    del request.approved_spec["bare_metal_profile"]["slurm_membership"]
    ResourceRequest.objects.filter(pk=request.pk).update(approved_spec=request.approved_spec)
    client.force_login(team.developer)

    assert shown_membership(client, ResourceRequest.objects.get(pk=request.pk))[0] == "shared_cluster_no_root"


def test_other_orders_have_no_membership(api_as, shop, team):
    from tests.requests.conftest import make_order

    request = services.request_submit(order=make_order(shop, team.project), requester=team.developer)

    assert api_as(team.developer).get(f"/api/v1/requests/{request.pk}/").json()["slurm_membership"] is None
