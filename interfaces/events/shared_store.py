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
from collections.abc import Callable
from typing import Any

from autoresponse.actors.journal.jetstream import compare_and_set
from autoresponse.interfaces.events.actions import EventPayload
from autoresponse.interfaces.events.store import StoredEvent, first_due, next_due
from autoresponse.messages import OriginalContext

EVENTS_BUCKET = "autoresponse_events"
_COUNTER = "next-id"


class SharedEventStore:
    """Thread-safe (every call runs on the journal's loop thread)."""

    def __init__(self, journal: Any) -> None:
        self._journal = journal
        self._kv = journal.bucket(EVENTS_BUCKET)

    def close(self) -> None:
        """Nothing of its own to close: the journal owns the connection."""

    async def _read(self, key: str) -> tuple[dict[str, Any] | None, int | None]:
        from nats.js.errors import KeyDeletedError, KeyNotFoundError

        try:
            entry = await self._kv.get(key)
        except (KeyNotFoundError, KeyDeletedError):
            return None, None
        return _load(entry.value), entry.revision

    async def _change(self, key: str, change: Callable[[dict[str, Any] | None], dict[str, Any] | None]) -> None:
        """Apply ``change`` to one value (another daemon may write it too)."""
        def apply(data: bytes | None) -> bytes | None:
            changed = change(_load(data))
            return None if changed is None else _dump(changed)
        await compare_and_set(self._kv, key, apply)

    def add(self, payload: EventPayload, context: OriginalContext) -> StoredEvent:
        due = first_due(payload.date, payload.time)

        async def add() -> int:
            got: list[int] = []

            def bump(value: dict[str, Any] | None) -> dict[str, Any]:
                got[:] = [(value or {"id": 0})["id"] + 1]
                return {"id": got[0]}
            await self._change(_COUNTER, bump)
            await self._kv.put(f"event-{got[0]}", _dump({
                "id": got[0], "context": context.model_dump(mode="json"), "description": payload.description,
                "repeat": payload.repeat, "due": due, "state": "pending", "failures": 0, "next_try": None,
                "last_error": None, "created": time.time()}))
            return got[0]
        event = self.get(self._journal.run(add()))
        assert event is not None
        return event

    def get(self, event_id: int) -> StoredEvent | None:
        value, _ = self._journal.run(self._read(f"event-{event_id}"))
        return None if value is None else _event(value)

    def due(self, now: float) -> list[StoredEvent]:
        """Pending occurrences that are due and not waiting out a failure's backoff."""
        async def everything() -> list[dict[str, Any]]:
            from nats.js.errors import NoKeysError

            try:
                keys = await self._kv.keys()
            except NoKeysError:
                return []
            values = [(await self._read(k))[0] for k in keys if k.startswith("event-")]
            return [v for v in values if v is not None]
        due = [v for v in self._journal.run(everything(), timeout=60)
               if v["state"] == "pending" and v["due"] <= now and (v["next_try"] is None or v["next_try"] <= now)]
        return [_event(v) for v in sorted(due, key=lambda v: v["due"])]

    def delivered(self, event_id: int, due: float, now: float) -> None:
        """The occurrence at ``due`` was confirmed sent: move on to the next, or finish."""
        def move_on(value: dict[str, Any] | None) -> dict[str, Any] | None:
            if value is None or value["due"] != due:
                return None  # already moved on
            following = next_due(due, value["repeat"], now)
            if following is None:
                return {**value, "state": "delivered", "failures": 0, "next_try": None}
            return {**value, "due": following, "failures": 0, "next_try": None}
        self._journal.run(self._change(f"event-{event_id}", move_on))

    def failed(self, event_id: int, due: float, error: str, *, max_attempts: int,
               retry_in: float, now: float | None = None) -> StoredEvent | None:
        """As ``EventStore.failed``: count it; try again in ``retry_in`` s, or give it up."""
        def count(value: dict[str, Any] | None) -> dict[str, Any] | None:
            if value is None or value["due"] != due or value["state"] != "pending":
                return None
            failures = value["failures"] + 1
            return {**value, "failures": failures, "last_error": error, "next_try": (time.time() if now is None else now) + retry_in,
                    "state": "failed" if failures >= max_attempts else value["state"]}
        self._journal.run(self._change(f"event-{event_id}", count))
        return self.get(event_id)


def _load(data: bytes | None) -> dict[str, Any] | None:
    return json.loads(data) if data else None


def _dump(value: dict[str, Any]) -> bytes:
    """A reminder's value in the bucket: the SQLite row's columns, as JSON."""
    return json.dumps(value).encode()


def _event(value: dict[str, Any]) -> StoredEvent:
    return StoredEvent(id=value["id"], context=OriginalContext.model_validate(value["context"]),
                       description=value["description"], repeat=value["repeat"], due=value["due"],
                       state=value["state"], failures=value["failures"])
