"""After a key rotation (a new key first in SECRETS_ENCRYPTION_KEYS, or a new SECRET_KEY with the old one in
SECRET_KEY_FALLBACKS): every stored connect secret encrypted again under the current key, so the old key can go."""

from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from config.encryption import Undecryptable, reencrypted
from provisioning.models import ConnectSecret


class Command(BaseCommand):
    help = "Encrypt every stored connect secret again under the first key (after a key rotation)."

    def handle(self, *args, **options):
        unreadable = []
        with transaction.atomic():
            secrets = list(ConnectSecret.objects.select_for_update().only("pk", "ciphertext"))
            for secret in secrets:
                try:
                    secret.ciphertext = reencrypted(secret.ciphertext)
                except Undecryptable:
                    unreadable.append(secret.pk)
            ConnectSecret.objects.bulk_update(secrets, ["ciphertext"], batch_size=500)
        if unreadable:
            raise CommandError(
                f"{len(unreadable)} secrets are under no configured key (ids {unreadable[:20]}); the others were "
                "re-encrypted. Put the missing key back to keep them."
            )
        self.stdout.write(f"Re-encrypted {len(secrets)} connect secrets under the current key.")
