"""Fuzzing in the suite: schemathesis drives every operation of the live OpenAPI (stateless phases and the stateful
one) against the app under gunicorn on the test PostgreSQL database, as anonymous, a developer, a developer of
another tenant, an approver and an operator. Any 5xx fails, and so does any error body that is not
{code, message, details} (tests/config/fuzz_checks.py).

schemathesis imports the PyPI `requests`, which our `requests` app shadows, so it runs from its own virtualenv
(`make fuzz-venv`, part of `make test`) as a subprocess. The data is the demo's (two tenants, a catalog, a
cluster, usage history), so ids in paths and bodies name real objects. Examples per operation and the time per
role are bounded, and the seed is fixed, to keep the test within the CI budget and repeatable.
"""

import os
import subprocess
from pathlib import Path

import httpx
import pytest
from django.contrib.auth.models import Permission

from tenancy.management.commands.seed_demo import run_demo_seeds
from tests import factories
from tests.config.conftest import REPO

pytestmark = pytest.mark.django_db(transaction=True, serialized_rollback=True)

SCHEMATHESIS = REPO / ".venv-fuzz" / "bin" / "schemathesis"
CHECKS = Path(__file__).with_name("fuzz_checks.py")
SEED = 20261201
MAX_EXAMPLES = 10  # per operation and phase, in each round
# Each role's time budget: schemathesis repeats its fuzzing and stateful rounds until it is spent (and stops there),
# so the five roles take about 5 x this, whatever the machine's speed.
SECONDS_PER_ROLE = 25
ROLES = {
    "anonymous": None,
    "developer": "developer",
    "other_tenant_developer": "developer2",
    "approver": "approver",
    "operator": "operator",
}


@pytest.fixture
def tokens():
    """The demo's people, each with an API token; the operator may also send health events."""
    users = run_demo_seeds(factories.PASSWORD)["users"]
    users["operator"].user_permissions.add(Permission.objects.get(codename="ingest_health"))
    return {role: username and factories.token_for(users[username]) for role, username in ROLES.items()}


def _fuzz(schema: Path, base_url: str, token: str | None, report: Path) -> subprocess.CompletedProcess:
    command = [
        str(SCHEMATHESIS),
        "run",
        str(schema),
        "--url",
        base_url,
        "--phases",
        "examples,coverage,fuzzing,stateful",
        "--checks",
        "not_a_server_error,error_body_shape",
        "--max-examples",
        str(MAX_EXAMPLES),
        "--max-time",
        str(SECONDS_PER_ROLE),
        "--seed",
        str(SEED),
        "--generation-database",
        "none",
        "--no-shrink",
        "--continue-on-failure",
        "--request-timeout",
        "30",
        "--workers",
        "1",
        "--no-color",
        "--report",
        "junit",
        "--report-junit-path",
        str(report),
    ]
    if token:
        command += ["--header", f"Authorization: Token {token}"]
    env = {**os.environ, "SCHEMATHESIS_HOOKS": str(CHECKS)}
    return subprocess.run(
        command, cwd=report.parent, env=env, capture_output=True, text=True, timeout=SECONDS_PER_ROLE * 4
    )


def _failures_section(output: str) -> str:
    """What schemathesis found (each failure with its curl reproduction), without the run's progress and warnings."""
    start, summary = output.find(" FAILURES "), output.rfind(" SUMMARY ")
    found = output[start : output.find(" WARNINGS ", start)] if start >= 0 else output
    return found[:8000] + (output[summary:] if summary >= 0 else "")


def test_no_operation_answers_5xx_or_an_unshaped_error_for_any_role(served_app, tokens, tmp_path):
    assert SCHEMATHESIS.exists(), f"{SCHEMATHESIS} is missing: run `make fuzz-venv` (part of `make test`)"
    base_url, server_log = served_app
    schema = tmp_path / "openapi.json"  # fetched once: generating it is slow, and it is the same for every role
    schema.write_bytes(httpx.get(f"{base_url}/api/schema/?format=json", timeout=60).raise_for_status().content)

    failures = {}
    for role, token in tokens.items():
        result = _fuzz(schema, base_url, token, tmp_path / f"{role}.xml")
        if result.returncode != 0:
            failures[role] = _failures_section(result.stdout) + result.stderr[-2000:]

    assert not failures, "\n\n".join(f"===== {role} =====\n{output}" for role, output in failures.items()) + (
        f"\n\n===== server log =====\n{server_log.read_text()[-4000:]}"
    )
