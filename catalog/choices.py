from django.db import models


class AcceleratorKind(models.TextChoices):
    GPU = "gpu", "GPU"
    NPU = "npu", "NPU"


class Interconnect(models.TextChoices):
    PCIE = "pcie", "PCIe"
    NVLINK = "nvlink", "NVLink"
    NVSWITCH = "nvswitch", "NVLink + NVSwitch"
    INFINITY_FABRIC = "infinity_fabric", "AMD Infinity Fabric"
    HCCS = "hccs", "Huawei HCCS"
    ROCE = "roce", "Integrated RoCE"


class SliceKind(models.TextChoices):
    MIG = "mig", "MIG partition (hardware-isolated)"
    SHARE = "share", "Fractional share (time-sliced)"


class SpecStatus(models.TextChoices):
    ACTIVE = "active", "Active"
    DEPRECATED = "deprecated", "Deprecated"


class Runtime(models.TextChoices):
    CUDA = "cuda", "CUDA"
    ROCM = "rocm", "ROCm"
    CANN = "cann", "CANN"
    SYNAPSE_AI = "synapse_ai", "SynapseAI"
    NONE = "none", "None (CPU only)"


class ServingRuntime(models.TextChoices):
    SIMULATED = "simulated", "Simulated (the platform's stand-in server)"
    LLAMACPP = "llamacpp", "llama.cpp (llama-cpp-python server, CPU)"
    VLLM = "vllm", "vLLM"
    TGI = "tgi", "Text Generation Inference"
    TRITON = "triton", "Triton Inference Server"
    MINDIE = "mindie", "MindIE (Ascend)"


class ServiceKind(models.TextChoices):
    COMPUTE = "compute", "Compute (container or VM on accelerators)"
    BARE_METAL = "bare_metal", "Bare-metal server"
    MODEL_SERVING = "model_serving", "Model-serving endpoint"


class Visibility(models.TextChoices):
    ALL = "all", "Everyone"
    RESTRICTED = "restricted", "Chosen tenants and projects"


class ValidationCheck(models.TextChoices):
    """Hardware checks a bare-metal profile can demand before and after install."""

    BMC_REACHABLE = "bmc_reachable", "BMC reachable"
    SYSTEM_HEALTH = "system_health", "System health OK"
    INVENTORY_MATCH = "inventory_match", "CPU, memory and accelerator count match inventory"
    ACCELERATOR_BURN_IN = "accelerator_burn_in", "Accelerator burn-in"
    COLLECTIVE_BANDWIDTH = "collective_bandwidth", "Collective bandwidth (NCCL/HCCL all-reduce)"


class BootMethod(models.TextChoices):
    """How a bare-metal server boots its OS installer."""

    VIRTUAL_MEDIA = "virtual_media", "Virtual media (the OS image as a BMC CD)"
    PXE = "pxe", "PXE (network boot: the platform's iPXE script and install config)"


class SlurmMembership(models.TextChoices):
    """How a bare-metal server joins Slurm, and with it whether its tenant gets root: a server whose tenant has root
    never holds a secret shared with other tenants (the shared cluster's munge key lets root forge any user's
    credentials in that whole cluster)."""

    SHARED_CLUSTER_NO_ROOT = "shared_cluster_no_root", "Shared Slurm cluster, no root for the tenant"
    TENANT_CLUSTER = "tenant_cluster", "Tenant's own Slurm cluster, with root"
    NONE = "none", "No Slurm, with root"


# The memberships whose servers give their tenant root (sudo).
TENANT_ROOT_MEMBERSHIPS = frozenset({SlurmMembership.TENANT_CLUSTER, SlurmMembership.NONE})


class TopologyLevel(models.TextChoices):
    """How close the members of a multi-node spec must run, from closest to widest: one node, one rack (leaf
    switch), one block (spine: the racks under one parent switch), one site."""

    NODE = "node", "one node"
    RACK = "rack", "one rack"
    BLOCK = "block", "one block"
    SITE = "site", "one site"


# The levels from closest to widest: a `preferred` gang that no domain of its level holds spills to the next one.
TOPOLOGY_LEVELS = (TopologyLevel.NODE, TopologyLevel.RACK, TopologyLevel.BLOCK, TopologyLevel.SITE)


class TopologyMode(models.TextChoices):
    """Whether a multi-node spec's level is a must (`required`: all members in one domain of that level, or wait) or
    a wish (`preferred`: as few domains as possible, the closest level first)."""

    REQUIRED = "required", "required"
    PREFERRED = "preferred", "preferred"
