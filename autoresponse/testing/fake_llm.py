"""A fake OpenAI-compatible LLM: a real aiohttp server on 127.0.0.1, for tests and benchmarks.

>>> with FakeLLMServer() as llm:                                 # doctest: +SKIP
...     llm.script(FakeResponse(status=429, headers={"Retry-After": "1"}))
...     engine = HttpEngine(llm.base_url, model="fake")
...     # the first call gets the 429, the retry gets the default answer
...     llm.requests[0].body["messages"]

With nothing scripted it answers like the offline engine would, so the full
loop works against it. Scripted responses are served first, in order; a
``responder(body)`` answers the rest (a reply text, or a whole ``FakeResponse``
with its delay), or returns None to leave it to the default.
Run it alone with ``python -m autoresponse.testing.fake_llm --port 8089``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from autoresponse.actors.llm.offline import OfflineEngine
from autoresponse.actors.loopback import LoopbackServer


@dataclass(frozen=True)
class FakeResponse:
    """One scripted answer: a status, a reply text (or raw body), headers, a delay.

    The body served is ``raw`` bytes verbatim if given, else ``body`` text, else a
    completion of ``content`` (an error object for a status other than 200).
    ``hang`` never answers (until the server stops). ``chunked`` streams the body
    in chunks without a Content-Length; ``drip`` sends the headers, then the body
    one byte every ``drip`` seconds (a server that is slow but never silent).

    A request that asks to ``stream`` gets the reply as server-sent events, as
    OpenAI streams it: ``piece`` characters a delta, one every ``every`` seconds;
    ``unfinished`` cuts the stream off half way.
    """

    status: int = 200
    content: str | None = None
    body: str | None = None
    raw: bytes | None = None
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0
    hang: bool = False
    chunked: bool = False
    drip: float | None = None
    piece: int = 16
    every: float = 0.0
    unfinished: bool = False


@dataclass(frozen=True)
class RecordedRequest:
    time: float
    body: dict[str, Any]
    headers: dict[str, str]

    @property
    def messages(self) -> list[dict[str, str]]:
        return self.body.get("messages", [])

    @property
    def raw(self) -> str:
        return json.dumps(self.body, ensure_ascii=False)


def completion(content: str, model: str = "fake") -> dict[str, Any]:
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content},
                     "finish_reason": "stop"}],
    }


class FakeLLMServer(LoopbackServer):
    """Serves ``POST /v1/chat/completions`` on a thread and loop of its own."""

    def __init__(self, *, delay: float = 0.0, port: int = 0,
                 responder: Callable[[dict[str, Any]], str | FakeResponse | None] | None = None) -> None:
        super().__init__(port=port, name="fake-llm")
        self.delay = delay
        self.responder = responder
        self.requests: list[RecordedRequest] = []
        self._script: deque[FakeResponse] = deque()
        self._lock = threading.Lock()
        self._offline = OfflineEngine()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def script(self, *responses: FakeResponse) -> None:
        with self._lock:
            self._script.extend(responses)

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        with self._lock:
            self.requests.append(RecordedRequest(time.monotonic(), body, dict(request.headers)))
            scripted = self._script.popleft() if self._script else None
        if scripted is None and self.responder is not None:
            answer = self.responder(body)
            scripted = FakeResponse(content=answer) if isinstance(answer, str) else answer
        if scripted is not None and scripted.hang:
            await self.stopping.wait()
            raise web.HTTPServiceUnavailable()
        delay = scripted.delay if scripted is not None else self.delay
        if delay:
            await asyncio.sleep(delay)
        status = scripted.status if scripted is not None else 200
        if body.get("stream") and status == 200 and (scripted is None or (scripted.raw is None
                                                                          and scripted.body is None)):
            return await self._events(request, scripted or FakeResponse(), body)
        data = await self._body(scripted, body)
        if scripted is not None and (scripted.chunked or scripted.drip is not None):
            return await self._stream(request, scripted, data)
        headers = scripted.headers if scripted is not None else {}
        return web.Response(status=status, body=data, headers=headers,
                            content_type="application/json")

    async def _events(self, request: web.Request, scripted: FakeResponse, body: dict[str, Any]) -> web.StreamResponse:
        """The reply as an OpenAI-style stream of deltas."""
        content = scripted.content
        if content is None:
            content = await self._offline.complete(body.get("messages", []))
        response = web.StreamResponse(status=200, headers={"Cache-Control": "no-cache"})
        response.content_type = "text/event-stream"
        await response.prepare(request)
        if scripted.unfinished:
            content = content[:len(content) // 2]
        try:
            for start in range(0, len(content), scripted.piece):
                delta = {"choices": [{"index": 0, "delta": {"content": content[start:start + scripted.piece]}}]}
                await response.write(f"data: {json.dumps(delta)}\n\n".encode())
                if scripted.every and await self._stopped_within(scripted.every):
                    return response
            if not scripted.unfinished:
                await response.write(b"data: [DONE]\n\n")
            await response.write_eof()
        except ConnectionError:
            pass
        return response

    async def _body(self, scripted: FakeResponse | None, request: dict[str, Any]) -> bytes:
        """The bytes of the answer to ``request`` (see ``FakeResponse``)."""
        if scripted is not None and scripted.raw is not None:
            return scripted.raw
        if scripted is not None and scripted.body is not None:
            return scripted.body.encode()
        if scripted is not None and scripted.status != 200:
            return json.dumps({"error": {"message": f"scripted {scripted.status}",
                                         "type": "fake"}}).encode()
        content = scripted.content if scripted is not None else None
        if content is None:
            content = await self._offline.complete(request.get("messages", []))
        return json.dumps(completion(content, request.get("model", "fake"))).encode()

    async def _stream(self, request: web.Request, scripted: FakeResponse,
                      data: bytes) -> web.StreamResponse:
        """Serve ``data`` chunked: in 64 KiB pieces, or byte by byte for a drip.

        Stops early when the client goes away or the server stops, so a dripping
        handler never holds up shutdown.
        """
        response = web.StreamResponse(status=scripted.status, headers=scripted.headers)
        response.content_type = "application/json"
        response.enable_chunked_encoding()
        await response.prepare(request)
        size = 1 if scripted.drip is not None else 64 * 1024
        try:
            for start in range(0, len(data), size):
                await response.write(data[start:start + size])
                if scripted.drip is not None and await self._stopped_within(scripted.drip):
                    return response
            await response.write_eof()
        except ConnectionError:  # the client gave up; nothing left to serve
            pass
        return response

    async def _stopped_within(self, seconds: float) -> bool:
        """Wait ``seconds``, or less if the server stops; True if it did."""
        try:
            await asyncio.wait_for(self.stopping.wait(), seconds)
        except TimeoutError:
            return False
        return True

    def routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/chat/completions", self._handle)


def main() -> None:
    parser = argparse.ArgumentParser(description="A fake OpenAI-compatible LLM on 127.0.0.1")
    parser.add_argument("--port", type=int, default=8089)
    parser.add_argument("--delay", type=float, default=0.0, help="seconds per reply")
    args = parser.parse_args()
    FakeLLMServer(delay=args.delay, port=args.port).serve_forever("fake LLM at http://127.0.0.1:{port}/v1")


if __name__ == "__main__":
    main()
