"""Scheduled events: the `event` action stores a reminder; the scheduler delivers it
through the LLM when it is due, and marks it delivered only once its send is confirmed."""

from autoresponse.interfaces.events.executor import EventExecutor
from autoresponse.interfaces.events.scheduler import EventScheduler, Tick, due_in
from autoresponse.interfaces.events.settings import EventsSettings
from autoresponse.interfaces.events.store import EventStore, StoredEvent, first_due, next_due

__all__ = ["EventExecutor", "EventScheduler", "EventStore", "EventsSettings", "StoredEvent", "Tick",
           "due_in", "first_due", "next_due"]
