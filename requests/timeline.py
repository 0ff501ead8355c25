"""A request's timeline as a service writes it: moves and notes collected in order, written in one INSERT.

A service that moves one request through several states (a submission: submitted, admitted, approved, queued)
collects its events here and writes them together once the request row is saved, rather than one INSERT per
event. A new request's events get its id at `write()`, after the row's INSERT gave it one.
"""

from django_fsm import TransitionNotAllowed

from config.errors import Conflict
from requests.models import RequestEvent, ResourceRequest
from requests.notifications import announce_events
from tenancy.models import User


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
        """Insert the collected events (the request must be saved) and announce them after commit."""
        for event in self.events:
            event.request = self.request
        written = RequestEvent.objects.bulk_create(self.events)
        announce_events(written)
        self.events = []
        return written
