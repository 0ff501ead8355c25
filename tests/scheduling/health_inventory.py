"""Inventory for the health tests: the node and GPUs that tests/scheduling/fixtures/dcgm_exporter.txt describes."""

from pathlib import Path

from django.contrib.auth.models import Permission

from scheduling.models import Device, Node
from tests import factories

DCGM_TEXT = (Path(__file__).parent / "fixtures" / "dcgm_exporter.txt").read_text()
HOSTNAME = "dgx-a-01"
# gpu0 healthy, gpu1 last XID 79, gpu2 at 91 C, gpu3 two double-bit ECC errors (see the fixture)
UUIDS = [
    "GPU-5fd4a2c1-3b7e-4d0a-9c1e-6a2f8b9d0e11",
    "GPU-8b2e7f40-1c5d-4e6a-b3f2-0d9c7a1e4b22",
    "GPU-c31a9d5e-7f20-4b8c-a6d4-2e1f0b3c5d33",
    "GPU-e47b0c6f-9a31-4d2e-8f5b-3c2a1d4e6f44",
]


def gpu_node(name: str = HOSTNAME, uuids: list[str] | None = None, model=None) -> Node:
    """A node with one H100-like device per UUID, indexed in order."""
    node = Node.objects.create(
        name=name,
        serial_number=f"SN-{name}",
        cpu_milli=112_000,
        memory_mib=2_048 * 1024,
        bmc_address=f"https://{name}-bmc.example.test",
    )
    model = model or factories.AcceleratorModelFactory(name=f"NVIDIA H100 80GB HBM3 ({name})", slug=f"h100-{name}")
    for index, uuid in enumerate(UUIDS if uuids is None else uuids):
        Device.objects.create(node=node, index=index, uuid=uuid, model=model, memory_gb=80)
    return node


def ingest_user(**kwargs):
    """An operator's service account holding scheduling.ingest_health (a central exporter): it speaks for any node.
    Node agents use agent tokens instead (tests/scheduling/test_agents.py)."""
    user = factories.UserFactory(is_staff=True, **kwargs)
    user.user_permissions.add(Permission.objects.get(content_type__app_label="scheduling", codename="ingest_health"))
    return user


def device(uuid: str) -> Device:
    return Device.objects.select_related("node").get(uuid=uuid)
