"""Choices of model serving."""

from django.db import models


class DeploymentState(models.TextChoices):
    """States of a model-serving deployment; the gateway routes only to serving ones."""

    DEPLOYING = "deploying", "Deploying"
    SERVING = "serving", "Serving"
    STOPPED = "stopped", "Stopped"
