"""An aiohttp application served on 127.0.0.1 from a thread and loop of its own.

The base of the fake servers (LLM, Telegram) that tests, benchmarks and users
drive real clients against::

    class Echo(LoopbackServer):
        def routes(self, app: web.Application) -> None:
            app.router.add_post("/echo", self.echo)

    with Echo() as server:
        requests.post(f"http://127.0.0.1:{server.port}/echo")
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from typing import Self

from aiohttp import web


class LoopbackServer:
    def __init__(self, *, port: int = 0, name: str = "loopback-server") -> None:
        self.port = port
        self._name = name
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stopping: asyncio.Event | None = None
        #: Bodies to answer a call's next requests with, as they are (``answer_next``).
        self._raw_answers: dict[str, deque[tuple[int, bytes]]] = {}
        self._raw_lock = threading.Lock()

    def answer_next(self, call: str, body: bytes, *, status: int = 200) -> None:
        """Answer the next request of ``call`` (as the server names its calls) with ``body``
        as it is: what a broken proxy or a server in trouble sends (not JSON, JSON of
        another shape, nested past any parser)."""
        with self._raw_lock:
            self._raw_answers.setdefault(call, deque()).append((status, body))

    def raw_answer(self, call: str) -> web.Response | None:
        """The answer ``answer_next`` scripted for this request of ``call``, if any."""
        with self._raw_lock:
            queued = self._raw_answers.get(call)
            answer = queued.popleft() if queued else None
        if answer is None:
            return None
        return web.Response(status=answer[0], body=answer[1], content_type="application/json")

    def routes(self, app: web.Application) -> None:
        """Override: add the server's routes."""
        raise NotImplementedError

    async def on_stopping(self) -> None:
        """Override: release waiting handlers before the server closes."""

    @property
    def stopping(self) -> asyncio.Event:
        assert self._stopping is not None, "the server is not running"
        return self._stopping

    def call_soon(self, callback: object, *args: object) -> None:
        """Run ``callback(*args)`` on the server's loop, from any thread."""
        if self._loop is not None:
            self._loop.call_soon_threadsafe(callback, *args)  # type: ignore[arg-type]

    async def _serve(self, started: threading.Event) -> None:
        self._stopping = asyncio.Event()
        app = web.Application()
        self.routes(app)
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", self.port)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        started.set()
        await self._stopping.wait()
        await self.on_stopping()
        await runner.cleanup()

    def start(self) -> Self:
        started = threading.Event()
        loop = self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=lambda: loop.run_until_complete(self._serve(started)),
                                        name=self._name, daemon=True)
        self._thread.start()
        if not started.wait(10):
            raise RuntimeError(f"{self._name} did not start")
        return self

    def stop(self) -> None:
        if self._loop is None or self._thread is None:
            return
        self._loop.call_soon_threadsafe(self.stopping.set)
        self._thread.join(10)
        self._loop.close()
        self._loop = self._thread = None

    def serve_forever(self, banner: str) -> None:
        """Start, print ``banner`` (the address), and serve until Ctrl-C: for ``python -m``."""
        self.start()
        print(banner.format(port=self.port), flush=True)
        try:
            threading.Event().wait()
        except KeyboardInterrupt:
            self.stop()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
