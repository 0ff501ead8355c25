"""A request's timeline as a service writes it: moves and notes collected in order, written in one INSERT.

A service that moves one request through several states (a submission: submitted, admitted, approved, queued)
collects its events here and writes them together once the request row is saved, rather than one INSERT per
event. A new request's events get its id at `write()`, after the row's INSERT gave it one.

`write_events` is the one place a request's timeline is written, for single moves and the scheduler's batches
alike: every event that moves the state also goes to the shared audit trail (tenancy's AuditEvent, action
`request.<new state>`) with its actor and reason, in the same transaction.
"""

from django_fsm import TransitionNotAllowed

from config.errors import Conflict
from requests.models import RequestEvent, ResourceRequest
from requests.notifications import announce_events
from tenancy.models import User
from tenancy.services import audit_records, audit_row


def _reason(event: RequestEvent) -> str:
    """The reason someone gave (a cancellation's, an operator's comment), else the event's own sentence."""
    data = event.data or {}
    given = data.get("reason") or data.get("comment")
    return given if isinstance(given, str) and given.strip() else event.message


def write_events(events: list[RequestEvent]) -> list[RequestEvent]:
    """Insert timeline events (their requests saved), audit each move of state in the shared trail, and announce
    the events after commit."""
    written = RequestEvent.objects.bulk_create(events)
    audit_records(
        rows=[
            audit_row(
                actor=event.actor,
                action=f"request.{event.to_state}",
                target=event.request,
                target_repr=f"Request #{event.request_id}",
                reason=_reason(event),
                data={"from": event.from_state, "to": event.to_state, "code": event.code, "event": event.pk},
            )
            for event in written
            if event.is_transition
        ]
    )
    announce_events(written)
    return written


class Timeline:
    def __init__(self, request: ResourceRequest):
        self.request = request
        self.events: list[RequestEvent] = []

    def move(self, transition: str, *, actor: User | None, code: str, message: str, data: dict | None = None,
             intervention: bool = False) -> None:  # fmt: skip
        """Run the request's FSM transition in memory and note it; an illegal move is a 409 and changes nothing."""
        before = self.request.state
        try:
            getattr(self.request, transition)()
        except TransitionNotAllowed as refusal:
            raise Conflict(
                f"Request #{self.request.pk} is {self.request.get_state_display().lower()}; "
                f"'{transition.replace('_', ' ')}' is not possible from there.",
                code="illegal_transition",
                details={"state": before, "action": transition},
            ) from refusal
        self.note(actor=actor, code=code, message=message, data=data, from_state=before, intervention=intervention)

    def note(self, *, actor: User | None, code: str, message: str, data: dict | None = None,
             from_state: str | None = None, intervention: bool = False) -> None:  # fmt: skip
        """An entry, timed when written; without from_state a note that leaves the state as it is. `intervention`
        marks a manual operator action (the zero-touch KPI counts them)."""
        self.events.append(
            RequestEvent(
                actor=actor if actor is not None and actor.is_authenticated else None,
                from_state=from_state if from_state is not None else self.request.state,
                to_state=self.request.state,
                code=code,
                message=message,
                data=data or {},
                intervention=intervention,
            )
        )

    def write(self) -> list[RequestEvent]:
        """Insert the collected events (the request must be saved), audit its moves, announce them after commit."""
        for event in self.events:
            event.request = self.request
        written = write_events(self.events)
        self.events = []
        return written
