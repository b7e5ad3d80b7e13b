"""The runtime's one asyncio event loop, on a thread the runtime owns."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

log = logging.getLogger("autoresponse.loop")
T = TypeVar("T")


def _copy_outcome(task: asyncio.Task[Any], future: concurrent.futures.Future[Any]) -> None:
    if task.cancelled():
        # Already marked running, the future cannot be cancel()ed; its waiters must still wake.
        future.set_exception(concurrent.futures.CancelledError())
    elif task.exception() is not None:
        future.set_exception(task.exception())  # type: ignore[arg-type]
    else:
        future.set_result(task.result())


class EventLoopThread:
    """Start it, hand it coroutines from any thread, stop it; nothing outlives ``stop``.

    >>> loop = EventLoopThread()
    >>> loop.start()
    >>> async def two(): return 2
    >>> loop.submit(two()).result(timeout=5)
    2
    >>> loop.stop()
    """

    def __init__(self, name: str = "autoresponse-io") -> None:
        self._name = name
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._closers: list[Callable[[], Awaitable[None]]] = []
        self._incoming: list[tuple[Coroutine[Any, Any, Any], concurrent.futures.Future[Any]]] = []
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

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("the event loop thread was already started")
        ready = threading.Event()
        self._loop = asyncio.new_event_loop()

        def run() -> None:
            asyncio.set_event_loop(self._loop)
            self._loop.call_soon(ready.set)
            self._loop.run_forever()

        self._thread = threading.Thread(target=run, name=self._name, daemon=True)
        self._thread.start()
        ready.wait()

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Run ``coro`` on the loop; the future completes in the loop thread.

        Unlike ``run_coroutine_threadsafe``, which wakes the loop (a write to its
        self-pipe) for every coroutine, submissions queue up and the loop is woken
        once per batch: under load that wake-up was the largest single cost of a hop.
        """
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        with self._incoming_lock:
            self._incoming.append((coro, future))
            wake = not self._wake_pending
            self._wake_pending = True
        if wake:
            self.loop.call_soon_threadsafe(self._start_incoming)
        return future

    def _start_incoming(self) -> None:
        with self._incoming_lock:
            batch, self._incoming = self._incoming, []
            self._wake_pending = False
        for coro, future in batch:
            if future.set_running_or_notify_cancel():
                self.loop.create_task(coro).add_done_callback(
                    lambda task, future=future: _copy_outcome(task, future))
            else:
                coro.close()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run ``coro`` on the loop and wait for it: for callers outside the loop only."""
        return self.submit(coro).result(timeout)

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
