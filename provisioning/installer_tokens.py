"""The installer's token: a bare-metal run's only credential for the installer to report with. Issued by the boot
step (provisioning/steps.py), handed out again by the install config (provisioning/api/views.py), checked by
`services.installer_report`. A leaf module, so that a step does not import the services that import the pipelines
that import the steps."""

import secrets

from django.utils.crypto import salted_hmac

from config.tokens import secret_hash
from provisioning.models import ProvisioningRun


def installer_token_issue(run: ProvisioningRun) -> str:
    """A new token for this run's installer, its only credential to report (a repeated boot step replaces the
    previous one). Stored hashed; derived from a fresh nonce and the secret key, so that the PXE install config can
    hand it out again (installer_token) while the database alone does not reveal it."""
    nonce = secrets.token_hex(16)
    token = _derived_installer_token(run.pk, nonce)
    ProvisioningRun.objects.filter(pk=run.pk).update(
        installer_token_hash=secret_hash(token),
        installer_token_nonce=nonce,
        installer_reported_at=None,
        installer_report={},
    )
    return token


def installer_token(run: ProvisioningRun) -> str:
    """The run's current installer token (for the install config only: never an output, a log or a page)."""
    return _derived_installer_token(run.pk, run.installer_token_nonce)


def _derived_installer_token(run_id: int, nonce: str) -> str:
    return salted_hmac("provisioning.installer-token", f"{run_id}:{nonce}", algorithm="sha256").hexdigest()
