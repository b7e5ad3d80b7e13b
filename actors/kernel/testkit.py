"""The test kit: start part of a tree, inject a message anywhere, wait for what it causes.

>>> with running(("dispatcher", ActionDispatcher), ("sender.console", Recorder)) as rt:  # doctest: +SKIP
...     with rt.probe("sender.console") as out:
...         rt.send("dispatcher", LLMReply(prompt=prompt, text='{"type": "message_console", ...}'))
...         out.expect(OutboundMessage, timeout=5)

``Runtime.send`` injects, ``Runtime.probe`` watches, ``Probe.expect`` waits.

On a ``ManualClock`` no timer fires until the test advances it::

    >>> clock = ManualClock()
    >>> with running(("ticker", Ticker), clock=clock) as rt:                  # doctest: +SKIP
    ...     with rt.probe("ticker") as seen:
    ...         rt.send("ticker", Start())        # its handler schedule()s a Tick in 30 s
    ...         clock.wait_for_sleepers(1)        # the timer is set; no time has passed
    ...         clock.advance(30)
    ...         seen.expect(Tick, timeout=5)
"""

from __future__ import annotations

import contextlib
import random
import threading
from collections.abc import Collection, Iterator
from typing import Any

from autoresponse.actors.kernel.actor import TypedActor, handles
from autoresponse.actors.kernel.clock import Clock, ManualClock  # noqa: F401  (for tests)
from autoresponse.actors.kernel.runtime import Runtime
from autoresponse.messages.envelope import Envelope


class Recorder(TypedActor):
    """A stand-in that accepts any message and does nothing; probe it to see what arrived."""

    @handles
    def on_anything(self, message: object, env: Envelope) -> None:
        pass


@contextlib.contextmanager
def running(*specs: tuple[Any, ...], runtime: Runtime | None = None,
            clock: Clock | None = None) -> Iterator[Runtime]:
    """A started runtime with ``(name, actor_class, *args)`` spawned in order; stopped after.

    ``clock`` is the new runtime's clock (a ``ManualClock`` to drive its timers); a
    ``runtime`` given already has its own."""
    if runtime is not None and clock is not None and runtime.clock is not clock:
        raise ValueError("give the clock to the Runtime you pass, not to running()")
    rt = runtime or Runtime(clock=clock)
    rt.start()
    try:
        for name, actor_class, *args in specs:
            rt.spawn(name, actor_class, *args)
        yield rt
    finally:
        rt.stop(drain=5.0)


class InjectedFault(RuntimeError):
    """Raised by a ``FaultInjector`` in place of a handler."""


class FaultInjector:
    """Install as ``runtime.fault``: chosen actors raise on a share of their messages.

    ``times`` raises on that many messages, then never again; otherwise each
    message raises with probability ``rate``.
    """

    def __init__(self, *, actors: Collection[str] | None = None, rate: float = 0.0,
                 times: int | None = None, seed: int = 0) -> None:
        self.actors = None if actors is None else frozenset(actors)
        self.rate = rate
        self.times = times
        self.raised: list[tuple[str, str]] = []  # (actor, message id)
        self._random = random.Random(seed)
        self._lock = threading.Lock()

    def __call__(self, actor: str, envelope: Envelope) -> None:
        if self.actors is not None and actor not in self.actors:
            return
        with self._lock:
            if self.times is not None:
                if self.times <= 0:
                    return
                self.times -= 1
            elif self._random.random() >= self.rate:
                return
            self.raised.append((actor, envelope.message_id))
        raise InjectedFault(f"injected fault in {actor}")
