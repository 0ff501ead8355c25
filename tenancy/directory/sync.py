"""The periodic sync (django-q2 schedule every DIRECTORY_SYNC_MINUTES): each person's groups read again (LDAP's
group search, or the IdP by refreshing the person's grant) and their mappings applied, so someone taken out of a
group loses what it gave within the interval. A directory or IdP that does not answer changes nothing (transient is
not final); one that answers that the person is gone takes every directory right of theirs away."""

import logging
from dataclasses import dataclass, field

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from tenancy.choices import DirectorySource
from tenancy.directory.rights import active_mappings, directory_rights_apply
from tenancy.models import DirectoryAccount
from tenancy.services import audit_record

logger = logging.getLogger(__name__)


@dataclass
class SyncReport:
    read: int = 0
    granted: int = 0
    removed: int = 0
    gone: list[str] = field(default_factory=list)
    unavailable: dict[str, str] = field(default_factory=dict)  # source -> why

    def as_data(self) -> dict:
        return {
            "read": self.read,
            "granted": self.granted,
            "removed": self.removed,
            "gone": self.gone,
            "unavailable": self.unavailable,
        }


def _reader(source: str):
    """The function that reads an account's current groups for its source, with the exception it raises when the
    source does not answer; None when that sign-in method is not configured any more."""
    if source == DirectorySource.LDAP and settings.LDAP_ENABLED:
        from tenancy.directory import ldap

        return ldap.current_groups, ldap.DirectoryUnavailable
    if source == DirectorySource.OIDC and settings.OIDC_ENABLED:
        from tenancy.directory import oidc

        return oidc.current_groups, oidc.ProviderUnavailable
    return None


def directory_sync() -> SyncReport:
    report = SyncReport()
    mappings = active_mappings()
    for account in DirectoryAccount.objects.select_related("user").order_by("user__username"):
        reader = _reader(account.source)
        if reader is None or account.source in report.unavailable:
            continue
        read, unavailable = reader
        try:
            groups = read(account)
        except unavailable as failure:
            report.unavailable[account.source] = str(failure)
            logger.warning(
                "Directory sync: %s did not answer; nothing changed for its people: %s", account.source, failure
            )
            continue
        report.read += 1
        if groups is None:
            report.gone.append(account.user.username)
        change = _apply(account, groups or [], mappings)
        report.granted += len(change.granted)
        report.removed += len(change.removed)
    if report.unavailable:  # each grant and removal has its own row; an outage gets one so operators see it
        with transaction.atomic():
            audit_record(actor=None, action="directory.sync_incomplete", target=None, data=report.as_data())
    return report


@transaction.atomic
def _apply(account: DirectoryAccount, groups: list[str], mappings):
    account.groups, account.groups_read_at = groups, timezone.now()
    account.save(update_fields=["groups", "groups_read_at", "refresh_token"])
    return directory_rights_apply(user=account.user, groups=groups, trigger="sync", mappings=mappings)
