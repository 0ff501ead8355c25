"""A dropped database connection (pg_terminate_backend of the test's own connection, as a server restart or a proxy
would drop it) is never a bare 500: a read runs once more on a fresh connection, and otherwise the answer is 503
with Retry-After in the API's error shape (config/database.py)."""

import contextlib

import psycopg
import pytest
from django.db import connection
from django.db.backends.signals import connection_created

from requests import services
from requests.choices import RequestState
from tests.requests.conftest import make_order

# Terminating connections needs them outside the per-test transaction.
pytestmark = pytest.mark.django_db(transaction=True, serialized_rollback=True)


def terminate(pid: int) -> None:
    """End that database backend from a connection of our own, and wait until it is gone."""
    with psycopg.connect(**connection.get_connection_params(), autocommit=True) as other:
        other.execute("SELECT pg_terminate_backend(%s, 5000)", [pid])


def drop_the_connection() -> None:
    connection.ensure_connection()
    terminate(connection.connection.info.backend_pid)


@contextlib.contextmanager
def every_new_connection_dropped():
    """The database keeps dropping connections: each new one is terminated the moment it opens."""

    def drop(sender, connection, **_kwargs):
        terminate(connection.connection.info.backend_pid)

    connection_created.connect(drop)
    try:
        yield
    finally:
        connection_created.disconnect(drop)


@pytest.fixture
def ordered(shop, team):
    return services.request_submit(order=make_order(shop, team.project), requester=team.developer)


def test_a_read_on_a_dropped_connection_is_answered_from_a_fresh_one(ordered, api_as):
    api = api_as(ordered.requester)
    drop_the_connection()

    response = api.get(f"/api/v1/requests/{ordered.pk}/")

    assert response.status_code == 200, response.content
    assert response.json()["id"] == ordered.pk


def test_a_read_that_loses_its_connection_twice_is_a_503_with_retry_after(ordered, api_as):
    api = api_as(ordered.requester)
    drop_the_connection()

    with every_new_connection_dropped():
        response = api.get(f"/api/v1/requests/{ordered.pk}/")

    assert response.status_code == 503
    assert response["Retry-After"] == "2"
    assert response.json() == {
        "code": "database_unavailable",
        "message": "The database connection was lost while answering; try again in a few seconds.",
        "details": {"retry_after_seconds": 2},
    }
    assert api.get(f"/api/v1/requests/{ordered.pk}/").status_code == 200  # and the next call is answered


def test_a_write_on_a_dropped_connection_is_not_repeated_and_changes_nothing(ordered, api_as):
    api = api_as(ordered.requester)
    drop_the_connection()

    response = api.post(f"/api/v1/requests/{ordered.pk}/cancel/", {"reason": "changed my mind"}, format="json")

    assert (response.status_code, response["Retry-After"], response.json()["code"]) == (
        503,
        "2",
        "database_unavailable",
    )
    ordered.refresh_from_db()
    assert ordered.state == RequestState.QUEUED


def test_a_page_on_a_dropped_connection_is_answered_from_a_fresh_one(ordered, client):
    client.force_login(ordered.requester)
    drop_the_connection()

    response = client.get(f"/requests/{ordered.pk}/")

    assert response.status_code == 200
    assert f"#{ordered.pk}" in response.content.decode()


def test_a_page_that_loses_its_connection_twice_is_a_503_not_a_500(ordered, client):
    client.force_login(ordered.requester)
    drop_the_connection()

    with every_new_connection_dropped():
        response = client.get(f"/requests/{ordered.pk}/")

    assert (response.status_code, response["Retry-After"]) == (503, "2")
    assert "try again in a few seconds" in response.content.decode()
