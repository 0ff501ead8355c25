"""The operator console's home: panels that each app's admin registers (approvals, queue, failed runs, devices,
capacity, budgets), shown above the app list. The console lives below every app, so it only collects what they
register; each panel reads its data in a constant number of queries (tests/config/test_dashboard.py)."""

from collections.abc import Callable
from dataclasses import dataclass, field

from django.http import HttpRequest


@dataclass
class Row:
    """One line of a panel: a label, a value, an optional link and tone (ok, warn, bad)."""

    label: str
    value: str = ""
    url: str = ""
    tone: str = ""
    note: str = ""


@dataclass
class PanelContent:
    count: int | None = None  # the headline number, None for panels that are a table only
    count_label: str = ""
    tone: str = ""  # of the headline: "bad" when something needs an operator
    rows: list[Row] = field(default_factory=list)
    links: list[tuple[str, str]] = field(default_factory=list)  # (label, url)
    empty: str = "Nothing to report."
    columns: list[str] = field(default_factory=list)  # for table panels: the column headings
    table: list[list[str]] = field(default_factory=list)


@dataclass(frozen=True)
class Panel:
    key: str
    title: str
    order: int
    build: Callable[[HttpRequest], PanelContent | None]  # None: not for this user (no permission)


_panels: dict[str, Panel] = {}


def register_panel(key: str, *, title: str, order: int):
    """Decorator for a function (request) -> PanelContent | None, called on every render of the console's home."""

    def decorate(build):
        _panels[key] = Panel(key=key, title=title, order=order, build=build)
        return build

    return decorate


def panels_for(request: HttpRequest) -> list[dict]:
    shown = []
    for panel in sorted(_panels.values(), key=lambda panel: (panel.order, panel.key)):
        content = panel.build(request)
        if content is not None:
            shown.append({"key": panel.key, "title": panel.title, "content": content})
    return shown
