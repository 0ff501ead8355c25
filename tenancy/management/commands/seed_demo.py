import os
from importlib import import_module

from django.apps import apps
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction
from django.utils.module_loading import module_has_submodule

from tenancy.demo import DEMO_PASSWORD_DEFAULT, seed_group_mappings
from tenancy.models import User


def run_demo_seeds(password: str) -> dict:
    """Run every installed app's `demo.seed(context)` in INSTALLED_APPS order, in one transaction."""
    context = {"password": password}
    with transaction.atomic():
        for config in apps.get_app_configs():
            if module_has_submodule(config.module, "demo"):
                import_module(f"{config.name}.demo").seed(context)
    return context


class Command(BaseCommand):
    help = "Create (or refresh) the demo catalog, tenants, projects, quotas, policies and users. Idempotent."

    def add_arguments(self, parser):
        parser.add_argument("--force", action="store_true", help="Seed even outside the demo (DEMO and DEBUG off).")
        parser.add_argument(
            "--sso", action="store_true", help="Also the group mappings for `make run-sso`'s IdP and directory."
        )

    def handle(self, *args, force: bool, sso: bool = False, **options):
        if not (settings.DEMO or settings.DEBUG) and not force:
            raise CommandError("Refusing to seed demo users outside the demo (DEMO off); pass --force if you mean it.")
        password = os.environ.get("DEMO_PASSWORD") or DEMO_PASSWORD_DEFAULT
        context = run_demo_seeds(password)
        self.stdout.write(self.style.SUCCESS("Demo data ready."))
        source = "DEMO_PASSWORD" if os.environ.get("DEMO_PASSWORD") else f"default password {password!r}"
        self.stdout.write(f"Users ({source}): {', '.join(sorted(context['users']))}")
        if sso:
            mappings = seed_group_mappings(author=User.objects.get(username="operator"))
            self.stdout.write(f"Group mappings: {'; '.join(str(mapping) for mapping in mappings)}")
