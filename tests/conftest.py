import contextlib
import gc
from collections import Counter

import pytest
from django.conf import settings
from django.core.cache import cache
from django.core.management import call_command
from django.db import connection, transaction
from django.test import override_settings
from pytest_django.plugin import blocking_manager_key
from rest_framework.test import APIClient

from devcluster.ldap_directory import running_directory
from devcluster.oidc_provider import running_provider
from tests import factories
from tests.devcluster_fixtures import cluster_for_tests
from tests.migrated_rows import migrated_rows_reload
from tests.module_data import asks_for_shared_data, shareable_builders, shared_by_module
from tests.smtp_server import smtp_server
from tests.template_database import migrated_template

# Fixtures that start a real daemon, a server or a browser (once per session, reset per test): a test that asks for
# one belongs to the integration layer, which `make test-fast` leaves out.
DAEMON_FIXTURES = frozenset(
    {
        "slurm_cluster",
        "podman_service",
        "_ldap_directory",
        "_identity_provider",
        "live_server",
        "redis_db",
        "served_app",
        "sushy_emulator",
        "sushy_emulator_with_auth",
        "sushy_static",
        "image_server",
        "untyped_cluster",
        "server_url",
    }
)


# Tests that share one Redis database across modules (tests/provisioning/gateway_process.py's): one xdist group, so two
# workers never flush it under each other.
SHARED_REDIS_FIXTURES = frozenset({"gateway_redis"})
# Fixtures that make a test transactional as the marker's transaction=True does (pytest-django).
TRANSACTIONAL_FIXTURES = frozenset({"transactional_db", "live_server"})
# An integration test takes about this many unit tests' time (suite durations, 2026-12-06).
INTEGRATION_TEST_WEIGHT = 50


def pytest_itemcollected(item):
    """Each test's worker group and layer, before any collection hook reads them (xdist's groups, `-m`). Every test
    that commits (transactional), asks for a daemon or is marked so runs in the integration layer. Under
    pytest-xdist (`--dist loadgroup`) a group's tests run in one worker, which starts their module's fixtures once."""
    item.add_marker(pytest.mark.xdist_group(_worker_group(item)))
    if _transactional(item) or DAEMON_FIXTURES.intersection(item.fixturenames):
        item.add_marker(pytest.mark.integration)


@pytest.hookimpl(trylast=True)  # after pytest-django's sort, which puts a group's transactional tests last
def pytest_collection_modifyitems(items):
    """A transactional test must restore the serialized database (serialized_rollback=True): its flush otherwise
    re-runs post_migrate, whose Operators group then clashes with the next restoring test's setup."""
    unrestored = [
        item.nodeid
        for item in items
        if _transactional(item)
        and not getattr(item.get_closest_marker("django_db"), "kwargs", {}).get("serialized_rollback")
    ]
    if unrestored:
        raise pytest.UsageError("Transactional tests without serialized_rollback=True: " + ", ".join(unrestored))
    items[:] = _heaviest_groups_first(items)


def _transactional(item) -> bool:
    marker = item.get_closest_marker("django_db")
    committing = marker is not None and bool(marker.kwargs.get("transaction"))
    return committing or not TRANSACTIONAL_FIXTURES.isdisjoint(item.fixturenames)


def _in_a_rolled_back_transaction(item) -> bool:
    """A database test that is not transactional (pytest-django's own sort tells them apart the same way)."""
    uses_database = item.get_closest_marker("django_db") is not None or "db" in item.fixturenames
    return uses_database and not _transactional(item)


# Whether this worker's database was emptied by a transactional test's flush since the migrated data was last there.
FLUSHED = pytest.StashKey[bool]()


@pytest.hookimpl(tryfirst=True)  # before the test's fixtures open its transaction
def pytest_runtest_setup(item):
    """A transactional test's teardown empties the database (serialized rollback restores it at the next such test's
    setup, not after). A worker runs one group's transactional tests last, then the next group's other tests, which
    need the migrated rows (content types, vendors, groups): they are loaded again once, before the first of them."""
    if item.config.stash.get(FLUSHED, False) and _in_a_rolled_back_transaction(item):
        with item.config.stash[blocking_manager_key].unblock():
            migrated_rows_reload()
        item.config.stash[FLUSHED] = False


def pytest_runtest_teardown(item):
    if _transactional(item):
        item.config.stash[FLUSHED] = True


def pytest_collection_finish(session):
    """What exists once the tests are collected (modules, Django, fixtures) lives to the end: frozen out of the
    collector's sight, and the young generation collected every 50,000 allocations rather than 700, so the collector
    stops re-walking the same long-lived graph between tests."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 20, 20)


def _heaviest_groups_first(items: list) -> list:
    """xdist hands a free worker the next group in collection order (`--no-loadscope-reorder`): the groups with the
    most integration tests (seconds each, against milliseconds for a unit test) go first, so that the last groups to
    start are short and both workers finish together. A stable sort: a group's tests keep their order, but for a
    module's tests that ask for no shared fixture, which run first (tests/module_data.py)."""
    weight, first_seen = Counter(), {}
    for index, item in enumerate(items):
        group = _worker_group(item)
        weight[group] += INTEGRATION_TEST_WEIGHT if item.get_closest_marker("integration") else 1
        first_seen.setdefault(group, index)
    module_seen = {}
    for index, item in enumerate(items):
        module_seen.setdefault(item.module, index)
    return sorted(
        items,
        key=lambda item: (
            -weight[_worker_group(item)],
            first_seen[_worker_group(item)],
            module_seen[item.module],
            asks_for_shared_data(item),  # before the module's shared rows exist (tests/module_data.py)
        ),
    )


def _worker_group(item) -> str:
    if SHARED_REDIS_FIXTURES.intersection(item.fixturenames):
        return "shared-redis"
    return item.module.__name__


@pytest.fixture(scope="session")
def django_db_modify_db_settings(django_db_modify_db_settings_parallel_suffix):
    """pytest-django's hook before the test databases are made: each is copied from the migrated template
    (tests/template_database.py) instead of migrated from nothing."""
    database = settings.DATABASES["default"]
    if database["ENGINE"].endswith("postgresql"):
        database.setdefault("TEST", {})["TEMPLATE"] = migrated_template(database)


@pytest.fixture(autouse=True, scope="session")
def _postgresql_only(django_db_setup, django_db_blocker):
    """The suite runs on PostgreSQL, like production; SQLite would hide locking and constraint behaviour."""
    with django_db_blocker.unblock():
        assert connection.vendor == "postgresql", "Tests need PostgreSQL: set DATABASE_URL or start it locally."


@pytest.fixture(autouse=True)
def _fresh_cache():
    """Throttle counters (and anything else kept in the default cache) start from nothing in each test: the tests of
    one process all call from 127.0.0.1."""
    cache.clear()


DEMO_PASSWORD = "demo-pass-for-tests"


@contextlib.contextmanager
def _module_transaction(django_db_blocker):
    """A transaction around a module's tests, rolled back after the last of them: each test runs in a savepoint inside
    it (pytest-django's TestCase atomics), as under Django's setUpTestData, and sees what was written before it."""
    with django_db_blocker.unblock():
        outer = transaction.atomic()
        outer.__enter__()
    try:
        yield
    finally:
        with django_db_blocker.unblock():
            transaction.set_rollback(True)
            outer.__exit__(None, None, None)


def _check_deferred_constraints():
    """Checks the foreign keys of the module's rows once, as they are built. Left deferred, they were checked again
    after each of the module's tests (Django's TestCase checks before rolling back the test's savepoint, and the
    rollback leaves the module's checks pending again): about a second a test after the demo's thousands of rows."""
    connection.check_constraints()


@pytest.fixture(scope="module")
def demo_once(django_db_setup, django_db_blocker):
    """The demo (seed_demo, DEBUG on, DEMO_PASSWORD) seeded once for a module's tests, in the module's transaction.
    Tests of the module that run after the first one asking for it see the demo too."""
    with django_db_blocker.unblock(), pytest.MonkeyPatch.context() as env, _module_transaction(django_db_blocker):
        env.setenv("DEMO_PASSWORD", DEMO_PASSWORD)
        with override_settings(DEBUG=True):
            call_command("seed_demo")
        _check_deferred_constraints()
        yield


@pytest.fixture(scope="module")
def _module_data(request, django_db_setup, django_db_blocker):
    """The fixtures this module's tests share (tests/module_data.py), built once in the module's transaction; none
    where they cannot be shared."""
    builders = shareable_builders([item for item in request.session.items if item.module is request.module])
    if not builders:
        yield {}
        return
    with _module_transaction(django_db_blocker):
        with django_db_blocker.unblock():
            built = {fixture: build() for fixture, build in builders.items()}
            _check_deferred_constraints()
        yield built


@pytest.fixture
def api():
    return APIClient()


@pytest.fixture
def api_as(api):
    """An API client authenticated with a real token for the given user."""

    def authenticate(user):
        api.credentials(HTTP_AUTHORIZATION=f"Token {factories.token_for(user)}")
        return api

    return authenticate


@shared_by_module
def roles():
    """One project with a member and an approver, a second project with its own developer, an operator."""
    return factories.role_matrix()


@shared_by_module
def operator():
    """A staff user in the Operators group."""
    return factories.operator()


@pytest.fixture
def console(client, operator):
    """The Django test client signed in to the operator console."""
    client.force_login(operator)
    return client


@pytest.fixture(scope="session")
def slurm_cluster():
    """A real Slurm cluster (devcluster/slurm_cluster.py) shared by the session: 3 idle nodes with gpu:a100:2 each,
    slurmrestd with a JWT, and slurmdbd keeping its books in MariaDB (a database of its own, dropped at the end). A
    missing part fails the test that asked for it (`make slurm` installs the parts)."""
    with cluster_for_tests(accounting=True) as cluster:
        yield cluster


@pytest.fixture
def slurm(slurm_cluster):
    """The session's Slurm cluster, with every job cancelled and every node resumed after the test."""
    yield slurm_cluster
    slurm_cluster.reset()


@pytest.fixture
def slurm_settings(settings, slurm):
    """Django settings pointed at the session's Slurm cluster (REST URL, user, JWT, SLURM_CONF for scontrol)."""
    settings.SLURM_REST_URL = slurm.rest_url
    settings.SLURM_USER_NAME = slurm.user_name
    settings.SLURM_JWT = slurm.token
    settings.SLURM_JWT_FILE = ""
    settings.SLURM_CONF = str(slurm.slurm_conf)
    return slurm


@pytest.fixture(scope="session")
def _smtp_server():
    with smtp_server() as running:
        yield running


@pytest.fixture
def mailbox(_smtp_server, settings):
    """A real SMTP server on the loopback (aiosmtpd), with Django's mail settings pointed at it; the mails that
    arrived during the test, parsed (tests/smtp_server.py)."""
    host, port, received = _smtp_server
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.EMAIL_HOST, settings.EMAIL_PORT, settings.EMAIL_USE_TLS = host, port, False
    settings.EMAIL_HOST_USER = settings.EMAIL_HOST_PASSWORD = ""
    settings.PUBLIC_BASE_URL = "https://compute.example.org"
    received.clear()
    yield received
    received.clear()


@pytest.fixture(scope="session")
def _ldap_directory():
    with running_directory() as directory:
        yield directory


@pytest.fixture
def directory(_ldap_directory, settings):
    """The session's OpenLDAP directory (devcluster/ldap_directory.py), as it started, with the platform's LDAP sign-in
    pointed at it (the settings config/settings.py builds from LDAP_*)."""
    from config.ldap_settings import connection_options, group_type, search

    _ldap_directory.reset()
    env = _ldap_directory.settings()
    settings.LDAP_ENABLED = True
    settings.AUTH_LDAP_SERVER_URI = env["LDAP_SERVER_URI"]
    settings.AUTH_LDAP_BIND_DN, settings.AUTH_LDAP_BIND_PASSWORD = env["LDAP_BIND_DN"], env["LDAP_BIND_PASSWORD"]
    settings.AUTH_LDAP_USER_SEARCH = search(env["LDAP_USER_SEARCH_BASE"], env["LDAP_USER_FILTER"])
    settings.AUTH_LDAP_GROUP_SEARCH = search(env["LDAP_GROUP_SEARCH_BASE"], env["LDAP_GROUP_FILTER"])
    settings.AUTH_LDAP_GROUP_TYPE = group_type(env["LDAP_GROUP_TYPE"])
    settings.AUTH_LDAP_CONNECTION_OPTIONS = connection_options(5)
    settings.AUTHENTICATION_BACKENDS = _with_backend(settings, "tenancy.directory.ldap.DirectoryLDAPBackend")
    yield _ldap_directory
    _ldap_directory.reset()


@pytest.fixture(scope="session")
def _identity_provider():
    with running_provider() as provider:
        yield provider


@pytest.fixture
def idp(_identity_provider, settings):
    """The session's OpenID Connect provider (devcluster/oidc_provider.py), its people as they started and their grants
    ended, with the platform's OIDC sign-in pointed at it."""
    _identity_provider.reset()
    env = _identity_provider.settings()
    settings.OIDC_ENABLED = True
    settings.OIDC_RP_CLIENT_ID, settings.OIDC_RP_CLIENT_SECRET = env["OIDC_CLIENT_ID"], env["OIDC_CLIENT_SECRET"]
    settings.OIDC_OP_DISCOVERY_URL = env["OIDC_DISCOVERY_URL"]
    settings.OIDC_RP_IDP_SIGN_KEY = env["OIDC_IDP_SIGN_KEY"]
    settings.OIDC_PROVIDER_NAME = env["OIDC_PROVIDER_NAME"]
    settings.AUTHENTICATION_BACKENDS = _with_backend(settings, "tenancy.directory.oidc.OIDCBackend")
    yield _identity_provider
    _identity_provider.reset()


def _with_backend(settings, backend: str) -> list[str]:
    """The authentication backends with `backend` before guardian's (as config/settings.py lists them)."""
    backends = [path for path in settings.AUTHENTICATION_BACKENDS if path != backend]
    return [*backends[:-1], backend, backends[-1]]
