"""Each bare-metal profile declares how its server joins Slurm, and with it whether the tenant gets root: an operator
sets it in the console (a server of the shared cluster names that cluster, the others name none), the catalog API
shows it, and existing profiles came through the migration as shared-cluster servers without root."""

import pytest
from django.forms.models import model_to_dict

from catalog.choices import SlurmMembership
from catalog.models import BareMetalProfile
from tenancy.selectors import audit_events_for
from tests.factories import BareMetalProfileFactory

pytestmark = pytest.mark.django_db

CHANGE = "/admin/catalog/baremetalprofile/{}/change/"


def change_post(profile: BareMetalProfile, **overrides) -> dict:
    """The profile's change form as the console sends it back, with some fields changed."""
    data = {key: value for key, value in model_to_dict(profile).items() if value is not None}
    data["validation_suite"] = '["bmc_reachable"]'
    data.update(overrides)
    return data


def test_a_new_profile_joins_the_shared_cluster_without_root():
    assert BareMetalProfile._meta.get_field("slurm_membership").default == SlurmMembership.SHARED_CLUSTER_NO_ROOT


@pytest.mark.parametrize(("membership", "cluster"), [(SlurmMembership.TENANT_CLUSTER, ""), (SlurmMembership.NONE, "")])
def test_an_operator_gives_a_profile_root_and_its_own_cluster_or_none_in_the_console(
    console, operator, membership, cluster
):
    profile = BareMetalProfileFactory()

    answer = console.post(
        CHANGE.format(profile.pk), change_post(profile, slurm_membership=membership, target_cluster=cluster)
    )

    assert answer.status_code == 302, answer.context["adminform"].form.errors
    profile.refresh_from_db()
    assert (profile.slurm_membership, profile.target_cluster) == (membership, cluster)
    audit = audit_events_for(target=profile).get()
    assert audit.action == "baremetalprofile.updated" and audit.actor == operator


@pytest.mark.parametrize(
    ("membership", "cluster"),
    [
        (SlurmMembership.SHARED_CLUSTER_NO_ROOT, ""),  # which shared cluster?
        (SlurmMembership.TENANT_CLUSTER, "cluster-a"),  # a server with root never joins the shared one
        (SlurmMembership.NONE, "cluster-a"),
        ("root_everywhere", ""),
    ],
)
def test_a_membership_that_does_not_fit_its_cluster_is_refused_and_nothing_changes(console, membership, cluster):
    profile = BareMetalProfileFactory()

    answer = console.post(
        CHANGE.format(profile.pk), change_post(profile, slurm_membership=membership, target_cluster=cluster)
    )

    assert answer.status_code == 200
    errors = answer.context["adminform"].form.errors
    assert {"target_cluster", "slurm_membership"} & set(errors)
    profile.refresh_from_db()
    assert (profile.slurm_membership, profile.target_cluster) == (SlurmMembership.SHARED_CLUSTER_NO_ROOT, "cluster-a")


def test_the_console_lists_and_filters_profiles_by_membership(console):
    BareMetalProfileFactory(name="Shared server")
    BareMetalProfileFactory(name="Own server", slurm_membership=SlurmMembership.TENANT_CLUSTER, target_cluster="")

    page = console.get("/admin/catalog/baremetalprofile/?slurm_membership__exact=tenant_cluster").content.decode()

    assert "Own server" in page and "Shared server" not in page
    assert "Tenant&#x27;s own Slurm cluster, with root" in page


def test_the_catalog_api_shows_each_profiles_membership(api_as, roles):
    own = BareMetalProfileFactory(slurm_membership=SlurmMembership.TENANT_CLUSTER, target_cluster="")
    shared = BareMetalProfileFactory()

    listed = api_as(roles.developer).get("/api/v1/catalog/bare-metal-profiles/").json()["results"]

    by_id = {row["id"]: row for row in listed}
    assert (by_id[own.pk]["slurm_membership"], by_id[own.pk]["target_cluster"]) == ("tenant_cluster", "")
    assert (by_id[shared.pk]["slurm_membership"], by_id[shared.pk]["target_cluster"]) == (
        "shared_cluster_no_root",
        "cluster-a",
    )
