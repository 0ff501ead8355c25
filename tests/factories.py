"""Factories for tests. Tenancy objects are built through services so permissions match production."""

from decimal import Decimal
from types import SimpleNamespace

import factory
from django.utils import timezone

from catalog.choices import AcceleratorKind, Interconnect, Runtime, ServiceKind, SliceKind
from catalog.models import (
    AcceleratorModel,
    BareMetalProfile,
    Image,
    ResourceSpec,
    Service,
    ServingModel,
    ServingTemplate,
    SliceProfile,
    Vendor,
)
from catalog.parameters import default_parameter_schema, serving_parameter_schema
from tenancy import services as tenancy_services
from tenancy.api_tokens import api_token_issue
from tenancy.choices import Role
from tenancy.models import ApiToken, User
from tenancy.operators import sync_operator_group

PASSWORD = "correct-horse-battery"


class UserFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = User

    username = factory.Sequence(lambda n: f"user{n}")
    email = factory.LazyAttribute(lambda user: f"{user.username}@example.com")
    password = factory.django.Password(PASSWORD)  # hashed before the INSERT: one query, not an INSERT and an UPDATE


def operator(**kwargs) -> User:
    user = UserFactory(is_staff=True, **kwargs)
    user.groups.add(sync_operator_group())
    return user


def tenant(**kwargs):
    n = next(_counter)
    return tenancy_services.tenant_create(
        name=kwargs.get("name", f"Tenant {n}"), slug=kwargs.get("slug", f"tenant-{n}"), actor=None
    )


def project(*, tenant_obj=None, lead=None, quota=None, max_priority="standard", **kwargs):
    n = next(_counter)
    return tenancy_services.project_create(
        tenant=tenant_obj or tenant(),
        name=kwargs.get("name", f"Project {n}"),
        slug=kwargs.get("slug", f"project-{n}"),
        lead=lead or UserFactory(),
        cost_centre=kwargs.get("cost_centre", f"CC-{n}"),
        quota=quota,
        max_priority=max_priority,
        actor=None,
    )


def member(project_obj, role=Role.MEMBER, user=None) -> User:
    user = user or UserFactory()
    tenancy_services.membership_grant(project=project_obj, user=user, role=role, actor=None)
    return user


def token_for(user: User, **kwargs) -> str:
    """A fresh API token of the user, as signing in at the token endpoint issues it, noted as used just now from the
    test client's address: the once-a-minute note of a token's use (and the audit of a use from a new address) would
    otherwise make a test's first call cost more queries than the next."""
    issued = api_token_issue(user=user, name="tests", actor=user, **kwargs)
    ApiToken.objects.filter(pk=issued.token.pk).update(last_used_at=timezone.now(), last_used_from="127.0.0.1")
    return issued.secret


def role_matrix() -> SimpleNamespace:
    home, other = project(), project()
    return SimpleNamespace(
        project=home,
        other_project=other,
        developer=member(home),
        approver=member(home, Role.APPROVER),
        lead=home.lead,
        other_developer=member(other),
        operator=operator(),
        outsider=UserFactory(),
    )


def _counting():
    n = 0
    while True:
        n += 1
        yield n


_counter = _counting()


def vendor(slug="nvidia") -> Vendor:
    return Vendor.objects.get(slug=slug)  # the four standard vendors come with the migrations


class AcceleratorModelFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = AcceleratorModel

    vendor = factory.LazyFunction(vendor)
    name = factory.Sequence(lambda n: f"Accel {n} 80GB")
    slug = factory.Sequence(lambda n: f"accel-{n}")
    kind = AcceleratorKind.GPU
    memory_gb = 80
    interconnect = Interconnect.NVLINK


class SliceProfileFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = SliceProfile

    accelerator = factory.SubFactory(AcceleratorModelFactory)
    name = factory.Sequence(lambda n: f"{n}g.10gb")
    kind = SliceKind.MIG
    compute_fraction = Decimal("0.1429")
    memory_gb = 10
    max_per_device = 7


class ResourceSpecFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = ResourceSpec
        skip_postgeneration_save = True

    name = factory.Sequence(lambda n: f"Spec {n}")
    slug = factory.Sequence(lambda n: f"spec-{n}")
    accelerator_count = 1
    cpu_cores = 8
    memory_gb = 64
    local_disk_gb = 100
    hourly_price = Decimal("2.50")
    max_duration_hours = 168

    @factory.post_generation
    def accelerator_models(obj, create, extracted, **kwargs):
        if create:
            obj.accelerator_models.set(extracted or [AcceleratorModelFactory()])


class ImageFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Image
        skip_postgeneration_save = True

    name = factory.Sequence(lambda n: f"image-{n}")
    version = "1.0"
    reference = factory.LazyAttribute(lambda image: f"registry.test/{image.name}:{image.version}")
    os = "Ubuntu 22.04"
    runtime = Runtime.CUDA
    approved = True

    @factory.post_generation
    def compatible_vendors(obj, create, extracted, **kwargs):
        if create:
            obj.compatible_vendors.set(extracted or [vendor()])


class BareMetalProfileFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = BareMetalProfile

    name = factory.Sequence(lambda n: f"Server {n}")
    slug = factory.Sequence(lambda n: f"server-{n}")
    server_class = "HGX 8-GPU"
    accelerator_model = factory.SubFactory(AcceleratorModelFactory)
    accelerator_count = 8
    cpu_cores = 112
    memory_gb = 2048
    os_image = factory.SubFactory(ImageFactory)
    driver_version = "550.127.05"
    monitoring_agent = "dcgm-exporter"
    target_cluster = "cluster-a"
    validation_suite = ["bmc_reachable", "system_health"]
    hourly_price = Decimal("30.00")
    max_duration_hours = 720


class ServingTemplateFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = ServingTemplate

    name = factory.Sequence(lambda n: f"Template {n}")
    runtime = "simulated"
    replicas = 1
    context_length = 8192
    max_tokens = 1024
    spec = factory.SubFactory(ResourceSpecFactory)


class ServingModelFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = ServingModel
        skip_postgeneration_save = True

    name = factory.Sequence(lambda n: f"Model {n}")
    version = "1"
    parameters_billion = Decimal("7.00")
    artifact_uri = "s3://models.test/model"
    license = "Apache-2.0"
    max_context_length = 32768
    min_accelerator_memory_gb = 16
    approved = True

    @factory.post_generation
    def templates(obj, create, extracted, **kwargs):
        if create:
            obj.templates.set(extracted or [ServingTemplateFactory()])


class ServiceFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Service
        skip_postgeneration_save = True

    name = factory.Sequence(lambda n: f"Service {n}")
    slug = factory.Sequence(lambda n: f"service-{n}")
    kind = ServiceKind.COMPUTE
    description = "A test service"
    default_duration_hours = 24
    max_duration_hours = 168
    parameter_schema = factory.LazyAttribute(
        lambda service: (
            serving_parameter_schema() if service.kind == ServiceKind.MODEL_SERVING else default_parameter_schema()
        )
    )

    @factory.post_generation
    def specs(obj, create, extracted, **kwargs):
        if create:
            obj.specs.set(extracted if extracted is not None else [ResourceSpecFactory()])

    @factory.post_generation
    def images(obj, create, extracted, **kwargs):
        if create:
            obj.images.set(extracted if extracted is not None else [ImageFactory()])
