"""Reminders in SQLite: one file under the data directory, safe across restarts.

>>> store = EventStore(Path("/tmp/events.sqlite3"))               # doctest: +SKIP
>>> event = store.add(payload, context)                            # doctest: +SKIP
>>> store.due(now=time.time())                                     # doctest: +SKIP
"""

from __future__ import annotations

import calendar
import datetime as dt
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from autoresponse.actors.memory import open_store
from autoresponse.interfaces.events.actions import EventPayload, Repeat
from autoresponse.interfaces.events.settings import EVENTS_PAST_GRACE_SECONDS
from autoresponse.messages import OriginalContext

#: When a reminder gives a day but no time.
DEFAULT_TIME = dt.time(9, 0)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    context TEXT NOT NULL,
    description TEXT NOT NULL,
    repeat TEXT NOT NULL,
    due REAL NOT NULL,
    state TEXT NOT NULL DEFAULT 'pending',  -- pending | delivered | failed
    failures INTEGER NOT NULL DEFAULT 0,
    last_error TEXT,
    created REAL NOT NULL,
    next_try REAL,                             -- after a failure: not before this time
    first_due REAL                             -- the first occurrence, which repeats count from
);
CREATE INDEX IF NOT EXISTS events_due ON events (state, due);
"""
#: Columns added since the first release, for stores made by it.
_MIGRATIONS = {"next_try": "ALTER TABLE events ADD COLUMN next_try REAL",
               "first_due": "ALTER TABLE events ADD COLUMN first_due REAL"}


def _set_up(db: sqlite3.Connection) -> None:
    """The schema, and the columns a store made by an older release lacks."""
    db.executescript(_SCHEMA)
    columns = {row[1] for row in db.execute("PRAGMA table_info(events)")}
    for column, statement in _MIGRATIONS.items():
        if column not in columns:
            db.execute(statement)



class StoredEvent(BaseModel):
    id: int
    context: OriginalContext
    description: str
    repeat: Repeat
    due: float
    state: str
    failures: int
    next_try: float | None = None  # after a failure: not before this time

    @property
    def due_text(self) -> str:
        return dt.datetime.fromtimestamp(self.due).astimezone().isoformat(timespec="minutes")


@dataclass(frozen=True)
class UnreadableEvent:
    """A stored reminder that cannot be read (its context no longer valid JSON, say). It is
    given up when found, so it is reported once (a dead letter) and never holds up the rest."""

    id: int
    reason: str
    raw: Any  # as stored, for the operator


def unreadable_reason(exc: Exception) -> str:
    """Why a stored reminder cannot be read, in one line (pydantic's first error)."""
    if isinstance(exc, ValidationError) and exc.errors():
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        return f"{exc.title}{'.' + where if where else ''}: {first['msg']}"
    return f"{type(exc).__name__}: {exc}"


def read_event(row: dict[str, Any]) -> StoredEvent:
    """A stored reminder from its columns (the context as JSON text); raises ValueError,
    TypeError or KeyError if they are not one."""
    context = row["context"]
    context = (OriginalContext.model_validate_json(context) if isinstance(context, (str, bytes))
               else OriginalContext.model_validate(context))
    return StoredEvent(id=row["id"], context=context, description=row["description"], repeat=row["repeat"],
                       due=row["due"], state=row["state"], failures=row["failures"],
                       next_try=row.get("next_try"))


def scheduled(payload: EventPayload, now: float | None = None) -> tuple[float, float]:
    """When a new reminder is first due, and the occurrence its repeats count from. One
    whose first date is past by more than EVENTS_PAST_GRACE_SECONDS at ``now`` would go out
    at once, "N days late": a repeating one (every day at 9, asked at 10) starts at its next
    occurrence, a one-off is refused (DateInPast). Raises DateOutOfRange too."""
    first = first_due(payload.date, payload.time)
    if now is None or first >= now - EVENTS_PAST_GRACE_SECONDS:
        return first, first
    upcoming = next_due(first, payload.repeat, now, first=first)
    if upcoming is None:  # a one-off
        raise DateInPast(f"date in the past: {_local(first)} is already past (it is now {_local(now)}); "
                         "a reminder needs a date and time still to come")
    return upcoming, first


def _local(moment: float) -> str:
    return dt.datetime.fromtimestamp(moment).astimezone().isoformat(timespec="minutes")


class DateInPast(ValueError):
    """A reminder for a moment already past: it would go out at once, "N days late"."""


class DateOutOfRange(ValueError):
    """A reminder's date this machine cannot represent (year 1, or 9999 in some zones)."""


def first_due(date: dt.date, at: dt.time | None) -> float:
    """The moment a reminder is for, in this machine's time zone. Raises DateOutOfRange."""
    try:
        return dt.datetime.combine(date, at or DEFAULT_TIME).astimezone().timestamp()
    except (ValueError, OverflowError, OSError) as exc:  # the zone's offset takes it past year 1 or 9999
        raise DateOutOfRange(f"date out of range: {date} {at or DEFAULT_TIME} cannot be scheduled "
                             f"({exc})") from None


def next_due(due: float, repeat: str, now: float, first: float | None = None) -> float | None:
    """The first occurrence after ``now`` (and not before ``due``) of a repeating reminder;
    None if it does not repeat. Occurrences count from ``first`` (default ``due``) in local
    wall-clock time: 09:00 stays 09:00 across a daylight-saving change, and a monthly one on
    the 31st comes on each month's last day when it is shorter, and on the 31st again after."""
    if repeat == "none":
        return None
    start = dt.datetime.fromtimestamp(due if first is None else first)  # naive: local wall time
    # Skip most of the occurrences already past, so a reminder years old costs no more.
    past = (dt.datetime.fromtimestamp(max(due, now)) - start).days // _MAX_DAYS_APART[repeat]
    n = max(0, past - 1)
    while (when := _occurrence(start, repeat, n).timestamp()) <= now or when < due:
        n += 1
    return when


#: The most days between two occurrences of each repeat.
_MAX_DAYS_APART = {"daily": 1, "weekly": 7, "monthly": 31}


def _occurrence(start: dt.datetime, repeat: str, n: int) -> dt.datetime:
    """The ``n``th occurrence after ``start`` (naive, local): the same wall-clock time; for a
    monthly one ``start``'s day of month, or the month's last day when it has fewer."""
    if repeat == "daily":
        return start + dt.timedelta(days=n)
    if repeat == "weekly":
        return start + dt.timedelta(weeks=n)
    year, month = divmod(start.month - 1 + n, 12)
    year, month = start.year + year, month + 1
    return start.replace(year=year, month=month, day=min(start.day, calendar.monthrange(year, month)[1]))


class EventStore:
    """Thread-safe; every write is committed before it returns."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        # Like the memory's: a file that is no database is named, and never replaced.
        self._db = open_store(path, "reminder store", _set_up)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def add(self, payload: EventPayload, context: OriginalContext, now: float | None = None) -> StoredEvent:
        """Store a new reminder (``scheduled`` at ``now``)."""
        due, first = scheduled(payload, now)
        with self._lock:
            cursor = self._db.execute(
                "INSERT INTO events (context, description, repeat, due, created, first_due) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (context.model_dump_json(), payload.description, payload.repeat, due, time.time(), first),
            )
        event = self.get(cursor.lastrowid)  # type: ignore[arg-type]
        assert event is not None
        return event

    def _rows(self, sql: str, *args: object) -> list[StoredEvent | UnreadableEvent]:
        """The rows ``sql`` selects, each read on its own: one that cannot be read is
        an ``UnreadableEvent``, and the others are read as usual."""
        with self._lock:
            cursor = self._db.execute("SELECT id, context, description, repeat, due, state, failures, "
                                      f"next_try FROM events {sql}", args)
            names = [column[0] for column in cursor.description]
            rows = [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]
        found: list[StoredEvent | UnreadableEvent] = []
        for row in rows:
            try:
                found.append(read_event(row))
            except (ValueError, TypeError, KeyError) as exc:  # pydantic's ValidationError is a ValueError
                found.append(UnreadableEvent(id=row["id"], reason=unreadable_reason(exc), raw=row))
        return found

    def get(self, event_id: int) -> StoredEvent | None:
        """The reminder, or None if there is none (or it cannot be read)."""
        found = self._rows("WHERE id = ?", event_id)
        return found[0] if found and isinstance(found[0], StoredEvent) else None

    def due(self, now: float) -> list[StoredEvent | UnreadableEvent]:
        """Pending occurrences that are due and not waiting out a failure's backoff; and
        each row that cannot be read, once: it is given up here, so it is never read again."""
        found = self._rows("WHERE state = 'pending' AND due <= ? AND (next_try IS NULL OR next_try <= ?) "
                           "ORDER BY due", now, now)
        for event in found:
            if isinstance(event, UnreadableEvent):
                with self._lock:
                    self._db.execute("UPDATE events SET state = 'failed', last_error = ? WHERE id = ?",
                                     (f"unreadable: {event.reason}", event.id))
        return found

    def delivered(self, event_id: int, due: float, now: float) -> None:
        """The occurrence at ``due`` was confirmed sent: move on to the next, or finish."""
        with self._lock:
            row = self._db.execute("SELECT repeat, due, first_due FROM events WHERE id = ?",
                                   (event_id,)).fetchone()
            if row is None or row[1] != due:
                return  # already moved on
            first = due if row[2] is None else row[2]  # a row kept before first_due was: from here on
            following = next_due(due, row[0], now, first=first)
            if following is None:
                self._db.execute("UPDATE events SET state = 'delivered', failures = 0, next_try = NULL "
                                 "WHERE id = ?", (event_id,))
            else:
                self._db.execute("UPDATE events SET due = ?, first_due = ?, failures = 0, next_try = NULL "
                                 "WHERE id = ?", (following, first, event_id))

    def failed(self, event_id: int, due: float, error: str, *, max_attempts: int,
               retry_in: float, now: float | None = None) -> StoredEvent | None:
        """The occurrence at ``due`` was not delivered: count it, and either try it again
        in ``retry_in`` seconds (after ``now``, the runtime's clock; default the wall
        clock) or, after ``max_attempts`` tries, give it up."""
        with self._lock:
            self._db.execute(
                "UPDATE events SET failures = failures + 1, last_error = ?, next_try = ?, "
                "state = CASE WHEN failures + 1 >= ? THEN 'failed' ELSE state END "
                "WHERE id = ? AND due = ? AND state = 'pending'",
                (error, (time.time() if now is None else now) + retry_in, max_attempts, event_id, due),
            )
        return self.get(event_id)
