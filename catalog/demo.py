"""Demo catalog: accelerators of four vendors with MIG slices and shares, specs, images, a bare-metal
profile, serving models and the services that offer them. Idempotent, like every app's demo module.
"""

from decimal import Decimal

from catalog.choices import (
    AcceleratorKind,
    Interconnect,
    Runtime,
    ServiceKind,
    ServingRuntime,
    SliceKind,
    SlurmMembership,
    TopologyLevel,
    TopologyMode,
    Visibility,
)
from catalog.choices import ValidationCheck as Check
from catalog.models import (
    AcceleratorModel,
    BareMetalProfile,
    Image,
    MigGeometry,
    ResourceSpec,
    Service,
    ServingModel,
    ServingTemplate,
    SliceProfile,
    Vendor,
)
from catalog.parameters import SSH_PUBLIC_KEY, default_parameter_schema, serving_parameter_schema
from catalog.services import spec_deprecate
from catalog.serving_models import SMOLLM2
from tenancy.models import Project

D = Decimal

MIG_GEOMETRIES = {"h100-80gb": "H100 80GB", "a100-40gb": "A100 40GB"}  # demo model -> seeded MIG geometry
# slug, vendor, name, kind, memory, interconnect, [(slice name, kind, fraction, memory, per card)]
ACCELERATORS = [
    (
        "h100-80gb",
        "nvidia",
        "H100 80GB SXM",
        AcceleratorKind.GPU,
        80,
        Interconnect.NVSWITCH,
        [
            ("1g.10gb", SliceKind.MIG, "0.1429", 10, 7),
            ("2g.20gb", SliceKind.MIG, "0.2857", 20, 3),
            ("3g.40gb", SliceKind.MIG, "0.4286", 40, 2),
            ("4g.40gb", SliceKind.MIG, "0.5714", 40, 1),
            ("7g.80gb", SliceKind.MIG, "1", 80, 1),
        ],
    ),
    (
        "a100-40gb",
        "nvidia",
        "A100 40GB SXM",
        AcceleratorKind.GPU,
        40,
        Interconnect.NVLINK,
        [
            ("1g.5gb", SliceKind.MIG, "0.1429", 5, 7),
            ("2g.10gb", SliceKind.MIG, "0.2857", 10, 3),
            ("3g.20gb", SliceKind.MIG, "0.4286", 20, 2),
            ("7g.40gb", SliceKind.MIG, "1", 40, 1),
        ],
    ),
    (
        "l40s-48gb",
        "nvidia",
        "L40S 48GB",
        AcceleratorKind.GPU,
        48,
        Interconnect.PCIE,
        [("0.5", SliceKind.SHARE, "0.5", 24, 2)],
    ),
    (
        "t4-16gb",
        "nvidia",
        "T4 16GB",
        AcceleratorKind.GPU,
        16,
        Interconnect.PCIE,
        [("0.25", SliceKind.SHARE, "0.25", 4, 4)],
    ),
    ("mi300x-192gb", "amd", "Instinct MI300X 192GB", AcceleratorKind.GPU, 192, Interconnect.INFINITY_FABRIC, []),
    ("ascend-910b", "huawei-ascend", "Ascend 910B 64GB", AcceleratorKind.NPU, 64, Interconnect.HCCS, []),
    ("gaudi2-96gb", "intel-gaudi", "Gaudi 2 96GB", AcceleratorKind.NPU, 96, Interconnect.ROCE, []),
]

# slug, name, models, count, slice, cpu, memory, disk, price per accelerator and hour, max hours
SPECS = [
    ("h100-1x", "1x H100 80GB, 16 vCPU, 128 GiB", ["h100-80gb"], 1, None, 16, 128, 1000, "3.90", 336),
    ("h100-8x", "8x H100 80GB, 128 vCPU, 1.5 TiB", ["h100-80gb"], 8, None, 128, 1536, 7000, "3.90", 336),
    ("h100-mig-1g", "H100 MIG 1g.10gb, 4 vCPU, 32 GiB", ["h100-80gb"], 1, "1g.10gb", 4, 32, 200, "0.60", 720),
    ("h100-mig-3g", "H100 MIG 3g.40gb, 8 vCPU, 64 GiB", ["h100-80gb"], 1, "3g.40gb", 8, 64, 400, "1.70", 720),
    ("a100-1x", "1x A100 40GB, 12 vCPU, 96 GiB", ["a100-40gb"], 1, None, 12, 96, 500, "1.80", 336),
    ("a100-4x", "4x A100 40GB, 48 vCPU, 384 GiB", ["a100-40gb"], 4, None, 48, 384, 2000, "1.80", 336),
    (
        "ampere-or-ada-1x",
        "1x A100 40GB or L40S, 8 vCPU, 64 GiB",
        ["a100-40gb", "l40s-48gb"],
        1,
        None,
        8,
        64,
        300,
        "1.40",
        168,
    ),
    ("l40s-1x", "1x L40S 48GB, 8 vCPU, 64 GiB", ["l40s-48gb"], 1, None, 8, 64, 300, "1.20", 336),
    ("t4-quarter", "T4 quarter share, 2 vCPU, 8 GiB", ["t4-16gb"], 1, "0.25", 2, 8, 50, "0.10", 720),
    ("t4-2x", "2x T4 16GB, 8 vCPU, 32 GiB", ["t4-16gb"], 2, None, 8, 32, 200, "0.35", 336),
    ("mi300x-1x", "1x MI300X 192GB, 16 vCPU, 256 GiB", ["mi300x-192gb"], 1, None, 16, 256, 1000, "3.40", 336),
    ("mi300x-8x", "8x MI300X 192GB, 128 vCPU, 2 TiB", ["mi300x-192gb"], 8, None, 128, 2048, 8000, "3.40", 336),
    ("ascend-910b-1x", "1x Ascend 910B, 24 vCPU, 192 GiB", ["ascend-910b"], 1, None, 24, 192, 800, "2.10", 336),
    ("ascend-910b-8x", "8x Ascend 910B, 192 vCPU, 1.5 TiB", ["ascend-910b"], 8, None, 192, 1536, 6000, "2.10", 336),
    ("gaudi2-1x", "1x Gaudi 2 96GB, 12 vCPU, 128 GiB", ["gaudi2-96gb"], 1, None, 12, 128, 500, "1.90", 336),
    ("h100-2n-rack", "2 nodes x 8x H100 80GB, one rack", ["h100-80gb"], 8, None, 96, 1536, 7000, "3.90", 168),
    ("h100-4n-block", "4 nodes x 8x H100 80GB, one block", ["h100-80gb"], 8, None, 96, 1536, 7000, "3.90", 168),
]
# Multi-node specs (LLM pretraining): slug -> (nodes, topology level, mode); cards, CPU and memory above are per node.
GANG_SPECS = {
    "h100-2n-rack": (2, TopologyLevel.RACK, TopologyMode.REQUIRED),
    "h100-4n-block": (4, TopologyLevel.BLOCK, TopologyMode.REQUIRED),
}
DEPRECATED_SPECS = {"t4-2x": "Superseded by l40s-1x, which costs less per useful TFLOP."}

# name, version, reference, os, driver, runtime, runtime version, agent, vendors, approved
IMAGES = [
    (
        "pytorch",
        "2.5-cuda12.4",
        "registry.internal/ml/pytorch:2.5-cuda12.4",
        "Ubuntu 22.04",
        "550.127.05",
        Runtime.CUDA,
        "12.4",
        "dcgm-exporter 3.3.8",
        ["nvidia"],
        True,
    ),
    (
        "jupyter-datascience",
        "2026.10",
        "registry.internal/ml/jupyter-ds:2026.10",
        "Ubuntu 22.04",
        "550.127.05",
        Runtime.CUDA,
        "12.4",
        "dcgm-exporter 3.3.8",
        ["nvidia"],
        True,
    ),
    (
        "pytorch",
        "2.5-rocm6.2",
        "registry.internal/ml/pytorch:2.5-rocm6.2",
        "Ubuntu 22.04",
        "6.8.5",
        Runtime.ROCM,
        "6.2",
        "amd-device-metrics-exporter 1.1",
        ["amd"],
        True,
    ),
    (
        "mindspore",
        "2.4-cann8.0",
        "registry.internal/ml/mindspore:2.4-cann8.0",
        "openEuler 22.03",
        "24.1.rc3",
        Runtime.CANN,
        "8.0",
        "npu-exporter 6.0",
        ["huawei-ascend"],
        True,
    ),
    (
        "pytorch",
        "2.4-synapse1.18",
        "registry.internal/ml/pytorch:2.4-synapse1.18",
        "Ubuntu 22.04",
        "1.18.0",
        Runtime.SYNAPSE_AI,
        "1.18",
        "habana-metric-exporter 1.18",
        ["intel-gaudi"],
        True,
    ),
    (
        "ubuntu-hgx-baremetal",
        "22.04.5",
        "http://images.internal/baremetal/ubuntu-22.04.5-hgx.iso",
        "Ubuntu 22.04",
        "550.127.05",
        Runtime.CUDA,
        "12.4",
        "dcgm-exporter 3.3.8",
        ["nvidia"],
        True,
    ),
    (
        "pytorch-nightly",
        "2.6.dev",
        "registry.internal/ml/pytorch-nightly:latest",
        "Ubuntu 24.04",
        "560.35.03",
        Runtime.CUDA,
        "12.6",
        "dcgm-exporter 3.3.8",
        ["nvidia"],
        False,
    ),
]

# Parameters the demo services declare beyond the default ones (environment, workload).
JUPYTER = {
    "name": "jupyter",
    "type": "bool",
    "default": True,
    "label": "Start Jupyter",
    "help": "Serve a Jupyter notebook next to SSH.",
}


def workspace_schema() -> list[dict]:
    """The GPU workspace's parameters: Jupyter next to SSH, and the key SSH accepts."""
    return [*default_parameter_schema(), dict(JUPYTER), dict(SSH_PUBLIC_KEY)]


TRAINING_SCHEMA = [
    *default_parameter_schema(),
    {
        "name": "batch_size",
        "type": "int",
        "min": 1,
        "max": 65536,
        "label": "Global batch size",
        "help": "Recorded for rightsizing advice.",
    },
    {
        "name": "checkpoint_interval_minutes",
        "type": "int",
        "min": 5,
        "max": 1440,
        "default": 60,
        "label": "Checkpoint every (minutes)",
    },
]


def _upsert(model, lookup: dict, values: dict, many: dict | None = None):
    obj, _ = model.objects.update_or_create(**lookup, defaults=values)
    for field, related in (many or {}).items():
        getattr(obj, field).set(related)
    return obj


def _gang_fields(slug: str) -> dict:
    nodes, level, mode = GANG_SPECS.get(slug, (1, TopologyLevel.NODE, TopologyMode.REQUIRED))
    return {"node_count": nodes, "topology_level": level, "topology_mode": mode}


def seed_catalog() -> dict:
    vendors = {vendor.slug: vendor for vendor in Vendor.objects.all()}
    accelerators = {}
    for slug, vendor, name, kind, memory, link, slices in ACCELERATORS:
        accelerators[slug] = _upsert(
            AcceleratorModel,
            {"slug": slug},
            {
                "vendor": vendors[vendor],
                "name": name,
                "kind": kind,
                "memory_gb": memory,
                "interconnect": link,
                # the MIG tables migration 0007 seeded from NVIDIA's guide
                "mig_geometry": MigGeometry.objects.filter(name=MIG_GEOMETRIES.get(slug, "")).first(),
            },
        )
        for slice_name, slice_kind, fraction, slice_memory, per_card in slices:
            _upsert(
                SliceProfile,
                {"accelerator": accelerators[slug], "name": slice_name},
                {
                    "kind": slice_kind,
                    "compute_fraction": D(fraction),
                    "memory_gb": slice_memory,
                    "max_per_device": per_card,
                },
            )
    specs = {}
    for slug, name, models, count, slice_name, cpu, memory, disk, price, hours in SPECS:
        profile = SliceProfile.objects.get(accelerator__slug=models[0], name=slice_name) if slice_name else None
        spec = ResourceSpec.objects.filter(slug=slug).first()
        values = {
            "name": name,
            "accelerator_count": count,
            "slice_profile": profile,
            "cpu_cores": cpu,
            "memory_gb": memory,
            "local_disk_gb": disk,
            "hourly_price": D(price),
            "max_duration_hours": hours,
            **_gang_fields(slug),
        }
        specs[slug] = _upsert(
            ResourceSpec, {"slug": slug}, values, {"accelerator_models": [accelerators[model] for model in models]}
        )
        if spec is None and slug in DEPRECATED_SPECS:
            spec_deprecate(spec=specs[slug], reason=DEPRECATED_SPECS[slug], actor=None)
    images = {}
    for name, version, ref, os_name, driver, runtime, runtime_version, agent, image_vendors, approved in IMAGES:
        images[f"{name}:{version}"] = _upsert(
            Image,
            {"name": name, "version": version},
            {
                "reference": ref,
                "os": os_name,
                "driver_version": driver,
                "runtime": runtime,
                "runtime_version": runtime_version,
                "monitoring_agent": agent,
                "approved": approved,
                "configuration": {"env": {"NCCL_DEBUG": "WARN"}} if runtime == Runtime.CUDA else {},
            },
            {"compatible_vendors": [vendors[vendor] for vendor in image_vendors]},
        )
    return {"accelerators": accelerators, "specs": specs, "images": images}


def seed_offerings(catalog: dict, tenants: dict) -> None:
    specs, images, accelerators = catalog["specs"], catalog["images"], catalog["accelerators"]
    hgx_server = {
        "server_class": "HGX H100 8-GPU, 2x Xeon Platinum 8480+, 2 TiB",
        "accelerator_model": accelerators["h100-80gb"],
        "accelerator_count": 8,
        "cpu_cores": 112,
        "memory_gb": 2048,
        "os_image": images["ubuntu-hgx-baremetal:22.04.5"],
        "driver_version": "550.127.05",
        "monitoring_agent": "dcgm-exporter 3.3.8 + node-exporter 1.8",
        "validation_suite": list(Check.values),
        "max_duration_hours": 720,
    }
    # Two ways to hold the same server: in the shared training cluster without root, or as the tenant's own cluster
    # with root (docs/provisioning.md, "Slurm membership and root").
    hgx_profiles = [
        _upsert(
            BareMetalProfile,
            {"slug": "hgx-h100-8gpu"},
            {
                **hgx_server,
                "name": "HGX H100 8-GPU server",
                "slurm_membership": SlurmMembership.SHARED_CLUSTER_NO_ROOT,
                "target_cluster": "train-east",
                "hourly_price": D("29.50"),
            },
        ),
        _upsert(
            BareMetalProfile,
            {"slug": "hgx-h100-8gpu-root"},
            {
                **hgx_server,
                "name": "HGX H100 8-GPU server, own Slurm with root",
                "slurm_membership": SlurmMembership.TENANT_CLUSTER,
                "target_cluster": "",
                "hourly_price": D("31.00"),
            },
        ),
    ]
    templates = [
        _upsert(
            ServingTemplate,
            {"name": "vLLM on 1x H100, 2 replicas"},
            {
                "runtime": ServingRuntime.VLLM,
                "replicas": 2,
                "context_length": 32768,
                "max_tokens": 4096,
                "spec": specs["h100-1x"],
            },
        ),
        _upsert(
            ServingTemplate,
            {"name": "vLLM on 1x L40S, 1 replica"},
            {
                "runtime": ServingRuntime.VLLM,
                "replicas": 1,
                "context_length": 16384,
                "max_tokens": 2048,
                "spec": specs["l40s-1x"],
            },
        ),
    ]
    cpu_template = _upsert(
        ServingTemplate,
        {"name": "llama.cpp on CPU, 1 replica"},
        {
            "runtime": ServingRuntime.LLAMACPP,
            "replicas": 1,
            "context_length": 2048,
            "max_tokens": 512,
            "spec": specs["l40s-1x"],
        },
    )
    # The platform's stand-in server needs nothing installed: SmolLM2 is served by it on nodes without llama.cpp.
    stand_in_template = _upsert(
        ServingTemplate,
        {"name": "Stand-in server (simulated), 1 replica"},
        {
            "runtime": ServingRuntime.SIMULATED,
            "replicas": 1,
            "context_length": 2048,
            "max_tokens": 512,
            "spec": specs["l40s-1x"],
        },
    )
    models = [
        _upsert(
            ServingModel,
            {"name": SMOLLM2["name"], "version": SMOLLM2["version"]},
            {key: value for key, value in SMOLLM2.items() if key not in ("name", "version")},
            {"templates": [cpu_template, stand_in_template]},
        ),
        _upsert(
            ServingModel,
            {"name": "Llama 3.1 8B Instruct", "version": "3.1"},
            {
                "family": "llama",
                "parameters_billion": D("8.03"),
                "license": "Llama 3.1 Community License",
                "artifact_uri": "s3://models.internal/meta-llama/Llama-3.1-8B-Instruct",
                "max_context_length": 131072,
                "min_accelerator_memory_gb": 24,
                "approved": True,
            },
            {"templates": templates},
        ),
        _upsert(
            ServingModel,
            {"name": "Mistral 7B Instruct", "version": "0.3"},
            {
                "family": "mistral",
                "parameters_billion": D("7.25"),
                "license": "Apache-2.0",
                "artifact_uri": "s3://models.internal/mistralai/Mistral-7B-Instruct-v0.3",
                "max_context_length": 32768,
                "min_accelerator_memory_gb": 20,
                "approved": True,
            },
            {"templates": templates},
        ),
    ]
    nvidia_specs = [
        specs[slug]
        for slug in (
            "h100-1x",
            "h100-8x",
            "h100-2n-rack",
            "h100-4n-block",
            "h100-mig-1g",
            "h100-mig-3g",
            "a100-1x",
            "a100-4x",
            "ampere-or-ada-1x",
            "l40s-1x",
            "t4-quarter",
            "t4-2x",
        )
    ]
    nvidia_images = [images["pytorch:2.5-cuda12.4"], images["jupyter-datascience:2026.10"]]
    _service(
        "gpu-workspace",
        "NVIDIA GPU workspace",
        ServiceKind.COMPUTE,
        "A container with whole NVIDIA GPUs or MIG slices and an approved CUDA image, with SSH and Jupyter.",
        24,
        336,
        specs=nvidia_specs,
        images=nvidia_images,
        schema=workspace_schema(),
    )
    _service(
        "amd-instinct-training",
        "AMD Instinct training",
        ServiceKind.COMPUTE,
        "MI300X nodes with ROCm PyTorch for large-memory training.",
        48,
        336,
        specs=[specs["mi300x-1x"], specs["mi300x-8x"]],
        images=[images["pytorch:2.5-rocm6.2"]],
        schema=TRAINING_SCHEMA,
    )
    _service(
        "ascend-npu-training",
        "Ascend NPU training",
        ServiceKind.COMPUTE,
        "Huawei Ascend 910B NPUs with MindSpore on CANN. Offered to Acme Research only.",
        48,
        336,
        specs=[specs["ascend-910b-1x"], specs["ascend-910b-8x"]],
        images=[images["mindspore:2.4-cann8.0"]],
        visible_tenants=[tenants["acme-research"]],
        schema=TRAINING_SCHEMA,
    )
    _service(
        "gaudi-experiments",
        "Intel Gaudi experiments",
        ServiceKind.COMPUTE,
        "Gaudi 2 accelerators with SynapseAI PyTorch, for the Computer Vision project's benchmarking.",
        24,
        168,
        specs=[specs["gaudi2-1x"]],
        images=[images["pytorch:2.4-synapse1.18"]],
        visible_projects=[Project.objects.get(slug="vision")],
    )
    _service(
        "baremetal-hgx",
        "Bare-metal HGX H100 server",
        ServiceKind.BARE_METAL,
        "A whole 8-GPU server installed with the approved OS, driver and monitoring agent: in the shared training "
        "cluster without root, or as your own Slurm cluster with root.",
        168,
        720,
        bare_metal_profiles=hgx_profiles,
        schema=[*default_parameter_schema(), dict(SSH_PUBLIC_KEY)],
    )
    _service(
        "llm-endpoint",
        "LLM inference endpoint",
        ServiceKind.MODEL_SERVING,
        "An approved open model served behind the platform gateway with per-project API keys.",
        720,
        2160,
        serving_models=models,
        specs=[specs["h100-1x"], specs["l40s-1x"]],
        schema=serving_parameter_schema(),
    )


def _service(
    slug,
    name,
    kind,
    description,
    default_hours,
    max_hours,
    visible_tenants=(),
    visible_projects=(),
    schema=None,
    **offerings,
):
    restricted = bool(visible_tenants or visible_projects)
    return _upsert(
        Service,
        {"slug": slug},
        {
            "name": name,
            "kind": kind,
            "description": description,
            "default_duration_hours": default_hours,
            "max_duration_hours": max_hours,
            "visibility": Visibility.RESTRICTED if restricted else Visibility.ALL,
            "parameter_schema": schema or default_parameter_schema(),
        },
        {**offerings, "visible_tenants": list(visible_tenants), "visible_projects": list(visible_projects)},
    )


def seed(context: dict) -> None:
    seed_offerings(seed_catalog(), context["tenants"])
