"""What the request page and API show of a model-serving deployment: endpoint, replica health, tokens, keys."""

from django.urls import reverse

from serving import usage
from serving.choices import ASLEEP_STATES
from serving.deployments import endpoint_url, example_curl
from serving.models import ApiKey, ServingDeployment


def _key_data(key: ApiKey) -> dict:
    return {
        "id": key.pk,
        "name": key.name,
        "prefix": key.prefix,
        "created_at": key.created_at,
        "last_used_at": key.last_used_at,
        "revoked_at": key.revoked_at,
        "expires_at": key.expires_at,
        "rotated": key.replaced_by_id is not None,
        "active": key.active,
        "rotate_url": reverse("serving-key-rotate", args=[key.pk]),
        "revoke_url": reverse("serving-key-revoke", args=[key.pk]),
    }


def project_keys(project_id: int) -> list[dict]:
    return [_key_data(key) for key in ApiKey.objects.filter(project_id=project_id).order_by("-created_at")]


def endpoint_details(request, base_url: str | None = None) -> dict | None:
    """The request's deployment (four queries), or None for other kinds of request (asked nothing)."""
    if request.serving_model_id is None:
        return None
    deployment = ServingDeployment.objects.filter(request=request).first()
    if deployment is None:
        return None
    url = endpoint_url(deployment, base_url)
    return {
        "url": url,
        "slug": deployment.slug,
        "model": deployment.model_name,
        "state": deployment.state,
        "state_label": deployment.get_state_display(),
        "asleep": deployment.state in ASLEEP_STATES,
        "scaled_to_zero_at": deployment.scaled_to_zero_at,
        "rate_limit_per_minute": deployment.rate_limit_per_minute,
        "monthly_token_budget": deployment.monthly_token_budget,
        "replicas": list(
            deployment.replicas.order_by("name").values("name", "healthy", "checked_at", "last_error", "devices")
        ),
        "tokens_this_month": usage.month_totals(deployment),
        "keys": project_keys(deployment.project_id),
        "create_key_url": reverse("serving-key-create", args=[request.pk]),
        "curl": example_curl(url, deployment.model_name),
    }
