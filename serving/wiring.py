"""What serving listens to: a node's availability (its replicas leave or rejoin the rotation), the minute health
check's schedule, the request page's endpoint hook, and any change the gateways must reload."""

from django_q.tasks import async_task

from config import schedules

REPLICA_CHECK_TASK = "serving.tasks.check_replicas"


def check_replicas_on_node(*, node_id: int, **_kwargs) -> None:
    """A node was cordoned or a card of it isolated (or cleared): its serving replicas leave (or rejoin) the
    rotation now, not at the next minute's health check."""
    async_task(REPLICA_CHECK_TASK, node_id)


def ensure_schedules(**_kwargs) -> None:
    """Every minute: health-check the serving deployments' replicas."""
    schedules.ensure(("Health-check serving replicas", REPLICA_CHECK_TASK, schedules.EVERY_MINUTE))


def connect() -> None:
    from django.db.models.signals import post_migrate

    from requests import hooks as request_hooks
    from scheduling.signals import node_availability_changed
    from serving.selectors import endpoint_details

    request_hooks.register(request_hooks.ENDPOINT_DETAILS, endpoint_details)
    node_availability_changed.connect(check_replicas_on_node, dispatch_uid="serving.replicas_on_node")
    post_migrate.connect(ensure_schedules, dispatch_uid="serving.ensure_schedules")
    _tell_gateways_on_change()


def _tell_gateways_on_change() -> None:
    """Any saved or deleted key, deployment or replica (services, admin, steps) makes the gateways reload their
    snapshot after commit; the few bulk updates call routes_changed() themselves."""
    from django.db.models.signals import post_delete, post_save

    from serving.models import ApiKey, ServingDeployment, ServingReplica
    from serving.routes import routes_changed

    def changed(**_kwargs):
        routes_changed()

    for model in (ApiKey, ServingDeployment, ServingReplica):
        post_save.connect(changed, sender=model, weak=False, dispatch_uid=f"gateway.{model.__name__}.saved")
        post_delete.connect(changed, sender=model, weak=False, dispatch_uid=f"gateway.{model.__name__}.deleted")
