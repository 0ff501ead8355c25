"""What uses a project's quota: each dimension split into running work, queued work, what is reserved for requests
awaiting approval and approved quota exceptions (card-hours also into what was metered this month), with the requests
behind each part. The parts add up to what admission counts (requests.quota.usage_of).

Four queries however many requests the project has: the sums per part, this month's ledger, the largest requests of
each part, and the limits.
"""

from dataclasses import dataclass
from decimal import Decimal

from django.db.models import Case, CharField, Count, F, Q, Sum, Value, When, Window
from django.db.models.functions import RowNumber

from catalog.orderable import orderable_catalog
from requests.choices import COMMITTED_STATES, RequestState
from requests.models import ResourceRequest
from requests.quota import CARD_HOUR_PRECISION, month_start
from requests.selectors import CATALOG_ITEMS
from tenancy.choices import QuotaDimension
from tenancy.models import MonthlyUsage, Project

D = QuotaDimension
ZERO = Decimal(0)
RUNNING_STATES = (RequestState.ALLOCATED, RequestState.PROVISIONING, RequestState.ACTIVE, RequestState.RELEASING)
QUEUED_STATES = (RequestState.APPROVED, RequestState.QUEUED)
ADMITTED_STATES = sorted(COMMITTED_STATES - {RequestState.PENDING_APPROVAL})

# The parts every committed request falls in exactly one of: an approved quota exception wherever it is, else by state.
PARTS = {
    "running": ("Running", "allocated, provisioning, active or being released"),
    "queued": ("Queued", "approved and waiting for the scheduler"),
    "reserved": ("Reserved", "awaiting approval: admission holds their demand"),
    "exception": ("Approved exceptions", "approved over the quota"),
}
METERED = ("metered", "Metered this month", "card-hours already used this month, finished work included")
METERED_KEYS = ("card_hours", "running_card_hours")
# How many requests a part lists; the rest are a link to the request list.
LISTED_PER_PART = 10
# Each dimension's amount on a request row, as the request stores it.
DEMAND_COLUMNS = {
    D.GPUS: "gpu_equivalents",
    D.ACCELERATOR_MEMORY_GB: "accelerator_memory_gb",
    D.CPU_CORES: "cpu_cores",
    D.MEMORY_GB: "memory_gb",
    D.MONTHLY_CARD_HOURS: "card_hours",
}

_PART = Case(
    When(quota_exception=True, state__in=ADMITTED_STATES, then=Value("exception")),
    When(state=RequestState.PENDING_APPROVAL, then=Value("reserved")),
    When(state__in=QUEUED_STATES, then=Value("queued")),
    default=Value("running"),
    output_field=CharField(),
)


@dataclass(frozen=True)
class Segment:
    key: str
    label: str
    amount: Decimal | int


@dataclass(frozen=True)
class DimensionBreakdown:
    """One dimension: its parts in order, the limit (None: no limit) and, for the bar, each part's share."""

    dimension: str
    label: str
    segments: list[Segment]
    limit: Decimal | int | None

    @property
    def used(self) -> Decimal | int:
        return sum((segment.amount for segment in self.segments), start=0)

    @property
    def over(self) -> bool:
        return self.limit is not None and round(self.used, 2) > self.limit

    @property
    def left(self):
        return None if self.limit is None else max(self.limit - self.used, 0)

    @property
    def bars(self) -> list[dict]:
        """Each part as a stretch of a bar 100 wide (x, width), scaled so that the limit, or the use when it is
        over, fills it; the limit's mark at `limit_x`."""
        scale = float(max(self.limit or 0, self.used)) or 1.0
        x, stretches = 0.0, []
        for segment in self.segments:
            width = float(segment.amount) / scale * 100
            if width > 0:
                stretches.append({"key": segment.key, "label": segment.label, "x": round(x, 2), "w": round(width, 2)})
            x += width
        return stretches

    @property
    def limit_x(self) -> float | None:
        return (
            None if self.limit is None else round(float(self.limit) / float(max(self.limit, self.used) or 1) * 100, 2)
        )


@dataclass(frozen=True)
class PartRequests:
    """The requests behind one part, largest first (at most LISTED_PER_PART), and how many there are."""

    key: str
    label: str
    meaning: str
    count: int
    rows: list[dict]

    @property
    def more(self) -> int:
        return self.count - len(self.rows)


@dataclass(frozen=True)
class QuotaBreakdown:
    dimensions: list[DimensionBreakdown]
    parts: list[PartRequests]


def quota_breakdown(project: Project) -> QuotaBreakdown:
    committed = ResourceRequest.objects.filter(project=project, state__in=COMMITTED_STATES).annotate(part=_PART)
    sums = {row["part"]: row for row in _part_sums(committed)}
    ledger = MonthlyUsage.objects.filter(project=project, month=month_start()).values(
        "card_hours", "running_card_hours"
    )
    metered = ledger.first() or {"card_hours": ZERO, "running_card_hours": ZERO}
    limits = project.quota.limits()
    dimensions = [
        DimensionBreakdown(dimension, D(dimension).label, _segments(dimension, sums, metered), limits[dimension])
        for dimension in D.values
    ]
    return QuotaBreakdown(dimensions=dimensions, parts=_parts(committed, sums))


def _part_sums(committed) -> list[dict]:
    """Per part: each dimension's demand and how many requests; card-hours without requests being released, whose
    use is in the ledger already (as requests.quota counts them)."""
    return list(
        committed.order_by()
        .values("part")
        .annotate(
            count=Count("id"),
            gpus=Sum("gpu_equivalents"),
            accelerator_memory_gb=Sum("accelerator_memory_gb"),
            cpu_cores=Sum("cpu_cores"),
            memory_gb=Sum("memory_gb"),
            monthly_card_hours=Sum("card_hours", filter=~Q(state=RequestState.RELEASING)),
        )
    )


def _segments(dimension: str, sums: dict, metered: dict) -> list[Segment]:
    if dimension == D.CONCURRENT_TASKS:
        amounts = {part: sums.get(part, {}).get("count", 0) for part in PARTS}
    else:
        amounts = {part: _number(sums.get(part, {}).get(dimension)) for part in PARTS}
    segments = []
    if dimension == D.MONTHLY_CARD_HOURS:
        amounts = _still_to_use(amounts, _number(metered["running_card_hours"]))
        segments.append(Segment(METERED[0], METERED[1], _number(metered["card_hours"])))
    return segments + [Segment(part, PARTS[part][0], amounts[part]) for part in PARTS]


def _still_to_use(amounts: dict, running_metered: Decimal) -> dict:
    """Card-hours committed work will still use: what running work (plain or an exception) metered so far is in the
    ledger's card-hours already, so it is taken off running work first, then off exceptions; what is left of it
    (work released since the ledger's last refresh) off the rest, as admission counts it (requests.quota._usage)."""
    left = dict(amounts)
    for part in ("running", "exception", "queued", "reserved"):
        taken = min(left[part], running_metered)
        left[part] -= taken
        running_metered -= taken
    return {part: value.quantize(CARD_HOUR_PRECISION) for part, value in left.items()}


def _number(value) -> Decimal | int:
    if value is None:
        return ZERO
    return value if isinstance(value, Decimal | int) else Decimal(str(value))


def _parts(committed, sums: dict) -> list[PartRequests]:
    rows = _largest_per_part(committed)
    parts = []
    for part, (label, meaning) in PARTS.items():
        listed = [row for row in rows if row["part"] == part]
        parts.append(PartRequests(part, label, meaning, sums.get(part, {}).get("count", 0), listed))
    return parts


def _largest_per_part(committed) -> list[dict]:
    """The LISTED_PER_PART largest requests of each part (by GPUs, then card-hours), with their catalog items from
    the kept catalog: one query."""
    ranked = committed.annotate(
        rank=Window(
            RowNumber(),
            partition_by=[F("part")],
            order_by=[F("gpu_equivalents").desc(), F("card_hours").desc(), F("id")],
        )
    ).filter(rank__lte=LISTED_PER_PART)
    rows = list(
        ranked.order_by("part", "rank").values(
            "id",
            "part",
            "state",
            "created_at",
            "requester__username",
            "requester__first_name",
            "requester__last_name",
            "service_id",
            "spec_id",
            "bare_metal_profile_id",
            *DEMAND_COLUMNS.values(),
        )
    )
    catalog = orderable_catalog()
    for row in rows:
        for item in ("service", "spec", "bare_metal_profile"):
            row[item] = catalog.get(CATALOG_ITEMS[item], row[f"{item}_id"])
        row["state_label"] = RequestState(row["state"]).label
        full_name = f"{row['requester__first_name']} {row['requester__last_name']}".strip()
        row["requester"] = full_name or row["requester__username"]
    return rows
