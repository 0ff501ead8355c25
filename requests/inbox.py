"""The approval inbox worked out for deciding fast: per task, how long it has waited, what earlier stages decided
and said, quota bars for the dimensions near or over a limit (what is in use apart from what awaits approval),
rightsizing advice and placement warnings; and the approver's decided history.

Everything is read in a constant number of queries however many tasks there are (tests/requests/test_inbox.py).
"""

from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal

from django.contrib.contenttypes.models import ContentType
from django.db.models import Prefetch
from django.utils.timesince import timesince

from requests import hooks, selectors, start_words
from requests.choices import EventCode, RequestState
from requests.models import ApprovalAssignment, ApprovalStage, QuotaChangeRequest, RequestEvent, ResourceRequest
from requests.quota import (
    LIMIT_PRECISION,
    Demand,
    _fmt,
    awaiting_approval,
    quota_scopes_by_project,
    request_quota_impact,
)

# A dimension is shown once this request, what is in use and what awaits approval reach this share of its limit.
NEAR_SHARE = Decimal("0.8")
SORTS = {
    "oldest": "Waiting longest first",
    "newest": "Newest first",
    "cost": "Highest cost first",
    "project": "Project",
}
KINDS = {"request": "Resource requests", "quota": "Quota changes", "other": "Other"}
FLAGS = {
    "over": "Over a quota limit",
    "exception": "Quota exceptions",
    "never_fits": "Cannot be placed",
    "rightsizing": "Rightsizing advice",
    "duplicate": "Likely duplicates",
}
ROW_ERRORS_SESSION_KEY = "inbox_row_errors"


def _quantized(value):
    return value.quantize(LIMIT_PRECISION) if isinstance(value, Decimal) else value


@dataclass(frozen=True)
class QuotaBar:
    """One dimension of one scope: in use (approved and running work, this month's metered card-hours), awaiting
    approval (the project's other requests still pending), this request, and the limit."""

    scope: str
    label: str
    in_use: Decimal | int
    awaiting: Decimal | int
    requested: Decimal | int
    limit: Decimal | int

    @property
    def fits_now(self) -> bool:
        return _quantized(self.in_use + self.requested) <= self.limit

    @property
    def fits_with_awaiting(self) -> bool:
        return _quantized(self.in_use + self.awaiting + self.requested) <= self.limit

    @property
    def near(self) -> bool:
        return not self.fits_with_awaiting or (self.in_use + self.awaiting + self.requested) >= NEAR_SHARE * self.limit

    def _share(self, value) -> float:
        scale = max(self.limit, self.in_use + self.awaiting + self.requested) or 1
        return round(float(value) / float(scale) * 100, 1)

    @property
    def widths(self) -> dict:
        return {
            "in_use": self._share(self.in_use),
            "awaiting": self._share(self.awaiting),
            "requested": self._share(self.requested),
            "limit": self._share(self.limit),
        }

    @property
    def text(self) -> str:
        where = "Tenant " if self.scope == "tenant" else ""
        parts = [f"{_fmt(self.in_use)} in use"]
        if self.awaiting:
            parts.append(f"{_fmt(self.awaiting)} awaiting approval")
        parts.append(f"{_fmt(self.requested)} this request")
        return f"{where}{self.label}: {' + '.join(parts)} of {_fmt(self.limit)}"

    @property
    def verdict(self) -> str:
        if not self.fits_now:
            return "over"
        if not self.fits_with_awaiting:
            return "over if the others are approved"
        return ""


def quota_bars(resource_request: ResourceRequest, scopes, awaiting: dict) -> list[QuotaBar]:
    """Every limited dimension of the request's project (and capped tenant), with what awaits approval apart."""
    demand = Demand.of(resource_request)
    own_pending = resource_request.state == RequestState.PENDING_APPROVAL
    bars = []
    for impact in request_quota_impact(resource_request, scopes):
        if impact.limit is None:
            continue
        scope_id = resource_request.project_id if impact.scope == "project" else resource_request.project.tenant_id
        others = awaiting[(impact.scope, scope_id)][impact.dimension] - (
            demand.get(impact.dimension) if own_pending else 0
        )
        others = max(others, 0)
        in_use = max(impact.used - others, 0)
        bars.append(QuotaBar(impact.scope, impact.label, in_use, others, impact.requested, impact.limit))
    return bars


def _kind(subject) -> str:
    if isinstance(subject, ResourceRequest):
        return "request"
    if isinstance(subject, QuotaChangeRequest):
        return "quota"
    return "other"


def _earlier_stages(task: ApprovalAssignment) -> list[ApprovalStage]:
    return [stage for stage in task.stage.approval.stages.all() if stage.order < task.stage.order]


def _waiting_since(task: ApprovalAssignment, earlier: list[ApprovalStage]):
    decided = [stage.decided_at for stage in earlier if stage.decided_at]
    return max(decided) if decided else task.stage.approval.created_at


def _never_fits_by_request(request_ids: list[int]) -> dict[int, str]:
    """The placement warning each request was submitted with (no node could ever hold it), one query."""
    events = RequestEvent.objects.filter(
        request_id__in=request_ids, code=EventCode.SUBMITTED, data__has_key="never_fits"
    ).values_list("request_id", "data")
    return {request_id: data["never_fits"].get("message", "") for request_id, data in events}


def _advice_by_project_and_spec(user) -> dict[tuple[str, str], list[dict]]:
    advice: dict[tuple[str, str], list[dict]] = {}
    for item in hooks.ask(hooks.RIGHTSIZING_ADVICE, user, None, None) or []:
        advice.setdefault((item["project"], item["spec"]), []).append(item)
    return advice


def _with_stages(queryset):
    assignments = ApprovalAssignment.objects.select_related("approver")
    stages = ApprovalStage.objects.order_by("order").prefetch_related(Prefetch("assignments", queryset=assignments))
    return queryset.prefetch_related(Prefetch("stage__approval__stages", queryset=stages))


def pending_rows(user, *, params, row_errors: dict) -> dict:
    """The waiting tasks as rows, filtered and sorted as `params` (the query string) asks."""
    tasks = selectors.with_subjects(list(_with_stages(selectors.approval_inbox(user=user))))
    requests = [task.subject for task in tasks if isinstance(task.subject, ResourceRequest)]
    projects = {resource_request.project for resource_request in requests}
    scopes = quota_scopes_by_project(projects) if projects else {}
    awaiting = awaiting_approval(projects) if projects else {}
    never_fits = _never_fits_by_request([resource_request.pk for resource_request in requests])
    advice = _advice_by_project_and_spec(user) if requests else {}
    duplicates = selectors.likely_duplicates(requests)
    starts = (hooks.ask(hooks.STARTS_IF_APPROVED, [request.pk for request in requests]) or {}) if requests else {}
    rows = []
    for task in tasks:
        subject = task.subject
        earlier = _earlier_stages(task)
        row = {
            "task": task,
            "subject": subject,
            "kind": _kind(subject),
            "project": task.stage.approval.project,
            "earlier": earlier,
            "waiting_since": _waiting_since(task, earlier),
            "cost": subject.cost_estimate if isinstance(subject, ResourceRequest) else None,
            "bars": [],
            "bars_within": 0,
            "over": False,
            "never_fits": "",
            "expected_start": None,
            "rightsizing": [],
            "duplicates": [],
            "error": row_errors.get(str(task.pk), ""),
        }
        if isinstance(subject, ResourceRequest):
            bars = quota_bars(subject, scopes[subject.project_id], awaiting)
            row["bars"] = [bar for bar in bars if bar.near]
            row["bars_within"] = len(bars) - len(row["bars"])
            row["over"] = any(not bar.fits_now for bar in bars)
            row["never_fits"] = never_fits.get(subject.pk, "")
            row["expected_start"] = start_words.expected_start(starts.get(subject.pk))
            spec_slug = subject.spec.slug if subject.spec_id else ""
            row["rightsizing"] = advice.get((subject.project.slug, spec_slug), [])
            row["duplicates"] = [_duplicate(subject, other) for other in duplicates.get(subject.pk, [])]
        rows.append(row)
    project_choices = sorted({(row["project"].pk, str(row["project"])) for row in rows if row["project"]}, key=_second)
    shown = _sorted(_filtered(rows, params), params.get("sort", "oldest"))
    return {"rows": shown, "total": len(rows), "project_choices": project_choices}


def _duplicate(resource_request: ResourceRequest, other: dict) -> dict:
    """Another live request of the same person with the same order, as the row says it."""
    earlier = other["created_at"] <= resource_request.created_at
    apart = abs(resource_request.created_at - other["created_at"])
    gap = (
        "less than a minute"
        if apart < timedelta(minutes=1)
        else timesince(resource_request.created_at - apart, resource_request.created_at)
    )
    return {
        "id": other["id"],
        "state": RequestState(other["state"]).label.lower(),
        "when": f"{gap} {'earlier' if earlier else 'later'}",
    }


def _second(pair):
    return pair[1]


def _filtered(rows: list[dict], params) -> list[dict]:
    project, kind, flag = params.get("project", ""), params.get("kind", ""), params.get("flag", "")
    if project:
        rows = [row for row in rows if row["project"] and str(row["project"].pk) == project]
    if kind in KINDS:
        rows = [row for row in rows if row["kind"] == kind]
    if flag == "over":
        rows = [row for row in rows if row["over"]]
    elif flag == "exception":
        rows = [row for row in rows if getattr(row["subject"], "quota_exception", False)]
    elif flag == "never_fits":
        rows = [row for row in rows if row["never_fits"]]
    elif flag == "rightsizing":
        rows = [row for row in rows if row["rightsizing"]]
    elif flag == "duplicate":
        rows = [row for row in rows if row["duplicates"]]
    return rows


def _sorted(rows: list[dict], sort: str) -> list[dict]:
    if sort == "newest":
        return sorted(rows, key=lambda row: row["waiting_since"], reverse=True)
    if sort == "cost":
        return sorted(rows, key=lambda row: row["cost"] if row["cost"] is not None else Decimal(-1), reverse=True)
    if sort == "project":
        return sorted(rows, key=lambda row: (str(row["project"] or ""), row["waiting_since"]))
    return sorted(rows, key=lambda row: row["waiting_since"])


DECIDED_PAGE = 100


def decided_rows(user) -> list[dict]:
    """The user's own decisions, newest first (the last DECIDED_PAGE), with where each approval ended."""
    decided = (
        ApprovalAssignment.objects.filter(approver=user)
        .exclude(decision="")
        .select_related("stage__approval__project__tenant", "stage__approval__requester")
        .order_by("-decided_at", "-id")[:DECIDED_PAGE]
    )
    tasks = selectors.with_subjects(list(decided))
    request_type = ContentType.objects.get_for_model(ResourceRequest)
    return [
        {
            "task": task,
            "subject": task.subject,
            "approval": task.stage.approval,
            "is_request": task.stage.approval.subject_type_id == request_type.pk,
        }
        for task in tasks
    ]
