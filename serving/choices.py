"""Choices of model serving."""

from django.db import models


class DeploymentState(models.TextChoices):
    """States of a model-serving deployment; the gateway routes only to serving ones."""

    DEPLOYING = "deploying", "Deploying"
    SERVING = "serving", "Serving"
    SCALING_TO_ZERO = "scaling_to_zero", "Scaling to zero: stopping its servers"
    SCALED_TO_ZERO = "scaled_to_zero", "Scaled to zero (woken by its next call)"
    WAKING = "waking", "Waking: starting a replica"
    STOPPED = "stopped", "Stopped"


# Deployments going to, at or coming back from zero replicas: the gateways keep their route (a call wakes them) while
# their request lives.
ASLEEP_STATES = (DeploymentState.SCALING_TO_ZERO, DeploymentState.SCALED_TO_ZERO, DeploymentState.WAKING)
