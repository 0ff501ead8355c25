"""Model serving: a request's deployment behind the gateway, its replicas (one allocation each) and the project's
API keys that call it."""

from django.conf import settings
from django.db import models
from django.utils import timezone
from django_fsm import ConcurrentTransitionMixin, FSMField, transition

from serving.choices import DeploymentState


class ServingDeployment(ConcurrentTransitionMixin, models.Model):
    """A model-serving request's endpoint behind the gateway: /serve/<slug>/v1/... while it is serving."""

    request = models.OneToOneField("requests.ResourceRequest", on_delete=models.PROTECT, related_name="deployment")
    project = models.ForeignKey("tenancy.Project", on_delete=models.PROTECT, related_name="deployments")
    slug = models.SlugField(max_length=80, unique=True)
    model_name = models.CharField(max_length=160, help_text="The model id clients send, as /v1/models lists it.")
    state = FSMField(max_length=16, choices=DeploymentState.choices, default=DeploymentState.DEPLOYING, protected=True)
    rate_limit_per_minute = models.PositiveIntegerField(help_text="Requests per minute per API key.")
    monthly_token_budget = models.PositiveBigIntegerField(
        null=True, blank=True, help_text="Input + output tokens a month; empty = none."
    )
    created_at = models.DateTimeField(auto_now_add=True)
    stopped_at = models.DateTimeField(null=True, blank=True)
    scaled_to_zero_at = models.DateTimeField(
        null=True, blank=True, help_text="When it last left the rotation to go down to no replica."
    )
    wake_requested = models.BooleanField(
        default=False, help_text="A call came while its servers were stopping: woken once they have."
    )

    class Meta:
        ordering = ["-created_at"]

    def __str__(self):
        return self.slug

    # A retried provisioning routes a deployment again after the failure's cleanup stopped it; a woken one serves
    # again once its replica answers.
    @transition(
        field=state,
        source=[DeploymentState.DEPLOYING, DeploymentState.STOPPED, DeploymentState.WAKING],
        target=DeploymentState.SERVING,
    )
    def serve(self):
        self.stopped_at = None

    @transition(
        field=state,
        source=[
            DeploymentState.DEPLOYING,
            DeploymentState.SERVING,
            DeploymentState.SCALING_TO_ZERO,
            DeploymentState.SCALED_TO_ZERO,
            DeploymentState.WAKING,
        ],
        target=DeploymentState.STOPPED,
    )
    def stop(self):
        self.stopped_at = timezone.now()

    # Out of rotation while its servers stop; at zero once every one of them has stopped and freed its cards.
    @transition(field=state, source=DeploymentState.SERVING, target=DeploymentState.SCALING_TO_ZERO)
    def scale_to_zero(self):
        self.scaled_to_zero_at = timezone.now()
        self.wake_requested = False

    @transition(field=state, source=DeploymentState.SCALING_TO_ZERO, target=DeploymentState.SCALED_TO_ZERO)
    def reach_zero(self):
        pass

    @transition(field=state, source=DeploymentState.SCALED_TO_ZERO, target=DeploymentState.WAKING)
    def wake(self):
        pass


class ServingReplica(models.Model):
    deployment = models.ForeignKey(ServingDeployment, on_delete=models.CASCADE, related_name="replicas")
    name = models.CharField(max_length=40)
    allocation = models.ForeignKey(
        "scheduling.Allocation",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="serving_replicas",
        help_text="The allocation (node and devices) the replica runs on.",
    )
    url = models.URLField(
        "URL", max_length=200, blank=True, help_text="Where the gateway sends this replica's traffic."
    )
    pid = models.PositiveIntegerField(null=True, blank=True)
    devices = models.JSONField(default=list, blank=True)
    healthy = models.BooleanField(default=False)
    checked_at = models.DateTimeField(null=True, blank=True)
    last_error = models.CharField(max_length=300, blank=True)

    class Meta:
        ordering = ["deployment", "name"]
        constraints = [models.UniqueConstraint(fields=["deployment", "name"], name="replica_name_unique")]

    def __str__(self):
        return f"{self.deployment.slug}/{self.name}"


class ApiKey(models.Model):
    """A project's key for its deployments: shown once, stored as a SHA-256 hash, found by its public prefix."""

    project = models.ForeignKey("tenancy.Project", on_delete=models.CASCADE, related_name="api_keys")
    name = models.CharField(max_length=80)
    prefix = models.CharField(max_length=12, unique=True)
    hashed = models.CharField(max_length=64)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    replaced_by = models.OneToOneField(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="replaces", help_text="Set when rotated."
    )
    expires_at = models.DateTimeField(
        null=True,
        blank=True,
        help_text="Set when rotated: the key keeps working until then (the grace period its owner chose).",
    )

    class Meta:
        ordering = ["project", "-created_at"]
        verbose_name = "API key"

    def __str__(self):
        return f"{self.name} ({self.prefix}…)"

    @property
    def active(self) -> bool:
        return self.revoked_at is None and (self.expires_at is None or self.expires_at > timezone.now())
