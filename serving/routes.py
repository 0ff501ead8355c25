"""What the gateway data plane reads from the control plane, and how it learns that something changed.

Django writes keys, deployments, replicas and budgets (services in keys.py and deployments.py, the admin); the
gateway processes (serving/gateway.py) hold a snapshot of them in memory and never write them. Every
committed change bumps a version counter in Redis (`ROUTES_VERSION_KEY`); each gateway polls it every
`GATEWAY_POLL_SECONDS` and reloads its snapshot when it moved, so a revoked key or a released deployment is
refused everywhere from the next poll on. Without Redis (the embedded default) there is nothing to poll: each
gateway reloads its snapshot every `GATEWAY_SNAPSHOT_TTL_SECONDS` instead.

The snapshot is three small queries (serving deployments and those at zero replicas, their healthy replicas, the
active keys of their projects) run in the gateway's database thread, never per call.
"""

import logging
import time
from dataclasses import dataclass, field

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

logger = logging.getLogger(__name__)

ROUTES_VERSION_KEY = "gateway:routes:version"
_redis: tuple[str, object] | None = None  # (url, client)


def _store():
    global _redis
    if not settings.REDIS_URL:
        return None
    if _redis is None or _redis[0] != settings.REDIS_URL:
        import redis

        _redis = (settings.REDIS_URL, redis.Redis.from_url(settings.REDIS_URL, socket_timeout=2))
    return _redis[1]


def _bump() -> None:
    store = _store()
    if store is None:
        return
    try:
        store.incr(ROUTES_VERSION_KEY)
    except Exception as error:  # the gateways fall back on their snapshot TTL; the change itself is committed
        logger.warning("Could not signal the gateways (%s): they pick the change up on their next reload", error)


def routes_changed() -> None:
    """Tell every gateway to reload its snapshot once the current transaction commits."""
    transaction.on_commit(_bump)


@dataclass(frozen=True)
class Replica:
    id: int
    name: str
    url: str


@dataclass
class Route:
    deployment_id: int
    request_id: int
    project_id: int
    slug: str
    model: str
    rate_limit_per_minute: int
    monthly_token_budget: int | None
    replicas: list[Replica] = field(default_factory=list)
    state: str = "serving"  # serving.choices.DeploymentState: at zero or waking, a call wakes it

    @property
    def asleep(self) -> bool:
        return self.state != "serving"


@dataclass(frozen=True)
class Key:
    id: int
    prefix: str
    project_id: int
    expires_at: float | None  # epoch seconds; set while a rotated key is in its grace period


@dataclass(frozen=True)
class Snapshot:
    routes: dict[str, Route]
    keys: dict[str, Key]  # by the SHA-256 of the whole secret (what the database stores)
    loaded_at: float


def snapshot_load() -> Snapshot:
    """Everything the gateway needs to admit and route a call (three queries)."""
    from requests.choices import RUNNING_STATES, RequestState
    from serving.choices import ASLEEP_STATES, DeploymentState
    from serving.models import ApiKey, ServingDeployment, ServingReplica

    routes = {
        row["slug"]: Route(
            deployment_id=row["pk"],
            request_id=row["request_id"],
            project_id=row["project_id"],
            slug=row["slug"],
            model=row["model_name"],
            rate_limit_per_minute=row["rate_limit_per_minute"],
            monthly_token_budget=row["monthly_token_budget"],
            state=row["state"],
        )
        for row in ServingDeployment.objects.filter(
            # At zero replicas a deployment keeps its route while its request lives: the next call wakes it.
            Q(state=DeploymentState.SERVING)
            | Q(state__in=ASLEEP_STATES, request__state__in=[*RUNNING_STATES, RequestState.QUEUED])
        ).values(
            "pk",
            "request_id",
            "project_id",
            "slug",
            "model_name",
            "rate_limit_per_minute",
            "monthly_token_budget",
            "state",
        )
    }
    by_id = {route.deployment_id: route for route in routes.values()}
    for row in (
        ServingReplica.objects.filter(deployment_id__in=by_id, healthy=True)
        .exclude(url="")
        .order_by("name")
        .values("pk", "name", "url", "deployment_id")
    ):
        by_id[row["deployment_id"]].replicas.append(Replica(row["pk"], row["name"], row["url"].rstrip("/")))
    keys = {
        row["hashed"]: Key(
            row["pk"], row["prefix"], row["project_id"], row["expires_at"].timestamp() if row["expires_at"] else None
        )
        for row in ApiKey.objects.filter(Q(expires_at__isnull=True) | Q(expires_at__gt=timezone.now()))
        .filter(revoked_at__isnull=True)
        .values("pk", "prefix", "hashed", "project_id", "expires_at")
    }
    return Snapshot(routes=routes, keys=keys, loaded_at=time.monotonic())
