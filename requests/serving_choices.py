"""The serving order form's choices: the models smallest first, and for the chosen model only its templates, those
that can run on this inventory first (a real engine before the platform's stand-in), each that cannot marked so.
The form opens with the first of them, so a fresh demo orders what its nodes really run (llama.cpp where `make
llama` installed it, the stand-in server otherwise)."""

from dataclasses import dataclass

from django.db.models import Case, IntegerField, QuerySet, Value, When

from catalog import selectors as catalog_selectors
from catalog.choices import ServingRuntime
from catalog.models import Service, ServingModel, ServingTemplate
from requests import hooks
from requests.orders import Order, size_order
from tenancy.models import User

CANNOT_RUN_HERE = "cannot run here"


def model_queryset(service: Service, user: User) -> QuerySet[ServingModel]:
    """The service's models, smallest first: the cheapest to try comes first."""
    return (
        catalog_selectors.serving_model_list(user=user)
        .filter(services=service)
        .order_by("parameters_billion", "name", "-version")
    )


@dataclass(frozen=True)
class TemplateChoices:
    templates: list[ServingTemplate]  # in the order the form offers them
    cannot_run: dict[int, str]  # template id -> why no node of the inventory could run it with the model

    def queryset(self) -> QuerySet[ServingTemplate]:
        ids = [template.pk for template in self.templates]
        order = Case(*(When(pk=pk, then=Value(i)) for i, pk in enumerate(ids)), output_field=IntegerField())
        return ServingTemplate.objects.select_related("spec").filter(pk__in=ids).order_by(order)

    def label(self, template: ServingTemplate) -> str:
        return f"{template.name} ({CANNOT_RUN_HERE})" if template.pk in self.cannot_run else template.name

    @property
    def first(self) -> ServingTemplate | None:
        return self.templates[0] if self.templates else None


def template_choices(service: Service, model: ServingModel | None, user: User) -> TemplateChoices:
    """The model's templates the user sees, in the order the form offers them (one inventory read for all)."""
    if model is None:
        return TemplateChoices([], {})
    templates = list(
        catalog_selectors.serving_template_list(user=user)
        .filter(models=model)
        .prefetch_related("spec__accelerator_models")
        .order_by("name")
    )
    orders = []
    for template in templates:
        order = Order(service, None, 1, spec=template.spec, serving_model=model, serving_template=template)
        orders.append((order, size_order(order)))
    reasons = hooks.ask(hooks.ORDERS_NEVER_FIT, orders) or [None] * len(orders)
    cannot_run = {template.pk: reason["message"] for template, reason in zip(templates, reasons, strict=True) if reason}
    templates.sort(key=lambda t: (t.pk in cannot_run, t.runtime == ServingRuntime.SIMULATED))  # stable: by name
    return TemplateChoices(templates, cannot_run)
