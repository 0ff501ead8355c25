"""Who may send health signals and runtime reports, and for which nodes.

Node agents authenticate with `Authorization: Agent <token>` (an AgentToken issued by an operator) and speak
only for their token's nodes. Operators (staff holding scheduling.ingest_health) authenticate with their user
token (`Authorization: Token ...`) and may speak for any node, e.g. a central exporter scraping a whole site.
"""

from django.contrib.auth.models import AnonymousUser
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import exceptions, permissions
from rest_framework.authentication import BaseAuthentication, get_authorization_header

from scheduling.inventory.agents import ANY_NODE, NodeScope, agent_token_authenticate, agent_token_scope
from scheduling.models import AgentToken

INGEST_HEALTH = "scheduling.ingest_health"


class AgentTokenAuthentication(BaseAuthentication):
    """`Authorization: Agent cca_...`: the request is the token's, not a user's (request.user stays anonymous)."""

    keyword = "Agent"

    def authenticate(self, request):
        words = get_authorization_header(request).split()
        if not words or words[0].lower() != self.keyword.lower().encode():
            return None
        if len(words) != 2:
            raise exceptions.AuthenticationFailed("Send `Authorization: Agent <token>`, the token without spaces.")
        token = agent_token_authenticate(words[1].decode("latin-1"))
        if token is None:
            raise exceptions.AuthenticationFailed("Unknown or revoked agent token.")
        return AnonymousUser(), token

    def authenticate_header(self, request):
        return self.keyword


class AgentTokenScheme(OpenApiAuthenticationExtension):
    target_class = AgentTokenAuthentication
    name = "agentToken"

    def get_security_definition(self, auto_schema):
        return {
            "type": "apiKey",
            "in": "header",
            "name": "Authorization",
            "description": "`Agent <token>`: a node agent's token, issued by an operator for its nodes.",
        }


def _is_operator_sender(user) -> bool:
    return bool(user and user.is_authenticated and user.is_staff and user.has_perm(INGEST_HEALTH))


class CanReportForNodes(permissions.BasePermission):
    """An agent token, or an operator's user token with the ingest permission."""

    message = (
        "Sending health events and runtime reports needs an agent token (Authorization: Agent ...) or an "
        "operator's token with the scheduling.ingest_health permission."
    )

    def has_permission(self, request, view):
        if isinstance(request.auth, AgentToken):
            return True
        if request.user.is_authenticated and request.user.has_perm(INGEST_HEALTH) and not request.user.is_staff:
            self.message = (
                "scheduling.ingest_health on a user who is not an operator no longer speaks for any "
                "node; node agents use an agent token (Authorization: Agent ...) issued for their nodes."
            )
            return False
        return _is_operator_sender(request.user)


def sender_scope(request) -> NodeScope:
    """The nodes this request may speak for: its agent token's, or any node for an operator."""
    return agent_token_scope(request.auth) if isinstance(request.auth, AgentToken) else ANY_NODE


def sender_actor(request):
    """The user to audit for changes: None for an agent (the platform's change, with the signal as its reason)."""
    return None if isinstance(request.auth, AgentToken) else request.user
