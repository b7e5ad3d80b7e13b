"""The runtime: named actors, delivery, the event loop, dead letters, in-flight work.

>>> from autoresponse.actors.kernel.testkit import Recorder  # takes any message, does nothing
>>> runtime = Runtime().start()
>>> cell = runtime.spawn("echo", Recorder)
>>> runtime.send("echo", "ping")
Envelope(..., hops=0, attempt=1, body=str)
>>> runtime.wait_idle(timeout=5)
True
>>> runtime.stop()
True

Names are stable: a cell (a name plus its mailbox, see ``cell``) outlives every
incarnation of its actor, so a restart breaks no sender and loses no queued message.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal

from autoresponse.actors.kernel._loop import EventLoopKind, EventLoopThread
from autoresponse.actors.kernel._mailbox import Addressed, Mailbox, MailboxClosed, OverflowPolicy, refuse
from autoresponse.actors.kernel.actor import ActorGaveUp, IoDone, TypedActor
from autoresponse.actors.kernel.cell import Cell, restart_and_dead_letter
from autoresponse.actors.kernel.clock import Clock
from autoresponse.actors.kernel.deadletters import DeadLetterOffice
from autoresponse.actors.kernel.inflight import InFlight
from autoresponse.actors.kernel.intake import Intake
from autoresponse.actors.limits import (
    DRAIN_SECONDS,
    MAILBOX_BLOCK_SECONDS,
    MAILBOX_CAPACITY,
    MAX_HOPS,
    MAX_OPEN_ITEMS,
    MESSAGE_ATTEMPTS,
)
from autoresponse.actors.kernel.probe import Probe
from autoresponse.actors.kernel.trace import InFlightHop, TraceRecorder, hops_of
from autoresponse.messages.control import MalformedInput
from autoresponse.messages.envelope import Envelope

if TYPE_CHECKING:
    from autoresponse.actors.journal import DeliveryJournal

log = logging.getLogger("autoresponse.runtime")


class _Tap:
    """A listener on one actor's deliveries (see ``Runtime.watch``)."""

    __slots__ = ("name", "offer")

    def __init__(self, name: str, offer: Callable[[Envelope], None]) -> None:
        self.name = name
        self.offer = offer


class NotReplayable(KeyError):
    """A dead letter that ``Runtime.replay`` cannot send again: none with that id, or one
    nothing can run (an input that could not be read, a type its actor no longer handles)."""

    def __str__(self) -> str:  # the sentence, not KeyError's quoted repr of it
        return str(self.args[0]) if self.args else ""


class Runtime:
    """Owns the actors, the event loop thread, the clock and the dead-letter office.

    ``clock`` is the one clock every timer of the runtime waits on (``Clock()``, real
    time, by default; a ``ManualClock`` in tests): see ``autoresponse.actors.kernel.clock``.
    """

    _current: Runtime | None = None

    def __init__(
        self,
        *,
        max_hops: int = MAX_HOPS,
        mailbox_capacity: int = MAILBOX_CAPACITY,
        message_attempts: int = MESSAGE_ATTEMPTS,
        max_open: int = MAX_OPEN_ITEMS,
        trace: bool = True,
        clock: Clock | None = None,
        event_loop: EventLoopKind = "uvloop",
    ) -> None:
        #: What time it is, and the timers' sleep: every actor reads ``self.runtime.clock``.
        self.clock: Clock = clock if clock is not None else Clock()
        self.max_hops = max_hops
        self.message_attempts = message_attempts
        self.mailbox_capacity = mailbox_capacity
        self.dead_letters = DeadLetterOffice(now=self.clock.time)
        #: Every hop of the recent requests (None: not recorded).
        self.tracer: TraceRecorder | None = TraceRecorder(now=self.clock.time) if trace else None
        if self.tracer is not None:
            self.dead_letters.observers.append(self.tracer.dead_letter)
        self.io = EventLoopThread(kind=event_loop)
        # Asked by a full mailbox under BLOCK: never block the event loop's thread, where
        # every actor's I/O completes (made once, not on every hop).
        self._off_loop: Callable[[], bool] = lambda: not self.io.in_loop_thread()
        self.inflight = InFlight()
        self.crash_policy: Callable[[Cell, Envelope | None, BaseException], None] = (
            restart_and_dead_letter
        )
        #: Called before every handler with (actor name, envelope); raising crashes
        #: the actor as the handler would. For fault injection in tests (see testkit).
        self.fault: Callable[[str, Envelope], None] | None = None
        #: The actor that error reports go to (see ``route_error``).
        self.error_route: str | None = None
        #: The front door for work from outside: admission, journal, resume (see ``accept``).
        self.intake = Intake(self, capacity=max_open)
        self.inflight.on_finished = self._finished
        self._watches: dict[str, list[tuple[str, Any]]] = {}
        self._hurry = threading.Event()
        self._cells: dict[str, Cell] = {}
        #: Named sections of the status that the application reports (its LLM engines,
        #: their usage): each a function called when a status is taken.
        self.reports: dict[str, Callable[[], dict[str, Any]]] = {}
        #: Stores of the application besides the journal whose writes may fail (the chat
        #: memory), by the name the status shows them failing under: each has ``failing``,
        #: why and since when, or None.
        self.stores: dict[str, Any] = {}
        self._taps: dict[str, list[Probe | _Tap]] = {}
        self._lock = threading.Lock()
        self._state: Literal["new", "running", "stopping", "stopped"] = "new"

    # ---------------------------------------------------------------- lifetime

    @classmethod
    def current(cls) -> Runtime:
        """The runtime started last in this process (for helpers callable from anywhere)."""
        if cls._current is None:
            raise RuntimeError("no autoresponse runtime is running")
        return cls._current

    def start(self) -> Runtime:
        if self._state != "new":
            raise RuntimeError(f"cannot start a runtime that is {self._state}")
        self.io.start()
        self._state = "running"
        Runtime._current = self
        return self

    def spawn(
        self,
        name: str,
        actor_class: type[TypedActor],
        *args: Any,
        capacity: int | None = None,
        overflow: OverflowPolicy = OverflowPolicy.HOLD,
        block_seconds: float = MAILBOX_BLOCK_SECONDS,
        supervisor: str | None = None,
        **kwargs: Any,
    ) -> Cell:
        """Start ``actor_class(*args, **kwargs)`` under the stable ``name``.

        ``supervisor`` names the actor told of its exits; without one, a crash
        dead-letters the message and restarts the actor at once.
        """
        if self._state != "running":
            raise RuntimeError("start the runtime before spawning actors")
        mailbox = Mailbox(capacity or self.mailbox_capacity, overflow, block_seconds)
        cell = Cell(self, name, actor_class, args, kwargs, mailbox, supervisor)
        with self._lock:
            if name in self._cells:
                raise ValueError(f"an actor named {name!r} already exists")
            self._cells[name] = cell
        cell.start()
        return cell

    def stop(self, drain: float = DRAIN_SECONDS, *, first: tuple[str, ...] = ()) -> bool:
        """Stop everything; True if all in-flight work finished within ``drain`` seconds.

        The actors named in ``first`` (inbound interfaces) stop before the drain,
        so no new work arrives while in-flight work finishes. A stop is a pause:
        whatever is still under way afterwards is *interrupted*, not dead-lettered;
        its journal item stays open and resumes on the next start. ``hurry`` (a
        second signal) ends the drain at once. The drain waits in real time, on the
        in-flight count (a condition with a deadline), whatever the clock.
        """
        if self._state != "running":
            return True
        for name in first:
            if name in self._cells:  # as every actor below: even with no drain, a second to stop
                self._cells[name].stop(timeout=max(drain, 1.0))
        until = time.monotonic() + drain
        drained = self.inflight.wait(timeout=0)
        while not drained and not self._hurry.is_set() and time.monotonic() < until:
            drained = self.inflight.wait(timeout=min(0.1, max(0.0, until - time.monotonic())))
        self._state = "stopping"
        cells = list(self._cells.values())
        for cell in reversed(cells):
            cell.stop(timeout=max(drain, 1.0))
        for cell in cells:
            self.close(cell)
        self.io.stop()
        self._state = "stopped"
        left = self.intake.unfinished_here()
        if left:
            log.info("%d work items did not finish; they stay open and resume on the next start", left)
        if Runtime._current is self:
            Runtime._current = None
        return drained

    def hurry(self) -> None:
        """End a drain under way at once (an operator's second signal); nothing is lost."""
        self._hurry.set()

    @property
    def stopping(self) -> bool:
        """True once ``stop`` has begun stopping actors: nothing restarts any more."""
        return self._state in ("stopping", "stopped")

    def close(self, cell: Cell) -> None:
        """Close ``cell``'s mailbox for good; what was queued is interrupted at a stop,
        dead-lettered otherwise (an actor that can never start again)."""
        for item in cell.mailbox.close():
            self._discard(cell, item)

    def _discard(self, cell: Cell, item: Any) -> None:
        """``item`` was queued for ``cell`` (an envelope, an I/O completion, a task's end, or
        one of pykka's letters: its stop, a proxy call, an ``ask``)."""
        if type(item) is Addressed:  # a stop, for one incarnation
            item = item.letter
        if type(item) is Envelope:
            self.cut_short(item, actor=cell.name, detail="still queued")
        elif type(item) is IoDone:
            self.cut_short(item.cause, actor=cell.name, detail="its I/O ended as the actor stopped")
        elif hasattr(item, "reply_to"):  # one of pykka's letters: whoever waits on it is told
            refuse(item, f"{cell.name} stopped")

    def __enter__(self) -> Runtime:
        return self.start() if self._state == "new" else self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---------------------------------------------------------------- delivery

    def send(
        self,
        to: str,
        body: Any,
        *,
        cause: Envelope | None = None,
        correlation_id: str | None = None,
        timeout: float | None = None,
    ) -> Envelope | None:
        """Send ``body`` to the actor named ``to`` from outside any actor (a test,
        the CLI, an interface's own thread). Starts a new correlation unless
        ``cause`` or ``correlation_id`` continues one. Returns the envelope sent,
        or None if it was dead-lettered at once."""
        if cause is not None:
            envelope = cause.child(body)
        else:
            envelope = Envelope.new(body, correlation_id=correlation_id, timeout=timeout,
                                    now=None if timeout is None else self.clock.time())
        return self.deliver(to, envelope)

    def deliver(self, to: str, envelope: Envelope, *, counted: bool = False) -> Envelope | None:
        """Put an envelope in the named actor's mailbox, or dead-letter it with the reason.
        ``counted``: it carries on an in-flight count its correlation holds already (the
        message whose handler sent it), instead of taking one."""
        if envelope.hops > self.max_hops:
            self._undeliverable(envelope, counted, "hop limit", actor=to,
                                detail=f"more than {self.max_hops} hops in one chain")
            return None
        cell = self._cells.get(to)
        if cell is None:
            self._undeliverable(envelope, counted, "no such actor", actor=to)
            return None
        if not counted:
            self.inflight.add(envelope.correlation_id)
        tracer = self.tracer
        if tracer is not None:  # before it can be handled, and its work finish
            if envelope.trace is None or tracer.spans is not None:
                tracer.queued(envelope, to)
            else:  # a later hop of its trace, heard by nothing else: only its time (``queued``'s)
                envelope.queued_at = tracer.now()
        mailbox = cell.mailbox
        try:
            mailbox.put(envelope, may_block=self._off_loop)
        except MailboxClosed:
            self.cut_short(envelope, actor=to, detail="its actor has stopped")
            return None
        taps = self._taps.get(to)
        if taps:
            for probe in taps:
                probe.offer(envelope)
        return envelope

    def _undeliverable(self, envelope: Envelope, counted: bool, reason: str, **why: Any) -> None:
        self.dead_letters.post(envelope, reason, **why)
        self.intake.failed(envelope.correlation_id)  # a real failure: its item closes as dead
        if counted:  # the count it carried ends with it (the correlation may finish)
            self.inflight.done(envelope.correlation_id)

    def signal(self, to: str, body: Any) -> None:
        """Deliver a control message ahead of all queued work (exit signals, restarts)."""
        cell = self._cells.get(to)
        envelope = Envelope.new(body)
        if cell is None:
            self.dead_letters.post(envelope, "no such actor", actor=to)
            return
        self.inflight.add(envelope.correlation_id)
        try:
            cell.mailbox.put_priority(envelope)
        except MailboxClosed:
            self.inflight.done(envelope.correlation_id)
            if not self.stopping:
                log.warning("%s is stopped; dropped control message %r", to, body)

    def requeue(self, cell: Cell, envelope: Envelope) -> None:
        """Put work already in flight back at the head of ``cell``'s queue (its I/O was
        cancelled with the incarnation that started it)."""
        try:
            cell.mailbox.put_front(envelope)
        except MailboxClosed:
            self.cut_short(envelope, actor=cell.name, detail="its actor stopped mid-I/O")

    def recover(self, cell: Cell, envelope: Envelope | None, error: BaseException) -> bool:
        """After a crash: put the message back for the next incarnation, at the head of
        the queue, or dead-letter it once it has failed ``message_attempts`` times. True
        when it became a dead letter (a poison set aside: the next incarnation starts on
        other work)."""
        if envelope is None:
            return False
        if isinstance(error, ActorGaveUp):
            self.inflight.done(envelope.correlation_id)
        elif self.stopping:
            self.cut_short(envelope, actor=cell.name, detail=f"it crashed as the runtime stopped: {error!r}")
        elif envelope.attempt < self.message_attempts:
            again = envelope.retried()
            if self.tracer is not None:  # the next attempt is a hop of its own
                self.tracer.queued(again, cell.name)
            try:
                cell.mailbox.put_front(again)
            except MailboxClosed:
                self.cut_short(envelope, actor=cell.name, detail="its actor has stopped")
        else:
            self.dead_letter(envelope, "crash", actor=cell.name, error=error,
                             detail=f"failed on attempt {envelope.attempt} of {self.message_attempts}")
            return True
        return False

    def replay(self, letter_id: int) -> Envelope | None:
        """Send a dead letter again, to the actor it was for, as a new attempt (also one
        kept in the journal by an earlier run)."""
        letter = self.dead_letters.get(letter_id)
        if letter is None or letter.actor is None:
            raise NotReplayable(f"no replayable dead letter #{letter_id}")
        if letter.record.get("body_type") == MalformedInput.__name__:
            raise NotReplayable(f"dead letter #{letter_id} is an input that could not be read: nothing can run it")
        envelope = letter.envelope
        if envelope is None:
            record = letter.record
            body = self.rebuild(letter.actor, record["body_type"], record["body"])
            if body is None:
                raise NotReplayable(f"dead letter #{letter_id}: {letter.actor} does not handle {record['body_type']}")
            envelope = Envelope.restore(record, body)
        return self.deliver(letter.actor, envelope.retried())

    def rebuild(self, actor: str, type_name: str, data: Any) -> Any:
        """A message for ``actor`` from its type name and JSON (a string or parsed), or None
        when the actor does not handle such a message."""
        cell = self._cells.get(actor)
        types = {t.__name__: t for t in (cell.actor_class._handlers if cell else ()) if isinstance(t, type)}
        model: Any = types.get(type_name)
        if model is None or not hasattr(model, "model_validate"):
            return None
        return model.model_validate_json(data) if isinstance(data, str) else model.model_validate(data)

    def dead_letter(
        self,
        envelope: Envelope,
        reason: str,
        *,
        actor: str | None = None,
        detail: str = "",
        error: BaseException | None = None,
    ) -> None:
        """An in-flight envelope leaves the system here, as a dead letter with its reason.

        A real failure: the correlation's journal item closes as ``dead`` (a dead letter
        can be replayed). At a stop, nothing is dead-lettered: see ``cut_short``.
        """
        self.dead_letters.post(envelope, reason, actor=actor, detail=detail, error=error)
        self.intake.failed(envelope.correlation_id)
        self.inflight.done(envelope.correlation_id)

    def cut_short(self, envelope: Envelope, *, actor: str | None = None, detail: str = "") -> None:
        """An in-flight envelope could not be handled because actors are stopping. At a stop
        that is an interruption (the item stays open and resumes); otherwise the actor
        stopped for good, which is a real failure (a dead letter)."""
        if not self.stopping:
            self.dead_letter(envelope, "actor stopped", actor=actor, detail=detail)
            return
        log.debug("interrupted %s at %s: %s", envelope.correlation_id, actor or "-", detail)
        if self.tracer is not None:
            self.tracer.ended(envelope, type(envelope.body).__name__, "interrupted", actor)
        self.intake.interrupted(envelope.correlation_id)
        self.inflight.done(envelope.correlation_id)

    def route_error(self, error: Any, *, cause: Envelope, actor: str | None = None, detail: str = "",
                    deliver: Callable[[str, Envelope], Any] | None = None) -> None:
        """Send an error to ``error_route`` (the retry pool), through ``deliver`` when given
        (an actor's, which keeps it in order with what its handler sent); without a route
        it is a dead letter, with ``detail`` saying what was wrong."""
        if self.error_route is not None and self.has(self.error_route):
            (deliver or self.deliver)(self.error_route, cause.child(error))
            return
        self.dead_letters.post(cause.child(error), "llm output rejected", actor=actor, detail=detail)

    # ---------------------------------------------------------------- durable intake

    @property
    def journal(self) -> DeliveryJournal | None:
        """Where accepted work, confirmed sends and dead letters are recorded."""
        return self.intake.journal

    @journal.setter
    def journal(self, journal: DeliveryJournal | None) -> None:
        self.intake.journal = journal
        if journal is not None:
            self.dead_letters.attach(journal)

    def trace(self, correlation_id: str) -> list[dict[str, Any]]:
        """The hops of a request, in causal order: from memory, else from the journal."""
        hops = self.tracer.trace(correlation_id, self._in_flight(correlation_id)) if self.tracer is not None else []
        if not hops and self.journal is not None:
            hops = hops_of(self.journal.trace(correlation_id))
        return hops

    def _in_flight(self, correlation_id: str) -> list[InFlightHop]:
        """The messages of ``correlation_id`` queued or being handled now, for its trace."""
        found: list[InFlightHop] = []
        for name, cell in list(self._cells.items()):
            in_hand = cell.in_hand()
            if in_hand is not None and in_hand[0].correlation_id == correlation_id:
                found.append((in_hand[0], name, in_hand[1], in_hand[2]))
            waiting = cell.mailbox.envelopes_of(correlation_id)
            found.extend((env, name, type(env.body).__name__, None) for env in waiting)
        return found

    def accept(self, to: str, body: Any, *, correlation_id: str | None = None,
               wait: float | None = 0.0) -> concurrent.futures.Future[Envelope]:
        """Start a correlation from outside, durably: admitted (or ``IntakeFull`` after
        ``wait`` seconds), journaled when there is a journal, then delivered; the future
        resolves with its envelope, which is when the caller may acknowledge it upstream."""
        return self.intake.accept(to, body, correlation_id, wait=wait)

    def resume(self) -> int:
        """Deliver again every journaled item that had not finished (after a stop or a kill)."""
        return self.intake.resume()

    def when_finished(self, correlation_id: str, to: str, message: Any) -> None:
        """Send ``message`` to ``to`` once ``correlation_id`` has nothing left in flight.
        Call it while handling a message of that correlation (so it cannot be over yet)."""
        with self._lock:
            self._watches.setdefault(correlation_id, []).append((to, message))

    def _finished(self, correlation_id: str) -> None:
        journal = self.journal
        # A trace to keep only with a journal: with the item's finish, else on its own
        # (work sent, not accepted, has no item).
        trace = self.tracer.finished(correlation_id, keep=journal is not None) if self.tracer is not None else None
        if not self.intake.finished(correlation_id, trace) and journal is not None and trace is not None:
            journal.record_trace(correlation_id, trace)
        if self._watches:
            with self._lock:
                watchers = self._watches.pop(correlation_id, ())
            for to, message in watchers:
                if not self.stopping:
                    self.send(to, message)

    def wait_idle(self, correlation_id: str | None = None, timeout: float = 10.0) -> bool:
        """Wait until nothing (of one correlation, or at all) is in flight."""
        return self.inflight.wait(correlation_id, timeout)

    # ---------------------------------------------------------------- inspection

    def probe(self, name: str) -> Probe:
        """Watch every message delivered to ``name`` from now on (close it when done)."""
        probe = Probe(name, on_close=self._untap)
        self._tap(probe)
        return probe

    def watch(self, name: str, listener: Callable[[Envelope], None]) -> Callable[[], None]:
        """Call ``listener`` (on the sender's thread, so quickly) with every envelope
        delivered to ``name`` from now on; the function returned stops it."""
        tap = _Tap(name, listener)
        self._tap(tap)
        return lambda: self._untap(tap)

    def _tap(self, tap: Probe | _Tap) -> None:
        with self._lock:
            self._taps[tap.name] = [*self._taps.get(tap.name, ()), tap]

    def _untap(self, tap: Probe | _Tap) -> None:
        with self._lock:
            left = [p for p in self._taps.get(tap.name, ()) if p is not tap]
            if left:
                self._taps[tap.name] = left
            else:
                self._taps.pop(tap.name, None)

    def has(self, name: str) -> bool:
        return name in self._cells

    @property
    def actor_count(self) -> int:
        return len(self._cells)

    def cell(self, name: str) -> Cell:
        return self._cells[name]

    @property
    def cells(self) -> list[Cell]:
        return list(self._cells.values())
