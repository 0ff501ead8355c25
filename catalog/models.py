"""The standard, approved things a developer can order: accelerators, specs, images, profiles, models, services."""

from decimal import Decimal

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator, RegexValidator
from django.db import models
from django.db.models import Q

from catalog.choices import (
    AcceleratorKind,
    BootMethod,
    Interconnect,
    Runtime,
    ServiceKind,
    ServingRuntime,
    SliceKind,
    SlurmMembership,
    SpecStatus,
    TopologyLevel,
    TopologyMode,
    ValidationCheck,
    Visibility,
)
from catalog.parameters import default_parameter_schema, schema_problems
from config.words import joined_without_repeat
from tenancy.models import slug_validator

# A control character (a newline above all) in a field that reaches a batch script, a command line or a log line
# would end the line it is written into: refused on the form (the validator) and in the database (the constraint).
CONTROL_CHARACTERS = r"[\x01-\x1f\x7f]"  # NUL: PostgreSQL text cannot hold it at all
no_control_characters = RegexValidator(
    CONTROL_CHARACTERS, inverse_match=True, message="Must not contain a line break or other control character."
)


def _money_field(per: str):
    return models.DecimalField(
        max_digits=10,
        decimal_places=2,
        validators=[MinValueValidator(Decimal(0))],
        help_text=f"Price per {per} per hour in {settings.CATALOG_CURRENCY}.",
    )


class Vendor(models.Model):
    slug = models.SlugField(max_length=40, unique=True, validators=[slug_validator])
    name = models.CharField(max_length=80, unique=True)
    software_stack = models.CharField(max_length=40, choices=Runtime.choices)

    class Meta:
        ordering = ["name"]

    def __str__(self):
        return self.name


class MigGeometry(models.Model):
    """How a MIG-capable card partitions: its compute and memory slices and its GPU-instance profiles with their
    allowed placements, as NVIDIA's MIG User Guide ("Supported MIG Profiles") and `nvidia-smi mig -lgipp` give
    them. The placement engine reads it; operators edit it in the admin (validated)."""

    name = models.CharField(max_length=80, unique=True, help_text="e.g. H100 80GB")
    compute_slices = models.PositiveSmallIntegerField(validators=[MinValueValidator(1), MaxValueValidator(16)])
    memory_slices = models.PositiveSmallIntegerField(validators=[MinValueValidator(1), MaxValueValidator(16)])
    source = models.CharField(max_length=300, help_text="The document (and its version) the table comes from.")

    class Meta:
        ordering = ["name"]
        verbose_name_plural = "MIG geometries"

    def __str__(self):
        return f"{self.name} ({self.compute_slices} compute / {self.memory_slices} memory slices)"


class MigProfile(models.Model):
    """One GPU-instance profile of a geometry: NVIDIA profile id, slices, memory, allowed placements.

    A media-extension profile (``+me`` in its name, e.g. ``1g.10gb+me``) takes the card's one set of media engines
    (JPEG decoders, OFA): a card holds at most one ``+me`` instance of any size, so such a profile allows one
    instance (the layout checks and the placement engine hold every card to the rule, scheduling.mig)."""

    geometry = models.ForeignKey(MigGeometry, on_delete=models.CASCADE, related_name="profiles")
    name = models.CharField(max_length=30, help_text="e.g. 3g.40gb")
    profile_id = models.PositiveSmallIntegerField(help_text="NVIDIA GPU-instance profile id (nvidia-smi mig -lgip).")
    compute_slices = models.PositiveSmallIntegerField(validators=[MinValueValidator(1)])
    memory_slices = models.PositiveSmallIntegerField(validators=[MinValueValidator(1)])
    memory_gb = models.PositiveIntegerField(validators=[MinValueValidator(1)])
    max_instances = models.PositiveSmallIntegerField(validators=[MinValueValidator(1)])
    placements = models.JSONField(
        help_text="Allowed placements as [[start memory slice, size], ...], e.g. [[0, 4], [4, 4]]."
    )

    class Meta:
        ordering = ["geometry", "compute_slices", "memory_slices", "name"]
        constraints = [
            models.UniqueConstraint(fields=["geometry", "name"], name="mig_profile_unique_name"),
            models.UniqueConstraint(fields=["geometry", "profile_id"], name="mig_profile_unique_id"),
            models.CheckConstraint(condition=Q(compute_slices__gte=1), name="mig_profile_compute_positive"),
            models.CheckConstraint(condition=Q(memory_slices__gte=1), name="mig_profile_memory_positive"),
        ]

    def __str__(self):
        return f"{self.geometry.name} {self.name}"

    @property
    def placements_text(self) -> str:
        return ", ".join(f"{start}+{size}" for start, size in self.placements or [])

    def clean(self):
        errors = placement_problems(self.placements, self.memory_slices)
        if errors:
            raise ValidationError({"placements": errors})
        has_geometry = self.geometry_id is not None or type(self).geometry.is_cached(self)
        if not has_geometry:
            return
        geometry = self.geometry
        problems = {}
        if self.compute_slices and self.compute_slices > geometry.compute_slices:
            problems["compute_slices"] = f"The card has {geometry.compute_slices} compute slices."
        outside = [f"{start}+{size}" for start, size in self.placements if start + size > geometry.memory_slices]
        if outside:
            problems["placements"] = (
                f"Placements {', '.join(outside)} end past the card's {geometry.memory_slices} memory slices."
            )
        elif self.max_instances and self.max_instances > _disjoint(self.placements):
            problems["max_instances"] = f"At most {_disjoint(self.placements)} instances fit at these placements."
        elif self.max_instances and self.max_instances > 1 and MEDIA_EXTENSIONS in self.name:
            problems["max_instances"] = (
                "A card has one set of media engines (JPEG/OFA): at most one +me instance of any size per card."
            )
        if problems:
            raise ValidationError(problems)


MEDIA_EXTENSIONS = "+me"  # NVIDIA's mark of a profile that takes the card's media engines


def placement_problems(placements, memory_slices) -> list[str]:
    """Shape of the placements list: pairs of integers, start >= 0, size equal to the profile's memory slices."""
    if not isinstance(placements, list) or not placements:
        return ["Give at least one placement as [start, size]."]
    problems = []
    for item in placements:
        if not (isinstance(item, list) and len(item) == 2 and all(type(v) is int for v in item)):
            problems.append(f"{item!r} is not [start, size].")
            continue
        start, size = item
        if start < 0:
            problems.append(f"Placement {start}+{size} starts before slice 0.")
        if memory_slices and size != memory_slices:
            problems.append(f"Placement {start}+{size} has size {size}, the profile takes {memory_slices} slices.")
    if not problems and len({tuple(p) for p in placements}) != len(placements):
        problems.append("A placement repeats.")
    return problems


def _disjoint(placements) -> int:
    """Most non-overlapping placements (one size per profile: earliest start first is optimal)."""
    taken, n = set(), 0
    for start, size in sorted(placements):
        slices = set(range(start, start + size))
        if not slices & taken:
            taken |= slices
            n += 1
    return n


class AcceleratorModel(models.Model):
    vendor = models.ForeignKey(Vendor, on_delete=models.PROTECT, related_name="accelerator_models")
    name = models.CharField(max_length=80, unique=True, help_text="e.g. H100 80GB SXM")
    slug = models.SlugField(max_length=60, unique=True, validators=[slug_validator])
    kind = models.CharField(max_length=8, choices=AcceleratorKind.choices)
    memory_gb = models.PositiveIntegerField("memory (GiB)", validators=[MinValueValidator(1)])
    interconnect = models.CharField(max_length=20, choices=Interconnect.choices)
    active = models.BooleanField(default=True)
    mig_geometry = models.ForeignKey(
        MigGeometry,
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="accelerator_models",
        help_text="MIG-capable models: how the card partitions. Empty for models without MIG.",
    )

    class Meta:
        ordering = ["vendor__name", "name"]
        constraints = [
            models.CheckConstraint(condition=Q(memory_gb__gte=1), name="accelerator_memory_positive"),
            models.CheckConstraint(condition=Q(kind__in=AcceleratorKind.values), name="accelerator_kind_valid"),
        ]

    def __str__(self):
        return joined_without_repeat(self.vendor.name, self.name)  # "Huawei Ascend 910B", not "... Ascend Ascend ..."


class SliceProfile(models.Model):
    """A partition of one card: a MIG profile such as 1g.10gb, or a fractional time-sliced share."""

    accelerator = models.ForeignKey(AcceleratorModel, on_delete=models.CASCADE, related_name="slice_profiles")
    name = models.CharField(max_length=30, help_text="e.g. 1g.10gb, 3g.40gb or 0.25")
    kind = models.CharField(max_length=8, choices=SliceKind.choices)
    compute_fraction = models.DecimalField(
        max_digits=5,
        decimal_places=4,
        validators=[MinValueValidator(Decimal("0.0001")), MaxValueValidator(Decimal(1))],
        help_text="Share of one card's compute, counted against the GPU quota (1g of 7 = 0.1429).",
    )
    memory_gb = models.PositiveIntegerField("memory (GiB)", validators=[MinValueValidator(1)])
    max_per_device = models.PositiveSmallIntegerField(
        validators=[MinValueValidator(1)], help_text="How many of these fit on one card at most."
    )

    class Meta:
        ordering = ["accelerator", "compute_fraction"]
        constraints = [
            models.UniqueConstraint(fields=["accelerator", "name"], name="slice_profile_unique_per_model"),
            models.CheckConstraint(
                condition=Q(compute_fraction__gt=0) & Q(compute_fraction__lte=1), name="slice_fraction_in_0_1"
            ),
            models.CheckConstraint(condition=Q(max_per_device__gte=1), name="slice_fits_at_least_once"),
        ]

    def __str__(self):
        return f"{self.accelerator.name} {self.name}"

    def clean(self):
        # The accelerator may still be unsaved (a new model with its slices inline in the admin), so look at
        # the related object when it is attached, not only at the id.
        has_accelerator = self.accelerator_id is not None or type(self).accelerator.is_cached(self)
        if has_accelerator and self.memory_gb and self.memory_gb > self.accelerator.memory_gb:
            raise ValidationError({"memory_gb": "A slice cannot have more memory than its card."})
        if has_accelerator and self.kind == SliceKind.MIG and self.accelerator.mig_geometry_id:
            self._check_against_geometry(self.accelerator.mig_geometry)

    def _check_against_geometry(self, geometry):
        """A MIG slice of a model with a geometry is one of its profiles: quota counts its compute fraction
        (compute slices / the card's) and its memory (the profile's), so both must be the profile's."""
        profile = geometry.profiles.filter(name=self.name).first()
        if profile is None:
            names = ", ".join(geometry.profiles.values_list("name", flat=True))
            raise ValidationError({"name": f"{geometry.name} has no MIG profile {self.name} (profiles: {names})."})
        problems = {}
        fraction = Decimal(profile.compute_slices) / Decimal(geometry.compute_slices)
        if self.compute_fraction is not None and abs(self.compute_fraction - fraction) > Decimal("0.0001"):
            problems["compute_fraction"] = (
                f"{self.name} takes {profile.compute_slices} of {geometry.compute_slices} compute slices: "
                f"{fraction.quantize(Decimal('0.0001'))}."
            )
        if self.memory_gb and self.memory_gb != profile.memory_gb:
            problems["memory_gb"] = f"{self.name} has {profile.memory_gb} GB."
        if self.max_per_device and self.max_per_device > profile.max_instances:
            problems["max_per_device"] = f"At most {profile.max_instances} {self.name} fit on one card."
        if problems:
            raise ValidationError(problems)


MAX_SPEC_NODES = 64  # the largest gang a spec may ask for (a block of racks, not the whole fleet)
GANG_LEVELS = [TopologyLevel.RACK, TopologyLevel.BLOCK, TopologyLevel.SITE]


class ResourceSpec(models.Model):
    """A standard spec: N cards (or N slices) of a compatible model with CPU, memory, disk and a price, on one node
    or, as a gang, on `node_count` nodes at once (cards, CPU and memory per node) inside one topology domain."""

    name = models.CharField(max_length=120, unique=True)
    slug = models.SlugField(max_length=60, unique=True, validators=[slug_validator])
    description = models.TextField(blank=True)
    accelerator_models = models.ManyToManyField(
        AcceleratorModel, related_name="specs", help_text="Any of these models satisfies the spec."
    )
    accelerator_count = models.PositiveSmallIntegerField(validators=[MinValueValidator(1)])
    slice_profile = models.ForeignKey(
        SliceProfile,
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="specs",
        help_text="Empty for whole cards; otherwise every unit is one slice of this profile.",
    )
    cpu_cores = models.PositiveIntegerField("CPU cores", validators=[MinValueValidator(1)])
    memory_gb = models.PositiveIntegerField("memory (GiB)", validators=[MinValueValidator(1)])
    node_count = models.PositiveSmallIntegerField(
        "nodes",
        default=1,
        validators=[MinValueValidator(1), MaxValueValidator(MAX_SPEC_NODES)],
        help_text="Nodes the work runs on together (a gang, all or none). Cards, CPU and memory are per node.",
    )
    topology_level = models.CharField(
        max_length=8,
        choices=TopologyLevel.choices,
        default=TopologyLevel.NODE,
        help_text="How close a multi-node spec's nodes run: one rack, one block or one site (one node: a single node).",
    )
    topology_mode = models.CharField(
        max_length=10,
        choices=TopologyMode.choices,
        default=TopologyMode.REQUIRED,
        help_text="Required: all nodes inside one domain of the level, or wait. Preferred: as few domains as possible.",
    )
    local_disk_gb = models.PositiveIntegerField("local disk (GiB)", default=0)
    hourly_price = _money_field("accelerator (card or slice)")
    max_duration_hours = models.PositiveIntegerField(validators=[MinValueValidator(1)])
    status = models.CharField(max_length=12, choices=SpecStatus.choices, default=SpecStatus.ACTIVE)
    deprecated_at = models.DateTimeField(null=True, blank=True)
    deprecation_reason = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.CheckConstraint(condition=Q(accelerator_count__gte=1), name="spec_count_positive"),
            models.CheckConstraint(condition=Q(hourly_price__gte=0), name="spec_price_non_negative"),
            models.CheckConstraint(condition=Q(status__in=SpecStatus.values), name="spec_status_valid"),
            models.CheckConstraint(
                condition=Q(status=SpecStatus.ACTIVE, deprecated_at__isnull=True)
                | Q(status=SpecStatus.DEPRECATED, deprecated_at__isnull=False),
                name="spec_deprecated_at_matches_status",
            ),
            models.CheckConstraint(
                condition=Q(node_count__gte=1, node_count__lte=MAX_SPEC_NODES), name="spec_node_count_in_bounds"
            ),
            # One node has no topology to ask for; a gang asks for a domain wider than a node, on whole cards (a MIG
            # slice is bound to one card of one node: a gang of slices has nothing to gain from other nodes).
            models.CheckConstraint(
                condition=Q(node_count=1, topology_level=TopologyLevel.NODE)
                | Q(node_count__gt=1, slice_profile__isnull=True, topology_level__in=GANG_LEVELS),
                name="spec_gang_whole_cards_in_a_domain",
            ),
            models.CheckConstraint(condition=Q(topology_mode__in=TopologyMode.values), name="spec_topology_mode_valid"),
        ]

    def __str__(self):
        return self.name

    @property
    def is_slice(self) -> bool:
        return self.slice_profile_id is not None

    @property
    def is_gang(self) -> bool:
        """Whether it runs on several nodes at once (all of them or none)."""
        return self.node_count > 1

    # The whole spec (every node of a gang) is what quota, budget, cost, approval and the preview count: these
    # totals are the one place a per-node figure is multiplied by the node count.

    @property
    def total_accelerator_count(self) -> int:
        """Cards (or slices) of all its nodes."""
        return self.accelerator_count * self.node_count

    @property
    def total_cpu_cores(self) -> int:
        return self.cpu_cores * self.node_count

    @property
    def total_memory_gb(self) -> int:
        return self.memory_gb * self.node_count

    @property
    def gpu_equivalents(self) -> Decimal:
        """Whole-card equivalents charged against the GPU quota, all nodes together."""
        if self.slice_profile is None:
            return Decimal(self.total_accelerator_count)
        return (self.slice_profile.compute_fraction * self.total_accelerator_count).quantize(Decimal("0.0001"))

    @property
    def hourly_cost(self) -> Decimal:
        """Price of the whole spec per hour: the per-accelerator price times the cards of all its nodes."""
        return self.hourly_price * self.total_accelerator_count

    @property
    def accelerator_memory_gb(self) -> int:
        """Accelerator memory guaranteed by the spec, all nodes together: the smallest compatible card, or the
        slice's memory."""
        if self.slice_profile is not None:
            return self.slice_profile.memory_gb * self.total_accelerator_count
        memories = [model.memory_gb for model in self.accelerator_models.all()]
        return min(memories, default=0) * self.total_accelerator_count

    @property
    def topology_text(self) -> str:
        """Its topology requirement in words: "2 nodes, one rack" or "4 nodes, one rack preferred"; "" for one node."""
        if not self.is_gang:
            return ""
        level = TopologyLevel(self.topology_level).label
        return f"{self.node_count} nodes, {level}{' preferred' if self.topology_mode == TopologyMode.PREFERRED else ''}"

    def clean(self):
        if self.slice_profile_id and self.accelerator_count > self.slice_profile.max_per_device:
            raise ValidationError(
                {
                    "accelerator_count": f"At most {self.slice_profile.max_per_device} slices of "
                    f"{self.slice_profile.name} fit on one card."
                }
            )
        self._clean_topology()

    def _clean_topology(self):
        if not self.is_gang:
            if self.topology_level != TopologyLevel.NODE:
                raise ValidationError({"topology_level": 'A one-node spec runs on one node: choose "one node".'})
            return
        if self.slice_profile_id:
            raise ValidationError(
                {"slice_profile": "A spec on several nodes takes whole cards on each node: leave the slice empty."}
            )
        if self.topology_level not in GANG_LEVELS:
            raise ValidationError(
                {"topology_level": f"{self.node_count} nodes cannot share one node: choose a rack, block or site."}
            )


IMAGE_TEXT_FIELDS = ("name", "version", "reference", "os", "driver_version", "runtime_version", "monitoring_agent")


class Image(models.Model):
    """An approved software image: OS, driver, runtime and monitoring agent, for the vendors it supports."""

    name = models.CharField(max_length=120, validators=[no_control_characters])
    version = models.CharField(max_length=40, validators=[no_control_characters])
    reference = models.CharField(
        max_length=300, validators=[no_control_characters], help_text="Registry reference or OS image URL."
    )
    os = models.CharField("operating system", max_length=80, validators=[no_control_characters])
    driver_version = models.CharField(max_length=40, blank=True, validators=[no_control_characters])
    runtime = models.CharField(max_length=12, choices=Runtime.choices)
    runtime_version = models.CharField(max_length=40, blank=True, validators=[no_control_characters])
    monitoring_agent = models.CharField(max_length=80, blank=True, validators=[no_control_characters])
    configuration = models.JSONField(default=dict, blank=True, help_text="Environment and defaults applied at start.")
    compatible_vendors = models.ManyToManyField(Vendor, related_name="images")
    approved = models.BooleanField(default=False, help_text="Only approved images can be ordered.")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name", "-version"]
        constraints = [
            models.UniqueConstraint(fields=["name", "version"], name="image_name_version_unique"),
            models.CheckConstraint(
                condition=~Q(
                    *(Q(**{f"{field}__regex": CONTROL_CHARACTERS}) for field in IMAGE_TEXT_FIELDS), _connector=Q.OR
                ),
                name="image_text_without_control_characters",
                violation_error_message="An image's names, version and reference must not contain control characters.",
            ),
        ]

    def __str__(self):
        return f"{self.name}:{self.version}"


class BareMetalProfile(models.Model):
    """A whole server, installed from an approved OS image and registered into a cluster."""

    name = models.CharField(max_length=120, unique=True)
    slug = models.SlugField(max_length=60, unique=True, validators=[slug_validator])
    server_class = models.CharField(max_length=120, help_text="e.g. HGX H100 8-GPU, 2x Xeon 8480+")
    accelerator_model = models.ForeignKey(AcceleratorModel, on_delete=models.PROTECT, related_name="profiles")
    accelerator_count = models.PositiveSmallIntegerField(validators=[MinValueValidator(1)])
    cpu_cores = models.PositiveIntegerField("CPU cores", validators=[MinValueValidator(1)])
    memory_gb = models.PositiveIntegerField("memory (GiB)", validators=[MinValueValidator(1)])
    os_image = models.ForeignKey(
        Image, on_delete=models.PROTECT, related_name="bare_metal_profiles", verbose_name="OS image"
    )
    boot_method = models.CharField(
        max_length=16,
        choices=BootMethod.choices,
        default=BootMethod.VIRTUAL_MEDIA,
        help_text="Virtual media boots the OS image's ISO; PXE boots the image's kernel and initrd over the network.",
    )
    driver_version = models.CharField(max_length=40)
    monitoring_agent = models.CharField(max_length=80)
    gpu_exporter = models.CharField(
        max_length=80,
        blank=True,
        help_text="GPU metrics exporter installed beside the monitoring agent (dcgm-exporter); blank for none.",
    )
    slurm_membership = models.CharField(
        max_length=24,
        choices=SlurmMembership.choices,
        default=SlurmMembership.SHARED_CLUSTER_NO_ROOT,
        help_text="How the server joins Slurm, and whether its tenant gets root. Only a server without root for its "
        "tenant joins the shared cluster (and holds its munge key); with root it runs a cluster of its own or none.",
    )
    target_cluster = models.CharField(
        max_length=120,
        blank=True,
        help_text="The shared Slurm cluster the server registers into (shared cluster membership only).",
    )
    validation_suite = models.JSONField(default=list, blank=True, help_text="Ordered hardware checks.")
    playbooks = models.CharField(
        max_length=60,
        default="bare-metal-v1",
        validators=[slug_validator],
        help_text="The versioned set of in-band playbooks (provisioning/playbooks/<name>/) the Ansible driver runs.",
    )
    hourly_price = _money_field("server")
    max_duration_hours = models.PositiveIntegerField(validators=[MinValueValidator(1)])
    active = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        constraints = [models.CheckConstraint(condition=Q(hourly_price__gte=0), name="profile_price_non_negative")]

    def __str__(self):
        return self.name

    def clean(self):
        unknown = [check for check in self.validation_suite or [] if check not in ValidationCheck.values]
        if not isinstance(self.validation_suite, list) or unknown:
            raise ValidationError(
                {"validation_suite": f"Must be a list of checks from {', '.join(ValidationCheck.values)}."}
            )
        if (
            self.os_image_id
            and self.accelerator_model_id
            and not self.os_image.compatible_vendors.filter(pk=self.accelerator_model.vendor_id).exists()
        ):
            raise ValidationError({"os_image": "The OS image does not support this accelerator's vendor."})
        if self.slurm_membership == SlurmMembership.SHARED_CLUSTER_NO_ROOT and not self.target_cluster:
            raise ValidationError({"target_cluster": "Name the shared cluster the server registers into."})
        if self.slurm_membership != SlurmMembership.SHARED_CLUSTER_NO_ROOT and self.target_cluster:
            raise ValidationError(
                {"target_cluster": "Only a server registering into the shared cluster names one: leave it blank."}
            )
        if self.boot_method == BootMethod.PXE and self.os_image_id and not _netboot_files(self.os_image):
            raise ValidationError(
                {"boot_method": "PXE needs the OS image's configuration to name netboot kernel and initrd URLs."}
            )


def _netboot_files(image: Image) -> bool:
    netboot = (image.configuration or {}).get("netboot")
    return isinstance(netboot, dict) and all(
        str(netboot.get(key, "")).startswith("http") for key in ("kernel", "initrd")
    )


class ServingTemplate(models.Model):
    """How a model is served: runtime, replicas, context and output limits, on which spec."""

    name = models.CharField(max_length=120, unique=True)
    runtime = models.CharField(max_length=12, choices=ServingRuntime.choices)
    replicas = models.PositiveSmallIntegerField(default=1, validators=[MinValueValidator(1)])
    context_length = models.PositiveIntegerField(validators=[MinValueValidator(1)])
    max_tokens = models.PositiveIntegerField(validators=[MinValueValidator(1)])
    spec = models.ForeignKey(
        ResourceSpec, on_delete=models.PROTECT, related_name="serving_templates", help_text="Resources of one replica."
    )
    active = models.BooleanField(default=True)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.CheckConstraint(condition=Q(replicas__gte=1), name="template_replicas_positive"),
            models.CheckConstraint(
                condition=Q(max_tokens__lte=models.F("context_length")), name="template_max_tokens_within_context"
            ),
        ]

    def __str__(self):
        return self.name


class ServingModel(models.Model):
    """An approved model that may be deployed behind the gateway."""

    name = models.CharField(max_length=120)
    version = models.CharField(max_length=40)
    family = models.CharField(max_length=60, blank=True)
    parameters_billion = models.DecimalField(max_digits=7, decimal_places=2, validators=[MinValueValidator(0)])
    artifact_uri = models.CharField(max_length=300, help_text="Where the weights are mirrored internally.")
    license = models.CharField(max_length=80)
    checksum_sha256 = models.CharField(
        max_length=64, blank=True, help_text="SHA-256 of the weights file; the runtime refuses a file that differs."
    )
    max_context_length = models.PositiveIntegerField(validators=[MinValueValidator(1)])
    min_accelerator_memory_gb = models.PositiveIntegerField(
        "minimum accelerator memory (GiB)", help_text="Memory one replica needs to load."
    )
    templates = models.ManyToManyField(ServingTemplate, related_name="models")
    approved = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name", "-version"]
        constraints = [models.UniqueConstraint(fields=["name", "version"], name="serving_model_unique")]

    def __str__(self):
        return joined_without_repeat(self.name, self.version)  # "Llama 3.1 8B Instruct", whose name has its version


class Service(models.Model):
    """A catalog entry a developer orders, bundling the specs, images, profiles or models it allows."""

    name = models.CharField(max_length=120, unique=True)
    slug = models.SlugField(max_length=60, unique=True, validators=[slug_validator])
    kind = models.CharField(max_length=16, choices=ServiceKind.choices)
    description = models.TextField()
    specs = models.ManyToManyField(ResourceSpec, blank=True, related_name="services")
    images = models.ManyToManyField(Image, blank=True, related_name="services")
    bare_metal_profiles = models.ManyToManyField(BareMetalProfile, blank=True, related_name="services")
    serving_models = models.ManyToManyField(ServingModel, blank=True, related_name="services")
    default_duration_hours = models.PositiveIntegerField(validators=[MinValueValidator(1)])
    max_duration_hours = models.PositiveIntegerField(validators=[MinValueValidator(1)])
    parameter_schema = models.JSONField(
        default=default_parameter_schema,
        blank=True,
        help_text="The parameters an order may carry: a list of {name, type (int, number, string, bool, enum), "
        "label, help, required, default, min, max, max_length, choices}. Other keys are refused.",
    )
    visibility = models.CharField(max_length=12, choices=Visibility.choices, default=Visibility.ALL)
    visible_tenants = models.ManyToManyField("tenancy.Tenant", blank=True, related_name="+")
    visible_projects = models.ManyToManyField("tenancy.Project", blank=True, related_name="+")
    active = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["kind", "name"]
        constraints = [
            models.CheckConstraint(condition=Q(kind__in=ServiceKind.values), name="service_kind_valid"),
            models.CheckConstraint(
                condition=Q(default_duration_hours__lte=models.F("max_duration_hours")),
                name="service_default_duration_within_max",
            ),
        ]

    def __str__(self):
        return self.name

    def clean(self):
        problems = schema_problems(self.parameter_schema)
        if problems:
            raise ValidationError({"parameter_schema": problems})
