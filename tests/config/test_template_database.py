"""The migrated template test databases are copied from: another checkout's run never drops one still in use."""

from django.db import connection
from psycopg import sql

from tests.template_database import PREFIX, _server, _use_key, drop_unused_templates

OTHER_CHECKOUT = PREFIX + "0123456789abcdef"  # a template of other migrations (or another Django release)


def _exists(server) -> bool:
    return server.execute("SELECT 1 FROM pg_database WHERE datname = %s", [OTHER_CHECKOUT]).fetchone() is not None


def test_a_template_another_run_copies_from_is_kept_and_dropped_once_that_run_ends():
    settings = connection.settings_dict
    with _server(settings) as builder, _server(settings) as other_run:
        builder.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(OTHER_CHECKOUT)))
        try:
            other_run.execute("SELECT pg_advisory_lock_shared(%s)", [_use_key(OTHER_CHECKOUT)])
            drop_unused_templates(builder)
            assert _exists(builder)  # the other run still copies from it
            other_run.execute("SELECT pg_advisory_unlock_shared(%s)", [_use_key(OTHER_CHECKOUT)])
            drop_unused_templates(builder)
            assert not _exists(builder)
        finally:
            builder.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(OTHER_CHECKOUT)))
