"""manage.py agent_token issue --name NAME (--node NODE ... | --site SITE [--node NODE ...]) [--by USERNAME]
manage.py agent_token revoke PREFIX --reason TEXT [--by USERNAME]"""

from django.core.management.base import BaseCommand, CommandError

from config.errors import DomainError
from scheduling.inventory.agents import agent_token_issue, agent_token_revoke
from scheduling.models import AgentToken, Node, Site
from tenancy.models import User


class Command(BaseCommand):
    help = """Issue or revoke a node agent's token (audited). An agent sends health signals and runtime reports
with `Authorization: Agent <token>` and speaks only for the token's nodes: the --node list, or with --site alone
every node of that site (including nodes added later). The token is printed once; only its hash is stored.
See docs/agents.md."""

    def add_arguments(self, parser):
        actions = parser.add_subparsers(dest="action", required=True)
        issue = actions.add_parser("issue", help="Issue a token and print it (once).")
        issue.add_argument("--name", required=True, help="What uses it, e.g. the agent's host name.")
        issue.add_argument("--node", action="append", default=[], help="A node it speaks for (repeatable).")
        issue.add_argument("--site", default="", help="A site: all its nodes, or the --node list within it.")
        issue.add_argument("--by", default="", help="Username of the operator issuing it (for the audit row).")
        revoke = actions.add_parser("revoke", help="Revoke a token by its prefix.")
        revoke.add_argument("prefix")
        revoke.add_argument("--reason", required=True)
        revoke.add_argument("--by", default="", help="Username of the operator revoking it (for the audit row).")

    def handle(self, *args, action: str, by: str, **options):
        actor = self._actor(by)
        try:
            if action == "issue":
                issued = agent_token_issue(
                    name=options["name"],
                    nodes=self._nodes(options["node"]),
                    site=self._site(options["site"]),
                    actor=actor,
                )
                self.stdout.write(issued.secret)
            else:
                token = AgentToken.objects.filter(prefix=options["prefix"]).first()
                if token is None:
                    raise CommandError(f"No agent token with prefix {options['prefix']}.")
                agent_token_revoke(token=token, reason=options["reason"], actor=actor)
                self.stdout.write(f"Revoked {token}.")
        except DomainError as refusal:
            raise CommandError(refusal.message) from refusal

    def _actor(self, username: str) -> User | None:
        actor = User.objects.filter(username=username).first() if username else None
        if username and actor is None:
            raise CommandError(f"No user {username}.")
        return actor

    def _nodes(self, names: list[str]) -> list[Node]:
        nodes = list(Node.objects.filter(name__in=names))
        missing = sorted(set(names) - {node.name for node in nodes})
        if missing:
            raise CommandError(f"No such node: {', '.join(missing)}.")
        return nodes

    def _site(self, name: str) -> Site | None:
        site = Site.objects.filter(name=name).first() if name else None
        if name and site is None:
            raise CommandError(f"No such site: {name}.")
        return site
