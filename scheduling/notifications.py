"""Operators hear about each device isolation by mail (the requests app sends; kinds and preferences live there)."""

from django.urls import reverse

from config.mail import absolute_url
from requests.choices import NotificationKind
from requests.models import ResourceRequest
from requests.notifications import operators_notify
from scheduling.models import Device


def isolation_notify(*, device_id: int, affected_request_ids: list[int], requeued: bool) -> int:
    """Tell operators which device was isolated, why, and whose running requests it stopped or requeued."""
    device = Device.objects.select_related("node", "model").filter(pk=device_id).first()
    if device is None or not device.isolated:
        return 0
    affected = list(
        ResourceRequest.objects.filter(pk__in=affected_request_ids)
        .select_related("requester", "project")
        .order_by("pk")
    )
    return operators_notify(
        kind=NotificationKind.OPERATOR_ISOLATION,
        key=f"device:{device.pk}:{device.isolated_at:%Y%m%dT%H%M%S.%f}",
        subject=f"Device {device.node.name}/gpu{device.index} isolated",
        template="scheduling/mail/operator_isolation",
        context={
            "device": device,
            "affected": affected,
            "requeued": requeued,
            "device_url": absolute_url(reverse("admin:scheduling_device_change", args=[device.pk])),
        },
    )
