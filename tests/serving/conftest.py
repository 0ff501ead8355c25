"""Fixtures: the serving tests order endpoints through the whole pipeline (quota, approval, scheduling,
provisioning), so they use provisioning's shop, order helper and gateway processes."""

from tests.provisioning.conftest import redis_db, run_on_commit, serving, shop, team  # noqa: F401  (fixtures)
from tests.provisioning.gateway_process import gateway_redis, gateways  # noqa: F401  (fixtures)
