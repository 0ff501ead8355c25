import os

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from catalog.demo import DEMO_PASSWORD_DEFAULT, seed_demo


class Command(BaseCommand):
    help = "Create (or refresh) the demo catalog, tenants, projects, quotas and users. Idempotent."

    def add_arguments(self, parser):
        parser.add_argument("--force", action="store_true", help="Seed even with DEBUG off.")

    def handle(self, *args, force: bool, **options):
        if not settings.DEBUG and not force:
            raise CommandError("Refusing to seed demo users with DEBUG off; pass --force if you mean it.")
        password = os.environ.get("DEMO_PASSWORD") or DEMO_PASSWORD_DEFAULT
        users = seed_demo(password)
        self.stdout.write(self.style.SUCCESS("Demo data ready."))
        source = "DEMO_PASSWORD" if os.environ.get("DEMO_PASSWORD") else f"default password {password!r}"
        self.stdout.write(f"Users ({source}): {', '.join(sorted(users))}")
