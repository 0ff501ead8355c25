"""manage.py import_inventory PATH [--format csv|yaml|openb] [--site NAME]"""

from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from config.errors import DomainError
from scheduling import inventory_formats
from scheduling.services import inventory_import


class Command(BaseCommand):
    help = """Import nodes and their accelerator devices; idempotent (a second run changes nothing, changed rows
update; cordons, health, isolation and allocations are never touched; devices missing from the file are kept).

Formats (guessed from the file when --format is not given):
  openb  The openb node list: sn,cpu_milli,memory_mib,gpu,model (e.g. openb_node_list_gpu_node.csv). name and
         serial = sn; `gpu` NVIDIA devices of `model`, with uuids derived from node and index. Missing models are
         created: T4 16 GB, P100 16 GB, V100M16 16 GB, V100M32 32 GB, A10 24 GB, and G2/G3 (anonymised in the
         trace) assumed 32 GB.
  csv    One node per line. Columns: name (required), serial_number (default: name), cpu_cores or cpu_milli,
         memory_gib or memory_mib, site, rack, topology_domain, bmc_address, bmc_credentials_ref, gpu_model
         (catalog slug or name), gpu_count, gpu_memory_gb (default: the model's), gpu_uuids (';'-separated,
         default: derived from node and index). Empty cells keep what is stored.
  yaml   `nodes:` a list of mappings with the CSV's keys, or `devices:` [{index, model, uuid, memory_gb}];
         optional top-level `site:` / `rack:` defaults.
--site NAME puts nodes without a site column into that site (rack "default" unless a rack is given).
See docs/inventory.md."""

    def add_arguments(self, parser):
        parser.add_argument("path", type=Path)
        parser.add_argument(
            "--format",
            choices=inventory_formats.FORMATS,
            default=None,
            help="File format; guessed from the extension and header when omitted.",
        )
        parser.add_argument("--site", default="", help="Site for nodes whose row names none.")

    def handle(self, *args, path: Path, format: str | None, site: str, **options):
        if not path.is_file():
            raise CommandError(f"No such file: {path}")
        fmt = format or inventory_formats.guess_format(path)
        try:
            records = inventory_formats.read(path, fmt)
            result = inventory_import(
                records, actor=None, default_site=site.strip(), create_openb_models=fmt == "openb"
            )
        except inventory_formats.InventoryFileError as error:
            raise CommandError(f"{path}: nothing imported. " + "\n".join(error.problems)) from error
        except DomainError as error:
            problems = error.details.get("problems") if isinstance(error.details, dict) else None
            raise CommandError(
                f"{path}: nothing imported. " + ("\n".join(problems) if problems else error.message)
            ) from error
        if result.models_created:
            self.stdout.write(f"Accelerator models created: {', '.join(result.models_created)}")
        self.stdout.write(
            self.style.SUCCESS(
                f"Nodes: {result.nodes_created} created, {result.nodes_updated} updated, {result.nodes_unchanged} "
                f"unchanged. Devices: {result.devices_created} created, {result.devices_updated} updated."
            )
        )
