"""Inventory files read into plain records: the openb node list, and a generic CSV or YAML of nodes with devices.

Parsing stores nothing; `scheduling.inventory.importer.inventory_import` writes the records. Every problem is collected
with its line (CSV) or position (YAML) so one run reports them all.
"""

import csv
import uuid
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path

import yaml

FORMATS = ("csv", "yaml", "openb")

# openb model code -> (slug, name, memory GB, interconnect). G2/G3 are anonymised in the trace; 32 GB assumed.
OPENB_MODELS = {
    "T4": ("t4-16gb", "T4 16GB", 16, "pcie"),
    "P100": ("p100-16gb", "P100 16GB", 16, "pcie"),
    "V100M16": ("v100-16gb", "V100 16GB", 16, "nvlink"),
    "V100M32": ("v100-32gb", "V100 32GB", 32, "nvlink"),
    "A10": ("a10-24gb", "A10 24GB", 24, "pcie"),
    "G2": ("openb-g2", "G2 (openb) 32GB", 32, "pcie"),
    "G3": ("openb-g3", "G3 (openb) 32GB", 32, "pcie"),
}
_UUID_NAMESPACE = uuid.UUID("6f1c2a4e-8d3b-4c5a-9e7f-0a1b2c3d4e5f")


def device_uuid(node: str, index: int) -> str:
    """Deterministic device uuid from node name and index, so re-imports find the same device."""
    return f"GPU-{uuid.uuid5(_UUID_NAMESPACE, f'{node}/{index}')}"


@dataclass
class DeviceRecord:
    index: int
    model: str  # accelerator model slug or name
    uuid: str
    memory_gb: int | None = None  # None: the model's memory
    serial_number: str | None = None  # None keeps what is stored
    mig: dict | None = None  # YAML `mig: {mode: mig|whole, instances: [{profile, start, size, gi_id, ci_id, uuid}]}`


@dataclass
class NodeRecord:
    name: str
    serial_number: str
    cpu_milli: int
    memory_mib: int
    devices: list[DeviceRecord] = field(default_factory=list)
    site: str = ""
    rack: str = ""
    block: str = ""  # the rack's block (spine); empty keeps the rack's
    topology_domain: str | None = None
    bmc_address: str | None = None
    bmc_credentials_ref: str | None = None
    bmc_inventory_address: str | None = None
    execution_backend: str | None = None  # None keeps what the node has (new nodes: simulated)
    where: str = ""


class InventoryFileError(ValueError):
    def __init__(self, problems: list[str]):
        super().__init__("; ".join(problems[:20]) + (f" (and {len(problems) - 20} more)" if len(problems) > 20 else ""))
        self.problems = problems


def guess_format(path: Path) -> str:
    if path.suffix.lower() in (".yaml", ".yml"):
        return "yaml"
    with path.open(newline="") as handle:
        header = handle.readline().strip().lower().split(",")
    return "openb" if header[:5] == ["sn", "cpu_milli", "memory_mib", "gpu", "model"] else "csv"


def read(path: Path, fmt: str | None = None, *, backends: Collection[str]) -> list[NodeRecord]:
    """The file's nodes. `backends` are the execution backends a node may name: the caller passes the values of
    scheduling.choices.ExecutionBackend (this module stays free of Django, so it does not read the enum itself)."""
    fmt = fmt or guess_format(path)
    if fmt == "openb":
        return read_openb(path)
    readers = {"csv": read_csv, "yaml": read_yaml}
    return readers[fmt](path, backends=backends)


def _int(value, what: str, problems: list[str], where: str, *, scale: int = 1, minimum: int = 0) -> int:
    try:
        number = float(str(value).strip()) * scale
        if number != int(number) or number < minimum:
            raise ValueError
        return int(number)
    except (TypeError, ValueError):
        problems.append(f"{where}: {what} must be a whole number ≥ {minimum}, not {value!r}")
        return 0


def _checked(records: list[NodeRecord], problems: list[str]) -> list[NodeRecord]:
    seen: dict[str, str] = {}
    serials: dict[str, str] = {}
    device_serials: dict[str, str] = {}
    for record in records:
        if record.name in seen:
            problems.append(f"{record.where}: node {record.name} also appears at {seen[record.name]}")
        seen.setdefault(record.name, record.where)
        if record.serial_number in serials:
            problems.append(
                f"{record.where}: serial {record.serial_number} also appears at {serials[record.serial_number]}"
            )
        serials.setdefault(record.serial_number, record.where)
        indexes = [device.index for device in record.devices]
        if len(set(indexes)) != len(indexes):
            problems.append(f"{record.where}: device indexes repeat on {record.name}")
        for device in record.devices:
            if device.serial_number and device.serial_number in device_serials:
                problems.append(
                    f"{record.where}: device serial {device.serial_number} also appears at "
                    f"{device_serials[device.serial_number]}"
                )
            elif device.serial_number:
                device_serials[device.serial_number] = f"{record.where} gpu{device.index}"
    if problems:
        raise InventoryFileError(problems)
    return records


def read_openb(path: Path) -> list[NodeRecord]:
    """sn,cpu_milli,memory_mib,gpu,model: one node per line, `gpu` cards of `model`."""
    problems: list[str] = []
    records = []
    with path.open(newline="") as handle:
        for line, row in enumerate(csv.DictReader(handle), start=2):
            where = f"line {line}"
            name = (row.get("sn") or "").strip()
            code = (row.get("model") or "").strip()
            if not name:
                problems.append(f"{where}: sn is empty")
                continue
            if code not in OPENB_MODELS:
                problems.append(f"{where}: unknown openb model {code!r} (known: {', '.join(OPENB_MODELS)})")
                continue
            count = _int(row.get("gpu"), "gpu", problems, where)
            records.append(
                NodeRecord(
                    name=name,
                    serial_number=name,
                    where=where,
                    cpu_milli=_int(row.get("cpu_milli"), "cpu_milli", problems, where),
                    memory_mib=_int(row.get("memory_mib"), "memory_mib", problems, where),
                    devices=[
                        DeviceRecord(index=i, model=OPENB_MODELS[code][0], uuid=device_uuid(name, i))
                        for i in range(count)
                    ],
                )
            )
    return _checked(records, problems)


def _node_from_mapping(raw: dict, where: str, problems: list[str], *, backends: Collection[str]) -> NodeRecord | None:
    name = str(raw.get("name") or "").strip()
    if not name:
        problems.append(f"{where}: name is required")
        return None
    if raw.get("cpu_milli") not in (None, ""):
        cpu_milli = _int(raw["cpu_milli"], "cpu_milli", problems, where)
    else:
        cpu_milli = _int(raw.get("cpu_cores"), "cpu_cores (or cpu_milli)", problems, where, scale=1000)
    if raw.get("memory_mib") not in (None, ""):
        memory_mib = _int(raw["memory_mib"], "memory_mib", problems, where)
    else:
        memory_mib = _int(raw.get("memory_gib"), "memory_gib (or memory_mib)", problems, where, scale=1024)
    devices = []
    if raw.get("devices"):
        for position, item in enumerate(raw["devices"]):
            spot = f"{where} device {position}"
            if not isinstance(item, dict) or not item.get("model"):
                problems.append(f"{spot}: needs at least a model")
                continue
            index = _int(item.get("index", position), "index", problems, spot)
            memory = item.get("memory_gb")
            serial = item.get("serial_number")
            mig = _mig_layout(item.get("mig"), problems, spot)
            devices.append(
                DeviceRecord(
                    index=index,
                    model=str(item["model"]).strip(),
                    uuid=str(item.get("uuid") or device_uuid(name, index)),
                    memory_gb=_int(memory, "memory_gb", problems, spot, minimum=1)
                    if memory not in (None, "")
                    else None,
                    serial_number=None if serial in (None, "") else str(serial).strip(),
                    mig=mig,
                )
            )
    elif raw.get("gpu_count") not in (None, "", 0, "0"):
        count = _int(raw.get("gpu_count"), "gpu_count", problems, where)
        model = str(raw.get("gpu_model") or "").strip()
        if not model:
            problems.append(f"{where}: gpu_model is required when gpu_count is given")
        uuids = [part.strip() for part in str(raw.get("gpu_uuids") or "").split(";") if part.strip()]
        if uuids and len(uuids) != count:
            problems.append(f"{where}: {len(uuids)} gpu_uuids for {count} GPUs")
        serials = [part.strip() for part in str(raw.get("gpu_serials") or "").split(";")]
        serials = serials if any(serials) else []
        if serials and len(serials) != count:
            problems.append(f"{where}: {len(serials)} gpu_serials for {count} GPUs")
        memory = raw.get("gpu_memory_gb")
        memory_gb = _int(memory, "gpu_memory_gb", problems, where, minimum=1) if memory not in (None, "") else None
        devices = [
            DeviceRecord(
                index=i,
                model=model,
                uuid=uuids[i] if uuids else device_uuid(name, i),
                memory_gb=memory_gb,
                serial_number=(serials[i] or None) if len(serials) == count else None,
            )
            for i in range(count)
        ]

    def optional(key: str) -> str | None:
        return None if raw.get(key) is None else str(raw[key]).strip()

    return NodeRecord(
        name=name,
        serial_number=str(raw.get("serial_number") or name).strip(),
        cpu_milli=cpu_milli,
        memory_mib=memory_mib,
        devices=devices,
        site=str(raw.get("site") or "").strip(),
        rack=str(raw.get("rack") or "").strip(),
        block=str(raw.get("block") or "").strip(),
        topology_domain=optional("topology_domain"),
        bmc_address=optional("bmc_address"),
        bmc_credentials_ref=optional("bmc_credentials_ref"),
        bmc_inventory_address=optional("bmc_inventory_address"),
        execution_backend=_backend(optional("execution_backend"), problems, where, backends=backends),
        where=where,
    )


def _backend(value: str | None, problems: list[str], where: str, *, backends: Collection[str]) -> str | None:
    if value in (None, ""):
        return None
    if value not in backends:
        problems.append(f"{where}: unknown execution_backend {value!r} (known: {', '.join(backends)})")
    return value


def read_csv(path: Path, *, backends: Collection[str]) -> list[NodeRecord]:
    """One node per line; see docs/inventory.md for the columns."""
    problems: list[str] = []
    records = []
    with path.open(newline="") as handle:
        for line, row in enumerate(csv.DictReader(handle), start=2):
            # empty CSV cells mean "not given": keep what the database has
            cleaned = {key.strip(): value.strip() for key, value in row.items() if key and value and value.strip()}
            record = _node_from_mapping(cleaned, f"line {line}", problems, backends=backends)
            if record is not None:
                records.append(record)
    return _checked(records, problems)


def read_yaml(path: Path, *, backends: Collection[str]) -> list[NodeRecord]:
    """`nodes:` a list of mappings with the CSV's keys, plus `devices:` (index, model, uuid, memory_gb,
    serial_number)."""
    try:
        document = yaml.safe_load(path.read_text())
    except yaml.YAMLError as error:
        raise InventoryFileError([f"not valid YAML: {error}"]) from error
    nodes = document.get("nodes") if isinstance(document, dict) else document
    if not isinstance(nodes, list):
        raise InventoryFileError(["expected a top-level `nodes:` list"])
    defaults = {
        key: document[key] for key in ("site", "block", "rack") if isinstance(document, dict) and key in document
    }
    problems: list[str] = []
    records = []
    for position, raw in enumerate(nodes):
        if not isinstance(raw, dict):
            problems.append(f"node {position}: expected a mapping")
            continue
        record = _node_from_mapping(
            {**defaults, **raw}, f"node {position} ({raw.get('name', '?')})", problems, backends=backends
        )
        if record is not None:
            records.append(record)
    return _checked(records, problems)


def _mig_layout(raw, problems: list[str], spot: str) -> dict | None:
    """A device's `mig:` block as {"mig_mode", "instances"}; the layout itself is checked against the card's
    geometry when it is stored."""
    if raw is None:
        return None
    if not isinstance(raw, dict) or raw.get("mode") not in ("mig", "whole"):
        problems.append(f"{spot}: mig needs mode: mig or whole")
        return None
    instances = raw.get("instances") or []
    if not isinstance(instances, list) or not all(isinstance(i, dict) and "profile" in i for i in instances):
        problems.append(f"{spot}: mig instances are mappings with at least profile and start")
        return None
    return {"mig_mode": raw["mode"] == "mig", "instances": instances}
