"""Mail about requests, approvals and the hardware, driven by the timeline.

Services append `RequestEvent`s as ever; after their commit `announce_events` enqueues one task with the ids of the
events worth a mail (`EVENT_KINDS`), and `request_events_notify` (in that task) tells each requester, and operators
of a failed run, unless they turned that kind off. Approvers get one digest of what waits for them
(`approval_digests_send`, a django-q2 schedule), operators a mail per isolation (`operators_notify`, called by
scheduling). Each mail is claimed in `NotificationDelivery` in the transaction that sends it: a task run twice sends
once, a failed send claims nothing and the task is retried.
"""

import threading
from collections import defaultdict
from collections.abc import Iterable

from django.db import transaction
from django.urls import reverse
from django.utils import timezone
from django_q.tasks import async_task

from config.mail import Mail, absolute_url, mails_send
from requests.choices import NOTIFICATION_AUDIENCE, EventCode, NotificationAudience, NotificationKind
from requests.failures import failure_sentence
from requests.models import (
    ApprovalAssignment,
    NotificationDelivery,
    NotificationPreference,
    RequestEvent,
)
from requests.selectors import approval_inbox_all, can_approve_anything
from tenancy.models import User
from tenancy.operators import OPERATOR_GROUP
from tenancy.services import audit_record

K = NotificationKind

# The timeline events a requester hears about by mail. An automatic approval is not one: the requester has just
# submitted and sees it. A device isolation that requeues the request is told by its `preempted` event.
EVENT_KINDS = {
    EventCode.APPROVED: K.REQUEST_APPROVED,
    EventCode.REJECTED: K.REQUEST_REJECTED,
    EventCode.ACTIVE: K.REQUEST_ACTIVE,
    EventCode.FAILED: K.REQUEST_FAILED,
    EventCode.PREEMPTED: K.REQUEST_REQUEUED,
    EventCode.EXPIRY_WARNING: K.REQUEST_EXPIRING,
    EventCode.IDLE_WARNING: K.REQUEST_IDLE,
    EventCode.IDLE_STOPPED: K.REQUEST_IDLE_STOPPED,
    EventCode.RELEASED: K.REQUEST_RELEASED,
    EventCode.WAITING_EXPIRED: K.REQUEST_WAITING_EXPIRED,
    EventCode.PLANNED_NODE_FAILED: K.RESERVATION_AT_RISK,
}
NOTIFY_TASK = "requests.tasks.notify_request_events"

SUBJECTS = {
    K.REQUEST_APPROVED: "Request #{id} approved",
    K.REQUEST_REJECTED: "Request #{id} rejected",
    K.REQUEST_ACTIVE: "Request #{id} is ready: how to connect",
    K.REQUEST_FAILED: "Request #{id} failed",
    K.REQUEST_REQUEUED: "Request #{id} is back in the queue",
    K.REQUEST_EXPIRING: "Request #{id} expires soon",
    K.REQUEST_IDLE: "Request #{id} is idle and will be stopped",
    K.REQUEST_IDLE_STOPPED: "Request #{id} was stopped for being idle",
    K.REQUEST_RELEASED: "Request #{id} released",
    K.REQUEST_WAITING_EXPIRED: "Request #{id} waited too long for quota and was cancelled",
    K.RESERVATION_AT_RISK: "Reservation #{id}: a planned node failed",
    K.OPERATOR_RUN_FAILED: "Provisioning failed for request #{id}",
}
ACCESS_LABELS = {"ssh": "SSH", "jupyter": "Jupyter", "attach": "Attach (Slurm)", "curl": "Try it", "url": "Endpoint"}


_announced = threading.local()  # ids of events worth a mail whose transaction has not committed yet, per thread


def announce_events(events: Iterable[RequestEvent]) -> None:
    """After the caller's commit, send what these events are worth telling: one task for every such event of the
    transaction (a batch of provisioning runs activates many requests in one)."""
    ids = [event.pk for event in events if event.code in EVENT_KINDS]
    if ids:
        _pending_announcements().extend(ids)
        transaction.on_commit(_announce_pending)


def _pending_announcements() -> list[int]:
    if not hasattr(_announced, "ids"):
        _announced.ids = []
    return _announced.ids


def _announce_pending() -> None:
    """The first commit hook of a transaction takes every pending id, the others find none. An id left by a
    transaction that rolled back goes along with the next one's and is skipped (its event does not exist)."""
    ids = _pending_announcements()
    if ids:
        taken = ids[:]
        ids.clear()
        async_task(NOTIFY_TASK, taken)


# --- Preferences -------------------------------------------------------------------------------------------


def kinds_for(user: User) -> list[tuple[str, list[tuple[str, str]]]]:
    """The kinds this person may get, by audience: everyone orders; approvers and operators get theirs too."""
    audiences = [NotificationAudience.REQUESTER]
    if user.is_staff or can_approve_anything(user):
        audiences.append(NotificationAudience.APPROVER)
    if user.is_staff:
        audiences.append(NotificationAudience.OPERATOR)
    return [
        (audience.label, [(kind.value, kind.label) for kind in K if NOTIFICATION_AUDIENCE[kind] == audience])
        for audience in audiences
    ]


def preferences_of(user: User) -> dict[str, bool]:
    """Every kind, on unless the person turned it off."""
    stored = dict(NotificationPreference.objects.filter(user=user).values_list("kind", "enabled"))
    return {kind.value: stored.get(kind.value, True) for kind in K}


@transaction.atomic
def notification_preferences_set(*, user: User, enabled: Iterable[str], shown: Iterable[str]) -> dict[str, bool]:
    """Set the kinds `shown` on the page: those in `enabled` on, the others off. Audited when anything changed."""
    enabled, shown = set(enabled), set(shown) & set(K.values)
    before = preferences_of(user)
    changed = {kind: kind in enabled for kind in shown if before[kind] != (kind in enabled)}
    NotificationPreference.objects.bulk_create(
        [NotificationPreference(user=user, kind=kind, enabled=on) for kind, on in changed.items()],
        update_conflicts=True,
        unique_fields=["user", "kind"],
        update_fields=["enabled", "updated_at"],
    )
    if changed:
        audit_record(actor=user, action="notifications.preferences_changed", target=user, data=changed)
    return {**before, **changed}


def _turned_off(pairs: Iterable[tuple[int, str]]) -> set[tuple[int, str]]:
    """Which (user id, kind) pairs are turned off: one query."""
    pairs = set(pairs)
    if not pairs:
        return set()
    users = {user_id for user_id, _ in pairs}
    kinds = {kind for _, kind in pairs}
    return set(
        NotificationPreference.objects.filter(user_id__in=users, kind__in=kinds, enabled=False).values_list(
            "user_id", "kind"
        )
    )


def _claimed(wanted: list[tuple[User, str, str, Mail]]) -> list[Mail]:
    """Claim each (user, kind, key) not yet delivered and give back the mails to send; call inside the sending
    transaction (a concurrent claim of the same row fails the task, whose retry then finds it taken)."""
    if not wanted:
        return []
    done = set(
        NotificationDelivery.objects.filter(
            user_id__in={user.pk for user, *_ in wanted}, key__in={key for _, _, key, _ in wanted}
        ).values_list("user_id", "kind", "key")
    )
    fresh = [(user, kind, key, mail) for user, kind, key, mail in wanted if (user.pk, kind, key) not in done]
    NotificationDelivery.objects.bulk_create(
        [NotificationDelivery(user=user, kind=kind, key=key) for user, kind, key, _ in fresh]
    )
    return [mail for *_, mail in fresh]


def _deliver(wanted: list[tuple[User, str, str, Mail]]) -> int:
    """Drop what people turned off, claim the rest and send it; how many mails went out."""
    off = _turned_off((user.pk, kind) for user, kind, _, _ in wanted)
    wanted = [item for item in wanted if (item[0].pk, item[1]) not in off and item[0].email and item[0].is_active]
    with transaction.atomic():
        return mails_send(_claimed(wanted))


def operators() -> list[User]:
    return list(User.objects.filter(is_active=True, is_staff=True, groups__name=OPERATOR_GROUP).order_by("pk"))


# --- Requests ---------------------------------------------------------------------------------------------


def _request_context(event: RequestEvent) -> dict:
    request = event.request
    path = reverse("portal:request-detail", args=[request.pk])
    delivered = event.data.get("delivered") or {}
    access = [
        {"label": ACCESS_LABELS.get(name, name), "value": value, "link": str(value).startswith("http")}
        for name, value in (delivered.get("access") or {}).items()
    ]
    return {
        "r": request,
        "event": event,
        "request_url": absolute_url(path),
        "access": access,
        "failure": _failure(event),
        "preferences_url": absolute_url(reverse("portal:notifications")),
    }


def _failure(event: RequestEvent) -> dict:
    """A failed event's failure with its plain sentence, and whether an operator can retry it."""
    failure = event.data.get("failure")
    if not failure:
        return {}
    return {
        **failure,
        "sentence": failure_sentence(failure.get("code", ""), failure.get("step", "")),
        "operator_retry": event.data.get("operator_retry", True),
    }


def request_events_notify(*, event_ids: list[int]) -> int:
    """Mail the requester of each event (and operators of a failed run); how many mails went out."""
    events = list(
        RequestEvent.objects.filter(pk__in=event_ids, code__in=list(EVENT_KINDS))
        .select_related("request__requester", "request__project__tenant", "request__service", "request__spec")
        .order_by("pk")
    )
    staff = operators() if any(event.code == EventCode.FAILED for event in events) else []
    wanted = []
    for event in events:
        kind = EVENT_KINDS[event.code]
        context = _request_context(event)
        request = event.request
        wanted.append(
            (
                request.requester,
                kind,
                f"event:{event.pk}",
                Mail(
                    to=request.requester.email,
                    subject=SUBJECTS[kind].format(id=request.pk),
                    template=f"requests/mail/{kind}",
                    context={**context, "person": request.requester},
                ),
            )
        )
        if event.code == EventCode.FAILED:
            admin_url = absolute_url(reverse("admin:requests_resourcerequest_change", args=[request.pk]))
            for operator in staff:
                wanted.append(
                    (
                        operator,
                        K.OPERATOR_RUN_FAILED,
                        f"event:{event.pk}",
                        Mail(
                            to=operator.email,
                            subject=SUBJECTS[K.OPERATOR_RUN_FAILED].format(id=request.pk),
                            template="requests/mail/operator_run_failed",
                            context={**context, "person": operator, "admin_url": admin_url},
                        ),
                    )
                )
    return _deliver(wanted)


# --- Approvers: one digest ----------------------------------------------------------------------------------


def _waiting_assignments() -> list[ApprovalAssignment]:
    return list(approval_inbox_all())


def approval_digests_send() -> int:
    """One mail per approver listing what waits for their decision, when anything arrived since their last
    digest (items already mailed are listed again as still waiting, not as new); how many digests went out."""
    waiting = _waiting_assignments()
    if not waiting:
        return 0
    by_user: dict[int, list[ApprovalAssignment]] = defaultdict(list)
    for assignment in waiting:
        by_user[assignment.approver_id].append(assignment)
    off = _turned_off((user_id, K.APPROVAL_DIGEST) for user_id in by_user)
    mailed = set(
        NotificationDelivery.objects.filter(
            kind=K.APPROVAL_DIGEST,
            user_id__in=list(by_user),
            key__in=[f"assignment:{assignment.pk}" for assignment in waiting],
        ).values_list("user_id", "key")
    )
    inbox_url = absolute_url(reverse("portal:approval-inbox"))
    sent = 0
    for user_id, items in by_user.items():
        approver = items[0].approver
        if (user_id, K.APPROVAL_DIGEST) in off or not approver.email or not approver.is_active:
            continue
        new = [item for item in items if (user_id, f"assignment:{item.pk}") not in mailed]
        if not new:
            continue
        rows = [
            {
                "approval": item.stage.approval,
                "stage": item.stage,
                "new": item in new,
                "age": item.stage.approval.created_at,
            }
            for item in items
        ]
        mail = Mail(
            to=approver.email,
            subject=f"{len(items)} waiting for your approval ({len(new)} new)",
            template="requests/mail/approval_digest",
            context={
                "person": approver,
                "rows": rows,
                "new_count": len(new),
                "inbox_url": inbox_url,
                "preferences_url": absolute_url(reverse("portal:notifications")),
                "now": timezone.now(),
            },
        )
        with transaction.atomic():
            claimed = _claimed([(approver, K.APPROVAL_DIGEST, f"assignment:{item.pk}", mail) for item in new])
            sent += mails_send(claimed[:1])  # one digest, however many items it claimed
    return sent


# --- Operators ----------------------------------------------------------------------------------------------


def operators_notify(*, kind: str, key: str, subject: str, template: str, context: dict) -> int:
    """Tell every operator who has `kind` on about one thing (`key` makes it once)."""
    return people_notify(people=operators(), kind=kind, key=key, subject=subject, template=template, context=context)


def people_notify(*, people: list[User], kind: str, key: str, subject: str, template: str, context: dict) -> int:
    """Tell each of `people` who has `kind` on about one thing (`key` makes it once per person)."""
    preferences_url = absolute_url(reverse("portal:notifications"))
    return _deliver(
        [
            (
                person,
                kind,
                key,
                Mail(
                    to=person.email,
                    subject=subject,
                    template=template,
                    context={**context, "person": person, "preferences_url": preferences_url},
                ),
            )
            for person in people
        ]
    )


__all__ = [
    "EVENT_KINDS",
    "announce_events",
    "approval_digests_send",
    "notification_preferences_set",
    "operators_notify",
    "people_notify",
    "preferences_of",
    "request_events_notify",
]
