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
from pathlib import Path

from pydantic import BaseModel

from autoresponse.actors.memory import open_store
from autoresponse.interfaces.events.actions import EventPayload
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
    next_try REAL                              -- after a failure: not before this time
);
CREATE INDEX IF NOT EXISTS events_due ON events (state, due);
"""
#: Columns added since the first release, for stores made by it.
_MIGRATIONS = {"next_try": "ALTER TABLE events ADD COLUMN next_try REAL"}


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
    repeat: str
    due: float
    state: str
    failures: int

    @property
    def due_text(self) -> str:
        return dt.datetime.fromtimestamp(self.due).astimezone().isoformat(timespec="minutes")


class DateOutOfRange(ValueError):
    """A reminder's date this machine cannot represent (year 1, or 9999 in some zones)."""


def first_due(date: dt.date, at: dt.time | None) -> float:
    """The moment a reminder is for, in this machine's time zone. Raises DateOutOfRange."""
    try:
        return dt.datetime.combine(date, at or DEFAULT_TIME).astimezone().timestamp()
    except (ValueError, OverflowError, OSError) as exc:  # the zone's offset takes it past year 1 or 9999
        raise DateOutOfRange(f"date out of range: {date} {at or DEFAULT_TIME} cannot be scheduled "
                             f"({exc})") from None


def next_due(due: float, repeat: str, now: float) -> float | None:
    """The first occurrence after ``now`` of a repeating reminder; None if it does not repeat."""
    if repeat == "none":
        return None
    when = dt.datetime.fromtimestamp(due).astimezone()
    while when.timestamp() <= now:
        if repeat == "daily":
            when += dt.timedelta(days=1)
        elif repeat == "weekly":
            when += dt.timedelta(weeks=1)
        else:  # monthly: the same day, or the month's last day
            year, month = (when.year + 1, 1) if when.month == 12 else (when.year, when.month + 1)
            day = min(when.day, calendar.monthrange(year, month)[1])
            when = when.replace(year=year, month=month, day=day)
    return when.timestamp()


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

    def add(self, payload: EventPayload, context: OriginalContext) -> StoredEvent:
        due = first_due(payload.date, payload.time)
        with self._lock:
            cursor = self._db.execute(
                "INSERT INTO events (context, description, repeat, due, created) VALUES (?, ?, ?, ?, ?)",
                (context.model_dump_json(), payload.description, payload.repeat, due, time.time()),
            )
        event = self.get(cursor.lastrowid)  # type: ignore[arg-type]
        assert event is not None
        return event

    def _rows(self, sql: str, *args: object) -> list[StoredEvent]:
        with self._lock:
            rows = self._db.execute(
                f"SELECT id, context, description, repeat, due, state, failures FROM events {sql}", args
            ).fetchall()
        return [StoredEvent(id=r[0], context=OriginalContext.model_validate_json(r[1]), description=r[2],
                            repeat=r[3], due=r[4], state=r[5], failures=r[6]) for r in rows]

    def get(self, event_id: int) -> StoredEvent | None:
        found = self._rows("WHERE id = ?", event_id)
        return found[0] if found else None

    def due(self, now: float) -> list[StoredEvent]:
        """Pending occurrences that are due and not waiting out a failure's backoff."""
        return self._rows("WHERE state = 'pending' AND due <= ? AND (next_try IS NULL OR next_try <= ?) "
                          "ORDER BY due", now, now)

    def delivered(self, event_id: int, due: float, now: float) -> None:
        """The occurrence at ``due`` was confirmed sent: move on to the next, or finish."""
        with self._lock:
            row = self._db.execute("SELECT repeat, due FROM events WHERE id = ?", (event_id,)).fetchone()
            if row is None or row[1] != due:
                return  # already moved on
            following = next_due(due, row[0], now)
            if following is None:
                self._db.execute("UPDATE events SET state = 'delivered', failures = 0, next_try = NULL "
                                 "WHERE id = ?", (event_id,))
            else:
                self._db.execute("UPDATE events SET due = ?, failures = 0, next_try = NULL WHERE id = ?",
                                 (following, event_id))

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
