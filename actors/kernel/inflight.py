"""Work in flight, counted per correlation and in all.

>>> inflight = InFlight()
>>> inflight.add("c1"); inflight.count("c1")
1
>>> inflight.done("c1"); inflight.wait("c1", timeout=0)
True
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class InFlight:
    """A message is in flight from the moment a mailbox accepts it until it has been
    handled or dead-lettered; I/O handed to the loop counts too. A correlation with
    nothing in flight has finished, and ``on_finished`` is told so."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_correlation: dict[str, int] = {}
        self._total = 0
        #: Waiters, woken only when what they wait for may have happened.
        self._waiting = 0
        self._changed = threading.Condition(self._lock)
        #: Called (outside the lock) with each correlation that has finished.
        self.on_finished: Callable[[str], None] | None = None

    def add(self, correlation_id: str) -> None:
        lock = self._lock
        lock.acquire()  # not ``with``, which binds two methods of the lock: this runs on most hops
        try:
            counts = self._by_correlation
            counts[correlation_id] = counts.get(correlation_id, 0) + 1
            self._total += 1
        finally:
            lock.release()

    def done(self, correlation_id: str) -> None:
        lock = self._lock
        lock.acquire()  # as in ``add``
        try:
            counts = self._by_correlation
            left = counts.get(correlation_id, 0) - 1
            if left > 0:
                counts[correlation_id] = left
            else:
                counts.pop(correlation_id, None)
                if self._waiting:
                    self._changed.notify_all()
            self._total -= 1
        finally:
            lock.release()
        if left <= 0 and self.on_finished is not None:
            self.on_finished(correlation_id)

    def count(self, correlation_id: str | None = None) -> int:
        with self._lock:
            return self._total if correlation_id is None else self._by_correlation.get(correlation_id, 0)

    def correlations(self) -> list[str]:
        """The correlations with work in flight now."""
        with self._lock:
            return list(self._by_correlation)

    def wait(self, correlation_id: str | None = None, timeout: float = 10.0) -> bool:
        """True once nothing (of ``correlation_id``, or at all) is in flight."""
        until = time.monotonic() + timeout
        with self._lock:
            self._waiting += 1
            try:
                while (self._total if correlation_id is None
                       else self._by_correlation.get(correlation_id, 0)):
                    left = until - time.monotonic()
                    if left <= 0:
                        return False
                    self._changed.wait(left)
                return True
            finally:
                self._waiting -= 1
