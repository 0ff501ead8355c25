"""Reads for requests and approvals; visibility rules live here and nowhere else."""

from collections import defaultdict
from collections.abc import Iterable
from datetime import timedelta

from django.contrib.contenttypes.models import ContentType
from django.db.models import F, Prefetch, Q, QuerySet
from django.http import Http404
from django.utils import timezone

from catalog.models import BareMetalProfile, Image, ResourceSpec, Service, ServingModel, ServingTemplate
from catalog.orderable import orderable_catalog
from requests.choices import TERMINAL_STATES, ApprovalState, EventCode, RequestState, StageState
from requests.models import (
    Approval,
    ApprovalAssignment,
    ApprovalStage,
    QuotaChangeRequest,
    RequestEvent,
    ResourceRequest,
)
from requests.quota import DimensionImpact, usage_of
from tenancy.choices import ProjectPermission, QuotaDimension
from tenancy.models import Project, User
from tenancy.selectors import grants_of, projects_with_permission, user_has_project_permission


def _assigned_subject_ids(user: User, model) -> QuerySet:
    # A set of ids, so unordered: the assignments' default order joins the users table to sort by approver name.
    return (
        ApprovalAssignment.objects.filter(
            approver=user, stage__approval__subject_type=ContentType.objects.get_for_model(model)
        )
        .order_by()
        .values("stage__approval__subject_id")
    )


def _visible(queryset: QuerySet, user: User) -> QuerySet:
    """Rows of projects the user may view, plus those the user was asked to approve; operators see all.

    The ids are read first (two small queries: the permissions, grants_of, then the approvals): with them inline
    as subqueries, PostgreSQL can only test every row of the table against both (a list's count read all 100,000
    requests). As id lists, the filter is an index scan of the user's projects, and the OR is there only for
    approvals outside them, which are rare."""
    model = queryset.model
    if not user.is_authenticated:
        return queryset.none()
    see_all = f"requests.view_{model._meta.model_name}"
    grants = grants_of(user=user, permissions=[see_all], project_permission=ProjectPermission.VIEW)
    if see_all in grants.held or grants.project_ids is None:  # every project's rows are every row
        return queryset
    projects = grants.project_ids
    elsewhere = list(
        _assigned_subject_ids(user, model)
        .exclude(stage__approval__project__in=projects)
        .values_list("stage__approval__subject_id", flat=True)
    )
    mine = Q(project__in=projects)
    return queryset.filter(mine | Q(pk__in=elsewhere) if elsewhere else mine)


def _with_relations(requests: QuerySet[ResourceRequest]) -> QuerySet[ResourceRequest]:
    return requests.select_related(
        *("tenant", "project__tenant", "requester", "service", "spec", "image", "bare_metal_profile"),
        "serving_model",
    )


def request_list_visible_to(*, user: User) -> QuerySet[ResourceRequest]:
    return _visible(_with_relations(ResourceRequest.objects.all()), user)


# What a list row shows (requests.api.serializers.RequestSummarySerializer), and only that, as value rows: a row
# of the whole request and its seven related rows is ~10 kB and ~40 columns, and building eight model instances
# per row cost more than the page's query. The rows serializer (RequestRowsSerializer) reads exactly these keys, and
# the catalog items (CATALOG_ITEMS) the page's rows name, which come from the kept catalog: joined in, their tables
# took PostgreSQL milliseconds to plan a page.
SUMMARY_COLUMNS = (
    *(
        "id",
        "state",
        "duration_hours",
        "reserved_start",
        "priority",
        "gpu_equivalents",
        "accelerator_count",
        "cost_estimate",
    ),
    *("quota_exception", "created_at", "queue_position", "queue_reason", "queue_updated_at", "queue_estimate"),
    *("project_id", "project__slug", "project__name", "requester__username"),
    *("service_id", "spec_id", "bare_metal_profile_id", "serving_model_id"),
)
SUMMARY_ITEMS = ("service", "spec", "bare_metal_profile", "serving_model")


def request_list_starts_with_own(user: User) -> bool:
    """Whether the user's request list starts with their own requests: people who order do; people who approve, lead
    a project or operate start with every request they may see (their own would be empty, or miss what they look
    after)."""
    if user.is_staff or projects_with_permission(user=user, permission=ProjectPermission.MANAGE).exists():
        return False
    return not can_approve_anything(user)


# What the request list's search looks in: a request matches when every word is in one of these.
SEARCHED_FIELDS = (
    *("service__name", "spec__name", "bare_metal_profile__name", "serving_model__name", "justification"),
    *("project__name", "project__tenant__name", "requester__username", "requester__first_name", "requester__last_name"),
)
BIGINT_MAX = 2**63 - 1


def _searched(requests: QuerySet[ResourceRequest], text: str) -> QuerySet[ResourceRequest]:
    """Requests with every word of `text` in one of SEARCHED_FIELDS; "#17" or "17" also finds request 17."""
    number = text.strip().lstrip("#")
    by_id = Q(pk=int(number)) if number.isdigit() and int(number) <= BIGINT_MAX else Q(pk__in=[])
    words = Q()
    for word in text.split():
        words &= Q.create([(f"{field}__icontains", word) for field in SEARCHED_FIELDS], connector=Q.OR)
    return requests.filter(by_id | words)


def request_list_filtered(
    *, user: User, mine: bool, state: str = "", project=None, spec=None, text: str = ""
) -> QuerySet[ResourceRequest]:
    """The request list page's rows: what the user may see, narrowed as its filters say, newest first."""
    requests = request_list_visible_to(user=user)
    if mine:
        requests = requests.filter(requester=user)
    if state:
        requests = requests.filter(state=state)
    if project is not None:
        requests = requests.filter(project=project)
    if spec is not None:
        requests = requests.filter(spec=spec)
    if text.strip():
        requests = _searched(requests, text)
    return requests.order_by("-created_at", "-id")


def request_rows_visible_to(*, user: User) -> QuerySet[ResourceRequest]:
    """What request_list_visible_to sees, with no joins yet: a list filters, orders and counts it, then reads its
    page as value rows (SummaryRows)."""
    return _visible(ResourceRequest.objects.all(), user)


class SummaryRows:
    """A filtered request list as Django's paginator takes it: counted as it is, its page read as value rows of
    SUMMARY_COLUMNS with the catalog items they name. Counting the value rows themselves would join the tables
    their columns come from (a project's count grew many times slower with a large history)."""

    def __init__(self, queryset: QuerySet[ResourceRequest]):
        self.queryset = queryset
        self.ordered = queryset.ordered  # the paginator warns about unordered lists

    def count(self) -> int:
        return self.queryset.count()

    def __getitem__(self, page: slice) -> list[dict]:
        # The page's ids first (a subquery), then their rows: sorted as rows, their joins were computed for every
        # row sorted (an operator's queue of thousands); this way only the page's rows are joined.
        ids = self.queryset.values("pk")[page]
        rows = list(self.queryset.filter(pk__in=ids).values(*SUMMARY_COLUMNS))
        catalog = orderable_catalog()
        for row in rows:
            row.update({item: catalog.get(CATALOG_ITEMS[item], row[f"{item}_id"]) for item in SUMMARY_ITEMS})
        return rows


def queue_visible_to(*, user: User) -> QuerySet[ResourceRequest]:
    """Queued requests in queue order; those not yet seen by a cycle come last, oldest first."""
    return (
        request_rows_visible_to(user=user)
        .filter(state=RequestState.QUEUED)
        .order_by(F("queue_position").asc(nulls_last=True), "created_at", "id")
    )


def request_get(*, user: User, pk: int) -> ResourceRequest:
    """One request the user may see, else 404. The row is read first and the user's right to it checked on that row
    (as `_visible` would decide it): one or two small queries, not the ids of every project the user sees."""
    try:
        found = ResourceRequest.objects.select_related("tenant", "project", "requester").get(pk=pk)
    except (ResourceRequest.DoesNotExist, ValueError, TypeError) as missing:
        raise Http404("No such request.") from missing
    if not _may_see(user, found):
        raise Http404("No such request.")
    found.project.tenant = found.tenant  # the same row: a project's requests are its tenant's
    with_catalog_items([found])
    return found


# A request's catalog items: taken from the catalog the process keeps (catalog.orderable) rather than joined in. Nine
# tables in one query took PostgreSQL far longer to plan than to read the row.
CATALOG_ITEMS = {
    "service": Service,
    "spec": ResourceSpec,
    "image": Image,
    "bare_metal_profile": BareMetalProfile,
    "serving_model": ServingModel,
    "serving_template": ServingTemplate,
}


def with_catalog_items(requests: Iterable[ResourceRequest]) -> None:
    catalog = orderable_catalog()
    for request in requests:
        for field, model in CATALOG_ITEMS.items():
            item = catalog.get(model, getattr(request, f"{field}_id"))
            if item is not None:  # catalog entries are retired, never deleted; a missing one is read as ever
                setattr(request, field, item)


def _may_see(user: User, request: ResourceRequest) -> bool:
    """Its project's view grant (members, nearly every caller: one query), an approval of it assigned to the user,
    or the operators' global permission."""
    return user.is_authenticated and (
        user_has_project_permission(user=user, project=request.project, permission=ProjectPermission.VIEW)
        or _assigned_subject_ids(user, ResourceRequest).filter(stage__approval__subject_id=request.pk).exists()
        or user.has_perm("requests.view_resourcerequest")
    )


def _approval_with_decisions() -> QuerySet[Approval]:
    assignments = ApprovalAssignment.objects.select_related("approver")
    stages = ApprovalStage.objects.prefetch_related(Prefetch("assignments", queryset=assignments))
    return Approval.objects.prefetch_related(Prefetch("stages", queryset=stages))


def approval_of(subject) -> Approval | None:
    """The subject's approval with every stage and decision (three queries)."""
    return (
        _approval_with_decisions()
        .filter(subject_type=ContentType.objects.get_for_model(subject), subject_id=subject.pk)
        .first()
    )


def backend_wait_of(request: ResourceRequest) -> RequestEvent | None:
    """Why the execution backend holds the request's workload back (Slurm keeping its job pending), as the
    provisioning step last noted it: a queue reason that names its backend."""
    return (
        request.events.filter(code=EventCode.QUEUE_REASON, data__details__has_key="backend")
        .order_by("-created_at", "-id")
        .first()
    )


def timeline_of(request: ResourceRequest) -> QuerySet[RequestEvent]:
    return request.events.select_related("actor").order_by("created_at", "id")


def approval_inbox(*, user: User) -> QuerySet[ApprovalAssignment]:
    """What waits for this user's decision now: current stage, undecided, approval still open."""
    return (
        ApprovalAssignment.objects.filter(
            approver=user,
            decision="",
            stage__state=StageState.PENDING,
            stage__approval__state=ApprovalState.PENDING,
        )
        .select_related("stage__approval__project__tenant", "stage__approval__requester")
        .order_by("stage__approval__created_at", "id")
    )


def approval_inbox_with_subjects(*, user: User) -> list[ApprovalAssignment]:
    return with_subjects(list(approval_inbox(user=user)))


def with_subjects(tasks: list[ApprovalAssignment]) -> list[ApprovalAssignment]:
    """Attach to each task its subject, loaded with what an inbox shows (two queries, however many tasks)."""
    loaders = {
        ResourceRequest: ResourceRequest.objects.select_related("project__tenant", "requester"),
        QuotaChangeRequest: QuotaChangeRequest.objects.select_related("project", "requested_by"),
    }
    for model, queryset in loaders.items():
        content_type = ContentType.objects.get_for_model(model)
        mine = [task for task in tasks if task.stage.approval.subject_type_id == content_type.pk]
        subjects = queryset.in_bulk([task.stage.approval.subject_id for task in mine]) if mine else {}
        for task in mine:
            task.subject = subjects[task.stage.approval.subject_id]
    requests = [task.subject for task in tasks if isinstance(getattr(task, "subject", None), ResourceRequest)]
    if requests:
        with_catalog_items(requests)  # joined in, the catalog's rows cost more to plan than to read (CATALOG_ITEMS)
    # Subjects of other apps (e.g. isolation clearances): one query per kind present on the page.
    others: dict[int, list[ApprovalAssignment]] = {}
    for task in tasks:
        if not hasattr(task, "subject"):
            others.setdefault(task.stage.approval.subject_type_id, []).append(task)
    for type_id, mine in others.items():
        model = ContentType.objects.get_for_id(type_id).model_class()
        subjects = model._default_manager.in_bulk([task.stage.approval.subject_id for task in mine])
        for task in mine:
            task.subject = subjects.get(task.stage.approval.subject_id)
    return tasks


def approval_task_get(*, user: User, pk: int) -> ApprovalAssignment:
    try:
        return ApprovalAssignment.objects.select_related("stage__approval").get(pk=pk, approver=user)
    except (ApprovalAssignment.DoesNotExist, ValueError, TypeError) as missing:
        raise Http404("No such approval task.") from missing


def project_quota_usage(project: Project) -> list[DimensionImpact]:
    """Per dimension: used now and the project's limit (requested is zero: nothing is being ordered)."""
    usage = usage_of([project.pk])
    limits = project.quota.limits()
    return [
        DimensionImpact("project", dimension, usage[dimension], 0, limits[dimension])
        for dimension in QuotaDimension.values
    ]


def quota_change_list_visible_to(*, user: User) -> QuerySet[QuotaChangeRequest]:
    return _visible(QuotaChangeRequest.objects.select_related("project__tenant", "requested_by"), user)


def approval_inbox_all() -> QuerySet[ApprovalAssignment]:
    """Every approver's inbox at once (the approval digest): undecided assignments of open stages."""
    return (
        ApprovalAssignment.objects.filter(
            decision="",
            stage__state=StageState.PENDING,
            stage__approval__state=ApprovalState.PENDING,
        )
        .select_related("approver", "stage__approval__project", "stage__approval__requester")
        .order_by("approver_id", "stage__approval__created_at", "id")
    )


def can_approve_anything(user: User) -> bool:
    """Whether the person approves at all: an approval role on a project, or an approval assigned to them."""
    return (
        projects_with_permission(user=user, permission=ProjectPermission.APPROVE).exists()
        or ApprovalAssignment.objects.filter(approver=user).exists()
    )


# An order is taken for the same one sent again when the same person sent it this recently from another form (a
# second tab, the form opened anew); the form a request was made from is recognised by its key whenever it comes back.
SAME_ORDER_WINDOW = timedelta(minutes=10)
# Requests that may still run: what a second identical order would double. Ended ones, and failed ones (ordering
# again is how a person gets past a failure), are not duplicated by a new order.
LIVE_STATES = frozenset(RequestState.values) - TERMINAL_STATES - {RequestState.FAILED}


def order_sent_before(*, requester: User, key: str, fingerprint: str) -> ResourceRequest | None:
    """The request this form (its idempotency key) made, else the same order the requester sent within
    SAME_ORDER_WINDOW that is still live; None when neither."""
    mine = ResourceRequest.objects.filter(requester=requester)
    if key and (made := mine.filter(idempotency_key=key).first()) is not None:
        return made
    return (
        mine.filter(
            order_fingerprint=fingerprint, state__in=LIVE_STATES, created_at__gte=timezone.now() - SAME_ORDER_WINDOW
        )
        .order_by("-created_at", "-id")
        .first()
    )


def likely_duplicates(requests: Iterable[ResourceRequest]) -> dict[int, list[dict]]:
    """Per request, the other live requests of the same person with the same order (project, choices, duration,
    priority, parameters), oldest first, as {id, state, created_at}: one query, however many requests."""
    requests = [request for request in requests if request.order_fingerprint]
    if not requests:
        return {}
    same = defaultdict(list)
    rows = (
        ResourceRequest.objects.filter(
            order_fingerprint__in={request.order_fingerprint for request in requests}, state__in=LIVE_STATES
        )
        .order_by("created_at", "id")
        .values("id", "requester_id", "order_fingerprint", "state", "created_at")
    )
    for row in rows:
        same[(row["requester_id"], row["order_fingerprint"])].append(row)
    return {
        request.pk: others
        for request in requests
        if (
            others := [
                row for row in same[(request.requester_id, request.order_fingerprint)] if row["id"] != request.pk
            ]
        )
    }


def open_work_of(project_id: int, user_id: int) -> list[dict]:
    """tenancy's OPEN_WORK hook: the person's open requests in the project, for the mail that tells its lead they left
    (their work stays the project's and keeps running)."""
    from django.urls import reverse

    from requests.choices import OPEN_STATES

    rows = ResourceRequest.objects.filter(project_id=project_id, requester_id=user_id, state__in=OPEN_STATES)
    return [
        {
            "id": row.pk,
            "title": f"#{row.pk} {row.service.name}",
            "state": row.get_state_display(),
            "url": reverse("portal:request-detail", args=[row.pk]),
        }
        for row in rows.select_related("service").order_by("pk")
    ]
