"""manage.py run_cycle [--json]"""

import json

from django.core.management.base import BaseCommand

from scheduling.cycle import run_cycle


class Command(BaseCommand):
    help = """Run one scheduling cycle now (as the triggers and the minute schedule do) and say what it did. When
another cycle is running it leaves that one a wake-up and reports ran=false."""

    def add_arguments(self, parser):
        parser.add_argument("--json", action="store_true", help="print the outcome as one JSON object")

    def handle(self, *args, **options):
        result = run_cycle()
        outcome = {
            "ran": result.ran,
            "allocated": result.allocated,
            "waiting": {str(pk): code for pk, code in result.waiting.items()},
        }
        if options["json"]:
            self.stdout.write(json.dumps(outcome))
        elif not result.ran:
            self.stdout.write("Another cycle is running; it will run once more after it.")
        else:
            self.stdout.write(f"Allocated {len(result.allocated)} request(s); {len(result.waiting)} still wait.")
