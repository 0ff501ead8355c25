"""Node agents for the tests: an API client carrying a real agent token issued for some nodes or a site."""

from rest_framework.test import APIClient

from scheduling.inventory.agents import agent_token_issue


def agent_api(nodes=(), site=None, name="node-agent") -> APIClient:
    issued = agent_token_issue(name=name, nodes=list(nodes), site=site, actor=None)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Agent {issued.secret}")
    return client
