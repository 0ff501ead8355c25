"""django-q2 entry points: take ids, call one service."""

from config.retry import retry_if_locked
from serving.deployments import serving_replicas_check


@retry_if_locked
def check_replicas(node_id: int | None = None) -> int:
    return serving_replicas_check(node_id=node_id)
