"""Related objects a service has just created, handed to the code that shows them without reading them again."""

from django.db import models


def attach_prefetched(instance: models.Model, relation: str, objects: list[models.Model]) -> None:
    """Give `instance.<relation>.all()` these objects, as prefetch_related would have loaded them. Django has no
    public call for this; it is what its prefetching stores (a queryset with its results filled in)."""
    cached = getattr(instance, relation).all()
    cached._result_cache, cached._prefetch_done = list(objects), True
    if not hasattr(instance, "_prefetched_objects_cache"):
        instance._prefetched_objects_cache = {}
    instance._prefetched_objects_cache[relation] = cached
