"""Connect secrets: what opens a delivered workload to its requester (a workspace's Jupyter token), and to no one else.

- Issued by the start step (`connect_secret_issue`: the same one on every attempt, so a retried start installs what
  the first one did) and installed in the running workload by its driver (`WorkloadDriver.connect_secret_set`,
  which never puts it on a command line). Stored encrypted (config/encryption.py); never in a step's output, the
  delivered record, the timeline, an audit row or a log.
- Shown to the requester only, while the request is active (`connect_secrets_shown`: the Connect panel of the
  request page and `connect_secrets` in the request's API detail). Teammates, approvers, leads and operators see the
  access without it.
- Changed by the requester (`connect_secret_rotate`): the workload takes the new one first (the notebook then
  refuses the old token and every sign-in made with it); only then is it stored.
- Revealed to an operator only on purpose (`connect_secret_reveal`, the admin's "Reveal…"): a reason, an audit
  row and a note on the request's timeline, none of which holds the secret.
- Forgotten when the workload is torn down (`connect_secrets_forget`, by the stop step).
"""

import secrets
from dataclasses import dataclass

from django.db import transaction
from django.db.models import OuterRef, Subquery
from django.utils import timezone

from config.encryption import Undecryptable, decrypt, encrypt, reencrypted
from config.errors import Conflict, DomainError, NotFound, NotPermitted
from provisioning.choices import RunKind, RunState
from provisioning.drivers import workload_driver
from provisioning.drivers.base import StepError
from provisioning.models import ConnectSecret, ProvisioningRun
from provisioning.targets import allocation_target
from requests.choices import EventCode, RequestState
from requests.models import ResourceRequest
from requests.services import record_event
from scheduling.choices import AllocationState
from tenancy.models import User
from tenancy.services import audit_record

SECRET_BYTES = 24  # 192 bits, url-safe: it travels in a URL's query


@dataclass(frozen=True)
class SecretKind:
    label: str
    in_access: str  # the access entry with its secret in it: a format of {access} and {secret}


KINDS = {"jupyter": SecretKind(label="Jupyter token", in_access="{access}?token={secret}")}


def label_of(name: str) -> str:
    return KINDS[name].label if name in KINDS else name


def new_secret() -> str:
    return secrets.token_urlsafe(SECRET_BYTES)


# --- Provisioning ---------------------------------------------------------------------------------------------


def connect_secret_issue(*, run: ProvisioningRun, name: str) -> str:
    """The allocation's `name` secret, made on first use: a retried start (or a second worker) gets the same one."""
    secret, _ = ConnectSecret.objects.get_or_create(
        allocation_id=run.allocation_id,
        name=name,
        defaults={"request_id": run.request_id, "ciphertext": encrypt(new_secret())},
    )
    return decrypt(secret.ciphertext)


def connect_secrets_forget(*, allocation_id: int) -> int:
    """The workload is gone, and what opened it with it."""
    deleted, _ = ConnectSecret.objects.filter(allocation_id=allocation_id).delete()
    return deleted


# --- The requester ----------------------------------------------------------------------------------------------


def _live(resource_request: ResourceRequest):
    """The request's secrets of its running workload, each with the delivered access entry it opens (one query)."""
    delivered = ProvisioningRun.objects.filter(
        allocation_id=OuterRef("allocation_id"), kind=RunKind.PROVISION, state=RunState.SUCCEEDED
    ).values("delivered")[:1]
    return (
        ConnectSecret.objects.filter(request=resource_request, allocation__state=AllocationState.ACTIVE)
        .annotate(delivered=Subquery(delivered))
        .order_by("name")
    )


def connect_secrets_shown(resource_request: ResourceRequest, viewer: User) -> dict | None:
    """{name: {label, secret, access, rotated_at}} for the requester of an active request, else None (no query)."""
    if viewer is None or viewer.pk != resource_request.requester_id or resource_request.state != RequestState.ACTIVE:
        return None
    shown = {}
    for secret in _live(resource_request):
        value = decrypt(secret.ciphertext)
        access = ((secret.delivered or {}).get("access") or {}).get(secret.name)
        shown[secret.name] = {
            "label": label_of(secret.name),
            "secret": value,
            "access": KINDS[secret.name].in_access.format(access=access, secret=value)
            if access and secret.name in KINDS
            else None,
            "rotated_at": secret.rotated_at,
        }
    return shown


def connect_secret_rotate(*, resource_request: ResourceRequest, name: str, actor: User) -> str:
    """A new `name` secret in the running workload, then stored; the old one stops working. The requester's only."""
    if actor.pk != resource_request.requester_id:
        raise NotPermitted(f"Only the requester may change the {label_of(name)}.", code="not_requester")
    if resource_request.state != RequestState.ACTIVE:
        raise Conflict(
            f"Request #{resource_request.pk} is {resource_request.state}: there is no running workload to change.",
            code="not_active",
            details={"state": resource_request.state},
        )
    with transaction.atomic():
        secret = _locked(resource_request, name)
        value = new_secret()
        _install(secret, name, value)
        secret.ciphertext, secret.rotated_at = encrypt(value), timezone.now()
        secret.save(update_fields=["ciphertext", "rotated_at"])
        record_event(
            request=resource_request,
            actor=actor,
            code=EventCode.CONNECT_SECRET_ROTATED,
            message=f"The {label_of(name)} was changed by the requester; the old one no longer works.",
            data={"name": name},
        )
        audit_record(actor=actor, action="connect_secret.rotated", target=secret, data={"name": name})
    return value


def _locked(resource_request: ResourceRequest, name: str) -> ConnectSecret:
    """The secret of the running workload, locked: two rotations take turns (the workload keeps the later one)."""
    secret = (
        ConnectSecret.objects.select_for_update(of=("self",))
        .filter(request=resource_request, name=name, allocation__state=AllocationState.ACTIVE)
        .select_related("allocation__node")
        .first()
    )
    if secret is None:
        raise NotFound(f"Request #{resource_request.pk}'s workload has no {label_of(name)}.", code="no_such_secret")
    return secret


def _install(secret: ConnectSecret, name: str, value: str) -> None:
    run = (
        ProvisioningRun.objects.select_related("request")
        .filter(allocation_id=secret.allocation_id, kind=RunKind.PROVISION)
        .get()
    )
    target = allocation_target(run, secret.allocation)
    try:
        workload_driver(target.backend).connect_secret_set(target, name, value)
    except StepError as refused:
        raise Conflict(
            f"The workload did not take a new {label_of(name)} ({refused.message}); the old one still works.",
            code="rotation_failed",
            details={"backend_code": refused.code},
        ) from refused


# --- Operators -------------------------------------------------------------------------------------------------


def connect_secret_reveal(*, secret: ConnectSecret, actor: User, reason: str) -> str:
    """The secret, for an operator who says why: an audit row and a note on the request's timeline (which the
    requester sees), neither holding the secret."""
    if not actor.has_perm("provisioning.reveal_connectsecret"):
        raise NotPermitted("Revealing a connect secret needs the reveal permission.")
    reason = reason.strip()
    if not reason:
        raise DomainError("Say why the secret must be revealed.", code="reason_required")
    with transaction.atomic():
        secret = ConnectSecret.objects.select_related("request").get(pk=secret.pk)
        label = label_of(secret.name)
        record_event(
            request=secret.request,
            actor=actor,
            code=EventCode.CONNECT_SECRET_REVEALED,
            message=f"{actor.get_username()} revealed the {label} to operate the workload: {reason}",
            data={"name": secret.name, "reason": reason},
            intervention=True,
        )
        audit_record(
            actor=actor, action="connect_secret.revealed", target=secret, reason=reason, data={"name": secret.name}
        )
    return decrypt(secret.ciphertext)


@dataclass(frozen=True)
class Reencrypted:
    count: int  # re-encrypted
    unreadable: list[int]  # ids of the secrets under no configured key (left as they were)


@transaction.atomic
def connect_secrets_reencrypt(*, actor: User | None = None) -> Reencrypted:
    """After a key rotation: every stored connect secret encrypted again under the current key (the first of
    SECRETS_ENCRYPTION_KEYS, or one derived from SECRET_KEY), so the old key can go. One audit row says how many,
    never what."""
    unreadable = []
    stored = list(ConnectSecret.objects.select_for_update().only("pk", "ciphertext"))
    for secret in stored:
        try:
            secret.ciphertext = reencrypted(secret.ciphertext)
        except Undecryptable:
            unreadable.append(secret.pk)
    ConnectSecret.objects.bulk_update(stored, ["ciphertext"], batch_size=500)
    result = Reencrypted(len(stored) - len(unreadable), unreadable)
    audit_record(
        actor=actor,
        action="connect_secrets.reencrypted",
        target=None,
        data={"count": result.count, "unreadable": unreadable[:100]},
    )
    return result
