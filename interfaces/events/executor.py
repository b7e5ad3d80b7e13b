"""The event executor: stores the reminder an `event` action asks for, and says so."""

from __future__ import annotations

from autoresponse.actors.kernel import TypedActor, handles
from autoresponse.actors.routes import BUILDER
from autoresponse.interfaces.events.shared_store import SharedEventStore
from autoresponse.interfaces.events.store import DateInPast, DateOutOfRange, EventStore
from autoresponse.messages import ActionRequest, ActionResult, Envelope


class EventExecutor(TypedActor):
    def __init__(self, store: EventStore | SharedEventStore) -> None:
        super().__init__()
        self.store = store

    @handles
    def on_action(self, request: ActionRequest, env: Envelope) -> None:
        payload = request.action.payload
        try:
            event = self.store.add(payload, request.context, self.runtime.clock.time())
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
