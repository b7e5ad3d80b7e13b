"""Reminders in SQLite: one file under the data directory, safe across restarts.

>>> store = EventStore(Path("/tmp/events.sqlite3"))               # doctest: +SKIP
>>> event = store.add(payload, context)                            # doctest: +SKIP
>>> store.due(now=time.time())                                     # doctest: +SKIP
"""

from __future__ import annotations

import calendar
import datetime as dt
import logging
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from autoresponse.actors.memory import open_store
from autoresponse.interfaces.events.actions import EventPayload, Repeat
from autoresponse.interfaces.events.settings import EVENTS_PAST_GRACE_SECONDS
from autoresponse.messages import OriginalContext

log = logging.getLogger("autoresponse.events")

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
    first_due REAL,                            -- the first occurrence (rows stored before first_local)
    first_local TEXT,                          -- its local wall time as asked, which repeats keep
    turn TEXT,                                 -- handed to the LLM in this turn (a correlation) ...
    turn_by TEXT,                              -- ... by this opening of the store (EventStore.opening)
    turn_ended REAL                            -- when that turn ended; NULL while it may still run
);
CREATE INDEX IF NOT EXISTS events_due ON events (state, due);
"""
#: Columns added since the first release, for stores made by an older one.
_MIGRATIONS = {"next_try": "ALTER TABLE events ADD COLUMN next_try REAL",
               "first_due": "ALTER TABLE events ADD COLUMN first_due REAL",
               "first_local": "ALTER TABLE events ADD COLUMN first_local TEXT",
               "turn": "ALTER TABLE events ADD COLUMN turn TEXT",
               "turn_by": "ALTER TABLE events ADD COLUMN turn_by TEXT",
               "turn_ended": "ALTER TABLE events ADD COLUMN turn_ended REAL"}


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
    # In turn: handed to the LLM in ``turn`` by the store opening ``turn_by``, and not
    # confirmed yet; ``turn_ended`` once that turn has ended (see ``EventScheduler``).
    turn: str | None = None
    turn_by: str | None = None
    turn_ended: float | None = None

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
                       next_try=row.get("next_try"), turn=row.get("turn"), turn_by=row.get("turn_by"),
                       turn_ended=row.get("turn_ended"))


def scheduled(payload: EventPayload, now: float | None = None) -> tuple[float, dt.datetime]:
    """When a new reminder is first due, and the local wall time its repeats count from (as
    asked, even a time a daylight-saving change skips: see ``moment``; a time with a UTC
    offset, at the local time it falls on: ``local_wall``). One whose first date
    is past by more than EVENTS_PAST_GRACE_SECONDS at ``now`` would go out at once, "N days
    late": a repeating one (every day at 9, asked at 10) starts at its next occurrence, a
    one-off is refused (DateInPast). Raises DateOutOfRange too."""
    first = first_due(payload.date, payload.time)
    wall = local_wall(payload.date, payload.time)
    if now is None or first >= now - EVENTS_PAST_GRACE_SECONDS:
        return first, wall
    upcoming = next_due(first, payload.repeat, now, first=wall)
    if upcoming is None:  # a one-off
        raise DateInPast(f"date in the past: {_local(first)} is already past (it is now {_local(now)}); "
                         "a reminder needs a date and time still to come")
    return upcoming, wall


def _local(when: float) -> str:
    return dt.datetime.fromtimestamp(when).astimezone().isoformat(timespec="minutes")


class DateInPast(ValueError):
    """A reminder for a moment already past: it would go out at once, "N days late"."""


class DateOutOfRange(ValueError):
    """A reminder's date this machine cannot represent (year 1, or 9999 in some zones)."""


def moment(wall: dt.datetime) -> float:
    """The moment of a local wall time (naive), in this machine's time zone.

    A time that a daylight-saving change skips (02:30 as the clocks go from 02:00 to 03:00)
    is read with the offset before the change: 03:30, the first valid instant after it by
    the hour skipped, which a clock not yet put forward shows as 02:30. So iCalendar reads
    it (RFC 5545), and it is never before the time asked (``astimezone`` says 01:30). A time
    that comes twice (as the clocks go back) is its first. Raises ValueError, OverflowError
    or OSError past what this machine can represent."""
    when = wall.replace(fold=0).timestamp()
    dt.datetime.fromtimestamp(when)  # it must read back too: it is shown, and counted from
    return when


def first_due(date: dt.date, at: dt.time | None) -> float:
    """The moment a reminder is for, in this machine's time zone; a time with a UTC offset
    ("09:00Z") is that instant. Raises DateOutOfRange."""
    try:
        return moment(dt.datetime.combine(date, at or DEFAULT_TIME))
    except (ValueError, OverflowError, OSError) as exc:  # the zone's offset takes it past year 1 or 9999
        raise _out_of_range(date, at, exc) from None


def local_wall(date: dt.date, at: dt.time | None) -> dt.datetime:
    """The local wall time (naive, this machine's zone) a reminder is for, which its repeats
    keep: as asked; for a time with a UTC offset, the local date and time of that instant
    (09:00Z is 10:00 in Berlin in winter; 23:30-05:00 is the next day there). Repeats count
    in local wall time only: an aware one cannot be compared with the naive ones they count
    with. Raises DateOutOfRange."""
    asked = dt.datetime.combine(date, at or DEFAULT_TIME)
    if asked.tzinfo is None:
        return asked
    try:
        return asked.astimezone().replace(tzinfo=None)
    except (ValueError, OverflowError, OSError) as exc:  # converted past year 1 or 9999
        raise _out_of_range(date, at, exc) from None


def _out_of_range(date: dt.date, at: dt.time | None, exc: Exception) -> DateOutOfRange:
    return DateOutOfRange(f"date out of range: {date} {at or DEFAULT_TIME} cannot be scheduled ({exc})")


def next_due(due: float, repeat: str, now: float, first: dt.datetime | None = None) -> float | None:
    """The first occurrence after ``now`` (and not before ``due``) of a repeating reminder;
    None if it does not repeat. Occurrences count from ``first``, a local wall time (default
    ``due``'s), and keep it: 09:00 stays 09:00 across a daylight-saving change, and 02:30
    asked on the day the change skips it is 02:30 on the days after (03:30 on that day:
    ``moment``); a monthly one on the 31st comes on each month's last day when it is
    shorter, and on the 31st again after. Raises DateOutOfRange when that occurrence is
    past what this machine can represent (year 9999)."""
    if repeat == "none":
        return None
    start = dt.datetime.fromtimestamp(due) if first is None else first
    try:
        # Skip most of the occurrences already past, so a reminder years old costs no more.
        past = (dt.datetime.fromtimestamp(max(due, now)) - start).days // _MAX_DAYS_APART[repeat]
        n = max(0, past - 1)
        while (when := moment(_occurrence(start, repeat, n))) <= now or when < due:
            n += 1
    except (ValueError, OverflowError, OSError) as exc:
        raise DateOutOfRange(f"date out of range: the {repeat} reminder's next time after "
                             f"{_local(max(due, now))} cannot be represented ({exc})") from None
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


def repeats_from(value: dict[str, Any]) -> dt.datetime:
    """The local wall time a reminder's repeats count from (its columns in ``value``): as
    asked (``first_local``); for one stored before that was kept, its first occurrence's
    (``first_due``), or, stored before that too, the one due now's. A ``first_local`` that
    is not one (a damaged or hand-edited row) is read as that older row, with a warning: the
    caller stores the time found, so it is logged once, not at every delivery."""
    first_local, first = value.get("first_local"), value.get("first_due")
    if first_local is not None:
        try:
            start = dt.datetime.fromisoformat(first_local)
        except (TypeError, ValueError):  # not text (TypeError), or not a date and time
            start = None
        if start is not None and start.tzinfo is None:  # as stored: local (an aware one cannot count)
            return start
        log.warning("reminder #%s: its first time %.80r is not a local date and time; it repeats from "
                    "its %s occurrence instead", value.get("id"), first_local,
                    "first" if first is not None else "current")
    return dt.datetime.fromtimestamp(value["due"] if first is None else first)


#: An occurrence done with (delivered, or counted failed) is in turn no more.
NOT_IN_TURN: dict[str, Any] = {"turn": None, "turn_by": None, "turn_ended": None}


def _done_with(value: dict[str, Any], now: float, end: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
    """What changes in a reminder (its columns in ``value``) whose occurrence due now is done
    with: it moves on to its next after ``now``, or ends (``end``: the columns it ends with);
    and why it ended before its repeats did, if it did (its next time past year 9999: it
    ends, rather than fail for ever)."""
    done = {"failures": 0, "next_try": None, **NOT_IN_TURN}
    if value["repeat"] == "none":
        return {**done, **end}, None  # nothing to count from (nor to warn of)
    start = repeats_from(value)
    try:
        following = next_due(value["due"], value["repeat"], now, first=start)
    except DateOutOfRange as exc:
        return {**done, "last_error": str(exc), **end}, str(exc)
    if following is None:
        return {**done, **end}, None
    return {**done, "due": following, "first_local": start.isoformat()}, None


def after_delivery(value: dict[str, Any], now: float) -> tuple[dict[str, Any], str | None]:
    """What changes in a reminder whose occurrence due now was confirmed sent: it moves on to
    its next, or finishes; and why it finished before its repeats did, if it did."""
    return _done_with(value, now, {"state": "delivered"})


def after_failure(value: dict[str, Any], error: str, *, max_attempts: int, retry_at: float,
                  now: float) -> tuple[dict[str, Any], bool, str | None]:
    """What changes in a reminder whose occurrence due now failed a try (it is in turn no
    more); whether that try was its last, and the occurrence is given up; and why it ended
    there before its repeats did, if it did. Before ``max_attempts`` tries it is tried again
    at ``retry_at``. Given up, a one-off fails; a repeating one moves on to its next
    occurrence after ``now`` (as ``after_delivery``: with backoff a daily one's next may be
    past already), its failures reset: one lost occurrence is not the end of the others."""
    failures = value["failures"] + 1
    if failures < max_attempts:
        return {**NOT_IN_TURN, "failures": failures, "last_error": error, "next_try": retry_at}, False, None
    changes, ended = _done_with(value, now, {"state": "failed", "failures": failures})
    return {**changes, "last_error": error}, True, ended


@dataclass(frozen=True)
class FailedTry:
    """A failed try of an occurrence, counted (``failed``): the reminder after it; whether the
    occurrence was given up (then a repeating reminder is pending at its next occurrence, a
    one-off has failed); and why a repeating one ended there, if it did (``after_failure``)."""

    event: StoredEvent
    given_up: bool
    ended: str | None = None


class EventStore:
    """Thread-safe; every write is committed before it returns."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        # Like the memory's: a file that is no database is named, and never replaced.
        self._db = open_store(path, "reminder store", _set_up)
        #: This opening of the store (one per daemon run): the reminders in turn it marked.
        self.opening = uuid.uuid4().hex

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def add(self, payload: EventPayload, context: OriginalContext, now: float | None = None) -> StoredEvent:
        """Store a new reminder (``scheduled`` at ``now``)."""
        due, first = scheduled(payload, now)
        with self._lock:
            cursor = self._db.execute(
                "INSERT INTO events (context, description, repeat, due, created, first_local) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (context.model_dump_json(), payload.description, payload.repeat, due, time.time(),
                 first.isoformat()),
            )
        event = self.get(cursor.lastrowid)  # type: ignore[arg-type]
        assert event is not None
        return event

    def _rows(self, sql: str, *args: object) -> list[StoredEvent | UnreadableEvent]:
        """The rows ``sql`` selects, each read on its own: one that cannot be read is
        an ``UnreadableEvent``, and the others are read as usual."""
        with self._lock:
            cursor = self._db.execute("SELECT id, context, description, repeat, due, state, failures, "
                                      f"next_try, turn, turn_by, turn_ended FROM events {sql}", args)
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

    def handed(self, event_id: int, due: float, turn: str) -> None:
        """The occurrence at ``due`` goes to the LLM in ``turn`` (a correlation): it is in turn,
        marked by this opening of the store, until it is delivered or counted failed."""
        with self._lock:
            self._db.execute("UPDATE events SET turn = ?, turn_by = ?, turn_ended = NULL "
                             "WHERE id = ? AND due = ? AND state = 'pending'",
                             (turn, self.opening, event_id, due))

    def turn_ended(self, event_id: int, turn: str, now: float) -> None:
        """``turn`` has ended at ``now``: if it still has the reminder in hand, the reminder
        waits for its confirmation from then on."""
        with self._lock:
            self._db.execute("UPDATE events SET turn_ended = ? "
                             "WHERE id = ? AND turn = ? AND turn_ended IS NULL", (now, event_id, turn))

    def _change(self, event_id: int, change: Callable[[dict[str, Any]], dict[str, Any] | None]) -> None:
        """Apply ``change`` to one row (its columns: the columns to change, or None), at once."""
        with self._lock:
            cursor = self._db.execute("SELECT * FROM events WHERE id = ?", (event_id,))
            row = cursor.fetchone()
            changes = None if row is None else change(
                dict(zip([column[0] for column in cursor.description], row, strict=True)))
            if changes:
                columns = ", ".join(f"{column} = ?" for column in changes)  # our own names, never input
                self._db.execute(f"UPDATE events SET {columns} WHERE id = ?", (*changes.values(), event_id))

    def delivered(self, event_id: int, due: float, now: float) -> str | None:
        """The occurrence at ``due`` was confirmed sent: move on to the next, or finish; why
        it finished before its repeats did, if it did (``after_delivery``)."""
        ended: list[str | None] = [None]

        def move_on(value: dict[str, Any]) -> dict[str, Any] | None:
            if value["due"] != due:
                return None  # already moved on
            changes, ended[0] = after_delivery(value, now)
            return changes
        self._change(event_id, move_on)
        return ended[0]

    def failed(self, event_id: int, due: float, error: str, *, max_attempts: int,
               retry_in: float, now: float | None = None) -> FailedTry | None:
        """The occurrence at ``due`` was not delivered (nor is it in turn any more): count it,
        and either try it again in ``retry_in`` seconds (after ``now``, the runtime's clock;
        default the wall clock) or, after ``max_attempts`` tries, give it up (``after_failure``).
        None if it was done with already (delivered, given up, moved on)."""
        at = time.time() if now is None else now
        counted: list[tuple[bool, str | None]] = []

        def count(value: dict[str, Any]) -> dict[str, Any] | None:
            if value["due"] != due or value["state"] != "pending":
                return None
            changes, given_up, ended = after_failure(value, error, max_attempts=max_attempts,
                                                     retry_at=at + retry_in, now=at)
            counted.append((given_up, ended))
            return changes
        self._change(event_id, count)
        event = self.get(event_id)
        return None if not counted or event is None else FailedTry(event, *counted[0])
