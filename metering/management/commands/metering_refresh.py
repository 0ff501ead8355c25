"""manage.py metering_refresh [--collect]

The metering schedules' work, at once: with --collect one telemetry sample of every running allocation first; then
yesterday's and today's daily rollups and the retention of raw samples; then this month's and last month's
card-hour ledger and the budget alerts. Safe to run at any time, as often as wanted.
"""

import json

from django.core.management.base import BaseCommand

from metering import services


class Command(BaseCommand):
    help = __doc__

    def add_arguments(self, parser):
        parser.add_argument("--collect", action="store_true", help="Take one telemetry sample first.")

    def handle(self, *args, collect: bool, **options):
        report = {}
        if collect:
            collected = services.telemetry_collect()
            report["telemetry"] = {"samples": collected.samples, "errors": collected.errors}
        report.update(services.telemetry_refresh())
        report.update(services.usage_refresh())
        self.stdout.write(json.dumps(report, indent=2))
