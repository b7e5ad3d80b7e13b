"""Backoff between restarts, driven by a clock you can control.

>>> now = [0.0]
>>> backoff = Backoff(BackoffPolicy(min=1, max=4, jitter=0, reset_after=60), clock=lambda: now[0])
>>> [backoff.next_delay() for _ in range(4)]
[1.0, 2.0, 4.0, 4.0]
>>> now[0] = 100.0   # a quiet minute and more
>>> backoff.next_delay()
1.0
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable

from autoresponse.supervisors.spec import BackoffPolicy


class Backoff:
    def __init__(self, policy: BackoffPolicy, *, clock: Callable[[], float] = time.monotonic,
                 rng: Callable[[], float] = random.random) -> None:
        self.policy = policy
        self._clock = clock
        self._rng = rng
        self._consecutive = 0
        self._last: float | None = None

    def next_delay(self) -> float:
        """The delay before the next restart; call once per restart."""
        now = self._clock()
        if self._last is not None and now - self._last >= self.policy.reset_after:
            self._consecutive = 0
        self._consecutive += 1
        self._last = now
        p = self.policy
        base = min(p.max, p.min * 2 ** (self._consecutive - 1))
        spread = 1 + p.jitter * (2 * self._rng() - 1)
        return max(0.0, min(p.max, base * spread))
