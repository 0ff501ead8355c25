"""Task entry points retry briefly when the embedded SQLite database stays locked past its busy timeout.

With WAL and IMMEDIATE transactions (config/settings.py) writers queue for the busy timeout instead of failing;
a task that still meets "database is locked" (a very long writer) runs again, whole, after a short pause: every
task is idempotent. PostgreSQL never raises this error, so there it changes nothing.
"""

import functools
import logging
import time

from django.db import OperationalError, close_old_connections

logger = logging.getLogger(__name__)

ATTEMPTS = 3
PAUSE_SECONDS = 1.0


def retry_if_locked(task):
    @functools.wraps(task)
    def run(*args, **kwargs):
        for attempt in range(1, ATTEMPTS + 1):
            try:
                return task(*args, **kwargs)
            except OperationalError as error:
                if "database is locked" not in str(error) or attempt == ATTEMPTS:
                    raise
                logger.warning("%s: database is locked (attempt %s of %s); retrying", task.__name__, attempt, ATTEMPTS)
                close_old_connections()
                time.sleep(PAUSE_SECONDS * attempt)

    return run
