"""Counting the queries a page or endpoint costs, for the constant-query-count tests."""

from django.db import connection
from django.test.utils import CaptureQueriesContext


def queries_for(client, url: str, **params) -> int:
    """How many queries one successful GET of `url` runs."""
    with CaptureQueriesContext(connection) as queries:
        response = client.get(url, params)
    assert response.status_code == 200, response.content[:500]
    return len(queries)
