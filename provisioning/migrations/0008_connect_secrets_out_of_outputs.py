"""Jupyter tokens left the step outputs, the delivered records and the timeline (issue 37): each is cut out of the
URL that carried it; a running workspace's goes into an encrypted connect secret, so its requester still sees it (and
no one else does)."""

from urllib.parse import parse_qs, urlsplit, urlunsplit

from django.db import migrations

from config.encryption import encrypt


def _without_token(url: str) -> tuple[str, str | None]:
    parts = urlsplit(url)
    token = parse_qs(parts.query).get("token", [None])[0]
    return urlunsplit(parts._replace(query="")), token


def _scrubbed(record: dict, *path: str) -> str | None:
    """Cut the token out of record[path...]["access"]["jupyter"]; the token, or None when there was none."""
    holder = record
    for key in path:
        holder = holder.get(key) or {}
    access = holder.get("access") or {}
    if "token=" not in (access.get("jupyter") or ""):
        return None
    access["jupyter"], token = _without_token(access["jupyter"])
    holder["connect_secrets"] = sorted({*holder.get("connect_secrets", []), "jupyter"})
    return token


def forward(apps, schema_editor):
    ProvisioningRun = apps.get_model("provisioning", "ProvisioningRun")
    ProvisioningStep = apps.get_model("provisioning", "ProvisioningStep")
    ConnectSecret = apps.get_model("provisioning", "ConnectSecret")
    RequestEvent = apps.get_model("requests", "RequestEvent")
    for run in ProvisioningRun.objects.filter(delivered__access__jupyter__icontains="token=").select_related(
        "request", "allocation"
    ):
        token = _scrubbed(run.delivered)
        run.save(update_fields=["delivered"])
        if token and run.request.state == "active" and run.allocation.state == "active":
            ConnectSecret.objects.get_or_create(
                allocation_id=run.allocation_id,
                name="jupyter",
                defaults={"request_id": run.request_id, "ciphertext": encrypt(token)},
            )
    for step in ProvisioningStep.objects.filter(output__access__jupyter__icontains="token="):
        _scrubbed(step.output)
        step.save(update_fields=["output"])
    for event in RequestEvent.objects.filter(data__delivered__access__jupyter__icontains="token="):
        _scrubbed(event.data, "delivered")
        event.save(update_fields=["data"])


class Migration(migrations.Migration):
    dependencies = [
        ("provisioning", "0007_connect_secrets"),
        ("requests", "0021_queue_order_index"),
    ]

    operations = [migrations.RunPython(forward, migrations.RunPython.noop)]
