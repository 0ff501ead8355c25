"""The placement engine is pure Python: these tests need no database, so the suite-wide PostgreSQL check is skipped."""

import pytest


@pytest.fixture(autouse=True, scope="session")
def _postgresql_only():
    """Overrides the suite-wide fixture of the same name: nothing here touches a database."""
