"""A Redfish mockup of HGX-like GPU servers, written as the directory tree that `sushy-static` serves: one
`index.json` per resource, at the resource's path under /redfish/v1 (the layout of DMTF's public mockups).

The fake driver of `sushy-emulator` lists no processors, so hardware validation's GPU checks read this mockup
instead, through the node's inventory address (docs/provisioning.md). One system per variant (VARIANTS).
"""

import json
from pathlib import Path

SYSTEMS = "/redfish/v1/Systems"
CPU_CORES, CPU_SOCKETS, MEMORY_GIB = 56, 2, 2048
GPU_MODEL = "NVIDIA H100 80GB HBM3"
GPU_SERIALS = tuple(f"165422301{index:04d}" for index in range(8))
VARIANTS = {
    "hgx": {},  # 2 CPUs, 8 healthy GPUs, 2 TiB
    "hgx-critical-gpu": {"critical_gpu": 3},  # GPU_SXM_4 reports Status.Health Critical; the system still OK
    "hgx-seven-gpus": {"gpus": 7},  # the eighth card is gone
}


def write_hgx_mockup(root: Path) -> dict[str, str]:
    """Write every variant under `root`; returns variant -> system id."""
    _write(root, "/redfish/v1", _service_root())
    _write(root, SYSTEMS, _collection("Computer System Collection", "ComputerSystemCollection", SYSTEMS, VARIANTS))
    for system_id, variant in VARIANTS.items():
        _write_system(root, system_id, gpus=variant.get("gpus", 8), critical_gpu=variant.get("critical_gpu"))
    return {name: name for name in VARIANTS}


def _write_system(root: Path, system_id: str, *, gpus: int, critical_gpu: int | None) -> None:
    path = f"{SYSTEMS}/{system_id}"
    processors = {f"CPU{socket}": _cpu(path, f"CPU{socket}", socket) for socket in range(CPU_SOCKETS)}
    processors |= {
        f"GPU_SXM_{index + 1}": _gpu(path, index, "Critical" if index == critical_gpu else "OK")
        for index in range(gpus)
    }
    rollup = "Critical" if critical_gpu is not None else "OK"
    _write(root, path, _system(path, system_id, rollup))
    _write(
        root,
        f"{path}/Processors",
        _collection("Processors Collection", "ProcessorCollection", f"{path}/Processors", processors),
    )
    for processor_id, body in processors.items():
        _write(root, f"{path}/Processors/{processor_id}", body)


def _service_root() -> dict:
    return {
        "@odata.type": "#ServiceRoot.v1_11_0.ServiceRoot",
        "@odata.id": "/redfish/v1/",
        "Id": "RootService",
        "Name": "Root Service",
        "RedfishVersion": "1.11.0",
        "Systems": {"@odata.id": SYSTEMS},
    }


def _collection(name: str, kind: str, path: str, members) -> dict:
    return {
        "@odata.type": f"#{kind}.{kind}",
        "@odata.id": path,
        "Name": name,
        "Members@odata.count": len(members),
        "Members": [{"@odata.id": f"{path}/{member}"} for member in members],
    }


def _system(path: str, system_id: str, rollup: str) -> dict:
    # ComputerSystem before v1.14 has no ProcessorSummary.CoreCount: cores come from the CPUs' TotalCores.
    return {
        "@odata.type": "#ComputerSystem.v1_13_0.ComputerSystem",
        "@odata.id": path,
        "Id": system_id,
        "Name": "HGX H100 8-GPU server",
        "SystemType": "Physical",
        "Manufacturer": "Mockup Systems",
        "Model": "HGX-H100-8",
        "SerialNumber": f"MOCK-{system_id.upper()}",
        "PowerState": "Off",
        "Status": {"State": "Enabled", "Health": "OK", "HealthRollup": rollup},
        "ProcessorSummary": {"Count": CPU_SOCKETS, "Model": "Intel Xeon Platinum 8480+", "Status": {"Health": "OK"}},
        "MemorySummary": {"TotalSystemMemoryGiB": MEMORY_GIB, "Status": {"State": "Enabled", "Health": "OK"}},
        "Processors": {"@odata.id": f"{path}/Processors"},
    }


def _cpu(system_path: str, processor_id: str, socket: int) -> dict:
    return {
        **_processor(system_path, processor_id, "OK"),
        "Socket": f"CPU {socket}",
        "ProcessorType": "CPU",
        "ProcessorArchitecture": "x86",
        "InstructionSet": "x86-64",
        "Manufacturer": "Intel(R) Corporation",
        "Model": "Intel Xeon Platinum 8480+",
        "TotalCores": CPU_CORES,
        "TotalThreads": CPU_CORES * 2,
        "SerialNumber": f"CPU-{socket:04d}",
    }


def _gpu(system_path: str, index: int, health: str) -> dict:
    return {
        **_processor(system_path, f"GPU_SXM_{index + 1}", health),
        "Socket": f"SXM {index + 1}",
        "ProcessorType": "GPU",
        "ProcessorArchitecture": "OEM",
        "Manufacturer": "NVIDIA",
        "Model": GPU_MODEL,
        "SerialNumber": GPU_SERIALS[index],
        "PartNumber": "692-2G520-0200-000",
    }


def _processor(system_path: str, processor_id: str, health: str) -> dict:
    return {
        "@odata.type": "#Processor.v1_13_0.Processor",
        "@odata.id": f"{system_path}/Processors/{processor_id}",
        "Id": processor_id,
        "Name": processor_id,
        "Status": {"State": "Enabled", "Health": health},
    }


def _write(root: Path, path: str, body: dict) -> None:
    directory = root / path.removeprefix("/redfish/v1").strip("/")
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "index.json").write_text(json.dumps(body, indent=2))
