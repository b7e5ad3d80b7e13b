"""A cell: a stable name, its mailbox, and the current incarnation of its actor.

Senders address cells by name; a restart swaps the incarnation, never the
name or the mailbox, so no sender breaks and no queued message is lost.

The crash path, in order, all in the dying incarnation's thread:

1. A handler raises. ``TypedActor._handle`` remembers the envelope it was
   handling, and the actor's loop (pykka's, with the runtime's items first)
   catches the exception as pykka's does, logs it and marks the
   incarnation stopped (its inbox view now reads as empty, so pykka drains
   nothing).
2. The loop calls ``TypedActor.on_failure``: the incarnation cancels every task
   and timer it owns, puts the work they were doing back at the head of the
   mailbox, runs ``teardown``, and calls ``Cell.crashed``.
3. ``Cell.crashed`` records the failure. Under a supervisor it asks the runtime
   to ``recover`` the message (back at the head of the mailbox, one attempt
   later, or a dead letter after its last attempt; an ``ActorGaveUp`` message
   counts as handled) and signals ``Exit(abnormal=True)`` to the supervisor,
   ahead of its queued work. Without one, the runtime's ``crash_policy``
   decides (the default dead-letters the message and restarts at once).
4. The supervisor's ``on_exit`` applies its restart type, restart intensity
   (one restart too many fails the supervisor itself, which climbs the tree
   the same way) and strategy, waits out the backoff on a timer it owns, and
   calls ``Cell.restart``: a new incarnation on the same mailbox, which
   handles the retried message first and then everything queued behind it.
"""

from __future__ import annotations

import logging
import threading
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import pykka

from autoresponse.actors.kernel._mailbox import Mailbox
from autoresponse.actors.kernel.actor import ActorGaveUp, TypedActor, adopting
from autoresponse.actors.limits import START_SECONDS
from autoresponse.messages.control import Exit, Failure
from autoresponse.messages.envelope import Envelope

if TYPE_CHECKING:
    from autoresponse.actors.kernel.runtime import Runtime

log = logging.getLogger("autoresponse.runtime")

_Book = TypeVar("_Book")

CellState = Literal["running", "restarting", "stopped"]


@dataclass(frozen=True)
class Failing:
    """What an actor said is wrong outside it (its platform refuses it, a lease it cannot
    renew), and since when (the runtime clock's ``time()``): see ``Cell.report_health``."""

    reason: str
    since: float


class Cell:
    """A stable name, its mailbox, and the current incarnation of its actor."""

    def __init__(
        self,
        runtime: Runtime,
        name: str,
        actor_class: type[TypedActor],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        mailbox: Mailbox,
        supervisor: str | None = None,
    ) -> None:
        self.runtime = runtime
        #: The name of the supervisor told of this actor's exits; None for the root.
        self.supervisor = supervisor
        #: True while a stop asked for by the runtime or a supervisor is under way.
        self.stop_requested = False
        self.name = name
        self.actor_class = actor_class
        self.args = args
        self.kwargs = kwargs
        self.mailbox = mailbox
        self.state: CellState = "stopped"
        self.restarts = 0
        self.processed = 0
        self.last_failure: Failure | None = None
        #: Set when the current incarnation has finished its setup.
        self.ready = threading.Event()
        #: What the actor reports failing outside it, by concern (see ``report_health``);
        #: kept across restarts: only the actor's next report clears it.
        self._failing: dict[str, Failing] = {}
        #: True once the actor has reported its health at all (it watches something outside).
        self.reports_health = False
        # Its own lock: a setup reports health while a restart holds ``_lock``, waiting for it.
        self._health_lock = threading.Lock()
        self._ref: pykka.ActorRef[Any] | None = None
        #: The incarnation now, weakly (set by it as it starts): what it is handling, for traces.
        self.incarnation: weakref.ref[TypedActor] | None = None
        self._books: dict[type, Any] = {}  # see ``book``
        self._books_lock = threading.Lock()  # held alone, briefly: an incarnation asks as it starts
        self._lock = threading.RLock()

    def __repr__(self) -> str:
        return f"<Cell {self.name} {self.state} restarts={self.restarts}>"

    def start(self, wait: float = START_SECONDS) -> None:
        """Start an incarnation on this cell's mailbox (the first, or after a stop).

        Returns once its ``setup`` has finished (or failed), as OTP's start_link
        does, so a supervisor's children start one after the other, in order.
        """
        with self._lock:
            ready = self._spawn()
        self._await_setup(ready, wait)

    def restart(self) -> None:
        """Start a fresh incarnation on the same mailbox, counted as a restart."""
        with self._lock:
            if self.mailbox.closed:
                return
            self.restarts += 1
            ready = self._spawn()
        self._await_setup(ready, START_SECONDS)

    def _spawn(self) -> threading.Event:
        """Start an incarnation (the caller holds ``_lock``); the event its setup sets."""
        with adopting(self):
            self.stop_requested = False
            self.ready = threading.Event()
            self._ref = self.actor_class.start(*self.args, **self.kwargs)
            self.state = "running"
            return self.ready

    def _await_setup(self, ready: threading.Event, wait: float) -> None:
        # Never under ``_lock``: a setup may need the event loop, and the loop may be
        # reading this cell's status (``alive``) for /healthz at that moment.
        if not ready.wait(wait):
            log.warning("actor %s is still setting up after %.0fs", self.name, wait)

    def crashed(self, envelope: Envelope | None, error: BaseException) -> None:
        """Called by a dying incarnation, in its own thread, with what it was handling."""
        with self._lock:
            # Shown by /status, the status page and `autoresponse status`: redacted as dead letters are.
            self.last_failure = Failure(type=type(error).__name__,
                                        message=self.runtime.dead_letters.redact(str(error)))
            self.state = "restarting"
        if self.supervisor is None:
            self.runtime.crash_policy(self, envelope, error)
            return
        set_aside = self.runtime.recover(self, envelope, error)
        self.runtime.signal(self.supervisor, Exit(name=self.name, abnormal=True,
                                                  failure=self.last_failure, set_aside=set_aside))

    def crashed_retired(self, envelope: Envelope | None, error: BaseException) -> None:
        """Called by an incarnation that a stop let go (``TypedActor.retire``), crashing once
        back from its handler: its successor runs on, so only the message is dealt with, as
        a crash's would be (retried under a supervisor, else a dead letter)."""
        if envelope is None:
            return
        if self.supervisor is not None:
            self.runtime.recover(self, envelope, error)
        else:
            _dead_letter_crashed(self, envelope, error)

    def exited_normally(self) -> None:
        """Called by an incarnation that stopped itself."""
        with self._lock:
            self.state = "stopped"
            self._ref = None
        if self.supervisor is not None:
            self.runtime.signal(self.supervisor, Exit(name=self.name, abnormal=False))

    def stop(self, timeout: float) -> bool:
        """Stop the current incarnation, keeping the mailbox; True if it stopped in time.
        Else it is retired (``TypedActor.retire``): it ends once its handler returns, and
        the mailbox is for the next incarnation."""
        with self._lock:
            self.state = "stopped"
            self.stop_requested = True
            ref, self._ref = self._ref, None
            actor = self.incarnation() if self.incarnation is not None else None
        if ref is None:
            return True
        try:
            ref.stop(block=True, timeout=timeout)
        except pykka.ActorDeadError:
            pass
        except pykka.Timeout:
            log.warning("actor %s did not stop within %.1fs", self.name, timeout)
            if actor is not None:  # a thread cannot be killed: it stops once its handler returns
                actor.retire()
            return False
        return True

    def book(self, kind: type[_Book]) -> _Book:
        """The cell's one ``kind()``, made at the first ask: what its actor must not forget
        when it crashes (the builder's batches, a conversation's turns), kept across its
        incarnations. Only facts go in it, each once it is true: the state of a crashed
        incarnation is never trusted. From any thread."""
        with self._books_lock:
            found = self._books.get(kind)
            if found is None:
                found = self._books[kind] = kind()
            return found

    def report_health(self, ok: bool, reason: str = "", *, concern: str = "") -> None:
        """The actor says whether the world outside it works: ``ok=False`` marks it failing
        with ``reason`` (redacted as dead letters are) from now, or since it began failing;
        ``ok=True`` clears the mark. Each ``concern`` (its platform, a lease) is marked and
        cleared on its own. From any thread; a transition is logged."""
        now = self.runtime.clock.time()
        with self._health_lock:
            self.reports_health = True
            before = self._failing.get(concern)
            if ok:
                if before is None:
                    return
                del self._failing[concern]
            else:
                reason = self.runtime.dead_letters.redact(reason or "failing")
                if before is not None and before.reason == reason:
                    return
                self._failing[concern] = Failing(reason, before.since if before else now)
        if ok and before is not None:  # (an ok with no mark returned above)
            log.info("%s works again (it was failing for %.0fs: %s)", self.name, now - before.since,
                     before.reason)
        elif before is None:
            log.warning("%s is failing: %s", self.name, reason)

    @property
    def failing(self) -> Failing | None:
        """None while the actor reports nothing wrong; else its reasons, since the earliest."""
        with self._health_lock:
            marks = list(self._failing.values())
        if not marks:
            return None
        return Failing("; ".join(m.reason for m in marks), min(m.since for m in marks))

    def in_hand(self) -> tuple[Envelope, str, float] | None:
        """The message the incarnation is handling now, its type, and when it started."""
        actor = self.incarnation() if self.incarnation is not None else None
        return actor.in_hand() if actor is not None else None

    @property
    def alive(self) -> bool:
        with self._lock:  # a (re)start in progress holds the lock until its ref is known
            ref = self._ref
            return ref is not None and ref.is_alive()


def restart_and_dead_letter(cell: Cell, envelope: Envelope | None, error: BaseException) -> None:
    """The default crash policy: the message goes to the dead-letter office with
    its exception, and the actor starts afresh on the same mailbox. Supervisors
    replace this with their strategies."""
    if envelope is None:
        # It failed outside any message (in setup): restarting would fail the
        # same way, forever. It stays stopped and its mailbox refuses work.
        cell.stop(timeout=0)
        cell.runtime.close(cell)
        return
    _dead_letter_crashed(cell, envelope, error)
    cell.restart()


def _dead_letter_crashed(cell: Cell, envelope: Envelope, error: BaseException) -> None:
    """The message a crash was on goes to the dead-letter office (one that gave up is done)."""
    if isinstance(error, ActorGaveUp):
        cell.runtime.inflight.done(envelope.correlation_id)
    else:
        cell.runtime.dead_letter(envelope, "crash", actor=cell.name, error=error)
