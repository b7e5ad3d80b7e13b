"""The event executor: stores the reminder an `event` action asks for, and says so.

Whatever storing it raises is that one action's failure, told to the LLM (which can tell
its user): never a crash of the executor, whose restarts would hold up every chat's reminders."""

from __future__ import annotations

import logging

from autoresponse.actors.kernel import TypedActor, handles
from autoresponse.actors.routes import BUILDER
from autoresponse.interfaces.events.shared_store import SharedEventStore
from autoresponse.interfaces.events.store import DateInPast, DateOutOfRange, EventStore
from autoresponse.messages import ActionRequest, ActionResult, Envelope

log = logging.getLogger("autoresponse.events")


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
            self._not_stored(request, env, f"refused: {exc}")
            return
        except Exception as exc:
            # A store that fails (a read-only file, a closed connection, a bug): a crash would
            # try the action again to no avail, then drop it, and hold up the other chats' meanwhile.
            log.exception("storing the reminder %r failed", payload.description)
            self._not_stored(request, env, f"failed: the reminder could not be stored "
                                           f"({type(exc).__name__}: {exc})")
            return
        repeat = "" if event.repeat == "none" else f", repeating {event.repeat}"
        result = ActionResult(
            action_type="event", command=f"remind: {event.description}",
            output=f"reminder #{event.id} scheduled for {event.due_text}{repeat}",
        )
        self.send(BUILDER, request.output(result), cause=env)

    def _not_stored(self, request: ActionRequest, env: Envelope, why: str) -> None:
        """The reminder was not stored, and why: back through the LLM, which tells its user."""
        result = ActionResult(action_type="event", command=f"remind: {request.action.payload.description}",
                              output=why, ok=False)
        self.send(BUILDER, request.output(result), cause=env)
