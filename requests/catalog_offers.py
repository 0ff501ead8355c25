"""What the catalog page lists: each service's options priced, sized against the project's remaining quota,
linked to the order form with the option chosen, filtered, and marked when no node could ever hold them.

Everything here works on the rows `catalog.selectors.service_list` prefetched, so the page's queries do not grow
with the catalog; the one inventory load for the never-fits marks goes through the ORDERS_NEVER_FIT hook.
"""

from urllib.parse import urlencode

from catalog.choices import ServiceKind
from catalog.durations import default_duration_hours, max_duration_hours
from requests import hooks
from requests.orders import Order, size_order
from requests.quota import dimensions_over


def offer_rows(service, project, usage) -> list[dict]:
    """Each orderable spec or profile with its price, whether it fits the project's remaining quota, the order
    link's query and what the filters look at (from prefetched rows: no query per offer)."""
    offers = [("spec", spec) for spec in service.specs.all()] if service.kind != ServiceKind.BARE_METAL else []
    offers += [("bare_metal_profile", profile) for profile in service.bare_metal_profiles.all()]
    rows = []
    for field, offer in offers:
        hours = default_duration_hours(service, **{field: offer})
        order = Order(service=service, project=project, duration_hours=hours, **{field: offer})
        sizing = size_order(order)
        models = [offer.accelerator_model] if field == "bare_metal_profile" else list(offer.accelerator_models.all())
        rows.append(
            {
                "offer": offer,
                "field": field,
                "order": order,
                "sizing": sizing,
                "over": dimensions_over(sizing.demand, usage) if project else [],
                "max_duration_hours": max_duration_hours(service, **{field: offer}),
                "link_query": urlencode(
                    {**({"project": project.pk} if project else {}), PREFILL_KEYS[field]: offer.pk}
                ),
                "vendors": {model.vendor.slug for model in models},
                "text": " ".join([service.name, service.description, offer.name, *(str(model) for model in models)]),
            }
        )
    return rows


# The query-string name a catalog link uses for each offering (the order form's short aliases).
PREFILL_KEYS = {"spec": "spec", "bare_metal_profile": "profile"}


def passes(row: dict, filters: dict) -> bool:
    sizing = row["sizing"]
    return (
        _matches(filters.get("q"), row["text"])
        and ("vendor" not in filters or filters["vendor"].slug in row["vendors"])
        and sizing.accelerator_memory_gb >= filters.get("min_accelerator_memory", 0)
        and ("max_hourly_price" not in filters or sizing.hourly_cost <= filters["max_hourly_price"])
        and not (filters.get("fits_quota") and row["over"])
    )


def shown_without_offers(service, filters: dict) -> bool:
    """Whether a service none of whose options passed the filters still shows: always without filters; with only
    a search, a serving service (which lists models, not options) the search finds by name or model."""
    if not filters:
        return True
    if service.kind != ServiceKind.MODEL_SERVING or set(filters) - {"q"}:
        return False
    names = [service.name, service.description, *(str(model) for model in service.serving_models.all())]
    return _matches(filters.get("q"), " ".join(names))


def _matches(query: str | None, text: str) -> bool:
    return not query or all(word in text.lower() for word in query.lower().split())


def mark_never_fitting(rows: list[dict]) -> None:
    """Say on each option no node of the inventory could ever hold why not (one inventory load for the page)."""
    reasons = hooks.ask(hooks.ORDERS_NEVER_FIT, [(row["order"], row["sizing"]) for row in rows])
    for row, reason in zip(rows, reasons or [None] * len(rows), strict=True):
        row["never_fits"] = reason
