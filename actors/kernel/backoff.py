"""Backoff: the one policy for every wait before trying again (restarts, re-asks,
HTTP retries, polling after errors), on a clock you can control.

>>> BackoffPolicy(min=0.5, max=8, jitter=0).delay(3)
2.0
>>> now = [0.0]
>>> backoff = Backoff(BackoffPolicy(min=1.0, max=4.0, jitter=0, reset_after=60), clock=lambda: now[0])
>>> [backoff.next_delay() for _ in range(4)]
[1.0, 2.0, 4.0, 4.0]
>>> now[0] = 100.0   # a quiet minute and more after the last wait (4 s)
>>> backoff.next_delay()
1.0
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass

from autoresponse.actors.limits import (
    RESTART_BACKOFF_JITTER,
    RESTART_BACKOFF_MAX_SECONDS,
    RESTART_BACKOFF_MIN_SECONDS,
    RESTART_BACKOFF_RESET_SECONDS,
)


@dataclass(frozen=True)
class BackoffPolicy:
    """Delay before the n-th consecutive try: ``min * 2**(n-1)``, capped at ``max``,
    spread by ±``jitter`` (a fraction); back to ``min`` after ``reset_after`` quiet
    seconds (for ``Backoff``, which counts the tries itself)."""

    min: float = RESTART_BACKOFF_MIN_SECONDS
    max: float = RESTART_BACKOFF_MAX_SECONDS
    jitter: float = RESTART_BACKOFF_JITTER
    reset_after: float = RESTART_BACKOFF_RESET_SECONDS

    def delay(self, attempt: int, rng: Callable[[], float] = random.random) -> float:
        """The wait before try number ``attempt`` (1 is the first retry)."""
        # The doubling stops at 64: far past any max, and 2 ** 1024 is past a float (after a
        # thousand failures in a row the wait must still be ``max``, not an OverflowError).
        base = min(self.max, self.min * 2.0 ** min(max(0, attempt - 1), 64))
        spread = 1 + self.jitter * (2 * rng() - 1)
        return max(0.0, min(self.max, base * spread))


class Backoff:
    """Counts consecutive tries of one thing and says how long to wait before the next."""

    def __init__(self, policy: BackoffPolicy, *, clock: Callable[[], float] = time.monotonic,
                 rng: Callable[[], float] = random.random) -> None:
        self.policy = policy
        self._clock = clock
        self._rng = rng
        self._consecutive = 0
        self._waited_until: float | None = None  # when the last delay given ran out

    def next_delay(self) -> float:
        """The delay before the next try; call once per try. Quiet is counted from when the
        last delay ran out, not from when it was given: a wait longer than ``reset_after``
        (a poll backing off towards minutes) is no quiet spell, and must not start it over."""
        now = self._clock()
        if self._waited_until is not None and now - self._waited_until >= self.policy.reset_after:
            self._consecutive = 0
        self._consecutive += 1
        delay = self.policy.delay(self._consecutive, self._rng)
        self._waited_until = now + delay
        return delay

    def reset(self) -> None:
        """It worked: the next failure starts from ``min`` again."""
        self._consecutive = 0
        self._waited_until = None


#: A platform's API refused or dropped a send: wait 1 s, doubling, at most 30 s.
SEND_BACKOFF = BackoffPolicy(min=1.0, max=30.0, jitter=0.1)
#: A platform's polling failed: wait 1 s, doubling, at most 5 minutes.
POLL_BACKOFF = BackoffPolicy(min=1.0, max=300.0, jitter=0.1)
