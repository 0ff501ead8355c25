"""An order as a developer fills it in: validated against the catalog, priced, and turned into demand."""

import hashlib
import json
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import Any

from django.utils import timezone

from catalog.choices import ServiceKind, SpecStatus, Visibility
from catalog.durations import duration_limits
from catalog.models import BareMetalProfile, Image, ResourceSpec, Service, ServingModel, ServingTemplate
from catalog.orderable import OrderableCatalog, orderable_catalog
from catalog.parameters import ParameterInvalid, parameters_clean
from config.errors import DomainError
from config.jsonvalues import as_stored
from config.words import counted
from requests.approvals import Facts
from requests.choices import ApprovalSubject, PriorityClass
from requests.quota import Demand
from requests.reservations import Window, lead_hours, validate_window
from tenancy.choices import ProjectPermission
from tenancy.models import Project, User
from tenancy.selectors import user_has_project_permission


class OrderInvalid(DomainError):
    status_code = 422
    code = "invalid_order"


# How an order naming a project id that is not there is refused, and, word for word, one naming a project the caller
# may not see: no answer may confirm that another tenant's project exists.
UNKNOWN_PROJECT = "No project with id {pk_value}."


class ProjectUnknown(DomainError):
    """The API's validation error for an unknown project id (OrderSerializer's `project`), for a service asked about
    a project its caller may not see."""

    status_code = 400
    code = "validation_error"

    def __init__(self, project_id: int):
        message = UNKNOWN_PROJECT.format(pk_value=project_id)
        super().__init__(f"project: {message}", details={"project": [message]})


@dataclass
class Order:
    service: Service
    project: Project
    duration_hours: int
    spec: ResourceSpec | None = None
    image: Image | None = None
    bare_metal_profile: BareMetalProfile | None = None
    serving_model: ServingModel | None = None
    serving_template: ServingTemplate | None = None
    priority: str = PriorityClass.STANDARD
    justification: str = ""
    parameters: dict[str, Any] = field(default_factory=dict)
    # An advance reservation's start (its window lasts duration_hours: requests/reservations.py); None: run as soon as
    # it can.
    start_at: datetime | None = None
    # The catalog the order's items were looked up in, which then checks them too (one read of it per order);
    # None: the current one.
    catalog: OrderableCatalog | None = field(default=None, repr=False, compare=False)

    @property
    def replicas(self) -> int:
        return self.serving_template.replicas if self.serving_template else 1

    @property
    def window(self) -> Window | None:
        return None if self.start_at is None else Window(self.start_at, self.duration_hours)


def _refuse(code: str, message: str, **details) -> None:
    raise OrderInvalid(message, code=code, details=details)


def validate_order(order: Order, requester: User) -> None:
    """Refuse, with a specific code, anything the catalog or the project does not allow."""
    project, service = order.project, order.service
    if not user_has_project_permission(user=requester, project=project, permission=ProjectPermission.REQUEST):
        if not user_has_project_permission(user=requester, project=project, permission=ProjectPermission.VIEW):
            raise ProjectUnknown(project.pk)
        _refuse("not_permitted_on_project", f"You may not order for project {project}.", project=project.slug)
    if not project.active:
        _refuse("project_inactive", f"Project {project} is inactive and accepts no new requests.")
    if not service.active:
        _refuse("service_unavailable", f"{service.name} is closed for new orders.", service=service.slug)
    catalog = order.catalog or orderable_catalog()
    if service.visibility != Visibility.ALL and not catalog.visible(
        service, tenant_id=project.tenant_id, project_id=project.pk
    ):
        _refuse(
            "service_not_offered_to_project",
            f"{service.name} is not offered to project {project}.",
            service=service.slug,
            project=project.slug,
        )
    _validate_offering(order, catalog)
    _validate_parameters(order)
    _validate_duration(order)
    if order.window is not None:
        validate_window(service_kind=service.kind, window=order.window, now=timezone.now())


def _validate_offering(order: Order, catalog: OrderableCatalog) -> None:
    service = order.service
    if service.kind == ServiceKind.BARE_METAL:
        profile = order.bare_metal_profile
        if profile is None:
            _refuse("bare_metal_profile_required", "Choose a bare-metal profile.", field="bare_metal_profile")
        if not profile.active or not catalog.offers(service, "bare_metal_profiles", profile):
            _refuse(
                "profile_not_offered", f"{profile.name} is not offered by {service.name}.", field="bare_metal_profile"
            )
        return
    spec = order.spec
    if spec is None:
        _refuse("spec_required", "Choose a resource spec.", field="spec")
    if not catalog.offers(service, "specs", spec):
        _refuse("spec_not_offered", f"{spec.name} is not offered by {service.name}.", field="spec")
    if spec.status != SpecStatus.ACTIVE:
        _refuse("spec_deprecated", f"{spec.name} is deprecated: {spec.deprecation_reason}", field="spec")
    if service.kind == ServiceKind.COMPUTE:
        _validate_image(order, catalog)
    else:
        _validate_serving(order, catalog)


def _validate_image(order: Order, catalog: OrderableCatalog) -> None:
    image, spec = order.image, order.spec
    if image is None:
        _refuse("image_required", "Choose an image.", field="image")
    if not image.approved or not catalog.offers(order.service, "images", image):
        _refuse("image_not_offered", f"{image} is not an approved image of {order.service.name}.", field="image")
    spec_vendors = {model.vendor_id for model in spec.accelerator_models.all()}
    if not spec_vendors <= catalog.vendors_of(image):
        _refuse(
            "image_incompatible",
            f"{image} does not support every accelerator vendor of {spec.name}.",
            field="image",
            image_vendors=sorted(image.compatible_vendors.values_list("slug", flat=True)),
        )


def _validate_serving(order: Order, catalog: OrderableCatalog) -> None:
    model, template = order.serving_model, order.serving_template
    if model is None:
        _refuse("serving_model_required", "Choose a model to serve.", field="serving_model")
    if not model.approved or not catalog.offers(order.service, "serving_models", model):
        _refuse("serving_model_not_offered", f"{model} is not offered by {order.service.name}.", field="serving_model")
    if template is None:
        _refuse("serving_template_required", "Choose a serving template.", field="serving_template")
    if not template.active or not catalog.serves_with(model, template):
        _refuse("serving_template_not_offered", f"{template} is not a template for {model}.", field="serving_template")


def _validate_parameters(order: Order) -> None:
    """Checked against the service's declared schema, and kept in the cleaned form (defaults filled in, numbers
    as the database gives them back), so what is stored is exactly what was checked."""
    order.parameters = parameters_clean(order.service.parameter_schema, order.parameters)


def _validate_duration(order: Order) -> None:
    limits = order_duration_limits(order)
    maximum = min(limits.values())
    if order.duration_hours < 1 or order.duration_hours > maximum:
        _refuse(
            "duration_out_of_range",
            f"Duration must be between 1 and {maximum} hours.",
            field="duration_hours",
            requested=order.duration_hours,
            maximum=maximum,
            limits=limits,
        )


def order_duration_limits(order: Order) -> dict[str, int]:
    """The maxima that bound this order's duration (see catalog.durations)."""
    return duration_limits(
        order.service,
        spec=order.spec,
        serving_template=order.serving_template,
        bare_metal_profile=order.bare_metal_profile,
    )


@dataclass(frozen=True)
class Sizing:
    """Demand and price of an order, as stored on the request."""

    gpu_equivalents: Decimal
    accelerator_count: int
    accelerator_memory_gb: int
    cpu_cores: int
    memory_gb: int
    hourly_cost: Decimal
    duration_hours: int

    @property
    def card_hours(self) -> Decimal:
        return self.gpu_equivalents * self.duration_hours

    @property
    def cost_estimate(self) -> Decimal:
        return self.hourly_cost * self.duration_hours

    @property
    def demand(self) -> Demand:
        return Demand(
            gpus=self.gpu_equivalents,
            accelerator_memory_gb=self.accelerator_memory_gb,
            cpu_cores=self.cpu_cores,
            memory_gb=self.memory_gb,
            concurrent_tasks=1,
            monthly_card_hours=self.card_hours,
        )

    def request_fields(self) -> dict:
        return {
            "gpu_equivalents": self.gpu_equivalents,
            "accelerator_count": self.accelerator_count,
            "accelerator_memory_gb": self.accelerator_memory_gb,
            "cpu_cores": self.cpu_cores,
            "memory_gb": self.memory_gb,
            "card_hours": self.card_hours,
            "hourly_cost": self.hourly_cost,
            "cost_estimate": self.cost_estimate,
        }


def size_order(order: Order) -> Sizing:
    profile = order.bare_metal_profile
    if profile is not None:
        return Sizing(
            Decimal(profile.accelerator_count),
            profile.accelerator_count,
            profile.accelerator_count * profile.accelerator_model.memory_gb,
            profile.cpu_cores,
            profile.memory_gb,
            profile.hourly_price,
            order.duration_hours,
        )
    spec, replicas = order.spec, order.replicas  # a spec's totals count every node of a multi-node spec
    return Sizing(
        spec.gpu_equivalents * replicas,
        spec.total_accelerator_count * replicas,
        spec.accelerator_memory_gb * replicas,
        spec.total_cpu_cores * replicas,
        spec.total_memory_gb * replicas,
        spec.hourly_cost * replicas,
        order.duration_hours,
    )


def approval_facts(order: Order, sizing: Sizing, requester: User, *, quota_exception: bool) -> Facts:
    models = (
        [order.bare_metal_profile.accelerator_model]
        if order.bare_metal_profile
        else list(order.spec.accelerator_models.all())
    )
    return Facts(
        subject=ApprovalSubject.RESOURCE_REQUEST,
        project=order.project,
        requester=requester,
        summary=f"{order.service.name}: {describe_order(order)} for {order.project}",
        service_kind=order.service.kind,
        vendor_ids=frozenset(model.vendor_id for model in models),
        accelerator_model_ids=frozenset(model.pk for model in models),
        spec_id=order.spec.pk if order.spec else None,
        accelerator_count=sizing.accelerator_count,
        cost_estimate=sizing.cost_estimate,
        parameters=order.parameters,
        quota_exception=quota_exception,
        priority=order.priority,
        reservation=order.window is not None,
        lead_hours=None if order.window is None else lead_hours(order.window, timezone.now()),
    )


def describe_order(order: Order) -> str:
    """The order in a few words: "1x H100 80GB, 16 vCPU, 128 GiB, 24 h"; a served model "Mistral 7B Instruct 0.3:
    2 replicas of 1x H100 80GB, …" (a spec's name already counts its cards: never "1x 1x")."""
    what = order.bare_metal_profile.name if order.bare_metal_profile else order.spec.name
    if order.serving_model:
        replicas = order.replicas
        what = (
            f"{order.serving_model} on {what}"
            if replicas == 1
            else f"{order.serving_model}: {counted(replicas, 'replica')} of {what}"
        )
    when = "" if order.start_at is None else f" from {order.start_at:%a %d %b %H:%M} UTC"
    return f"{what}, {order.duration_hours} h{when}"


# The catalog choices an order makes, by field name.
ORDER_ITEMS = ("spec", "image", "bare_metal_profile", "serving_model", "serving_template")


def order_fingerprint(order: Order) -> str:
    """What was ordered, as a hash: service, project, catalog choices, duration, priority and parameters (as they
    are stored: defaults filled in). Not the justification, which people word again when they order the same thing
    again. The same order sent twice has the same fingerprint, whichever form or client sent it."""
    try:
        parameters = parameters_clean(order.service.parameter_schema, order.parameters)
    except ParameterInvalid:
        parameters = order.parameters  # refused later, with its reason; the hash only has to be stable
    chosen = {
        "service": order.service.pk,
        "project": order.project.pk,
        **{name: getattr(getattr(order, name), "pk", None) for name in ORDER_ITEMS},
        "duration_hours": order.duration_hours,
        "priority": order.priority,
        "parameters": as_stored(parameters),
        # Only a reservation's: an order to run now hashes as it did before reservations existed.
        **({} if order.start_at is None else {"start_at": order.start_at.isoformat()}),
    }
    return hashlib.sha256(json.dumps(chosen, sort_keys=True, default=str).encode()).hexdigest()
