"""Queued requests as the order preview and the forecast of new work read them: plain rows (not model instances), and
the rows a process keeps between calls (`kept_rows`) so that previews during a backlog do not read the same frozen
snapshots again and again."""

from dataclasses import dataclass, fields
from datetime import datetime

from requests.models import ResourceRequest


@dataclass(frozen=True)
class Queued:
    """A queued request as demand_of and queue_order read it, with its approved duration: a preview places up to a
    few hundred of them, and building model instances (each with its state machine's bookkeeping) cost more than
    placing them."""

    pk: int
    priority: str
    project_id: int
    created_at: datetime
    approved_spec: dict
    cpu_cores: int
    memory_gb: int
    duration_hours: int


QUEUED_FIELDS = [field.name for field in fields(Queued)]


def as_queued(rows) -> list[Queued]:
    return [Queued(*row) for row in rows.values_list(*QUEUED_FIELDS)]


class UnseenRows:
    """The rows of queued requests, read once per process rather than on every preview: while a backlog builds up
    between cycles every preview places the same first requests (those queued since the last cycle, and the queue's
    head the expected start replays), and reading their frozen snapshots (JSON) was most of a preview's time. A
    request's row does not change while it waits (what it needs is frozen when it is approved), except its priority,
    which comes with its id from the index every time: a row kept under another priority is read again, and so is one
    of another submission time (an id used again, as after a database is flushed)."""

    LIMIT = 2000  # then the kept rows start over (ten times what a preview places behind the last cycle)

    def __init__(self):
        self.kept: dict[int, Queued] = {}

    def rows(self, keys: list[tuple[int, str, datetime]]) -> list[Queued]:
        # One dict for the whole call: a threaded server's other call may start the kept rows over meanwhile.
        kept = self.kept
        missing = [key[0] for key in keys if self._key(kept.get(key[0])) != key]
        if len(kept) + len(missing) > self.LIMIT:
            kept = self.kept = {}
            missing = [key[0] for key in keys]
        if missing:
            for pk in missing:  # kept under another priority or time: read again, or left out if gone
                kept.pop(pk, None)
            kept.update((row.pk, row) for row in as_queued(ResourceRequest.objects.filter(pk__in=missing)))
        # One gone since its id was read (cancelled, placed) is left out, as it would have been a moment later.
        return [row for row in map(kept.get, (key[0] for key in keys)) if row is not None]

    @staticmethod
    def _key(row: Queued | None) -> tuple | None:
        return None if row is None else (row.pk, row.priority, row.created_at)


kept_rows = UnseenRows()
