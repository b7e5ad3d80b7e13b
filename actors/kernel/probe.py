"""Probes: watch the messages sent to a named actor, and wait for one.

>>> from autoresponse.actors.kernel.testkit import Recorder, running
>>> with running(("sender.console", Recorder)) as runtime, runtime.probe("sender.console") as probe:
...     sent = runtime.send("sender.console", "hello")
...     probe.expect(str, timeout=10).body
'hello'
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from autoresponse.messages.envelope import Envelope

T = TypeVar("T")


class ProbeTimeout(AssertionError):
    """No matching message arrived in time."""


class Probe:
    """A copy of every envelope delivered to one actor's mailbox, in order."""

    def __init__(self, name: str, on_close: Callable[[Probe], None] | None = None) -> None:
        self.name = name
        self._cond = threading.Condition()
        self._seen: list[Envelope] = []
        self._taken: set[str] = set()
        self._on_close = on_close

    def offer(self, envelope: Envelope) -> None:
        with self._cond:
            self._seen.append(envelope)
            self._cond.notify_all()

    @property
    def envelopes(self) -> list[Envelope]:
        with self._cond:
            return list(self._seen)

    def bodies(self, body_type: type[T] = object) -> list[T]:  # type: ignore[assignment]
        return [e.body for e in self.envelopes if isinstance(e.body, body_type)]

    def expect(
        self,
        body_type: type[T] = object,  # type: ignore[assignment]
        where: Callable[[Any], bool] | None = None,
        timeout: float = 10.0,
    ) -> Envelope:
        """The next not yet expected envelope whose body matches; waits up to ``timeout``."""
        until = time.monotonic() + timeout
        with self._cond:
            while True:
                for env in self._seen:
                    if env.message_id in self._taken or not isinstance(env.body, body_type):
                        continue
                    if where is None or where(env.body):
                        self._taken.add(env.message_id)
                        return env
                left = until - time.monotonic()
                if left <= 0:
                    raise ProbeTimeout(
                        f"no {body_type.__name__} reached {self.name!r} within {timeout}s; "
                        f"saw {[type(e.body).__name__ for e in self._seen]}"
                    )
                self._cond.wait(left)

    def close(self) -> None:
        if self._on_close is not None:
            self._on_close(self)
            self._on_close = None

    def __enter__(self) -> Probe:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
