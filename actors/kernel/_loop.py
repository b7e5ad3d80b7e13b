"""The runtime's one asyncio event loop, on a thread the runtime owns.

Coroutines are handed to it as ``IoTask`` handles: whoever submits one owns it
and may cancel it from any thread, before or after it started.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import logging
import threading
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Literal, TypeVar

log = logging.getLogger("autoresponse.loop")
T = TypeVar("T")


class IoTask:
    """A coroutine on the loop. ``on_done(task)`` runs in the loop thread when it ends,
    unless it was cancelled before it started. Read ``outcome()`` there."""

    __slots__ = ("_coro", "_on_done", "_task", "_cancelled", "_loop", "_context")

    def __init__(self, coro: Coroutine[Any, Any, Any], on_done: Callable[[IoTask], None] | None,
                 loop: asyncio.AbstractEventLoop) -> None:
        self._coro = coro
        self._on_done = on_done
        self._task: asyncio.Task[Any] | None = None
        self._cancelled = False
        self._loop = loop
        # The submitter's context variables (the correlation being handled, for logs)
        # follow the coroutine onto the loop.
        self._context = contextvars.copy_context()

    def _start(self) -> None:
        if self._cancelled:
            self._coro.close()
            return
        self._task = self._loop.create_task(self._coro, context=self._context)
        if self._on_done is not None:
            self._task.add_done_callback(self._finished)

    def _finished(self, _task: asyncio.Task[Any]) -> None:
        assert self._on_done is not None
        self._on_done(self)

    def outcome(self) -> Any:
        """The coroutine's result; raises what it raised (CancelledError if cancelled)."""
        assert self._task is not None, "the task has not run"
        return self._task.result()

    def cancel(self) -> None:
        """Cancel it, from any thread; a task not yet started never starts."""
        self._cancelled = True
        try:
            self._loop.call_soon_threadsafe(self._cancel_on_loop)
        except RuntimeError:  # the loop is closed: nothing runs any more
            pass

    def _cancel_on_loop(self) -> None:
        if self._task is not None:
            self._task.cancel()


#: The kinds of event loop the runtime can run (``RuntimeSettings.event_loop``).
EventLoopKind = Literal["uvloop", "asyncio"]


def new_event_loop(kind: EventLoopKind = "uvloop") -> asyncio.AbstractEventLoop:
    """An event loop of ``kind``: uvloop's by default, where it is installed (every
    platform but Windows), else asyncio's own. The runtime's loop thread carries every
    delivery's I/O and every hand-off from the actors' threads; on uvloop it spends
    close to a third less CPU doing so (benchmarks, case 2).

    >>> loop = new_event_loop("asyncio"); loop.run_until_complete(asyncio.sleep(0)); loop.close()
    """
    if kind == "uvloop":
        try:
            import uvloop
        except ImportError:  # Windows, or a build without it: asyncio's loop does the same work
            pass
        else:
            return uvloop.new_event_loop()
    return asyncio.new_event_loop()


class EventLoopThread:
    """Start it, hand it coroutines from any thread, stop it; nothing outlives ``stop``.

    >>> loop = EventLoopThread()
    >>> loop.start()
    >>> async def two(): return 2
    >>> loop.run(two(), timeout=5)
    2
    >>> loop.stop()
    """

    def __init__(self, name: str = "autoresponse-io", kind: EventLoopKind = "uvloop") -> None:
        self._name = name
        self._kind: EventLoopKind = kind
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ident: int | None = None
        self._closers: list[Callable[[], Awaitable[None]]] = []
        self._incoming: list[IoTask] = []
        self._incoming_lock = threading.Lock()
        self._wake_pending = False

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            raise RuntimeError("the event loop thread is not running")
        return self._loop

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def in_loop_thread(self) -> bool:
        return threading.get_ident() == self._ident  # on every delivery: no Thread object looked up

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("the event loop thread was already started")
        ready = threading.Event()
        loop = self._loop = new_event_loop(self._kind)

        def run() -> None:
            asyncio.set_event_loop(loop)
            loop.call_soon(ready.set)
            loop.run_forever()

        self._thread = threading.Thread(target=run, name=self._name, daemon=True)
        self._thread.start()
        self._ident = self._thread.ident
        ready.wait()

    def submit(self, coro: Coroutine[Any, Any, Any],
               on_done: Callable[[IoTask], None] | None = None) -> IoTask:
        """Run ``coro`` on the loop; ``on_done`` is called in the loop thread when it ends.

        Unlike ``run_coroutine_threadsafe``, which wakes the loop (a write to its
        self-pipe) for every coroutine, submissions queue up and the loop is woken
        once per batch: under load that wake-up was the largest single cost of a hop.
        """
        task = IoTask(coro, on_done, self.loop)
        lock = self._incoming_lock
        lock.acquire()  # not ``with``, which binds two methods of the lock: on every delivery's I/O
        try:
            self._incoming.append(task)
            wake = not self._wake_pending
            self._wake_pending = True
        finally:
            lock.release()
        if wake:
            self.loop.call_soon_threadsafe(self._start_incoming)
        return task

    def _start_incoming(self) -> None:
        with self._incoming_lock:
            batch, self._incoming = self._incoming, []
            self._wake_pending = False
        for task in batch:
            task._start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run ``coro`` on the loop and wait for it: for callers outside the loop only."""
        if self.in_loop_thread():
            raise RuntimeError("EventLoopThread.run() would block its own loop; await instead")
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def add_closer(self, closer: Callable[[], Awaitable[None]]) -> None:
        """Run ``closer()`` on the loop at ``stop``, before it ends (last added, first run)."""
        self._closers.append(closer)

    def stop(self, timeout: float = 10.0) -> None:
        if self._thread is None or self._loop is None:
            return
        if self._thread.is_alive():
            try:
                self.run(self._shutdown(), timeout)
            except (concurrent.futures.TimeoutError, RuntimeError) as exc:
                log.warning("event loop did not shut down cleanly: %r", exc)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout)
        if not self._loop.is_running():
            self._loop.close()
        self._thread = None
        self._ident = None

    async def _shutdown(self) -> None:
        for closer in reversed(self._closers):
            try:
                await closer()
            except Exception:
                log.exception("closer %r failed", closer)
        self._closers.clear()
        me = asyncio.current_task()
        tasks = [t for t in asyncio.all_tasks() if t is not me]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.loop.shutdown_asyncgens()
        # The worker threads of run_in_executor / to_thread (the admin's readers) end here too.
        await self.loop.shutdown_default_executor()
