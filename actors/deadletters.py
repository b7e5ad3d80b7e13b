"""The dead-letter office: where every message that could not be handled ends.

>>> office = DeadLetterOffice()
>>> from autoresponse.messages.envelope import Envelope
>>> letter = office.post(Envelope.new("hi"), "no handler", actor="llm", detail="str")
>>> office.counts()
{'no handler': 1}
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import Counter, deque
from typing import Any

from pydantic import BaseModel, ConfigDict

from autoresponse.actors.limits import DEAD_LETTERS_KEPT
from autoresponse.messages.envelope import Envelope

log = logging.getLogger("autoresponse.deadletters")


class DeadLetter(BaseModel):
    """A message that was not handled, with why."""

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    id: int
    time: float
    reason: str  # short category: "crash", "mailbox full", "hop limit", ...
    detail: str = ""
    actor: str | None = None
    error: str | None = None  # "ExceptionType: message" when an exception caused it
    envelope: Envelope

    @property
    def correlation_id(self) -> str:
        return self.envelope.correlation_id

    def summary(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "time": self.time,
            "reason": self.reason,
            "detail": self.detail,
            "actor": self.actor,
            "error": self.error,
            "envelope": self.envelope.describe(),
        }


class DeadLetterOffice:
    """Thread-safe; keeps the newest ``keep`` letters and counts all of them."""

    def __init__(self, keep: int = DEAD_LETTERS_KEPT) -> None:
        self._lock = threading.Lock()
        self._letters: deque[DeadLetter] = deque(maxlen=keep)
        self._counts: Counter[str] = Counter()
        self._ids = itertools.count(1)

    def post(
        self,
        envelope: Envelope,
        reason: str,
        *,
        actor: str | None = None,
        detail: str = "",
        error: BaseException | None = None,
    ) -> DeadLetter:
        letter = DeadLetter(
            id=next(self._ids),
            time=time.time(),
            reason=reason,
            detail=detail,
            actor=actor,
            error=None if error is None else f"{type(error).__name__}: {error}",
            envelope=envelope,
        )
        with self._lock:
            self._letters.append(letter)
            self._counts[reason] += 1
        log.warning(
            "dead letter #%d at %s: %s%s (correlation %s, %s)",
            letter.id, actor or "-", reason, f": {detail}" if detail else "",
            envelope.correlation_id, type(envelope.body).__name__,
        )
        return letter

    def letters(self, correlation_id: str | None = None) -> list[DeadLetter]:
        with self._lock:
            kept = list(self._letters)
        if correlation_id is None:
            return kept
        return [d for d in kept if d.correlation_id == correlation_id]

    def get(self, letter_id: int) -> DeadLetter | None:
        with self._lock:
            return next((d for d in self._letters if d.id == letter_id), None)

    def counts(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)

    def __len__(self) -> int:
        with self._lock:
            return sum(self._counts.values())
