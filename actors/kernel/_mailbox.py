"""A bounded mailbox with a priority lane, shared by every incarnation of an actor.

Work (envelopes, queued bare: a hop allocates nothing for its mailbox) goes in a
bounded lane. Everything else (pykka's stop and proxy calls as pykka's letters,
I/O completions of work already accepted, supervision signals) goes in an
unbounded priority lane that is served first, so an actor can always be stopped
and always learns how its own I/O ended, however full it is.

Capacity is a level, not a wall: accepted work is never dropped for want of
room. What bounds the work in the runtime is the intake (``Intake``), which
makes the sources wait; inside, a mailbox over its capacity still takes the
letter, and says so (``overflowed``). Overflow policy, per mailbox:

* ``HOLD``: queue it anyway, at once; nothing blocks (the default).
* ``BLOCK``: a sender outside the event loop waits up to ``block_seconds``
  for room, then queues it anyway.
"""

from __future__ import annotations

import enum
import functools
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import pykka
from pykka.messages import _ActorStop as ActorStop  # pykka's stop letter (the kernel runs its loop)

from autoresponse.actors.kernel.inflight import InFlight
from autoresponse.messages.envelope import Envelope

_allocate_lock = threading.Lock


class _Closed:
    """What ``Mailbox.get`` returns once the mailbox is closed and holds nothing more."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "CLOSED"


CLOSED = _Closed()


class OverflowPolicy(enum.Enum):
    HOLD = "hold"
    BLOCK = "block"


class MailboxClosed(Exception):
    """The actor behind this mailbox has stopped for good."""


class Mailbox:
    def __init__(
        self,
        capacity: int,
        policy: OverflowPolicy = OverflowPolicy.HOLD,
        block_seconds: float = 0.0,
    ) -> None:
        if capacity < 1:
            raise ValueError("mailbox capacity must be at least 1")
        self.capacity = capacity
        self.policy = policy
        self.block_seconds = block_seconds
        self._lock = threading.Lock()
        self._writable = threading.Condition(self._lock)
        self._work: deque[Any] = deque()
        self._priority: deque[Any] = deque()
        self._closed = False
        #: Readers asleep in ``get``, each on a lock of its own that a put releases: what
        #: ``threading.Condition`` does, without its Python code on every hop (an actor's
        #: thread sleeps and is woken about once every other message under load).
        self._sleepers: deque[Any] = deque()
        #: Writers waiting for room (only ever under ``BLOCK``).
        self._putting = 0
        #: Letters queued while the work lane was at or over capacity.
        self.overflowed = 0

    def put(self, envelope: Envelope, *, may_block: Callable[[], bool] | None = None) -> None:
        """Queue ``envelope`` as work (or pykka's letter around one: an ``ask``).

        Under ``BLOCK`` a full work lane makes the caller wait (unless ``may_block()``
        says it must not: asked then, not on every put) up to ``block_seconds``; it is
        queued either way.
        """
        lock = self._lock
        lock.acquire()  # not ``with``: it binds two methods of the lock, on every hop
        try:
            if self._closed:
                raise MailboxClosed
            if len(self._work) >= self.capacity:
                if self.policy is OverflowPolicy.BLOCK and (may_block is None or may_block()):
                    self._wait_for_room()
                if len(self._work) >= self.capacity:
                    self.overflowed += 1
            self._work.append(envelope)
            if self._sleepers:
                self._sleepers.popleft().release()
        finally:
            lock.release()

    def put_priority(self, item: Any) -> None:
        """Queue ``item`` ahead of all work, whatever its type: an I/O completion, a
        supervision signal (an envelope), or pykka's letter (its stop, a proxy call)."""
        lock = self._lock
        lock.acquire()  # as in ``put``: an I/O completion on most deliveries
        try:
            if self._closed:
                raise MailboxClosed
            self._priority.append(item)
            if self._sleepers:
                self._sleepers.popleft().release()
        finally:
            lock.release()

    def put_front(self, envelope: Envelope) -> None:
        """Put accepted work back at the head of the work lane (a retry keeps its place)."""
        with self._lock:
            if self._closed:
                raise MailboxClosed
            self._work.appendleft(envelope)
            if self._sleepers:
                self._sleepers.popleft().release()

    def _wait_for_room(self) -> None:
        until = time.monotonic() + self.block_seconds
        while len(self._work) >= self.capacity and not self._closed:
            left = until - time.monotonic()
            if left <= 0:
                break
            self._putting += 1
            try:
                self._writable.wait(left)
            finally:
                self._putting -= 1
        if self._closed:
            raise MailboxClosed

    def get(self, may_take_work: Callable[[], bool] | None = None) -> Any:
        """The next item, priority first (an envelope of work, or what ``put_priority``
        queued); blocks until there is one. Once the mailbox is closed it returns ``CLOSED``
        (a thread still asleep here then ends, rather than sleep for ever).

        While ``may_take_work()`` is false only the priority lane is served (its
        answer may change only in the calling thread, after a priority letter).
        """
        lock = self._lock
        lock.acquire()  # as in ``put``
        try:
            while not self._priority and not (self._work and (may_take_work is None or may_take_work())):
                if self._closed:
                    return CLOSED
                asleep = _allocate_lock()
                asleep.acquire()
                self._sleepers.append(asleep)
                lock.release()
                try:
                    asleep.acquire()  # until a put releases it
                finally:
                    lock.acquire()
            if self._priority:
                return self._priority.popleft()
            envelope = self._work.popleft()
            if self._putting:
                self._writable.notify()
            return envelope
        finally:
            lock.release()

    def empty(self) -> bool:
        with self._lock:
            return not self._priority and not self._work

    def envelopes_of(self, correlation_id: str) -> list[Envelope]:
        """The envelopes of ``correlation_id`` waiting here, priority first (a snapshot)."""
        with self._lock:
            items = [*self._priority, *self._work]
        return [item for item in items if type(item) is Envelope and item.correlation_id == correlation_id]

    def __len__(self) -> int:
        """Depth: items waiting in both lanes."""
        return len(self._work) + len(self._priority)

    def withdraw(self, test: Callable[[Any], bool]) -> list[Any]:
        """Take back the items of the priority lane that pass ``test`` (rare: a scan)."""
        with self._lock:
            taken = [item for item in self._priority if test(item)]
            for item in taken:
                self._priority.remove(item)
            return taken

    def close(self) -> list[Any]:
        """Refuse all further items and hand back what was still queued."""
        with self._lock:
            self._closed = True
            left = [*self._priority, *self._work]
            self._priority.clear()
            self._work.clear()
            self._writable.notify_all()
            while self._sleepers:
                self._sleepers.popleft().release()
            return left

    @property
    def closed(self) -> bool:
        return self._closed


class Addressed:
    """A pykka stop letter for the incarnation whose view it was put in."""

    __slots__ = ("letter", "to")

    def __init__(self, letter: Any, to: InboxView) -> None:
        self.letter = letter
        self.to = to


def refuse(letter: Any, why: str) -> None:
    """Answer a pykka letter nobody will handle, if anyone waits on it: ``ActorDeadError``."""
    if letter.reply_to is not None:
        letter.reply_to.set_exception((pykka.ActorDeadError, pykka.ActorDeadError(why), None))


class InboxView:
    """One incarnation's view of a cell's mailbox.

    pykka drains an actor's inbox after the actor stops, discarding what it
    finds. A view reports itself empty once its actor has stopped (crashed,
    restarted or shut down), so the queue is left to the next incarnation, or
    to the runtime, which dead-letters whatever is left at shutdown.
    """

    __slots__ = ("_mailbox", "_inflight", "_stopped", "get")

    #: The next item (the actor's loop takes each with it): the mailbox's own ``get``, bound
    #: to the actor's ``may_take_work`` once known; no call of a view's between the two.
    get: Callable[[], Any]

    def __init__(self, mailbox: Mailbox, inflight: InFlight) -> None:
        self._mailbox = mailbox
        self._inflight = inflight  # the runtime's: an envelope put here is work in flight
        self._stopped: threading.Event | None = None
        self.get = mailbox.get

    def bind(self, stopped: threading.Event, may_take_work: Callable[[], bool] | None = None) -> None:
        self._stopped = stopped
        if may_take_work is not None:
            self.get = functools.partial(self._mailbox.get, may_take_work)

    def put(self, letter: Any) -> None:
        """pykka's ``tell`` and ``ask`` put its letters here: its own messages go ahead of
        the work; an envelope told or asked through pykka is work like any other, in turn
        (asked, it stays in its letter, which carries the reply). A stop is addressed to
        this view's incarnation: the next one, on the same mailbox, must not take it."""
        envelope = letter.message
        if type(envelope) is not Envelope:
            self._mailbox.put_priority(Addressed(letter, self) if type(envelope) is ActorStop else letter)
            return
        self._inflight.add(envelope.correlation_id)  # in flight from now, as ``Runtime.deliver`` counts it
        try:
            self._mailbox.put(envelope if letter.reply_to is None else letter)
        except MailboxClosed:
            self._inflight.done(envelope.correlation_id)
            raise

    def empty(self) -> bool:
        if self._stopped is not None and self._stopped.is_set():
            return True
        return self._mailbox.empty()
