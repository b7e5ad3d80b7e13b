"""The event scheduler: due reminders go through the LLM to the chat they came from.

A reminder is marked delivered only when the sender confirms the reply went
out (a send receipt). One that was handed to the LLM but never confirmed (the
daemon stopped, the send failed) is still pending in SQLite, so it is tried
again, late, with how late it is.
"""

from __future__ import annotations

import datetime as dt
import logging
import time

from pydantic import BaseModel, ConfigDict

from autoresponse.actors import TypedActor, handles
from autoresponse.actors.routes import BUILDER
from autoresponse.interfaces.events.settings import EventsSettings
from autoresponse.interfaces.events.store import EventStore
from autoresponse.messages import DueEvent, Envelope, EventDue, SendReceipt

log = logging.getLogger("autoresponse.events")


#: The scheduler's actor name.
EVENTS = "events"


class Tick(BaseModel):
    model_config = ConfigDict(frozen=True)


def _key(event_id: int, due: float) -> str:
    return f"{event_id}@{due!r}"


class EventScheduler(TypedActor):
    def __init__(self, store: EventStore, settings: EventsSettings) -> None:
        super().__init__()
        self.store = store
        self.settings = settings
        self._handed: dict[str, float] = {}  # receipt key → when it was handed to the LLM

    def setup(self) -> None:
        self.schedule(0, Tick())

    @handles
    def on_tick(self, tick: Tick, env: Envelope) -> None:
        now = time.time()
        try:
            for event in self.store.due(now):
                key = _key(event.id, event.due)
                if now - self._handed.get(key, float("-inf")) < self.settings.unconfirmed_seconds:
                    continue
                self._handed[key] = now
                context = event.context.model_copy(update={"receipt_to": self.name, "receipt_key": key})
                due = DueEvent(description=event.description, due=event.due_text,
                               late_seconds=max(0.0, now - event.due))
                self.send(BUILDER, EventDue(context=context, event=due), cause=env)
        finally:
            self.schedule(self.settings.check_seconds, Tick())

    @handles
    def on_receipt(self, receipt: SendReceipt, env: Envelope) -> None:
        event_id, due = receipt.key.split("@")
        if receipt.ok:
            self.store.delivered(int(event_id), float(due), time.time())
            self._handed.pop(receipt.key, None)
            return
        event = self.store.failed(int(event_id), receipt.detail)
        if event is not None and event.state == "failed":
            self.runtime.dead_letters.post(env, "reminder undeliverable", actor=self.name,
                                           detail=f"reminder #{event_id}: {receipt.detail}")
        log.warning("reminder #%s was not delivered (%s); it stays pending", event_id, receipt.detail)


def due_in(seconds: float) -> tuple[dt.date, dt.time]:
    """A date and time ``seconds`` from now, for an `event` payload."""
    when = dt.datetime.now().astimezone() + dt.timedelta(seconds=seconds)
    return when.date(), when.time().replace(microsecond=0)
