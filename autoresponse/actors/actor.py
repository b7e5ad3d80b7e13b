"""The typed actor: handlers chosen by message class.

>>> class Greeter(TypedActor):
...     @handles
...     def on_hello(self, msg: Hello, env: Envelope) -> None:
...         self.send("printer", Line(text=f"hello {msg.name}"), cause=env)

A handler takes the message body and its envelope. An actor never blocks on
another actor: it sends messages, and hands I/O to the runtime's event loop
with ``run_io``, whose result comes back as a message in its own mailbox.

A handler that raises crashes the actor: what happens next (restart, dead
letter, retry) is decided by whoever supervises it, never by the actor.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
import types
import typing
from collections.abc import Callable, Coroutine, Iterator
from typing import TYPE_CHECKING, Any, ClassVar

import pykka

from autoresponse.actors._mailbox import InboxView, Letter, MailboxClosed
from autoresponse.messages.control import Crash
from autoresponse.messages.envelope import Envelope

if TYPE_CHECKING:
    from autoresponse.actors.runtime import Cell, Runtime

Handler = Callable[[Any, Any, Envelope], None]
_adoption = threading.local()


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


class _IoDone:
    """A coroutine handed to the event loop has finished (priority lane)."""

    __slots__ = ("future", "cause")

    def __init__(self, future: concurrent.futures.Future[Any], cause: Envelope) -> None:
        self.future = future
        self.cause = cause


#: Names a TypedActor subclass may not define: pykka's private machinery and the
#: hooks this base class implements.
_RESERVED = frozenset(
    name for name in dir(pykka.ThreadingActor) if name.startswith("_") and not name.startswith("__")
) | {"on_start", "on_stop", "on_failure", "on_receive"}


class TypedActor(pykka.ThreadingActor):
    """Base of every actor of the runtime. Start one with ``Runtime.spawn``."""

    _handlers: ClassVar[dict[type, Handler]] = {}

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
    def _create_actor_inbox() -> InboxView:  # type: ignore[override]
        cell = getattr(_adoption, "cell", None)
        if cell is None:
            raise RuntimeError("start actors with Runtime.spawn(), not Actor.start()")
        return InboxView(cell.mailbox)

    def __init__(self) -> None:
        super().__init__()
        self.cell: Cell = _adoption.cell
        self.runtime: Runtime = self.cell.runtime
        self.name: str = self.cell.name
        self.actor_inbox.bind(self.actor_stopped)  # type: ignore[attr-defined]
        self._ready = self.cell.ready  # this incarnation's; set once setup is done
        self._failing: Envelope | None = None

    # ---------------------------------------------------------------- sending

    def send(self, to: str, body: Any, *, cause: Envelope) -> Envelope | None:
        """Send ``body`` to the actor named ``to``, as a consequence of ``cause``."""
        return self.runtime.deliver(to, cause.child(body))

    def run_io(self, coro: Coroutine[Any, Any, Any], *, cause: Envelope) -> None:
        """Run ``coro`` on the runtime's event loop.

        When it finishes, the message it returns is handled by this actor as a
        consequence of ``cause`` (``None`` means nothing more to do). If it
        raises, this actor crashes while handling ``cause``.
        """
        runtime = self.runtime
        mailbox = self.cell.mailbox
        runtime.inflight.add(cause.correlation_id)
        future = runtime.io.submit(coro)

        def finished(fut: concurrent.futures.Future[Any]) -> None:
            try:
                mailbox.put(Letter(_IoDone(fut, cause)))
            except MailboxClosed:
                runtime.finish(cause, "actor stopped", actor=self.name,
                               detail="its I/O finished after it stopped")

        future.add_done_callback(finished)

    def schedule(self, delay: float, message: Any) -> None:
        """Send ``message`` to this actor after ``delay`` seconds, as a new correlation.

        A pending timer is not work in flight (it does not hold up a drain); it is
        dropped when the runtime stops.
        """
        runtime, name = self.runtime, self.name
        loop = runtime.io.loop
        loop.call_soon_threadsafe(loop.call_later, delay, runtime.send, name, message)

    def report_error(self, error: Any, *, cause: Envelope, detail: str = "") -> None:
        """Hand an error (an LLM rejection) to the runtime's error route: the supervision
        tree's retry actors, or the dead-letter office (with ``detail``) when there are none."""
        self.runtime.route_error(error, cause=cause, actor=self.name, detail=detail)

    # ---------------------------------------------------------------- receiving

    @handles
    def on_crash_request(self, crash: Crash, env: Envelope) -> None:
        raise CrashRequested(crash.reason)

    def on_receive(self, message: Any) -> Any:
        kind = type(message)
        if kind is Envelope:
            self._handle(message.body, message)
        elif kind is _IoDone:
            self._io_done(message)
        else:
            return super().on_receive(message)
        return None

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
        if env.expired():
            runtime.finish(env, "deadline", actor=self.name, detail="expired before it was handled")
            return
        handler = self._handler_for(type(body))
        if handler is None:
            runtime.finish(env, "no handler", actor=self.name,
                           detail=f"{type(self).__name__} does not handle {type(body).__name__}")
            return
        try:
            if runtime.fault is not None:
                runtime.fault(self.name, env)
            handler(self, body, env)
        except BaseException:
            self._failing = env  # on_failure reports it; it stays in flight until then
            raise
        self.cell.processed += 1
        runtime.inflight.done(env.correlation_id)

    def _io_done(self, done: _IoDone) -> None:
        env = done.cause
        try:
            result = done.future.result()
        except (asyncio.CancelledError, concurrent.futures.CancelledError):
            self.runtime.finish(env, "shutdown", actor=self.name, detail="I/O was cancelled")
            return
        except BaseException:
            self._failing = env
            raise
        if result is None:
            self.runtime.inflight.done(env.correlation_id)
        else:
            # The result is handled as part of `cause`, which is still in flight.
            self._handle(result, env)

    def on_failure(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        failing, self._failing = self._failing, None
        try:
            self.teardown()  # release what the incarnation owns; its state is not trusted
        except Exception:
            pass
        self.cell.crashed(failing, exc or RuntimeError("unknown failure"))

    # ---------------------------------------------------------------- lifetime hooks

    def setup(self) -> None:
        """Override: runs in the actor's thread before its first message."""

    def teardown(self) -> None:
        """Override: runs in the actor's thread when it stops normally."""

    def on_start(self) -> None:
        try:
            self.setup()
        except Exception as exc:
            # pykka would stop the actor quietly; a failed start is a crash like any other.
            self.actor_stopped.set()
            pykka.ActorRegistry.unregister(self.actor_ref)
            self._ready.set()
            self.cell.crashed(None, exc)
        finally:
            self._ready.set()

    def on_stop(self) -> None:
        self.teardown()
        if not self.cell.stop_requested:
            self.cell.exited_normally()  # it stopped itself: tell whoever supervises it
