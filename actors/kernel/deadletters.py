"""The dead-letter office: where every message that could not be handled ends.

>>> office = DeadLetterOffice()
>>> from autoresponse.messages.envelope import Envelope
>>> letter = office.post(Envelope.new("hi"), "no handler", actor="llm", detail="str")
>>> office.counts()
{'no handler': 1}

With a store (the journal), letters are durable: they survive a restart, and
can be listed and replayed after it. Their ids continue across restarts.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from typing import Any, Protocol

from autoresponse.actors.limits import DEAD_LETTERS_KEPT
from autoresponse.messages.envelope import Envelope

log = logging.getLogger("autoresponse.deadletters")


class DeadLetter:
    """A message that was not handled, with why.

    ``record`` is its JSON-ready form (what the store keeps, what operators see);
    ``envelope`` is the live message when it was posted in this process, None
    when it was read back from the store (``Runtime.replay`` rebuilds it).
    """

    __slots__ = ("id", "time", "reason", "detail", "actor", "error", "correlation_id", "record", "envelope")

    def __init__(self, *, id: int, time: float, reason: str, detail: str, actor: str | None,
                 error: str | None, correlation_id: str, record: dict[str, Any],
                 envelope: Envelope | None = None) -> None:
        self.id = id
        self.time = time
        self.reason = reason  # short category: "crash", "hop limit", "retries exhausted", ...
        self.detail = detail
        self.actor = actor
        self.error = error  # "ExceptionType: message" when an exception caused it
        self.correlation_id = correlation_id
        self.record = record
        self.envelope = envelope

    def summary(self) -> dict[str, Any]:
        return {"id": self.id, "time": self.time, "reason": self.reason, "detail": self.detail,
                "actor": self.actor, "error": self.error, "envelope": self.record}

    @classmethod
    def from_summary(cls, data: dict[str, Any]) -> DeadLetter:
        """A letter from its ``summary`` (kept by an earlier run); KeyError, TypeError or
        ValueError when ``data`` is not one."""
        if not (isinstance(data["id"], int) and isinstance(data["time"], (int, float))
                and isinstance(data["reason"], str) and isinstance(data["envelope"], dict)):
            raise ValueError("not a dead letter's summary")
        return cls(id=data["id"], time=data["time"], reason=data["reason"], detail=data["detail"],
                   actor=data["actor"], error=data["error"],
                   correlation_id=data["envelope"]["correlation_id"], record=data["envelope"])

    def __repr__(self) -> str:
        return f"<DeadLetter #{self.id} {self.reason} at {self.actor}>"


class DeadLetterStore(Protocol):
    """Where dead letters are kept across restarts (the journal)."""

    def record_dead_letter(self, summary: dict[str, Any]) -> Any: ...
    def dead_letters(self, limit: int) -> list[dict[str, Any]]: ...
    def dead_letter(self, letter_id: int) -> dict[str, Any] | None: ...
    def last_dead_letter_id(self) -> int: ...
    def dead_letter_counts(self) -> dict[str, int]: ...


#: Told of a letter as it is posted: its envelope, its reason, and the actor it was for.
Observer = Callable[[Envelope, str, str | None], None]


def _from_store(data: Any) -> DeadLetter | None:
    """A letter kept by an earlier run; None, with a warning, when it lacks what one has."""
    try:
        return DeadLetter.from_summary(data)
    except (KeyError, TypeError, ValueError):
        log.warning("a kept dead letter is unreadable, and left out")
        return None


def _no_redaction(text: str) -> str:
    return text


class DeadLetterOffice:
    """Thread-safe; keeps the newest ``keep`` letters in memory, every one in the store
    when there is one (bounded by the store's retention), and counts them by reason."""

    def __init__(self, keep: int = DEAD_LETTERS_KEPT, store: DeadLetterStore | None = None,
                 redact: Callable[[str], str] = _no_redaction, *,
                 now: Callable[[], float] = time.time) -> None:
        self._lock = threading.Lock()
        self._now = now  # the runtime's clock (wall time), for each letter's time
        self._keep = keep
        self._letters: deque[DeadLetter] = deque(maxlen=keep)
        self._counts: Counter[str] = Counter()
        self._store: DeadLetterStore | None = None
        self._ids = itertools.count(1)
        #: Applied to every detail and error text (configured secrets must never show).
        self.redact = redact
        #: Told of every letter as it is posted, in the thread that posts it: the runtime's
        #: trace (where a request died), the user's notice (``actors.failures``).
        self.observers: list[Observer] = []
        if store is not None:
            self.attach(store)

    def attach(self, store: DeadLetterStore) -> None:
        """Keep letters in ``store`` from now on; earlier runs' letters become visible."""
        with self._lock:
            self._store = store
            self._ids = itertools.count(store.last_dead_letter_id() + 1)
            self._counts.update(store.dead_letter_counts())

    def post(
        self,
        envelope: Envelope,
        reason: str,
        *,
        actor: str | None = None,
        detail: str = "",
        error: BaseException | None = None,
    ) -> DeadLetter:
        error_text = None if error is None else self.redact(f"{type(error).__name__}: {error}")
        with self._lock:
            letter = DeadLetter(id=next(self._ids), time=self._now(), reason=reason,
                                detail=self.redact(detail), actor=actor, error=error_text,
                                correlation_id=envelope.correlation_id, record=envelope.describe(),
                                envelope=envelope)
            self._letters.append(letter)
            self._counts[reason] += 1
            store = self._store
        if store is not None:
            store.record_dead_letter(letter.summary())
        for observer in self.observers:
            try:
                observer(envelope, reason, actor)
            except Exception:  # one that fails must not keep the letter from the rest, or the poster
                log.exception("a dead-letter observer failed on letter #%d", letter.id)
        log.warning(
            "dead letter #%d at %s: %s%s (correlation %s, %s)",
            letter.id, actor or "-", reason, f": {letter.detail}" if letter.detail else "",
            envelope.correlation_id, type(envelope.body).__name__,
        )
        return letter

    def letters(self, correlation_id: str | None = None, limit: int | None = None) -> list[DeadLetter]:
        """The letters, oldest first: the stored ones of earlier runs, then this run's."""
        with self._lock:
            recent = list(self._letters)
            store = self._store
        if store is not None:
            first = recent[0].id if recent else None
            older = [d for d in map(_from_store, store.dead_letters(limit or self._keep)) if d is not None]
            recent = [d for d in older if first is None or d.id < first] + recent
        if correlation_id is not None:
            recent = [d for d in recent if d.correlation_id == correlation_id]
        return recent[-limit:] if limit else recent

    def get(self, letter_id: int) -> DeadLetter | None:
        with self._lock:
            found = next((d for d in self._letters if d.id == letter_id), None)
            store = self._store
        if found is None and store is not None:
            data = store.dead_letter(letter_id)
            found = _from_store(data) if data is not None else None
        return found

    def counts(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)

    def __len__(self) -> int:
        with self._lock:
            return sum(self._counts.values())
