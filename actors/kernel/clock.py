"""The runtime's one clock: what time it is, and waiting for a time to come.

A ``Runtime`` owns one clock (``Runtime(clock=...)``, real time by default), and
every timer of the runtime waits on it: ``TypedActor.schedule`` (so the builder's
batch wait, the re-ask delay and the reminders' ticks), the supervisor's restart
backoff and intensity, the interfaces' polling, rate-limit and retry waits (and their
deliveries' ``sleep``), envelope deadlines, reminders' due times, and the timestamps
of traces, dead letters and the status. Read it as ``self.runtime.clock``; a coroutine
that waits for a time to come awaits ``self.runtime.clock.sleep(seconds)``, never
``asyncio.sleep``.

In production it is ``Clock()``. In a test it is a ``ManualClock``: time stands
still until the test advances it, so no test waits for a timer to fire. A test waits
until the timer it means to fire is set (``wait_for_sleepers``, ``pending``), then
calls ``advance``; for a flow of several timers, ``advance_until`` a condition::

    >>> clock = ManualClock(start=100.0, wall=1_000_000.0)
    >>> async def nap(seconds):
    ...     await clock.sleep(seconds)
    ...     return clock.monotonic()
    >>> import asyncio, threading
    >>> loop = asyncio.new_event_loop()
    >>> threading.Thread(target=loop.run_forever, daemon=True).start()
    >>> woken = asyncio.run_coroutine_threadsafe(nap(5), loop)
    >>> clock.wait_for_sleepers(1)            # the timer is registered; nothing has moved
    True
    >>> clock.advance(4); woken.done()        # not yet due
    0
    False
    >>> clock.advance(1); woken.result(timeout=5), clock.time()
    1
    (105.0, 1000005.0)
    >>> _ = loop.call_soon_threadsafe(loop.stop)

Real time stays where a thread blocks waiting for something to *happen*, with a
generous safety timeout rather than a timer: a full mailbox's blocking put, the
intake's admission wait, ``InFlight.wait`` (``wait_idle``) and the drain at a stop,
a probe's ``expect``. A test on a manual clock never has to advance those; and the
NATS journal's leases and redelivery stay on real time (their tests run a real
server and real processes).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import threading
import time
from collections.abc import Callable

#: How long ``advance_until`` gives the runtime, in real time, to react to a move.
_REACT_SECONDS = 0.01


class Clock:
    """Real time: ``time.monotonic``, ``time.time`` and ``asyncio.sleep``.

    >>> clock = Clock()
    >>> a = clock.monotonic(); b = clock.monotonic(); b >= a
    True
    """

    #: Seconds on a clock that never goes back: for intervals and deadlines. (The
    #: functions themselves, not wrappers: traces read the time on every hop.)
    monotonic = staticmethod(time.monotonic)
    #: Seconds since the epoch (wall time): for timestamps and reminders' due times.
    time = staticmethod(time.time)

    async def sleep(self, seconds: float) -> None:
        """Return after ``seconds`` (at once for zero or less); cancel the task to call it off."""
        await asyncio.sleep(max(0.0, seconds))

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class _Sleeper:
    __slots__ = ("due", "seq", "loop", "future")

    def __init__(self, due: float, seq: int, loop: asyncio.AbstractEventLoop,
                 future: asyncio.Future[None]) -> None:
        self.due = due
        self.seq = seq
        self.loop = loop
        self.future = future

    def __lt__(self, other: _Sleeper) -> bool:
        return (self.due, self.seq) < (other.due, other.seq)


def _wake(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class ManualClock(Clock):
    """A clock for tests: time moves only when ``advance`` is called (from any thread).

    ``monotonic()`` starts at ``start``, ``time()`` at ``wall`` (default: the real wall
    time when the clock is made, so dates look like today's); both move together. A
    coroutine in ``sleep`` wakes once the clock is advanced to or past its due time;
    those woken by one ``advance`` wake in due order (ties: in the order they went to
    sleep). Time jumps: a sleeper that goes back to sleep when woken is due that long
    after the new time, so advance in steps to see a periodic timer fire several times.

    ``sleepers`` counts the coroutines asleep now; ``wait_for_sleepers(n)`` blocks (in
    real time, on a condition) until there are ``n``, so a test advances only once the
    timer it means to fire is registered.

    >>> clock = ManualClock(start=0.0, wall=0.0)
    >>> clock.advance(2.5)
    0
    >>> clock.monotonic(), clock.time(), clock.sleepers, clock.next_due()
    (2.5, 2.5, 0, None)
    """

    def __init__(self, start: float = 0.0, wall: float | None = None) -> None:
        self._start = float(start)
        self._wall = time.time() if wall is None else float(wall)
        self._elapsed = 0.0
        self._sleepers: list[_Sleeper] = []  # a heap, soonest first
        self._seq = itertools.count()
        self._changed = threading.Condition(threading.Lock())

    def monotonic(self) -> float:
        with self._changed:
            return self._start + self._elapsed

    def time(self) -> float:
        with self._changed:
            return self._wall + self._elapsed

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await asyncio.sleep(0)  # a zero delay waits for no time, as asyncio.sleep(0)
            return
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        with self._changed:
            sleeper = _Sleeper(self._start + self._elapsed + seconds, next(self._seq), loop, future)
            heapq.heappush(self._sleepers, sleeper)
            self._changed.notify_all()
        try:
            await future
        finally:
            with self._changed:  # cancelled before it was due: it no longer waits
                if sleeper in self._sleepers:
                    self._sleepers.remove(sleeper)
                    heapq.heapify(self._sleepers)
                    self._changed.notify_all()

    def advance(self, seconds: float) -> int:
        """Move time on by ``seconds`` and wake every sleeper now due, in due order; how many."""
        if seconds < 0:
            raise ValueError("a clock does not go back")
        with self._changed:
            self._elapsed += seconds
            now = self._start + self._elapsed
            due: list[_Sleeper] = []
            while self._sleepers and self._sleepers[0].due <= now:
                due.append(heapq.heappop(self._sleepers))
            self._changed.notify_all()
        for sleeper in due:  # one loop runs its callbacks in the order they were queued
            try:
                sleeper.loop.call_soon_threadsafe(_wake, sleeper.future)
            except RuntimeError:  # its loop is closed: nothing waits on it any more
                pass
        return len(due)

    @property
    def sleepers(self) -> int:
        """How many coroutines are asleep on this clock now."""
        with self._changed:
            return len(self._sleepers)

    def next_due(self) -> float | None:
        """When (on ``monotonic()``) the next sleeper is due; None when none sleeps."""
        with self._changed:
            return self._sleepers[0].due if self._sleepers else None

    def pending(self) -> list[float]:
        """The seconds left for each sleeper, soonest first (``[3.0, 60.0]``)."""
        with self._changed:
            now = self._start + self._elapsed
            return sorted(s.due - now for s in self._sleepers)

    def advance_until(self, condition: Callable[[], object], timeout: float = 15.0) -> bool:
        """Fire the timers in due order, moving time to each next due time in turn, until
        ``condition()`` is true (True), or ``timeout`` real seconds have passed (False).

        For a flow whose timers a test does not count one by one (a re-ask's delay, then a
        send's pacing): between two moves the runtime is given a moment of real time to
        react and set its next timers, so time runs ahead of a slow reaction: keep the
        timeouts of the flow (a reminder's ``unconfirmed_seconds``) long."""
        until = time.monotonic() + timeout
        while not condition():
            left = until - time.monotonic()
            if left <= 0:
                return False
            with self._changed:
                due = self._sleepers[0].due if self._sleepers else None
            if due is not None:
                self.advance(max(0.0, due - self.monotonic()))
            time.sleep(min(left, _REACT_SECONDS))
        return True

    def wait_for_sleepers(self, count: int = 1, timeout: float = 10.0) -> bool:
        """Block until at least ``count`` coroutines sleep on this clock (True), or ``timeout``
        real seconds have passed (False): a safety timeout, not a timer."""
        with self._changed:
            return self._changed.wait_for(lambda: len(self._sleepers) >= count, timeout)

    def __repr__(self) -> str:
        return f"ManualClock(monotonic={self.monotonic():g}, sleepers={self.sleepers})"
