"""Reminders in a JetStream key-value bucket, for daemons that share one bot.

The same interface as ``EventStore`` (SQLite, one daemon). Each reminder is one
value, changed compare-and-set on its revision; ids come from a counter in the same
bucket. Only the daemon holding the scheduler's lease hands due reminders to the
LLM (``EventScheduler``), so a reminder is not sent once per daemon.

>>> store = SharedEventStore(journal)                               # doctest: +SKIP
>>> event = store.add(payload, context)                            # doctest: +SKIP
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from typing import Any

from autoresponse.actors.journal.jetstream import compare_and_set
from autoresponse.interfaces.events.actions import EventPayload
from autoresponse.interfaces.events.store import (
    FailedTry,
    StoredEvent,
    UnreadableEvent,
    after_delivery,
    after_failure,
    read_event,
    scheduled,
    unreadable_reason,
)
from autoresponse.messages import OriginalContext

EVENTS_BUCKET = "autoresponse_events"
_COUNTER = "next-id"
_EVENT = "event-"  # and the reminder's id: its key


class SharedEventStore:
    """Thread-safe (every call runs on the journal's loop thread)."""

    def __init__(self, journal: Any) -> None:
        self._journal = journal
        self._kv = journal.bucket(EVENTS_BUCKET)
        #: This opening of the store (one per daemon run): the reminders in turn it marked.
        self.opening = uuid.uuid4().hex

    def close(self) -> None:
        """Nothing of its own to close: the journal owns the connection."""

    async def _raw(self, key: str) -> bytes | None:
        """One value as stored; None if there is none."""
        from nats.js.errors import KeyDeletedError, KeyNotFoundError

        try:
            entry = await self._kv.get(key)
        except (KeyNotFoundError, KeyDeletedError):
            return None
        return entry.value  # type: ignore[no-any-return]

    async def _change(self, key: str, change: Callable[[dict[str, Any] | None], dict[str, Any] | None]) -> None:
        """Apply ``change`` to one value (another daemon may write it too)."""
        def apply(data: bytes | None) -> bytes | None:
            changed = change(_load(data))
            return None if changed is None else _dump(changed)
        await compare_and_set(self._kv, key, apply)

    def add(self, payload: EventPayload, context: OriginalContext, now: float | None = None) -> StoredEvent:
        """Store a new reminder (``scheduled`` at ``now``)."""
        due, first = scheduled(payload, now)

        async def add() -> int:
            got: list[int] = []

            def bump(value: dict[str, Any] | None) -> dict[str, Any]:
                got[:] = [(value or {"id": 0})["id"] + 1]
                return {"id": got[0]}
            await self._change(_COUNTER, bump)
            await self._kv.put(f"event-{got[0]}", _dump({
                "id": got[0], "context": context.model_dump(mode="json"), "description": payload.description,
                "repeat": payload.repeat, "due": due, "state": "pending", "failures": 0, "next_try": None,
                "last_error": None, "created": time.time(), "first_local": first.isoformat()}))
            return got[0]
        event = self.get(self._journal.run(add()))
        assert event is not None
        return event

    def get(self, event_id: int) -> StoredEvent | None:
        """The reminder, or None if there is none (or it cannot be read)."""
        key = f"{_EVENT}{event_id}"
        found = read_value(key, self._journal.run(self._raw(key)))
        return found if isinstance(found, StoredEvent) else None

    def due(self, now: float) -> list[StoredEvent | UnreadableEvent]:
        """Pending occurrences that are due and not waiting out a failure's backoff; and
        each value that cannot be read, once: it is given up here, so it is never read again."""
        async def everything() -> list[tuple[str, bytes | None]]:
            from nats.js.errors import NoKeysError

            try:
                keys = await self._kv.keys()
            except NoKeysError:
                return []
            ours = [k for k in keys if k.startswith(_EVENT) and k[len(_EVENT):].isdigit()]
            return [(k, await self._raw(k)) for k in ours]
        due: list[StoredEvent] = []
        unreadable: list[UnreadableEvent] = []
        for key, data in self._journal.run(everything(), timeout=60):
            found = read_value(key, data)
            if isinstance(found, UnreadableEvent):
                self._journal.run(compare_and_set(self._kv, key, _give_up(data, found.reason)))
                unreadable.append(found)
            elif found is not None and found.state == "pending" and found.due <= now \
                    and (found.next_try is None or found.next_try <= now):
                due.append(found)
        return [*unreadable, *sorted(due, key=lambda event: event.due)]

    def handed(self, event_id: int, due: float, turn: str) -> None:
        """As ``EventStore.handed``: in turn, marked by this opening of the store."""
        def mark(value: dict[str, Any] | None) -> dict[str, Any] | None:
            if value is None or value["due"] != due or value["state"] != "pending":
                return None
            return {**value, "turn": turn, "turn_by": self.opening, "turn_ended": None}
        self._journal.run(self._change(f"{_EVENT}{event_id}", mark))

    def turn_ended(self, event_id: int, turn: str, now: float) -> None:
        """As ``EventStore.turn_ended``."""
        def end(value: dict[str, Any] | None) -> dict[str, Any] | None:
            if value is None or value.get("turn") != turn or value.get("turn_ended") is not None:
                return None
            return {**value, "turn_ended": now}
        self._journal.run(self._change(f"{_EVENT}{event_id}", end))

    def delivered(self, event_id: int, due: float, now: float) -> str | None:
        """As ``EventStore.delivered``: move on, or finish (why early, if it did)."""
        ended: list[str] = []

        def move_on(value: dict[str, Any] | None) -> dict[str, Any] | None:
            ended.clear()  # a compare-and-set may apply it again
            if value is None or value["due"] != due:
                return None  # already moved on
            changes, why = after_delivery(value, now)
            if why is not None:
                ended.append(why)
            return {**value, **changes}
        self._journal.run(self._change(f"{_EVENT}{event_id}", move_on))
        return ended[0] if ended else None

    def failed(self, event_id: int, due: float, error: str, *, max_attempts: int,
               retry_in: float, now: float | None = None) -> FailedTry | None:
        """As ``EventStore.failed``: count it; try again in ``retry_in`` s, or give it up."""
        at = time.time() if now is None else now
        counted: list[tuple[bool, str | None]] = []

        def count(value: dict[str, Any] | None) -> dict[str, Any] | None:
            counted.clear()  # a compare-and-set may apply it again
            if value is None or value["due"] != due or value["state"] != "pending":
                return None
            changes, given_up, ended = after_failure(value, error, max_attempts=max_attempts,
                                                     retry_at=at + retry_in, now=at)
            counted.append((given_up, ended))
            return {**value, **changes}
        self._journal.run(self._change(f"{_EVENT}{event_id}", count))
        event = self.get(event_id)
        return None if not counted or event is None else FailedTry(event, *counted[0])


def _load(data: bytes | None) -> dict[str, Any] | None:
    if not data:
        return None
    value = json.loads(data)
    if not isinstance(value, dict):
        raise ValueError(f"a reminder is a JSON object, not {type(value).__name__}")
    return value


def read_value(key: str, data: bytes | None) -> StoredEvent | UnreadableEvent | None:
    """One reminder's value, read on its own (one that cannot be read holds up no other):
    its reminder, an ``UnreadableEvent`` if it is pending (or says nothing of its state)
    and cannot be read, or None if there is none. One delivered or given up is not looked
    at further: what cannot be read of it matters to nobody."""
    value = None
    try:
        value = _load(data)
        return None if value is None else read_event(value)
    except (ValueError, TypeError, KeyError) as exc:  # pydantic's ValidationError is a ValueError
        if isinstance(value, dict) and value.get("state") in ("delivered", "failed"):
            return None
        raw = (data or b"").decode("utf-8", "replace")
        return UnreadableEvent(id=int(key[len(_EVENT):]), reason=unreadable_reason(exc), raw=raw)


def _give_up(data: bytes | None, reason: str) -> Callable[[bytes | None], bytes | None]:
    """The change that marks an unreadable value given up, keeping what it held (unless it
    was written meanwhile: then it is read again)."""
    def change(current: bytes | None) -> bytes | None:
        if current != data:
            return None
        return _dump({"state": "failed", "last_error": f"unreadable: {reason}",
                      "unreadable": (data or b"").decode("utf-8", "replace")})
    return change


def _dump(value: dict[str, Any]) -> bytes:
    """A reminder's value in the bucket: the SQLite row's columns, as JSON."""
    return json.dumps(value).encode()


