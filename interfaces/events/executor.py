"""The event executor: stores the reminder an `event` action asks for, and says so."""

from __future__ import annotations

import datetime as dt

from autoresponse.actors.kernel import TypedActor, handles
from autoresponse.actors.routes import BUILDER
from autoresponse.interfaces.events.settings import EVENTS_PAST_GRACE_SECONDS
from autoresponse.interfaces.events.shared_store import SharedEventStore
from autoresponse.interfaces.events.store import DateOutOfRange, EventStore, first_due
from autoresponse.messages import ActionRequest, ActionResult, Envelope


class DateInPast(ValueError):
    """A reminder for a moment already past: it would go out at once, "N days late"."""


class EventExecutor(TypedActor):
    def __init__(self, store: EventStore | SharedEventStore) -> None:
        super().__init__()
        self.store = store

    @handles
    def on_action(self, request: ActionRequest, env: Envelope) -> None:
        payload = request.action.payload
        now = self.runtime.clock.time()
        try:
            if payload.repeat == "none":  # a repeating one starts at its next occurrence instead
                _refuse_past(first_due(payload.date, payload.time), now)
            event = self.store.add(payload, request.context, now)
        except (DateOutOfRange, DateInPast) as exc:  # refused: back through the LLM, which can tell its user
            refused = ActionResult(action_type="event", command=f"remind: {payload.description}",
                                   output=f"refused: {exc}", ok=False)
            self.send(BUILDER, request.output(refused), cause=env)
            return
        repeat = "" if event.repeat == "none" else f", repeating {event.repeat}"
        result = ActionResult(
            action_type="event", command=f"remind: {event.description}",
            output=f"reminder #{event.id} scheduled for {event.due_text}{repeat}",
        )
        self.send(BUILDER, request.output(result), cause=env)


def _refuse_past(due: float, now: float) -> None:
    """Raise DateInPast if ``due`` is more than ``EVENTS_PAST_GRACE_SECONDS`` before ``now``."""
    if due < now - EVENTS_PAST_GRACE_SECONDS:
        def local(moment: float) -> str:
            return dt.datetime.fromtimestamp(moment).astimezone().isoformat(timespec="minutes")
        raise DateInPast(f"date in the past: {local(due)} is already past (it is now {local(now)}); "
                         f"a reminder needs a date and time still to come")
