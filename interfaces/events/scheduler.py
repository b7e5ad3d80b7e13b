"""The event scheduler: due reminders go through the LLM to the chat they came from.

A reminder is marked delivered only when the sender confirms the reply went
out (a send receipt). One that was handed to the LLM but never confirmed (the
daemon stopped, the send failed) is still pending in its store, so it is tried
again, late, with how late it is; but never while its turn is still under way
(a slow LLM, a backlog), which would deliver it twice. When several daemons share
the reminders (NATS), only the holder of the "reminders" lease hands them out.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict

from autoresponse.actors.inbound import dead_letter_malformed
from autoresponse.actors.kernel import TypedActor, handles
from autoresponse.actors.polling import SharedPoller
from autoresponse.actors.routes import BUILDER, sender
from autoresponse.interfaces.events.settings import EventsSettings
from autoresponse.interfaces.events.shared_store import SharedEventStore
from autoresponse.interfaces.events.store import EventStore, UnreadableEvent
from autoresponse.messages import DueEvent, Envelope, EventDue, OutboundMessage, SendReceipt

log = logging.getLogger("autoresponse.events")


#: The scheduler's actor name.
EVENTS = "events"


class Tick(BaseModel):
    model_config = ConfigDict(frozen=True)


class TurnsEnded(BaseModel):
    """The turns of the reminders one check handed out (``keys``, in the check's
    ``correlation``) have all ended."""

    model_config = ConfigDict(frozen=True)
    correlation: str
    keys: tuple[str, ...]


@dataclass
class _Handed:
    """An occurrence handed to the LLM and not confirmed yet."""

    turn: str  # the correlation its turn runs in
    ended: float | None = None  # when that turn ended; None while it is under way


def _key(event_id: int, due: float) -> str:
    return f"{event_id}@{due!r}"


GIVE_UP_NOTICE = "Sorry, I could not deliver your reminder ({description}): {why}"


class EventScheduler(TypedActor):
    """Hands due reminders to the LLM, and counts each occurrence's failures.

    An occurrence is delivered once its reply's send is confirmed. One that fails
    (the LLM unreachable, re-asks exhausted, the send refused, or no word within
    ``unconfirmed_seconds`` after its turn ended) is tried again with backoff, at most
    ``max_attempts`` times; then it is given up: one notice to its chat, and a dead letter
    that the operator can replay. A stored reminder that cannot be read is given up at
    once: a dead letter naming it, and the others go out as usual.
    """

    def __init__(self, store: EventStore | SharedEventStore, settings: EventsSettings) -> None:
        super().__init__()
        self.store = store
        self._shared: SharedPoller | None = None
        self.settings = settings
        self._handed: dict[str, _Handed] = {}  # by receipt key

    def setup(self) -> None:
        # Several daemons share the reminders: only the holder of this lease hands them out.
        self._shared = SharedPoller.of(self.runtime.journal, "reminders")
        if self._shared is not None:
            self.start_task(self._lead(self._shared), "reminders lease")
        self.schedule(0, Tick())

    async def _lead(self, shared: SharedPoller) -> None:
        """Hold the reminders' lease for as long as this incarnation lives."""
        try:
            await shared.start()
            await asyncio.Event().wait()
        finally:
            shared.release()

    @handles
    def on_tick(self, tick: Tick, env: Envelope) -> None:
        now = self.runtime.clock.time()  # due times are wall times, on the runtime's clock
        try:
            if self._shared is not None and not self._shared.holding:
                return  # another daemon hands out the reminders
            unconfirmed = self.settings.unconfirmed_seconds
            for key in [k for k, handed in self._handed.items()
                        if handed.ended is not None and now - handed.ended >= unconfirmed]:
                self._failed(key, f"no confirmation within {unconfirmed:g}s of its turn's end", env)
            keys: list[str] = []
            for event in self.store.due(now):
                if isinstance(event, UnreadableEvent):  # given up by the store: it is not read again
                    dead_letter_malformed(self, event.raw, "unreadable reminder",
                                          f"reminder #{event.id} cannot be read, given up: {event.reason}")
                    continue
                key = _key(event.id, event.due)
                if key in self._handed:
                    continue  # its turn is under way, or ended moments ago and may yet be confirmed
                self._handed[key] = _Handed(turn=env.correlation_id)
                keys.append(key)
                context = event.context.model_copy(update={"receipt_to": self.name, "receipt_key": key})
                due = DueEvent(description=event.description, due=event.due_text,
                               late_seconds=max(0.0, now - event.due))
                self.send(BUILDER, EventDue(context=context, event=due), cause=env)
            if keys:  # their turns are this check's work: when it has all ended, so have they
                self.runtime.when_finished(env.correlation_id, self.name,
                                           TurnsEnded(correlation=env.correlation_id, keys=tuple(keys)))
        finally:
            self.schedule(self.settings.check_seconds, Tick())

    @handles
    def on_turns_ended(self, ended: TurnsEnded, env: Envelope) -> None:
        """Those still unconfirmed now wait ``unconfirmed_seconds`` for a late word, then
        count as failed (a turn lost in a restart is tried again by the next incarnation)."""
        now = self.runtime.clock.time()
        for key in ended.keys:
            handed = self._handed.get(key)
            if handed is not None and handed.turn == ended.correlation:  # not a later try of it
                handed.ended = now

    @handles
    def on_receipt(self, receipt: SendReceipt, env: Envelope) -> None:
        if receipt.key not in self._handed:
            return  # already counted (a late word after its confirmation timed out)
        if receipt.ok:
            event_id, due = _parse_key(receipt.key)
            self.store.delivered(event_id, due, self.runtime.clock.time())
            self._handed.pop(receipt.key, None)
            return
        self._failed(receipt.key, receipt.detail, env)

    def _failed(self, key: str, why: str, env: Envelope) -> None:
        self._handed.pop(key, None)
        event_id, due = _parse_key(key)
        known = self.store.get(event_id)
        tries = (known.failures if known is not None else 0) + 1
        event = self.store.failed(event_id, due, why, max_attempts=self.settings.max_attempts,
                                  retry_in=self.settings.retry_backoff().delay(tries),
                                  now=self.runtime.clock.time())
        if event is None or event.state != "failed":
            log.warning("reminder #%s was not delivered (%s); try %d of %d", event_id, why, tries,
                        self.settings.max_attempts)
            return
        # Given up: the operator can replay it from the dead letters, and the user hears once.
        due_event = DueEvent(description=event.description, due=event.due_text)
        self.runtime.dead_letters.post(
            env.child(EventDue(context=event.context, event=due_event)), "reminder undeliverable",
            actor=BUILDER, detail=f"reminder #{event_id} failed {event.failures} times; last: {why}")
        notice_to = sender(event.context.interface_name)
        if self.runtime.has(notice_to):
            text = GIVE_UP_NOTICE.format(description=event.description, why=why)
            self.send(notice_to, OutboundMessage.reply(event.context, text, notice=True), cause=env)


def _parse_key(key: str) -> tuple[int, float]:
    event_id, due = key.split("@")
    return int(event_id), float(due)


def due_in(seconds: float) -> tuple[dt.date, dt.time]:
    """A date and time ``seconds`` from now, for an `event` payload."""
    when = dt.datetime.now().astimezone() + dt.timedelta(seconds=seconds)
    return when.date(), when.time().replace(microsecond=0)
