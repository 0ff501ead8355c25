"""The placement engine tests are pure Python and need no database, so they skip the suite-wide PostgreSQL check;
every other module here (health ingestion, the scheduling cycle, ...) keeps it."""

import pytest


def _uses_database(module, session) -> bool:
    return any(
        item.module is module
        and (
            "db" in item.fixturenames
            or "transactional_db" in item.fixturenames
            or item.get_closest_marker("django_db") is not None
        )
        for item in session.items
    )


@pytest.fixture(autouse=True, scope="module")
def _postgresql_only(request):
    """Overrides the suite-wide fixture of the same name: runs it only for modules with a test that uses the DB."""
    if _uses_database(request.module, request.session):
        request.getfixturevalue("_postgresql_only")  # the suite-wide check in tests/conftest.py
