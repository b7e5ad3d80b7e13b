"""The intake: the runtime's front door for work from outside.

It bounds the work in the runtime (admission): at most ``capacity`` items
accepted and not yet finished; past that, sources are told to wait (``room``,
``IntakeFull`` with a Retry-After), never accepted and then dropped.

With a journal, it makes that work survive a kill: each item is written before
it is acknowledged upstream, resumed on the next start if it did not finish,
and closed only when its correlation has nothing left in flight. An item cut
short by a stop is *interrupted*, not finished: it stays open and resumes.

>>> from autoresponse.actors.kernel.testkit import Recorder, running
>>> with running(("llm", Recorder)) as runtime:  # no journal here: set runtime.journal for one
...     runtime.accept("llm", "df -h", correlation_id="telegram-7").result()  # then acknowledge
Envelope(..., correlation=telegram-7, hops=0, attempt=1, body=str)
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from typing import TYPE_CHECKING, Any

from autoresponse.actors.journal import JournalFailing
from autoresponse.actors.limits import INTAKE_RETRY_AFTER_SECONDS, MALFORMED_KEPT, MAX_OPEN_ITEMS
from autoresponse.messages.control import MalformedInput
from autoresponse.messages.envelope import Envelope

if TYPE_CHECKING:
    from autoresponse.actors.journal import DeliveryJournal, JournalItem
    from autoresponse.actors.kernel.runtime import Runtime

log = logging.getLogger("autoresponse.intake")


class IntakeFull(Exception):
    """The runtime holds as much outside work as it may take; ask again after ``retry_after``."""

    def __init__(self, capacity: int, retry_after: float = INTAKE_RETRY_AFTER_SECONDS) -> None:
        super().__init__(f"busy: {capacity} requests are already in progress; try again in "
                         f"{retry_after:g}s")
        self.retry_after = retry_after


class Unstorable(ValueError):
    """A message that cannot be journaled (text that is not valid Unicode, such as a
    lone surrogate from a JSON escape): refused at the door, as malformed input."""


class Intake:
    """Admission, journaling and resumption of the work that starts correlations."""

    def __init__(self, runtime: Runtime, journal: DeliveryJournal | None = None,
                 capacity: int = MAX_OPEN_ITEMS) -> None:
        self.runtime = runtime
        self.journal = journal
        self.capacity = capacity
        self._lock = threading.Lock()
        self._room = threading.Condition(self._lock)
        self._waiting = 0  # threads waiting in ``_admit`` for a place
        #: Correlations accepted or resumed in this run and not finished.
        self._open: set[str] = set()
        self._reserved = 0  # admitted, waiting for the journal's word
        self._interrupted: set[str] = set()
        self._left_open: set[str] = set()  # interrupted and ended: they resume next start
        self._failed: set[str] = set()
        self._room_waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []
        self._paused = False
        self._feed_started = False

    # ---------------------------------------------------------------- admission

    @property
    def open_count(self) -> int:
        with self._lock:
            return len(self._open)

    def free(self) -> int:
        """Places left before sources are told to wait."""
        with self._lock:
            return 0 if self._paused else max(0, self.capacity - len(self._open) - self._reserved)

    @property
    def paused(self) -> bool:
        """Nothing new is taken now (``pause``d, not yet ``open``ed)."""
        with self._lock:
            return self._paused

    def pause(self) -> None:
        """Take nothing new until ``open`` (while the journal is resumed at start)."""
        with self._lock:
            self._paused = True

    def open(self) -> None:
        with self._lock:
            self._paused = False
            self._notify_room()
            feed = self.distributed and not self._feed_started
            self._feed_started = self._feed_started or feed
        if feed:
            self.journal.start_feed(self._take, self.free, self._unreadable)  # type: ignore[union-attr]

    @property
    def distributed(self) -> bool:
        """Work is shared with other daemons through the journal (NATS JetStream)."""
        return bool(getattr(self.journal, "distributed", False))

    def _has_room(self) -> bool:
        return not self._paused and len(self._open) + self._reserved < self.capacity

    def _admit(self, wait: float | None) -> bool:
        """Reserve a place, waiting up to ``wait`` seconds (None: until there is one).
        Never waits on the event loop thread, where the work that frees places runs."""
        if self.runtime.io.in_loop_thread():
            wait = 0.0
        until = None if wait is None else time.monotonic() + wait
        with self._lock:
            while not self._has_room():
                left = None if until is None else until - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._waiting += 1
                try:
                    self._room.wait(0.5 if left is None else min(left, 0.5))
                finally:
                    self._waiting -= 1
                if self.runtime.stopping:
                    return False
            self._reserved += 1
            return True

    async def room(self, timeout: float | None = None) -> bool:
        """Wait, on an event loop, until an item would be admitted; False after ``timeout``."""
        loop = asyncio.get_running_loop()
        until = None if timeout is None else loop.time() + timeout
        while True:
            with self._lock:
                if self._has_room():
                    return True
                waiter: asyncio.Future[None] = loop.create_future()
                self._room_waiters.append((loop, waiter))
            left = None if until is None else until - loop.time()
            if left is not None and left <= 0:
                return False
            try:
                await asyncio.wait_for(waiter, left if left is not None else 1.0)
            except asyncio.TimeoutError:
                if until is not None and loop.time() >= until:
                    return False

    def _notify_room(self) -> None:
        """Under the lock: a place may have freed up (said on every finish; usually nobody waits)."""
        if self._waiting:
            self._room.notify_all()
        if self._room_waiters:
            waiters, self._room_waiters = self._room_waiters, []
            for loop, waiter in waiters:
                loop.call_soon_threadsafe(_wake, waiter)

    # ---------------------------------------------------------------- accepting

    async def accept_async(self, to: str, body: Any, correlation_id: str | None = None) -> Envelope:
        """``accept`` for a coroutine on the runtime's loop (a polling interface): waits for
        room without blocking the loop, then for the journal (while its writes fail, asking
        again every ``retry_after``); acknowledge upstream after."""
        while True:
            accepted = self.accept(to, body, correlation_id, wait=0.0)
            try:
                return await asyncio.wrap_future(accepted)
            except JournalFailing as exc:
                await asyncio.sleep(exc.retry_after)
            except IntakeFull:
                await self.room()

    def accept(self, to: str, body: Any, correlation_id: str | None = None, *,
               wait: float | None = 0.0) -> concurrent.futures.Future[Envelope]:
        """Admit, journal (when there is a journal), then deliver ``body`` to ``to``.

        The future resolves with the envelope once it is durable and delivered
        (acknowledge upstream then), or fails with ``IntakeFull`` when no place
        freed up within ``wait`` seconds, with ``JournalFailing`` while the journal's
        writes fail (ask again later, as for ``IntakeFull``), or with ``Unstorable`` for
        a message the journal cannot write (a malformed input: acknowledge it). A correlation already known (a client's
        retry, a re-polled update) is acknowledged again and not run twice.
        """
        envelope = Envelope.new(body, correlation_id=correlation_id)
        accepted: concurrent.futures.Future[Envelope] = concurrent.futures.Future()
        if not self._admit(wait):
            accepted.set_exception(IntakeFull(self.capacity))
            return accepted
        if self.journal is None:
            self._start(to, envelope, new=True)
            accepted.set_result(envelope)
            return accepted

        def journaled(new: bool, error: BaseException | None) -> None:
            # In the journal's writer thread, once the item is committed (or could not be).
            # ``accepted`` may be cancelled meanwhile (its caller was stopped): the item's
            # fate does not depend on it, and nobody is told.
            if error is not None:
                self._unreserve()
                if not accepted.cancelled():
                    accepted.set_exception(error)
                return
            if self.distributed:  # one of the cluster's workers takes it from the journal
                self._unreserve()
            else:
                self._start(to, envelope, new=new)
            if not accepted.cancelled():
                accepted.set_result(envelope)

        spans = self.runtime.tracer.spans if self.runtime.tracer is not None else None
        if spans is not None and self.distributed:  # the worker that takes it continues this span
            envelope.traceparent = spans.published(envelope, to)
        try:
            self.journal.accept(envelope, actor=to, then=journaled)
        except ValueError as exc:  # pydantic cannot write it as JSON: refused, its place freed
            self._unreserve()
            accepted.set_exception(Unstorable(f"the message cannot be stored: {exc}"))
        except Exception as exc:  # the journal is closed (a stop): not taken, its place freed
            self._unreserve()
            accepted.set_exception(exc)
        return accepted

    def _unreserve(self) -> None:
        """An admitted item that did not start gives its place back."""
        with self._lock:
            self._reserved -= 1
            self._notify_room()

    def _start(self, to: str, envelope: Envelope, *, new: bool) -> None:
        correlation = envelope.correlation_id
        with self._lock:
            self._reserved -= 1
            # Not new: the journal knew it (a retry). Already open: resume claimed it first.
            start = new and correlation not in self._open
            if start:
                self._open.add(correlation)
            else:
                self._notify_room()
        if start:
            self.runtime.deliver(to, envelope)

    def resume(self) -> int:
        """Deliver again every journaled item that had not finished (after a stop, a
        crash or a kill), oldest first, skipping any already under way in this run."""
        if self.journal is None:
            return 0
        resumed = 0
        for item in self.journal.unfinished():
            body, why = self._rebuilt(item)
            if body is None:  # one item that cannot run must not keep the daemon from starting
                self._unreadable(item.correlation, item.payload, f"{item.type}: cannot resume it: {why}", item.actor)
                self.journal.finish(item.correlation, "dead")
                continue
            with self._lock:
                if item.correlation in self._open:
                    continue
                self._open.add(item.correlation)
            self.runtime.deliver(item.actor, Envelope.new(body, correlation_id=item.correlation))
            resumed += 1
        return resumed

    def _rebuilt(self, item: JournalItem) -> tuple[Any, str]:
        """The message ``item`` holds, or None and why not: its actor does not handle its
        type, or its payload was written by another version or is corrupt (it can run nowhere)."""
        try:
            body = self.runtime.rebuild(item.actor, item.type, item.payload)
        except (ValueError, TypeError, RecursionError) as exc:  # a ValidationError is a ValueError
            first = str(exc).split("\n", 1)[0]  # its name, not the payload it quotes after
            return None, f"its payload is unreadable ({type(exc).__name__}: {first})"
        if body is None:
            return None, f"{item.actor} does not handle {item.type}"
        return body, ""

    def _unreadable(self, correlation: str, raw: str, why: str, actor: str | None = None) -> None:
        """A dead letter for work that can run nowhere (an item of the journal, or what the
        cluster's stream holds that is no item): as it was stored, and why."""
        self.runtime.dead_letters.post(
            Envelope.new(MalformedInput(raw=raw[:MALFORMED_KEPT]), correlation_id=correlation),
            "unreadable work item", actor=actor, detail=why)

    def _take(self, item: JournalItem) -> bool:
        """Start one of the cluster's work items here (called by a distributed journal's
        feed); False when there is no room now, and the item goes back for later."""
        body, why = self._rebuilt(item)
        with self._lock:
            if self.runtime.stopping or item.correlation in self._open or not self._has_room():
                return False
            self._open.add(item.correlation)
            if body is None:
                self._failed.add(item.correlation)
        if body is None:
            self._unreadable(item.correlation, item.payload, f"{item.type}: cannot run it: {why}", item.actor)
            self.finished(item.correlation)
            return True
        self.runtime.deliver(item.actor, Envelope.new(body, correlation_id=item.correlation,
                                                      traceparent=item.traceparent))
        return True

    # ---------------------------------------------------------------- ending

    def interrupted(self, correlation_id: str) -> None:
        """Work of this correlation was cut short by a stop: its item stays open."""
        with self._lock:
            if correlation_id in self._open:
                self._interrupted.add(correlation_id)

    def failed(self, correlation_id: str) -> None:
        """Part of this correlation was dead-lettered: its item closes as ``dead``."""
        with self._lock:
            if correlation_id in self._open:
                self._failed.add(correlation_id)

    def finished(self, correlation_id: str, trace: Any = None) -> bool:
        """The correlation has nothing left in flight: its item closes, with its ``trace``
        when one is given. False when it had no item to close (the trace is not kept)."""
        if correlation_id not in self._open:  # work sent, not accepted (its item, if any, opened before it ran)
            return False
        with self._lock:
            if correlation_id not in self._open:
                return False
            self._open.discard(correlation_id)
            interrupted = correlation_id in self._interrupted
            if interrupted:
                self._interrupted.discard(correlation_id)
                self._left_open.add(correlation_id)
            state = "dead" if correlation_id in self._failed else "done"
            self._failed.discard(correlation_id)
            self._notify_room()
        if self.journal is None or interrupted:
            return False
        self.journal.finish(correlation_id, state, trace)
        return True

    def unfinished_here(self) -> int:
        """Items of this run not finished: under way, or interrupted by a stop (with a
        journal, those resume on the next start)."""
        with self._lock:
            return len(self._left_open) + len(self._open)


def _wake(waiter: asyncio.Future[None]) -> None:
    """On the waiter's loop: there may be room now (unless it stopped waiting)."""
    if not waiter.done():
        waiter.set_result(None)
