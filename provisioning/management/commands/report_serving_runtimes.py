"""Probe this host for serving runtimes and the model files they load, and record them on the nodes whose replicas
it runs: `python manage.py report_serving_runtimes [--node NAME ...] [--backend simulated]` (docs/serving.md)."""

from django.core.management.base import BaseCommand, CommandError

from provisioning.runtimes import serving_runtimes_report
from scheduling.choices import ExecutionBackend
from scheduling.models import Node


class Command(BaseCommand):
    help = (
        "Record on nodes which serving runtimes this host has installed and which model files it holds (llama.cpp "
        "in LLAMACPP_PYTHON's venv, the approved models' pypi:/file: artifacts with their checksums)."
    )

    def add_arguments(self, parser):
        parser.add_argument("--node", action="append", default=[], help="A node to report for (repeatable).")
        parser.add_argument(
            "--backend",
            choices=ExecutionBackend.values,
            default=ExecutionBackend.SIMULATED,
            help="Without --node: every node of this execution backend (default: simulated, the demo's nodes).",
        )

    def handle(self, *args, node: list[str], backend: str, **options):
        nodes = Node.objects.filter(name__in=node) if node else Node.objects.filter(execution_backend=backend)
        missing = sorted(set(node) - set(nodes.values_list("name", flat=True)))
        if missing:
            raise CommandError(f"No such node: {', '.join(missing)}.")
        found, changed = serving_runtimes_report(nodes=list(nodes))
        offered = "; ".join(f"{runtime}: {', '.join(files) or 'no model files'}" for runtime, files in found.items())
        self.stdout.write(f"This host serves {offered or 'no runtime that needs installing (llama.cpp is not)'}.")
        self.stdout.write(f"{len(changed)} of {nodes.count()} node(s) updated.")
