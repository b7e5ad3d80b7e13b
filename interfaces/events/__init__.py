"""Scheduled events: the `event` action stores a reminder; the scheduler delivers it
through the LLM when it is due, and marks it delivered only once its send is confirmed."""

from __future__ import annotations

from autoresponse.actors import routes
from autoresponse.interfaces.events.actions import EventAction, EventPayload
from autoresponse.interfaces.events.executor import EventExecutor
from autoresponse.interfaces.events.scheduler import EVENTS, EventScheduler, Tick, due_in
from autoresponse.interfaces.events.settings import EventsSettings
from autoresponse.interfaces.events.shared_store import SharedEventStore
from autoresponse.interfaces.events.store import EventStore, StoredEvent, first_due, next_due
from autoresponse.supervisors import ChildSpec, Mount, Platform


def _mount(m: Mount) -> None:
    store: EventStore | SharedEventStore
    if getattr(m.journal, "distributed", False):  # several daemons: one store, one scheduler
        store = SharedEventStore(m.journal)
    else:
        store = EventStore(m.data_dir / "events.sqlite3")
    m.on_close(store.close)
    m.expose(store)
    m.pipeline(ChildSpec(routes.executor("event"), EventExecutor, (store,)))
    m.inbound(ChildSpec(EVENTS, EventScheduler, (store, m.settings)))


PLATFORM = Platform("events", EventsSettings, _mount, actions=(EventAction,))

__all__ = ["EVENTS", "PLATFORM", "EventAction", "EventExecutor", "EventPayload", "EventScheduler",
           "EventStore", "EventsSettings", "StoredEvent", "Tick", "due_in", "first_due", "next_due"]
