"""Reads for idle detection: every running request under an active idle policy with its signals, in a fixed number
of queries however many there are (one annotated read), and what a request page shows about it."""

from dataclasses import dataclass
from datetime import date, timedelta

from django.db.models import FloatField, Max, Min, OuterRef, Q, QuerySet, Subquery, Sum
from django.db.models.functions import Coalesce
from django.utils import timezone

from catalog.choices import ServiceKind
from metering.choices import Grouping, IdleAction
from metering.idle.decide import Activity, Terms, Watch, duration_in_words
from metering.models import IdlePolicy, IdleWatch, TelemetrySample, TokenUsage
from metering.selectors import usage_report
from requests.choices import RequestState
from requests.models import ResourceRequest
from requests.services import can_release
from scheduling.choices import AllocationState
from scheduling.engine import MILLI
from scheduling.models import AllocationDevice

ACTIVE_ALLOCATION = Q(allocations__state=AllocationState.ACTIVE)


def terms_of(policy: IdlePolicy) -> Terms:
    endpoint = policy.service.kind == ServiceKind.MODEL_SERVING
    return Terms(
        utilization_below_pct=policy.utilization_below_pct if policy.watch_utilization else None,
        # An endpoint has no SSH or Jupyter sessions, and only an endpoint has gateway calls: a signal that is
        # always silent would be a reason without evidence.
        watch_sessions=policy.watch_sessions and not endpoint,
        watch_gateway=policy.watch_gateway and endpoint,
        idle=timedelta(minutes=policy.idle_minutes),
        lead=timedelta(minutes=policy.warning_minutes),
        readings_required=not endpoint,
    )


def watch_of(watch: IdleWatch | None) -> Watch:
    if watch is None:
        return Watch()
    return Watch(warned_at=watch.warned_at, snoozed_at=watch.snoozed_at, snoozed_until=watch.snoozed_until)


@dataclass(frozen=True)
class Watched:
    request: ResourceRequest
    policy: IdlePolicy
    terms: Terms
    activity: Activity
    watch: IdleWatch | None
    cards: float  # cards held now (shares added up)

    @property
    def stoppable(self) -> bool:
        """Bare-metal leases are warned, never stopped: the machine is the tenant's for the lease."""
        return self.request.service.kind != ServiceKind.BARE_METAL


def _samples_of_request():
    return TelemetrySample.objects.filter(
        allocation__request_id=OuterRef("pk"), allocation__state=AllocationState.ACTIVE
    ).order_by("-sampled_at", "-utilization_pct")


def watched_requests(*, request_ids: list[int] | None = None) -> list[Watched]:
    """Active requests whose offering has an active idle policy, each with its signals: one query."""
    samples = _samples_of_request()
    queryset: QuerySet = (
        ResourceRequest.objects.filter(state=RequestState.ACTIVE, service__idle_policy__active=True)
        .select_related("service__idle_policy", "idle_watch", "requester", "project")
        .annotate(
            running_since=Min("allocations__started_at", filter=ACTIVE_ALLOCATION),
            last_session_at=Max("allocations__session_seen_at", filter=ACTIVE_ALLOCATION),
            last_reading_at=Subquery(samples.values("sampled_at")[:1]),
            last_utilization_pct=Subquery(samples.values("utilization_pct")[:1]),
            last_busy_reading_at=Subquery(
                samples.filter(utilization_pct__gte=OuterRef("service__idle_policy__utilization_below_pct")).values(
                    "sampled_at"
                )[:1]
            ),
            last_call_at=Subquery(
                TokenUsage.objects.filter(request_id=OuterRef("pk"), last_call_at__isnull=False)
                .order_by("-last_call_at")
                .values("last_call_at")[:1]
            ),
            held_milli=Coalesce(
                Subquery(
                    AllocationDevice.objects.filter(
                        allocation__request_id=OuterRef("pk"), allocation__state=AllocationState.ACTIVE
                    )
                    .order_by()
                    .values("allocation__request_id")
                    .annotate(total=Sum("milli"))
                    .values("total")[:1],
                    output_field=FloatField(),
                ),
                0.0,
            ),
        )
        .filter(running_since__isnull=False)
        .order_by("pk")
    )
    if request_ids is not None:
        queryset = queryset.filter(pk__in=request_ids)
    return [_watched(request) for request in queryset]


def _watched(request: ResourceRequest) -> Watched:
    policy = request.service.idle_policy
    activity = Activity(
        started_at=request.running_since,
        last_reading_at=request.last_reading_at,
        last_busy_reading_at=request.last_busy_reading_at,
        last_utilization_pct=request.last_utilization_pct,
        last_session_at=request.last_session_at,
        last_call_at=request.last_call_at,
    )
    watch = getattr(request, "idle_watch", None)
    return Watched(request, policy, terms_of(policy), activity, watch, request.held_milli / MILLI)


def idle_status(resource_request: ResourceRequest, viewer) -> dict | None:
    """The request page's banner: a warned request's idle time, when it stops, the snoozes left and whether `viewer`
    may snooze; None while it is not warned."""
    watch = (
        IdleWatch.objects.filter(Q(warned_at__isnull=False) | Q(snoozed_until__isnull=False), request=resource_request)
        .only("idle_since", "warned_at", "acts_at", "snoozes", "snoozed_until", "reasons")
        .first()
    )
    if watch is None or resource_request.state != RequestState.ACTIVE:
        return None
    policy = IdlePolicy.objects.filter(service_id=resource_request.service_id, active=True).first()
    if policy is None:  # turned off since the warning: nothing will happen, so nothing to say
        return None
    return status_of(watch, policy, viewer, resource_request)


def status_of(watch: IdleWatch, policy: IdlePolicy, viewer, resource_request: ResourceRequest) -> dict:
    now = timezone.now()
    snoozes_left = max(0, policy.max_snoozes - watch.snoozes)
    idle_for = now - watch.idle_since if watch.idle_since else timedelta(0)
    return {
        "idle_since": watch.idle_since,
        "idle_for": idle_for,
        "idle_for_words": duration_in_words(idle_for),
        "warned_at": watch.warned_at,
        "acts_at": watch.acts_at,
        "stoppable": watch.acts_at is not None,
        "scales_to_zero": policy.action == IdleAction.SCALE_TO_ZERO,
        "snoozes": watch.snoozes,
        "snoozes_left": snoozes_left,
        "snoozed_until": watch.snoozed_until,
        "can_snooze": bool(
            snoozes_left and watch.warned_at and watch.acts_at and viewer and can_release(viewer, resource_request)
        ),
        "reasons": watch.reasons,
    }


def idle_report(*, user, first_month: date, last_month: date, project_id: int | None = None) -> dict:
    """Requested (held) against used card-hours of the visible requests that held cards in the months, with the idle
    card-hours of their ended idle episodes (IdleWatch); per request and per project. Three queries and the usage
    report's."""
    held = usage_report(
        user=user,
        first_month=first_month,
        last_month=last_month,
        group_by=[Grouping.PROJECT, Grouping.REQUEST],
        project_id=project_id,
    )
    idle_seconds = dict(
        IdleWatch.objects.filter(request_id__in=[row["request"] for row in held]).values_list(
            "request_id", "idle_card_seconds"
        )
    )
    requests, projects = [], {}
    for row in held:
        idle = min(float(row["card_hours"]), idle_seconds.get(row["request"], 0.0) / 3600)
        line = _usage_line(float(row["card_hours"]), idle)
        requests.append({"request": row["request"], "project": row["project"], **line})
        total = projects.setdefault(row["project"], {"card_hours": 0.0, "idle_card_hours": 0.0})
        total["card_hours"] += float(row["card_hours"])
        total["idle_card_hours"] += idle
    return {
        "projects": [
            {"project": slug, **_usage_line(total["card_hours"], total["idle_card_hours"])}
            for slug, total in sorted(projects.items())
        ],
        "requests": requests,
    }


def _usage_line(card_hours: float, idle: float) -> dict:
    return {
        "card_hours": round(card_hours, 4),
        "idle_card_hours": round(idle, 4),
        "used_card_hours": round(card_hours - idle, 4),
    }
