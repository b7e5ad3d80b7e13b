"""The event scheduler: due reminders go through the LLM to the chat they came from.

A reminder is marked delivered only when the sender confirms the reply went
out (a send receipt). One that was handed to the LLM but never confirmed (the
daemon stopped, the send failed) is still pending in its store, so it is tried
again, late, with how late it is; but never while its turn is still under way
(a slow LLM, a backlog; also after the scheduler alone crashed and was restarted),
which would deliver it twice. When several daemons share the reminders (NATS),
only the holder of the "reminders" lease hands them out.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging

from pydantic import BaseModel, ConfigDict

from autoresponse.actors.inbound import dead_letter_malformed
from autoresponse.actors.kernel import IoTask, TypedActor, handles
from autoresponse.actors.polling import SharedPoller
from autoresponse.actors.routes import BUILDER, sender
from autoresponse.interfaces.events.settings import EventsSettings
from autoresponse.interfaces.events.shared_store import SharedEventStore
from autoresponse.interfaces.events.store import EventStore, StoredEvent, UnreadableEvent
from autoresponse.messages import DueEvent, Envelope, EventDue, OutboundMessage, SendReceipt

log = logging.getLogger("autoresponse.events")


#: The scheduler's actor name.
EVENTS = "events"


class Tick(BaseModel):
    model_config = ConfigDict(frozen=True)


def _key(event_id: int, due: float) -> str:
    return f"{event_id}@{due!r}"


GIVE_UP_NOTICE = "Sorry, I could not deliver your reminder ({description}): {why}"
#: A repeating reminder's: only this occurrence is given up.
GIVE_UP_REPEAT_NOTICE = ("Sorry, I could not deliver your reminder ({description}) due {due}: {why}. "
                         "It will come again at its next time, {next}.")


class EventScheduler(TypedActor):
    """Hands due reminders to the LLM, and counts each occurrence's failures.

    An occurrence is delivered once its reply's send is confirmed. One that fails
    (the LLM unreachable, re-asks exhausted, the send refused, or no word within
    ``unconfirmed_seconds`` after its turn ended) is tried again with backoff, at most
    ``max_attempts`` times; then it is given up: one notice to its chat, and a dead letter
    that the operator can replay; a repeating reminder goes on at its next occurrence (the
    first after then), a one-off has failed. A stored reminder that cannot be read is given
    up at once: a dead letter naming it, and the others go out as usual. A receipt whose
    key is not one of ours is logged and ignored (raising, it would crash each incarnation).

    What is in turn is kept in the store, not in this actor, so that a new incarnation (the
    scheduler crashed, its supervisor restarted it) does not hand out again what its
    predecessor did. The rule: an occurrence is marked in turn before it is handed out,
    with its turn (the check's correlation) and the store's ``opening`` (one per run of the
    daemon). A mark of this opening holds it while the runtime has work of its turn in
    flight, and for ``unconfirmed_seconds`` after a check first finds that turn ended (when
    is kept in the mark); then, still unconfirmed, it counts as a failed try. A mark of
    another opening holds nothing: that run of the daemon ended, and its turns with it, so
    the occurrence goes out again at once (late, saying so) and is never lost.
    """

    def __init__(self, store: EventStore | SharedEventStore, settings: EventsSettings) -> None:
        super().__init__()
        self.store = store
        self._shared: SharedPoller | None = None
        self.settings = settings
        self._timer: IoTask | None = None  # the next check's

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
            for event in self.store.due(now):
                if isinstance(event, UnreadableEvent):  # given up by the store: it is not read again
                    dead_letter_malformed(self, event.raw, "unreadable reminder",
                                          f"reminder #{event.id} cannot be read, given up: {event.reason}")
                elif event.turn is None or event.turn_by != self.store.opening:
                    self._hand_out(event, now, env)  # not in turn, or its daemon's run is over
                elif event.turn_ended is None:
                    if not self.runtime.inflight.count(event.turn):  # it ended since the last check
                        self.store.turn_ended(event.id, event.turn, now)
                elif now - event.turn_ended >= unconfirmed:
                    self._failed(event.id, event.due, f"no confirmation within {unconfirmed:g}s of its "
                                 "turn's end", env)
                # else its turn is under way, or ended moments ago and may yet be confirmed
        finally:
            # One timer: a check retried after a crash sets one, as the new incarnation's first does.
            self.cancel(self._timer)
            self._timer = self.schedule(self.settings.check_seconds, Tick())

    def _hand_out(self, event: StoredEvent, now: float, env: Envelope) -> None:
        """To the LLM, in this check's turn: marked in turn first, so that a crash after
        the mark still holds it (its turn, this check, ends once the check is done)."""
        self.store.handed(event.id, event.due, env.correlation_id)
        key = _key(event.id, event.due)
        context = event.context.model_copy(update={"receipt_to": self.name, "receipt_key": key})
        due = DueEvent(description=event.description, due=event.due_text,
                       late_seconds=max(0.0, now - event.due))
        self.send(BUILDER, EventDue(context=context, event=due), cause=env)

    @handles
    def on_receipt(self, receipt: SendReceipt, env: Envelope) -> None:
        parsed = _parse_key(receipt.key)
        if parsed is None:
            log.warning("a send receipt for no reminder (key %.80r): ignored", receipt.key)
            return
        event_id, due = parsed
        event = self.store.get(event_id)
        if event is None or event.state != "pending" or event.due != due:
            return  # delivered, given up, or moved on already
        if receipt.ok:  # it went out (even a late word, after its try was counted failed)
            ended = self.store.delivered(event_id, due, self.runtime.clock.time())
            if ended is not None:
                log.warning("reminder #%s (%s) repeats no more: %s", event_id, event.description, ended)
        elif event.turn_by == self.store.opening:  # else counted already (no word in time)
            self._failed(event_id, due, receipt.detail, env)

    def _failed(self, event_id: int, due: float, why: str, env: Envelope) -> None:
        known = self.store.get(event_id)
        tries = (known.failures if known is not None else 0) + 1
        counted = self.store.failed(event_id, due, why, max_attempts=self.settings.max_attempts,
                                    retry_in=self.settings.retry_backoff().delay(tries),
                                    now=self.runtime.clock.time())
        if counted is None:
            return  # done with already (delivered, given up, moved on)
        event = counted.event
        if not counted.given_up:
            log.warning("reminder #%s was not delivered (%s); try %d of %d", event_id, why, tries,
                        self.settings.max_attempts)
            return
        if counted.ended is not None:
            log.warning("reminder #%s (%s) repeats no more: %s", event_id, event.description, counted.ended)
        # Given up: the operator can replay this occurrence from the dead letters, and the user hears once.
        lost = event.model_copy(update={"due": due})  # a repeating one is at its next occurrence now
        due_event = DueEvent(description=event.description, due=lost.due_text)
        self.runtime.dead_letters.post(
            env.child(EventDue(context=event.context, event=due_event)), "reminder undeliverable",
            actor=BUILDER, detail=f"reminder #{event_id} failed {tries} times; last: {why}")
        notice_to = sender(event.context.interface_name)
        if self.runtime.has(notice_to):
            notice = GIVE_UP_REPEAT_NOTICE if event.state == "pending" else GIVE_UP_NOTICE
            text = notice.format(description=event.description, why=why, due=lost.due_text,
                                 next=event.due_text)
            self.send(notice_to, OutboundMessage.reply(event.context, text, notice=True), cause=env)


def _parse_key(key: str) -> tuple[int, float] | None:
    """The reminder and occurrence a receipt's key names, or None if ``_key`` did not make it
    (a receipt meant for another, a damaged one)."""
    event_id, _, due = key.partition("@")
    try:
        parsed = int(event_id), float(due)
    except ValueError:
        return None
    # As made, exactly; and an id SQLite can hold (a larger one raises in the store).
    return parsed if _key(*parsed) == key and 0 < parsed[0] < 2**63 else None


def due_in(seconds: float) -> tuple[dt.date, dt.time]:
    """A date and time ``seconds`` from now, for an `event` payload."""
    when = dt.datetime.now().astimezone() + dt.timedelta(seconds=seconds)
    return when.date(), when.time().replace(microsecond=0)
