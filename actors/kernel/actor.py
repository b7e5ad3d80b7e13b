"""The typed actor: handlers chosen by message class, and the tasks it owns.

>>> from pydantic import BaseModel
>>> class Hello(BaseModel):
...     name: str
>>> class Line(BaseModel):
...     text: str
>>> class Greeter(TypedActor):
...     @handles
...     def on_hello(self, msg: Hello, env: Envelope) -> None:
...         self.send("printer", Line(text=f"hello {msg.name}"), cause=env)
>>> from autoresponse.actors.kernel.testkit import Recorder, running
>>> with running(("greeter", Greeter), ("printer", Recorder)) as runtime, runtime.probe("printer") as out:
...     sent = runtime.send("greeter", Hello(name="Ada"))
...     out.expect(Line, timeout=5).body
Line(text='hello Ada')

A handler takes the message body and its envelope. An actor never blocks on
another actor: it sends messages, and hands I/O to the runtime's event loop
with ``run_io``, whose result comes back as a message in its own mailbox.

Everything an incarnation starts on the loop (``run_io``, ``schedule``,
``start_task``) or puts aside (``hold``) belongs to it: when it crashes or
stops, its tasks and timers are cancelled, and the work they were doing goes
back to the head of the mailbox for the next incarnation. Nothing it started
outlives it.

A handler that raises crashes the actor: what happens next (restart, dead
letter, retry) is decided by whoever supervises it, never by the actor; see
``autoresponse.actors.kernel.cell`` for the whole crash path.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
import threading
import types
import typing
import weakref
from collections.abc import Callable, Coroutine, Iterator
from typing import TYPE_CHECKING, Any, ClassVar

import pykka

from autoresponse.actors.kernel._loop import IoTask
from autoresponse.actors.kernel._mailbox import CLOSED, Addressed, InboxView, MailboxClosed, refuse
from autoresponse.messages.control import Crash
from autoresponse.messages.envelope import Envelope, current_correlation

if TYPE_CHECKING:
    from autoresponse.actors.kernel.cell import Cell
    from autoresponse.actors.kernel.clock import Clock
    from autoresponse.actors.kernel.runtime import Runtime

Handler = Callable[[Any, Any, Envelope], None]
_adoption = threading.local()
_pykka_log = logging.getLogger("pykka")
_DISOWNED: Any = object()  # what a task's owner reads as once its incarnation let it go


def handles(fn: Handler) -> Handler:
    """Mark ``fn`` as the handler of the message class its first parameter names.

    A union annotation registers the handler for each member.
    """
    fn._handles = True  # type: ignore[attr-defined]
    return fn


def _message_types(fn: Handler) -> tuple[type, ...]:
    hints = typing.get_type_hints(fn)
    params = [p for p in fn.__code__.co_varnames[1 : fn.__code__.co_argcount]]
    if not params or params[0] not in hints:
        raise TypeError(f"handler {fn.__qualname__} must annotate its message parameter")
    hint = hints[params[0]]
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return typing.get_args(hint)
    return (hint,)


@contextlib.contextmanager
def adopting(cell: Cell) -> Iterator[None]:
    """Actors constructed inside this block join ``cell`` (its name and mailbox)."""
    _adoption.cell = cell
    try:
        yield
    finally:
        _adoption.cell = None


class ActorGaveUp(Exception):
    """Raised by a handler to crash its actor on purpose.

    Unlike any other exception, the message being handled counts as handled:
    it is not retried by the next incarnation.
    """


class CrashRequested(ActorGaveUp):
    """The actor was sent a ``Crash`` message."""


class TaskFailed(Exception):
    """A background task of the actor (``start_task``) ended; the actor crashes with it."""


class _TaskEnded:
    """A background task of the incarnation ``by`` ended (priority lane): the actor crashes
    while handling it (a predecessor's, let go, is nothing to its successor)."""

    __slots__ = ("name", "error", "by")

    def __init__(self, name: str, error: BaseException | None, by: TypedActor) -> None:
        self.name = name
        self.error = error
        self.by = by


class IoDone:
    """A task this actor handed to the loop has ended (it travels in the priority lane).
    ``by``: the incarnation that started it (one that just ended may have posted it)."""

    __slots__ = ("task", "cause", "by")

    def __init__(self, task: IoTask, cause: Envelope, by: TypedActor) -> None:
        self.task = task
        self.cause = cause
        self.by = by


async def _after(clock: Clock, delay: float, message: Any) -> Any:
    await clock.sleep(delay)
    return message


#: Names a TypedActor subclass may not define: pykka's private machinery and the
#: hooks this base class implements.
_RESERVED = frozenset(
    name for name in dir(pykka.ThreadingActor) if name.startswith("_") and not name.startswith("__")
) | {"on_start", "on_stop", "on_failure", "on_receive"}


class TypedActor(pykka.ThreadingActor):
    """Base of every actor of the runtime. Start one with ``Runtime.spawn``."""

    _handlers: ClassVar[dict[type, Handler]] = {}
    #: At most this many ``run_io`` tasks at once (None: no limit). At the limit the actor
    #: takes no new work from its mailbox, only completions and control messages: the
    #: work waits there, visible, and a crash cancels only the few calls under way.
    #: Set it in ``__init__`` or ``setup``: the actor's loop reads it once, as it starts.
    io_limit: int | None = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        clash = _RESERVED & set(vars(cls))
        if clash:
            # e.g. an `async def _stop` would silently replace pykka's own `_stop()`.
            raise TypeError(f"{cls.__name__} must not define {sorted(clash)}: pykka uses these "
                            "names; override setup() and teardown() for lifetime hooks")
        table: dict[type, Handler] = {}
        for klass in reversed(cls.__mro__):
            for attr in vars(klass).values():
                if getattr(attr, "_handles", False):
                    for message_type in _message_types(attr):
                        table[message_type] = attr
        cls._handlers = table

    @staticmethod
    def _create_actor_inbox() -> InboxView:
        cell = getattr(_adoption, "cell", None)
        if cell is None:
            raise RuntimeError("start actors with Runtime.spawn(), not Actor.start()")
        return InboxView(cell.mailbox, cell.runtime.inflight)

    def __init__(self) -> None:
        super().__init__()
        self.cell: Cell = _adoption.cell
        self.cell.incarnation = weakref.ref(self)
        self.runtime: Runtime = self.cell.runtime
        self.name: str = self.cell.name
        self.actor_inbox.bind(self.actor_stopped, self._may_take_work)  # type: ignore[attr-defined]
        self._ready = self.cell.ready  # this incarnation's; set once setup is done
        self._failing: Envelope | None = None
        #: Tasks and timers this incarnation started, with the work each is part of
        #: (an envelope), or the name of a background task whose end crashes the actor.
        self._owned: dict[IoTask, Envelope | str | None] = {}
        self._owned_lock = threading.Lock()
        self._running_io = 0  # run_io tasks not yet handled as IoDone (actor thread only)
        self._held: dict[str, Envelope] = {}  # message id → envelope put aside with hold()
        self._released = False
        self._put_back: set[str] = set()  # message ids its release put back (once each)
        #: Let go by a stop that gave up waiting for it (``retire``): the mailbox is its successor's.
        self._retired = False
        # The message whose handler runs now, what it sends (they go out when it returns),
        # and whether it still holds its own in-flight count (see ``_handle``).
        self._handling: Envelope | None = None
        self._handling_kind, self._handling_since = "", 0.0  # its type and start, when traced
        self._outbox: list[tuple[str, Envelope]] = []
        self._holds_count = False
        self._handler_thread: int | None = None  # the actor's thread (the only one that defers)

    # ---------------------------------------------------------------- sending

    def send(self, to: str, body: Any, *, cause: Envelope) -> Envelope:
        """Send ``body`` to the actor named ``to``, as a consequence of ``cause``.

        Sent by the handler of ``cause``, it goes out when the handler returns (in the
        order sent): the last such message carries on the in-flight count of ``cause``
        instead of taking one of its own, so a hop costs the runtime's bookkeeping
        nothing. A message that cannot be delivered is a dead letter, as always."""
        child = cause.child(body)
        self._post(to, child, cause)
        return child

    def _post(self, to: str, child: Envelope, cause: Envelope) -> None:
        if self._defers(cause):
            self._outbox.append((to, child))
        else:
            self.runtime.deliver(to, child)

    def _defers(self, cause: Envelope) -> bool:
        """``cause`` is being handled, and this is its handler's thread (a coroutine of the
        same work, on the loop, sends at once and takes its own count)."""
        return cause is self._handling and threading.get_ident() == self._handler_thread

    def run_io(self, coro: Coroutine[Any, Any, Any], *, cause: Envelope) -> IoTask | None:
        """Run ``coro`` on the runtime's event loop, owned by this incarnation.

        When it finishes, the message it returns is handled by this actor as a
        consequence of ``cause`` (``None`` means nothing more to do). If it
        raises, this actor crashes while handling ``cause``. If this incarnation
        ends first, the task is cancelled and ``cause`` is handled again by the next.
        """
        if self._holds_count and self._defers(cause):
            self._holds_count = False  # its outcome is handled here, after this handler: it carries the count
        else:
            self.runtime.inflight.add(cause.correlation_id)
        self._running_io += 1
        return self._own(coro, cause)

    def _may_take_work(self) -> bool:
        return self.io_limit is None or self._running_io < self.io_limit

    def schedule(self, delay: float, message: Any, *, cause: Envelope | None = None) -> IoTask | None:
        """Hand ``message`` to this actor after ``delay`` seconds of the runtime's clock
        (``runtime.clock``); ``cancel`` the handle to call it off.

        With ``cause`` it is part of that work (in flight, as after ``run_io``);
        without, it starts a new correlation and is not work in flight (a periodic
        tick does not hold up a drain). Either way the timer dies with this incarnation.
        """
        if cause is not None:
            return self.run_io(_after(self.runtime.clock, delay, message), cause=cause)
        return self._own(self._tick_after(delay, message), None)

    def cancel(self, task: IoTask | None) -> None:
        """Call off a timer or task of this incarnation; the work it was part of stops
        waiting for it. A task that already ended is handled as usual."""
        if task is None:
            return
        with self._owned_lock:
            owner = self._owned.pop(task, task)
        if owner is task:
            return
        task.cancel()
        if isinstance(owner, Envelope):
            self._running_io -= 1
            if not self._holds_count and self._defers(owner):
                self._holds_count = True  # back to the handler, which ends or passes it on
            else:
                self.runtime.inflight.done(owner.correlation_id)

    def start_task(self, coro: Coroutine[Any, Any, Any], name: str) -> None:
        """Run ``coro`` on the loop for as long as this incarnation lives (a polling loop).

        It is cancelled when the incarnation ends. If it ends on its own, with an
        error or without, the actor crashes with ``TaskFailed``, so its supervisor
        restarts it and a new incarnation starts the task again.
        """
        self._own(coro, name)

    async def _tick_after(self, delay: float, message: Any) -> None:
        await self.runtime.clock.sleep(delay)
        self.runtime.send(self.name, message)

    def _own(self, coro: Coroutine[Any, Any, Any], owner: Envelope | str | None) -> IoTask | None:
        lock = self._owned_lock
        lock.acquire()  # not ``with``, which binds two methods of the lock: on every delivery's I/O
        try:
            if self._released:  # this incarnation has ended (or was let go); it starts nothing new
                coro.close()
                if isinstance(owner, Envelope):
                    if self._retired and owner.message_id not in self._put_back:
                        self._put_back.add(owner.message_id)  # for its successor, as at a release
                        self.runtime.requeue(self.cell, owner)
                    else:
                        self.runtime.inflight.done(owner.correlation_id)
                return None
            task = self.runtime.io.submit(coro, self._task_ended)
            self._owned[task] = owner
            return task
        finally:
            lock.release()

    def _task_ended(self, task: IoTask) -> None:
        """In the loop thread: pass the outcome to the mailbox, unless the task was disowned."""
        lock = self._owned_lock
        lock.acquire()  # as in ``_own``
        try:
            owner = self._owned.pop(task, _DISOWNED)
        finally:
            lock.release()
        if owner is _DISOWNED:
            return  # this incarnation ended and already put its work back
        if isinstance(owner, Envelope):
            item: IoDone | _TaskEnded = IoDone(task, owner, self)
        else:
            try:
                task.outcome()
                error: BaseException | None = None
            except asyncio.CancelledError:
                return  # cancelled at shutdown
            except Exception as exc:
                error = exc
            if owner is None:
                return  # a timer: nothing to pass on
            item = _TaskEnded(owner, error, self)
        try:
            self.cell.mailbox.put_priority(item)
        except MailboxClosed:
            if isinstance(owner, Envelope):
                self.runtime.cut_short(owner, actor=self.name, detail="its I/O finished after it stopped")

    def _release(self, *, held: bool = True) -> None:
        """The incarnation ends: cancel what it started and put its work back, in order.
        Without ``held``, what it holds stays with it (its handler, still running, may
        deal with it): for ``retire``, until it ends."""
        work: dict[str, Envelope] = {}
        again: list[Envelope] = []
        with self._owned_lock:  # with ``_own``'s check: a cause is put back once
            self._released = True
            owned, self._owned = self._owned, {}
            kept: list[Envelope] = []
            if held:
                kept, self._held = list(self._held.values()), {}
            for cause in [c for c in owned.values() if isinstance(c, Envelope)] + kept:
                if cause.message_id in work or cause.message_id in self._put_back:
                    again.append(cause)  # of two tasks, of a task and a hold, or put back already
                else:
                    work[cause.message_id] = cause
            self._put_back.update(work)
        for task in owned:
            task.cancel()
        for cause in again:  # handled again once, so counted once
            self.runtime.inflight.done(cause.correlation_id)
        for cause in reversed(work.values()):  # each keeps the in-flight count its task or hold took
            self.runtime.requeue(self.cell, cause)

    def hold(self, env: Envelope) -> None:
        """Put ``env`` aside to handle later (Akka's stash): it stays work in flight, and
        if this incarnation ends first it goes back to the mailbox for the next one."""
        with self._owned_lock:
            if env.message_id in self._held:
                return  # already aside (handled again after a restart): counted once
            self._held[env.message_id] = env
        self.runtime.inflight.add(env.correlation_id)

    def release(self, env: Envelope) -> None:
        """``env`` put aside with ``hold`` is dealt with (call it after sending on what it caused)."""
        with self._owned_lock:
            held = self._held.pop(env.message_id, None)
        if held is not None:
            self.runtime.inflight.done(env.correlation_id)

    def report_error(self, error: Any, *, cause: Envelope, detail: str = "") -> None:
        """Hand an error (an LLM rejection) to the runtime's error route: the supervision
        tree's retry actors, or the dead-letter office (with ``detail``) when there are none."""
        self.runtime.route_error(error, cause=cause, actor=self.name, detail=detail,
                                 deliver=lambda to, child: self._post(to, child, cause))

    def report_health(self, ok: bool, reason: str = "", *, concern: str = "") -> None:
        """Say whether the world outside this actor works for it: ``ok=False`` with a reason
        (its platform refuses its token, a lease it cannot renew) shows it as failing, since
        then, in the status, ``/healthz`` and the metrics; ``ok=True`` clears it. Call it from
        the actor's thread or its tasks on the loop; it outlives a restart. No secrets in
        ``reason`` (configured ones are redacted anyway)."""
        self.cell.report_health(ok, reason, concern=concern)

    # ---------------------------------------------------------------- receiving

    @handles
    def on_crash_request(self, crash: Crash, env: Envelope) -> None:
        raise CrashRequested(crash.reason)

    def _actor_loop_running(self) -> None:
        """pykka's loop, with the runtime's own items handed straight to their handlers: an
        envelope of work or an I/O completion costs no pykka letter and no stop check (only
        a failure, pykka's stop letter, or being let go ends an incarnation, and each is
        checked: the last with one attribute a hop)."""
        inbox = self.actor_inbox
        get: Callable[[], Any] = inbox.get if self.io_limit is not None else self.cell.mailbox.get
        handle, io_done, stopped = self._handle, self._io_done, self.actor_stopped
        while not stopped.is_set():
            try:
                if self._retired:  # let go (in its setup, or a letter): the mailbox is its successor's
                    self._stop()
                    break
                item = get()
                kind = type(item)
                while kind is Envelope or kind is IoDone:
                    if kind is Envelope:
                        handle(item.body, item)
                    else:
                        io_done(item)
                    if self._retired:
                        item = CLOSED
                        break
                    item = get()
                    kind = type(item)
                if item is CLOSED:  # the runtime stopped waiting for this incarnation to stop
                    self._stop()
                    break
                if kind is _TaskEnded:
                    if item.by is not self:
                        continue
                    why = f"{type(item.error).__name__}: {item.error}" if item.error else "it returned"
                    raise TaskFailed(f"task {item.name!r} ended: {why}") from item.error
                if kind is Addressed:
                    if item.to is not inbox:  # a stop for a predecessor (let go, or gone)
                        refuse(item.letter, "the incarnation it was for was let go")
                        continue
                    item = item.letter
                self._receive_letter(item)
            except Exception:
                self._handle_failure(*sys.exc_info())
                try:
                    self.on_failure(*sys.exc_info())
                except Exception:
                    self._handle_failure(*sys.exc_info())
            except BaseException as exc:  # as pykka does: stop this actor and every other
                _pykka_log.debug(f"{exc!r} in {self}. Stopping all actors.")
                self._stop()
                pykka.ActorRegistry.stop_all()

    def _receive_letter(self, letter: Any) -> None:
        """One of pykka's letters (its stop, a proxy call, an ``ask``): handled as pykka
        handles it; an ``ask``'s error goes back to whoever asked."""
        reply_to = letter.reply_to
        try:
            response = self._handle_receive(letter.message)
        except Exception:
            if reply_to is None:
                raise
            _pykka_log.info(f"Exception returned from {self} to caller:", exc_info=sys.exc_info())
            reply_to.set_exception()
            failing, self._failing = self._failing, None  # this actor lives on, failing nothing
            if failing is not None:  # an envelope asked: it ends here, its error with whoever asked
                self.runtime.inflight.done(failing.correlation_id)
            return
        if reply_to is not None:
            reply_to.set(response)

    def _handle_receive(self, message: Any) -> Any:
        # Work first, without pykka's checks for its own messages.
        if type(message) is Envelope:
            self._handle(message.body, message)
            return None
        return super()._handle_receive(message)

    def on_receive(self, message: Any) -> Any:
        kind = type(message)
        if kind is Envelope:
            self._handle(message.body, message)
        elif kind is IoDone:
            self._io_done(message)
        else:
            return super().on_receive(message)
        return None

    def in_hand(self) -> tuple[Envelope, str, float] | None:
        """The message being handled now, its type and when it started (when traced)."""
        env = self._handling  # read first: set after its type and start
        return None if env is None else (env, self._handling_kind, self._handling_since)

    def _handler_for(self, message_type: type) -> Handler | None:
        handler = self._handlers.get(message_type)
        if handler is None:
            for base in message_type.__mro__[1:]:
                handler = self._handlers.get(base)
                if handler is not None:
                    break
        return handler

    def _handle(self, body: Any, env: Envelope) -> None:
        runtime = self.runtime
        if env.deadline is not None and env.expired(runtime.clock.time()):
            runtime.dead_letter(env, "deadline", actor=self.name, detail="expired before it was handled")
            return
        handler = self._handlers.get(type(body)) or self._handler_for(type(body))
        if handler is None:
            runtime.dead_letter(env, "no handler", actor=self.name,
                                detail=f"{type(self).__name__} does not handle {type(body).__name__}")
            return
        token = current_correlation.set(env.correlation_id)
        tracer = runtime.tracer
        if tracer is not None:
            kind = type(body).__name__
            self._handling_kind = kind
            self._handling_since = started = tracer.now()  # for its hop, as ``handled`` records it
            if tracer.spans is not None:
                tracer.spans.started(env, kind)
        self._handling, self._holds_count = env, True
        try:
            if runtime.fault is not None:
                runtime.fault(self.name, env)
            handler(self, body, env)
        except BaseException:
            self._failing = env  # on_failure reports it; it stays in flight until then
            if not self._holds_count:
                runtime.inflight.add(env.correlation_id)  # a task carries its count: it needs its own again
            self._send_outbox(env, holds_count=False)  # what it sent before it failed still goes
            if tracer is not None:
                tracer.handled(started, env, kind, "crash", self.name)
            raise
        finally:
            current_correlation.reset(token)
        if tracer is not None:
            tracer.handled(started, env, kind, "handled", self.name)
        self.cell.processed += 1
        self._send_outbox(env, holds_count=self._holds_count)

    def _send_outbox(self, env: Envelope, *, holds_count: bool) -> None:
        """Deliver what the handler of ``env`` sent; its in-flight count goes with the last
        message (one lock taken the fewer per hop each way), or ends here when it sent none.
        The last, not the first: until then the count still covers the work, so neither a
        first message dead-lettered nor one handled at once can finish it early."""
        self._handling = None
        outbox = self._outbox
        if not outbox:
            if holds_count:
                self.runtime.inflight.done(env.correlation_id)
            return
        self._outbox = []
        deliver = self.runtime.deliver
        for to, child in outbox[:-1]:
            deliver(to, child)
        deliver(*outbox[-1], counted=holds_count)

    def _io_done(self, done: IoDone) -> None:
        if done.by is self:  # else its predecessor's, just ended: the work is this one's now
            self._running_io -= 1
        env = done.cause
        try:
            result = done.task.outcome()
        except asyncio.CancelledError:
            self.runtime.cut_short(env, actor=self.name, detail="its I/O was cancelled")
            return
        except BaseException:
            self._failing = env
            raise
        if result is None:
            self.runtime.inflight.done(env.correlation_id)
        else:
            # The result is handled as part of `cause`, which is still in flight.
            if self.runtime.tracer is not None:
                self.runtime.tracer.queued(env, self.name, type(result).__name__)
            self._handle(result, env)

    def on_failure(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        failing, self._failing = self._failing, None
        self._release()
        try:
            self.teardown()  # release what the incarnation owns; its state is not trusted
        except Exception:
            pass
        error = exc or RuntimeError("unknown failure")
        if self._retired:  # its successor runs: only the message it failed on is dealt with
            self._answer_stops()
            self.cell.crashed_retired(failing, error)
        else:
            self.cell.crashed(failing, error)

    # ---------------------------------------------------------------- lifetime hooks

    def setup(self) -> None:
        """Override: runs in the actor's thread before its first message."""

    def teardown(self) -> None:
        """Override: runs in the actor's thread when it stops normally."""

    def on_start(self) -> None:
        self._handler_thread = threading.get_ident()
        try:
            self.setup()
        except Exception as exc:
            # pykka would stop the actor quietly; a failed start is a crash like any other.
            self.actor_stopped.set()
            pykka.ActorRegistry.unregister(self.actor_ref)
            self._release()
            if self._retired:  # let go in its setup: its successor runs
                self._answer_stops()
            else:  # recorded before anyone waiting for this start is let go: they read why it failed
                self.cell.crashed(None, exc)
        finally:
            self._ready.set()

    def retire(self) -> None:
        """A stop gave up waiting for this incarnation (its handler runs on past ``timeout``):
        what it started is cancelled and its work goes back to the mailbox now, which is its
        successor's (what it holds, once it ends: its handler may still deal with that; an
        I/O the handler starts meanwhile puts its message back too). Once the handler
        returns it stops, taking nothing more from the mailbox. Its end, or its crash, is not
        the cell's."""
        self._retired = True
        self._release(held=False)

    def _answer_stops(self) -> None:
        """A let-go incarnation has ended: its stop letters, still queued, are answered (it
        has stopped) and taken out of the mailbox."""
        inbox = self.actor_inbox
        for item in self.cell.mailbox.withdraw(lambda item: type(item) is Addressed and item.to is inbox):
            if item.letter.reply_to is not None:
                item.letter.reply_to.set(None)

    def on_stop(self) -> None:
        self._release()
        self.teardown()
        if self._retired:
            self._answer_stops()
        elif not self.cell.stop_requested:
            self.cell.exited_normally()  # it stopped itself: tell whoever supervises it
