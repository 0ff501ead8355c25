"""manage.py cordon_nodes --reason TEXT [--backend B] [--site S]"""

from django.core.management.base import BaseCommand, CommandError

from config.errors import DomainError
from scheduling import services
from scheduling.choices import ExecutionBackend
from scheduling.models import Node


class Command(BaseCommand):
    help = """Cordon every schedulable node of an execution backend and/or site, with a reason on each node's audit
record (e.g. a pool going into maintenance). What runs there keeps running; nodes already cordoned are left as
they are."""

    def add_arguments(self, parser):
        parser.add_argument("--reason", required=True, help="why; it goes on each node's audit record")
        parser.add_argument("--backend", choices=ExecutionBackend.values, help="only nodes of this backend")
        parser.add_argument("--site", help="only nodes of this site")

    def handle(self, *args, reason: str, backend: str | None, site: str | None, **options):
        if not (backend or site):
            raise CommandError("Name the nodes: give --backend, --site or both.")
        nodes = Node.objects.filter(schedulable=True).order_by("name")
        if backend:
            nodes = nodes.filter(execution_backend=backend)
        if site:
            nodes = nodes.filter(rack__site__name=site)
        try:
            cordoned = [services.node_cordon(node=node, reason=reason, actor=None).name for node in nodes]
        except DomainError as error:
            raise CommandError(error.message) from error
        self.stdout.write(f"Cordoned {len(cordoned)} node(s)" + (f": {', '.join(cordoned)}" if cordoned else "."))
