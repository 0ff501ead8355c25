"""Fixture data built once for a test module instead of once for each of its tests, as Django's TestCase.setUpTestData
does for a class: the module's tests run in savepoints inside one transaction, rolled back after the last of them,
and each test gets its own deep copy of the objects, so what one test changes (rows or objects) the next never sees.

A fixture is shared this way only where no test can tell: in a module whose every database test that asks for a
shared fixture asks for it, whose tests asking for none run first (no test meets rows it did not ask for) and that has
no transactional test (its flush would empty the shared transaction). Elsewhere it is built for each test, as before.
Building the same project and catalog for every test was most of the unit layer's time (a project with its people
costs about 45 queries)."""

import copy
from collections.abc import Callable

import pytest

# The fixture function each shared fixture is (as pytest resolves a test's fixture names) -> what builds its objects.
_BUILDERS: dict[Callable, Callable[[], object]] = {}
# A test that asks for one of these commits or flushes: its module shares nothing.
_TRANSACTIONAL_FIXTURES = frozenset(
    {"transactional_db", "django_db_reset_sequences", "django_db_serialized_rollback", "live_server"}
)


def shared_by_module(build: Callable[[], object]):
    """A fixture (named as `build`) of `build()`'s objects, which need nothing but the database: built once per module
    where no test can tell (see above), for each test elsewhere."""

    def fixture(db, _module_data: dict[Callable, object]):
        if fixture in _module_data:
            return copy.deepcopy(_module_data[fixture])
        return build()

    fixture.__name__, fixture.__qualname__, fixture.__doc__ = build.__name__, build.__qualname__, build.__doc__
    _BUILDERS[fixture] = build
    return pytest.fixture(fixture)


def shareable_builders(items: list[pytest.Item]) -> dict[Callable, Callable[[], object]]:
    """The shared fixtures that one module's selected tests (`items`, in the order they run) can share: those that
    every database test asking for any of them asks for, in the order the first of those asks. A database test that
    asks for none must run before them (`asks_for_shared_data` orders the tests so) and none may commit or flush."""
    database_tests = [item for item in items if _uses_database(item)]
    asking = [item for item in database_tests if asks_for_shared_data(item)]
    if (
        not asking
        or any(_is_transactional(item) for item in database_tests)
        or database_tests[-len(asking) :] != asking
    ):
        return {}
    return {
        fixture: _BUILDERS[fixture]
        for fixture in _shared_fixtures(asking[0])
        if all(fixture in _shared_fixtures(item) for item in asking)
    }


def asks_for_shared_data(item: pytest.Item) -> bool:
    """Whether the test asks for a shared fixture; a module's tests that do not run first (tests/conftest.py sorts
    them so), before its shared rows exist."""
    return bool(_shared_fixtures(item))


def _shared_fixtures(item: pytest.Item) -> list[Callable]:
    return [fixture for name in item.fixturenames if (fixture := _resolved(item, name)) in _BUILDERS]


def _resolved(item: pytest.Item, name: str) -> Callable | None:
    """The fixture function that `name` means for this test (a module may define its own `team`)."""
    definitions = item._fixtureinfo.name2fixturedefs.get(name)
    return definitions[-1].func if definitions else None


def _uses_database(item: pytest.Item) -> bool:
    return (
        item.get_closest_marker("django_db") is not None
        or "db" in item.fixturenames
        or "_django_db_helper" in item.fixturenames
        or _is_transactional(item)
    )


def _is_transactional(item: pytest.Item) -> bool:
    marker = item.get_closest_marker("django_db")
    return bool(marker is not None and marker.kwargs.get("transaction")) or bool(
        _TRANSACTIONAL_FIXTURES.intersection(item.fixturenames)
    )
