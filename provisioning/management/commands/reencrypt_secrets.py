"""After a key rotation (a new key first in SECRETS_ENCRYPTION_KEYS, or a new SECRET_KEY with the old one in
SECRET_KEY_FALLBACKS): every stored connect secret encrypted again under the current key, so the old key can go."""

from django.core.management.base import BaseCommand, CommandError

from provisioning.connect import connect_secrets_reencrypt


class Command(BaseCommand):
    help = "Encrypt every stored connect secret again under the first key (after a key rotation)."

    def handle(self, *args, **options):
        result = connect_secrets_reencrypt()
        if result.unreadable:
            raise CommandError(
                f"{len(result.unreadable)} secrets are under no configured key (ids {result.unreadable[:20]}); the "
                "others were re-encrypted. Put the missing key back to keep them."
            )
        self.stdout.write(f"Re-encrypted {result.count} connect secrets under the current key.")
