"""Engine reasons in a person's words. The placement engine is pure and names accelerator models by slug
("needs 8 x h100-80gb …; the largest h100-80gb node has 112", with its multiplication sign); what people read
(queue reasons, the order preview, the catalog's "cannot run here") names them as the catalog does ("needs 8 x H100
80GB SXM …"). The reason's numbers keep the identifiers."""

import re
from collections.abc import Callable

from catalog.models import AcceleratorModel
from config.versions import KeptPerProcess


def _pattern(names: dict[str, str]) -> re.Pattern | None:
    if not names:
        return None
    slugs = "|".join(re.escape(slug) for slug in sorted(names, key=len, reverse=True))
    return re.compile(rf"(?P<count>\d+×)?(?<![\w-])(?P<slug>{slugs})(?![\w-])")  # noqa: RUF001


def _every_model() -> tuple[dict[str, str], re.Pattern | None]:
    names = dict(AcceleratorModel.objects.values_list("slug", "name"))
    return names, _pattern(names)


# Catalog edits move the catalog's counter: a renamed model reads anew.
_kept = KeptPerProcess("catalog", _every_model)


def namer(models=None) -> Callable[[str], str]:
    """What replaces each accelerator model's slug in a message by its name, a count before it set apart, for as many
    messages as the caller has (a cycle's every pending reason: the names are read once). `models`: the models it can
    name (an order's, read with it, so that this reads nothing); else every model of the catalog (kept per process:
    one read of the catalog's counter)."""
    if models is None:
        names, pattern = _kept.get()
    else:
        names = {model.slug: model.name for model in models}
        pattern = _pattern(names)
    if pattern is None:
        return lambda message: message

    def name(match: re.Match) -> str:
        count = f"{match['count']} " if match["count"] else ""
        return f"{count}{names[match['slug']]}"

    return lambda message: pattern.sub(name, message)


def named(message: str, models=None) -> str:
    """One message with the models' names (see `namer`)."""
    return namer(models)(message)
