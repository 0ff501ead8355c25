"""Node agents' tokens: issued by operators for nodes or a site, shown once, revocable, audited.

An agent speaks only for its token's nodes: health signals and runtime reports about other nodes' devices or
allocations are refused item by item (`not_your_node`) and change nothing. Operators (staff holding
`scheduling.ingest_health`, e.g. a central exporter) send with their user token and may name any node.
"""

from dataclasses import dataclass
from datetime import timedelta

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from config.errors import Conflict, DomainError
from config.tokens import prefixed_secret_new, prefixed_secret_prefix, secret_hash, secret_matches
from scheduling.models import AgentToken, Node, Site
from tenancy.models import User
from tenancy.services import audit_record

TOKEN_KIND = "cca"
NOT_YOUR_NODE = "not_your_node"
# Writing last_used_at on every scrape would turn each report into a write; a minute's precision is enough.
LAST_USED_PRECISION = timedelta(minutes=1)


@dataclass(frozen=True)
class IssuedAgentToken:
    token: AgentToken
    secret: str  # the whole token; the only time anyone sees it


@dataclass(frozen=True)
class NodeScope:
    """The nodes a sender speaks for (id -> name); `None` nodes means any node (an operator)."""

    nodes: dict[int, str] | None = None

    def refusal(self, item: dict) -> dict:
        """The per-item refusal body: which item, and the nodes this sender may speak for."""
        return {
            "code": NOT_YOUR_NODE,
            "message": "This agent token does not speak for the node of this item; nothing was changed for it.",
            "details": {**item, "your_nodes": sorted(self.nodes.values())},
        }


ANY_NODE = NodeScope()


def agent_token_scope(token: AgentToken) -> NodeScope:
    """Every node of the site as it is now (nodes added to the site later are covered), or the listed nodes (a
    listed node deleted since is simply gone: the token never widens to the site)."""
    nodes = Node.objects.filter(rack__site_id=token.site_id) if token.whole_site else token.nodes.all()
    return NodeScope(dict(nodes.values_list("pk", "name")))


def _check_nodes(site: Site | None, nodes: list[Node]) -> None:
    if site is None and not nodes:
        raise DomainError("Name the nodes the agent speaks for, or a site.", code="nodes_required")
    outside = sorted(
        node.name for node in nodes if site is not None and (node.rack_id is None or node.rack.site_id != site.pk)
    )
    if outside:
        raise DomainError(
            f"{', '.join(outside)} not in site {site.name}.",
            code="node_outside_site",
            details={"site": site.name, "nodes": outside},
        )


@transaction.atomic
def agent_token_issue(
    *, name: str, nodes: list[Node], site: Site | None = None, actor: User | None
) -> IssuedAgentToken:
    """A new agent token for the nodes (or the site's nodes); the secret is returned once and never stored."""
    if not name.strip():
        raise DomainError("Give the token a name (what uses it).", code="name_required")
    nodes = list(Node.objects.select_related("rack").filter(pk__in=[node.pk for node in nodes]))
    _check_nodes(site, nodes)
    prefix, secret = prefixed_secret_new(TOKEN_KIND)
    token = AgentToken.objects.create(
        name=name.strip()[:80],
        prefix=prefix,
        hashed=secret_hash(secret),
        site=site,
        whole_site=not nodes,
        created_by=actor if actor is not None and actor.is_authenticated else None,
    )
    token.nodes.set(nodes)
    audit_record(
        actor=actor,
        action="agent_token.issued",
        target=token,
        data={"site": site.name if site else None, "nodes": sorted(node.name for node in nodes)},
    )
    return IssuedAgentToken(token, secret)


@transaction.atomic
def agent_token_revoke(*, token: AgentToken, reason: str, actor: User | None) -> AgentToken:
    """The token stops working at once; the row stays for the audit trail."""
    reason = (reason or "").strip()
    if not reason:
        raise DomainError("Give a reason; it goes on the audit record.", code="reason_required")
    token = AgentToken.objects.select_for_update().get(pk=token.pk)
    if token.revoked_at is not None:
        raise Conflict("This agent token is already revoked.", code="token_revoked", details={"token": token.prefix})
    token.revoked_at = timezone.now()
    token.save(update_fields=["revoked_at"])
    audit_record(actor=actor, action="agent_token.revoked", target=token, reason=reason)
    return token


def agent_token_authenticate(secret: str) -> AgentToken | None:
    """The active token this secret belongs to (its last use noted), or None: unknown, malformed or revoked."""
    prefix = prefixed_secret_prefix(TOKEN_KIND, secret)
    token = AgentToken.objects.filter(prefix=prefix, revoked_at__isnull=True).first() if prefix else None
    if token is None or not secret_matches(token.hashed, secret):
        return None
    now = timezone.now()
    AgentToken.objects.filter(
        Q(last_used_at__isnull=True) | Q(last_used_at__lt=now - LAST_USED_PRECISION), pk=token.pk
    ).update(last_used_at=now)
    return token
