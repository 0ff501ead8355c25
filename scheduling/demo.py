"""Demo hardware: a small heterogeneous cluster, so demo orders get placed (idempotent). The H100 nodes sit in two
racks of one block (spine-a), so both multi-node demo specs can run: "2 nodes x 8x H100 80GB, one rack" in r1 or r3,
"4 nodes x 8x H100 80GB, one block" over r1 and r3."""

from scheduling.inventory.formats import DeviceRecord, NodeRecord, device_uuid
from scheduling.inventory.importer import inventory_import

# node name, rack, topology domain, accelerator model slug, cards, CPU cores, memory GiB
NODES = [
    ("hgx-h100-01", "r1", "nvlink-a", "h100-80gb", 8, 112, 2048),
    ("hgx-h100-02", "r1", "nvlink-a", "h100-80gb", 8, 112, 2048),
    ("hgx-h100-03", "r3", "nvlink-c", "h100-80gb", 8, 112, 2048),
    ("hgx-h100-04", "r3", "nvlink-c", "h100-80gb", 8, 112, 2048),
    ("dgx-a100-01", "r1", "nvlink-b", "a100-40gb", 8, 128, 1024),
    ("l40s-01", "r2", "", "l40s-48gb", 4, 64, 512),
    ("t4-01", "r2", "", "t4-16gb", 4, 32, 256),
    ("mi300x-01", "r2", "xgmi-a", "mi300x-192gb", 8, 128, 2048),
    ("ascend-01", "r2", "hccs-a", "ascend-910b", 8, 192, 1536),
    ("gaudi-01", "r2", "", "gaudi2-96gb", 8, 96, 1024),
]
BLOCKS = {"r1": "spine-a", "r3": "spine-a"}  # rack -> block; r2 is a block of its own


def seed(context: dict) -> None:
    records = [
        NodeRecord(
            name=name,
            serial_number=f"DEMO-{name.upper()}",
            cpu_milli=cores * 1000,
            memory_mib=memory * 1024,
            site="demo-dc",
            rack=rack,
            block=BLOCKS.get(rack, ""),
            topology_domain=domain,
            bmc_address=f"https://bmc-{name}.demo.internal",
            bmc_credentials_ref="demo-bmc",
            devices=[DeviceRecord(index=i, model=model, uuid=device_uuid(name, i)) for i in range(cards)],
        )
        for name, rack, domain, model, cards, cores, memory in NODES
    ]
    inventory_import(records=records, actor=None)
