"""SSH public keys on a person's profile: added (checked with the platform's one key rule, config.ssh_keys), listed
and removed by that person only, audited; a workspace installs all of them (`authorized_keys_of`)."""

from django.db import transaction

from config.errors import Conflict, DomainError, NotFound
from config.limits import BIGINT_MAX
from config.ssh_keys import NotAPublicKey, public_key_parse
from tenancy.models import SshKey, User
from tenancy.services import audit_record

NAME_LENGTH = SshKey._meta.get_field("name").max_length


def ssh_keys_of(*, user: User):
    return SshKey.objects.filter(user=user).order_by("name", "id")


def authorized_keys_of(*, username: str) -> list[str]:
    """The key lines a workspace of this person lets log in, oldest first (one query)."""
    return list(
        SshKey.objects.filter(user__username=username).order_by("created_at", "id").values_list("public_key", flat=True)
    )


@transaction.atomic
def ssh_key_add(*, user: User, name: str, public_key: str, actor: User) -> SshKey:
    """A new named key for `user`; 422 ssh_key_invalid (a private key, or not one public key line), 409 when the
    person has that name or that key already."""
    name = (name or "").strip()
    if not name or len(name) > NAME_LENGTH:
        raise DomainError(
            f"Give the key a name of 1 to {NAME_LENGTH} characters (which machine holds it).",
            code="name_required",
            details={"field": "name", "maximum": NAME_LENGTH},
        )
    try:
        parsed = public_key_parse(public_key or "")
    except NotAPublicKey as problem:
        raise DomainError(f"The key {problem}.", code="ssh_key_invalid", details={"field": "public_key"}) from None
    held = SshKey.objects.select_for_update().filter(user=user)
    for existing in held:
        if existing.name == name or existing.fingerprint == parsed.fingerprint:
            same = "name" if existing.name == name else "public_key"
            raise Conflict(
                f"You have this {'name' if same == 'name' else 'key'} already: {existing.name}.",
                code="ssh_key_exists",
                details={"field": same, "existing": existing.name, "fingerprint": existing.fingerprint},
            )
    key = SshKey.objects.create(user=user, name=name, public_key=parsed.line, fingerprint=parsed.fingerprint)
    audit_record(
        actor=actor, action="ssh_key.added", target=user, data={"name": name, "fingerprint": parsed.fingerprint}
    )
    return key


@transaction.atomic
def ssh_key_remove(*, user: User, key_id: int, actor: User) -> SshKey:
    """The person's key is gone; another person's is not found (whether it exists is not theirs to learn)."""
    key = SshKey.objects.select_for_update().filter(user=user, pk=key_id).first() if key_id <= BIGINT_MAX else None
    if key is None:
        raise NotFound("You have no such SSH key.", code="ssh_key_not_found", details={"ssh_key_id": key_id})
    audit_record(
        actor=actor, action="ssh_key.removed", target=user, data={"name": key.name, "fingerprint": key.fingerprint}
    )
    key.delete()
    return key
