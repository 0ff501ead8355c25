"""The gateway data plane: `python manage.py run_gateway --port 8001` (docs/serving.md)."""

from django.conf import settings
from django.core.management.base import BaseCommand

from serving import gateway


class Command(BaseCommand):
    help = "Serve /serve/<deployment>/v1/... (the async gateway; run N of them behind the load balancer)."

    def add_arguments(self, parser):
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8001)
        parser.add_argument(
            "--reuse-port", action="store_true", help="SO_REUSEPORT: several gateway processes share the port."
        )

    def handle(self, *args, host: str, port: int, reuse_port: bool, **options):
        gateway.run(host=host, port=port, redis_url=settings.REDIS_URL, reuse_port=reuse_port)
