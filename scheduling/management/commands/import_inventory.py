"""manage.py import_inventory PATH [--format csv|yaml|openb] [--site NAME]
manage.py import_inventory --from-slurm [--gpu-model TYPE=MODEL ...] [--site NAME]"""

from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from config.errors import DomainError
from scheduling.choices import ExecutionBackend
from scheduling.inventory import formats as inventory_formats
from scheduling.inventory.importer import inventory_import
from scheduling.slurm.api import SlurmApi, SlurmApiError
from scheduling.slurm.services import SlurmImportResult, slurm_inventory_import
from scheduling.slurm.topology import TopologyError, parse_topology, topology_file


class Command(BaseCommand):
    help = """Import nodes and their accelerator devices; idempotent (a second run changes nothing, changed rows
update; cordons, health, isolation and allocations are never touched; devices missing from the file are kept).

Formats (guessed from the file when --format is not given):
  openb  The openb node list: sn,cpu_milli,memory_mib,gpu,model (e.g. openb_node_list_gpu_node.csv). name and
         serial = sn; `gpu` NVIDIA devices of `model`, with uuids derived from node and index. Missing models are
         created: T4 16 GB, P100 16 GB, V100M16 16 GB, V100M32 32 GB, A10 24 GB, and G2/G3 (anonymised in the
         trace) assumed 32 GB.
  csv    One node per line. Columns: name (required), serial_number (default: name), cpu_cores or cpu_milli,
         memory_gib or memory_mib, site, block, rack, topology_domain, bmc_address, bmc_credentials_ref, gpu_model
         (catalog slug or name), gpu_count, gpu_memory_gb (default: the model's), gpu_uuids (';'-separated,
         default: derived from node and index). Empty cells keep what is stored.
  yaml   `nodes:` a list of mappings with the CSV's keys, or `devices:` [{index, model, uuid, memory_gb}];
         optional top-level `site:` / `block:` / `rack:` defaults.
--site NAME puts nodes without a site column into that site (rack "default" unless a rack is given).

--from-slurm reads the nodes from slurmrestd (SLURM_REST_URL, SLURM_USER_NAME, SLURM_JWT or SLURM_JWT_FILE):
CPUs, real memory, GPU GRES (gpu:<type>:<n> or gpu:<n>) and state. Nodes get execution_backend=slurm; GRES types
map to catalog models by slug or name, or through --gpu-model TYPE=MODEL (repeatable; "gpu" names untyped GPUs;
defaults from SLURM_GPU_MODELS). Slurm's DOWN/DRAIN/FAIL become health events and a cordon with Slurm's reason;
slurm-backed nodes Slurm no longer lists (in --site, when given) are cordoned, never deleted. With a topology.conf
(--topology-conf, or the one next to SLURM_CONF) each node goes into its leaf switch's rack, in the block of that
switch's parent (racks need a site: --site or SLURM_SITE).
See docs/inventory.md."""

    def add_arguments(self, parser):
        parser.add_argument("path", type=Path, nargs="?")
        parser.add_argument("--from-slurm", action="store_true", help="Read the nodes from slurmrestd.")
        parser.add_argument(
            "--gpu-model",
            action="append",
            default=[],
            metavar="TYPE=MODEL",
            help="With --from-slurm: the catalog model (slug or name) of a Slurm GRES type; repeatable.",
        )
        parser.add_argument(
            "--format",
            choices=inventory_formats.FORMATS,
            default=None,
            help="File format; guessed from the extension and header when omitted.",
        )
        parser.add_argument("--site", default="", help="Site for nodes whose row names none.")
        parser.add_argument(
            "--topology-conf",
            type=Path,
            default=None,
            help="With --from-slurm: the cluster's topology.conf (default: the one next to SLURM_CONF, if any). Leaf "
            "switches become racks, their parents blocks.",
        )

    def handle(self, *args, path: Path | None, format: str | None, site: str, from_slurm: bool, **options):
        if from_slurm:
            if path is not None:
                raise CommandError("Give a file or --from-slurm, not both.")
            return self._from_slurm(
                site.strip() or settings.SLURM_SITE, options["gpu_model"], topology_file(options["topology_conf"])
            )
        if path is None:
            raise CommandError("Give an inventory file, or --from-slurm.")
        if not path.is_file():
            raise CommandError(f"No such file: {path}")
        fmt = format or inventory_formats.guess_format(path)
        try:
            records = inventory_formats.read(path, fmt, backends=ExecutionBackend.values)
            result = inventory_import(
                records=records, actor=None, default_site=site.strip(), create_openb_models=fmt == "openb"
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

    def _from_slurm(self, site: str, gpu_model_options: list[str], topology_path: Path | None) -> None:
        gpu_models = {**settings.SLURM_GPU_MODELS, **_gpu_models(gpu_model_options)}
        try:
            topology = parse_topology(topology_path.read_text()) if topology_path else None
        except (OSError, TopologyError) as error:
            raise CommandError(f"{topology_path}: nothing imported. {error}") from error
        try:
            with SlurmApi.from_settings() as api:
                result = slurm_inventory_import(api=api, gpu_models=gpu_models, site=site, topology=topology)
        except SlurmApiError as error:
            raise CommandError(f"Slurm: nothing imported. {error}") from error
        except DomainError as error:
            raise CommandError(f"Slurm: nothing imported. {error.message}") from error
        self._report_slurm(result)

    def _report_slurm(self, result: SlurmImportResult) -> None:
        inventory = result.inventory
        for line in result.cordoned:
            self.stdout.write(f"Cordoned {line}")
        for name in result.uncordoned:
            self.stdout.write(f"Uncordoned {name}: Slurm has it in service again")
        self.stdout.write(
            self.style.SUCCESS(
                f"Slurm nodes: {inventory.nodes_created} created, {inventory.nodes_updated} updated, "
                f"{inventory.nodes_unchanged} unchanged. Devices: {inventory.devices_created} created, "
                f"{inventory.devices_updated} updated. Health events: {result.health_events}."
            )
        )


def _gpu_models(options: list[str]) -> dict[str, str]:
    mapping = {}
    for option in options:
        gpu_type, separator, model = option.partition("=")
        if not separator or not gpu_type.strip() or not model.strip():
            raise CommandError(f"--gpu-model takes TYPE=MODEL (e.g. a100=a100-40gb), not {option!r}")
        mapping[gpu_type.strip()] = model.strip()
    return mapping
