"""A fake OpenAI-compatible LLM: a real aiohttp server on 127.0.0.1, for tests and benchmarks.

>>> with FakeLLMServer() as llm:                                 # doctest: +SKIP
...     llm.script(FakeResponse(status=429, headers={"Retry-After": "1"}))
...     engine = HttpEngine(llm.base_url, model="fake")
...     # the first call gets the 429, the retry gets the default answer
...     llm.requests[0].body["messages"]

With nothing scripted it answers like the offline engine would, so the full
loop works against it, in the protocol the request asks for: native ``tool_calls``
when it offers ``tools``, a JSON object for a ``json_schema`` response format, JSON in
text otherwise; with ``usage`` in every answer (and in a last streamed chunk when
``stream_options.include_usage`` asks). ``FakeLLMServer(tools=False)`` or
``json_schema=False`` refuses that feature with a 400 naming it, as servers do. Scripted responses are served first, in order; a
``responder(body)`` answers the rest (a reply text, or a whole ``FakeResponse``
with its delay), or returns None to leave it to the default.
Run it alone with ``python -m autoresponse.testing.fake_llm --port 8089``.

``POST /v1/audio/transcriptions`` transcribes as OpenAI's does (a multipart form with
``file`` and ``model``; ``{"text": ...}``): it answers ``transcript`` (or a status from
``transcription_status``) and records each upload in ``transcriptions``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
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
    ``hang`` never answers (until the server stops); ``drop`` closes the connection
    without an answer, as a server does with a kept-alive connection it has just
    closed. ``chunked`` streams the body in chunks without a Content-Length; ``drip``
    sends the headers, then the body one byte every ``drip`` seconds (a server that
    is slow but never silent).

    A request that asks to ``stream`` gets the reply as server-sent events, as
    OpenAI streams it: ``piece`` characters a delta, one every ``every`` seconds;
    ``unfinished`` cuts the stream off half way, and ``stream_error`` ends it there
    with an error event saying so (llama.cpp's ``data: {"error": ...}``, of
    ``stream_error_code``); ``linger`` keeps the stream open once the reply and its
    usage are sent, without ``[DONE]`` (until the server stops), as a proxy may;
    ``finish_on_every_chunk`` puts the finish reason on every chunk, as some proxies do.
    """

    status: int = 200
    content: str | None = None
    body: str | None = None
    raw: bytes | None = None
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0
    hang: bool = False
    drop: bool = False
    chunked: bool = False
    drip: float | None = None
    piece: int = 16
    every: float = 0.0
    unfinished: bool = False
    stream_error: str | None = None
    stream_error_code: int = 500
    linger: bool = False
    finish_on_every_chunk: bool = False
    #: Native tool calls, as (name, arguments) pairs: the arguments an object or raw text.
    tool_calls: tuple[tuple[str, Any], ...] | None = None
    #: Sent in the message's ``reasoning_content`` (and streamed as reasoning deltas).
    reasoning: str | None = None
    finish_reason: str = "stop"
    usage: dict[str, int] | None = None


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


def completion(content: str | None, model: str = "fake", *, tool_calls: list[dict[str, Any]] | None = None,
               reasoning: str | None = None, finish_reason: str = "stop",
               usage: dict[str, int] | None = None) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls:
        message["tool_calls"] = tool_calls
    if reasoning is not None:
        message["reasoning_content"] = reasoning
    body: dict[str, Any] = {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": message,
                     "finish_reason": "tool_calls" if tool_calls else finish_reason}],
    }
    if usage is not None:
        body["usage"] = usage
    return body


def tool_call_list(calls: tuple[tuple[str, Any], ...]) -> list[dict[str, Any]]:
    """OpenAI-style tool calls from (name, arguments) pairs."""
    return [{"id": f"call_{n}", "type": "function",
             "function": {"name": name, "arguments": args if isinstance(args, str) else json.dumps(args)}}
            for n, (name, args) in enumerate(calls)]


def offered_actions(body: dict[str, Any]) -> list[str] | None:
    """The action types a request offers through its tools or its response format."""
    if body.get("tools"):
        return [t.get("function", {}).get("name", "") for t in body["tools"]]
    schema = ((body.get("response_format") or {}).get("json_schema") or {}).get("schema")
    if schema is None:
        return None
    found: list[str] = []
    pending: list[Any] = [schema]
    while pending:
        item = pending.pop()
        if isinstance(item, dict):
            kind = (item.get("properties") or {}).get("type")
            if isinstance(kind, dict) and isinstance(kind.get("const"), str):
                found.append(kind["const"])
            pending.extend(item.values())
        elif isinstance(item, list):
            pending.extend(item)
    return sorted(set(found))


def estimated_usage(body: dict[str, Any], answer: str) -> dict[str, int]:
    """About four characters a token, as a server would count (roughly)."""
    prompt = len(json.dumps(body.get("messages", []), ensure_ascii=False)) // 4 + 1
    done = len(answer) // 4 + 1
    return {"prompt_tokens": prompt, "completion_tokens": done, "total_tokens": prompt + done}


@dataclass(frozen=True)
class Transcription:
    """One upload to ``/v1/audio/transcriptions``."""

    model: str
    filename: str
    content_type: str
    data: bytes
    headers: dict[str, str]


class FakeLLMServer(LoopbackServer):
    """Serves ``POST /v1/chat/completions`` on a thread and loop of its own."""

    def __init__(self, *, delay: float = 0.0, port: int = 0,
                 responder: Callable[[dict[str, Any]], str | FakeResponse | None] | None = None,
                 tools: bool = True, json_schema: bool = True, mistakes: float = 0.0, seed: int = 7,
                 context: int | None = None, props: dict[str, Any] | None = None) -> None:
        super().__init__(port=port, name="fake-llm")
        #: A context window in (estimated) tokens: a bigger request gets llama.cpp's 400.
        self.context = context
        #: Served at GET /props, as llama.cpp's server describes itself (None: 404), after
        #: ``props_delay`` seconds (a server slow to say what it is).
        self.props = props
        self.props_delay = 0.0
        self.delay = delay
        #: The fraction of first answers (not re-asks) that add an invalid action.
        self.mistakes = mistakes
        self._rng = random.Random(seed)
        #: Which protocol features it accepts; a request using another gets a 400 naming it.
        self.tools = tools
        self.json_schema = json_schema
        self.responder = responder
        self.requests: list[RecordedRequest] = []
        self._script: deque[FakeResponse] = deque()
        self._lock = threading.Lock()
        self._offline = OfflineEngine()
        #: What ``/v1/audio/transcriptions`` answers, and every upload it got.
        self.transcript = "this is what the voice note says"
        self.transcription_status = 200
        self.transcriptions: list[Transcription] = []

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def script(self, *responses: FakeResponse) -> None:
        with self._lock:
            self._script.extend(responses)

    def refusal(self, body: dict[str, Any]) -> web.Response | None:
        """A 400 naming the feature the request uses and this server does not have, or
        saying (as llama.cpp does) that the request exceeds the context window."""
        if self.context is not None:
            size = estimated_usage(body, "")["prompt_tokens"] + int(body.get("max_tokens") or 0)
            if size > self.context:
                return web.json_response({"error": {
                    "code": 400, "type": "exceed_context_size_error", "n_prompt_tokens": size, "n_ctx": self.context,
                    "message": f"the request exceeds the available context size ({size} > {self.context} tokens)"}},
                    status=400)
        if body.get("tools") and not self.tools:
            return web.json_response({"error": {"message": "tools are not supported by this model",
                                                "type": "invalid_request_error", "param": "tools"}}, status=400)
        if body.get("response_format") and not self.json_schema:
            return web.json_response({"error": {"message": "response_format json_schema is not supported",
                                                "type": "invalid_request_error"}}, status=400)
        return None

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        refused = self.refusal(body)
        with self._lock:
            self.requests.append(RecordedRequest(time.monotonic(), body, dict(request.headers)))
            if refused is not None:
                return refused
            scripted = self._script.popleft() if self._script else None
        if scripted is None and self.responder is not None:
            answer = self.responder(body)
            scripted = FakeResponse(content=answer) if isinstance(answer, str) else answer
        if scripted is not None and scripted.hang:
            await self.stopping.wait()
            raise web.HTTPServiceUnavailable()
        if scripted is not None and scripted.drop and request.transport is not None:
            request.transport.close()
            return web.Response()  # never sent: the connection is gone
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
        """The reply as an OpenAI-style stream of deltas (text, reasoning, tool calls)."""
        content, calls = scripted.content, scripted.tool_calls
        if content is None and calls is None:
            content, calls = await self._default(body)
        content = content or ""
        response = web.StreamResponse(status=200, headers={"Cache-Control": "no-cache"})
        response.content_type = "text/event-stream"
        await response.prepare(request)
        if scripted.unfinished or scripted.stream_error is not None:
            content = content[:len(content) // 2]
        deltas: list[dict[str, Any]] = []
        if scripted.reasoning:
            deltas += [{"reasoning_content": scripted.reasoning[i:i + scripted.piece]}
                       for i in range(0, len(scripted.reasoning), scripted.piece)]
        deltas += [{"content": content[i:i + scripted.piece]} for i in range(0, len(content), scripted.piece)]
        for n, call in enumerate(tool_call_list(calls or ())):
            arguments = call["function"]["arguments"]
            deltas.append({"tool_calls": [{"index": n, "id": call["id"], "type": "function",
                                           "function": {"name": call["function"]["name"], "arguments": ""}}]})
            deltas += [{"tool_calls": [{"index": n, "function": {"arguments": arguments[i:i + scripted.piece]}}]}
                       for i in range(0, len(arguments), scripted.piece)]
        try:
            for delta in deltas:
                chunk = {"model": body.get("model", "fake"), "choices": [{"index": 0, "delta": delta}]}
                if scripted.finish_on_every_chunk:
                    chunk["choices"][0]["finish_reason"] = "tool_calls" if calls else scripted.finish_reason
                await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
                if scripted.every and await self._stopped_within(scripted.every):
                    return response
            if scripted.stream_error is not None:
                error = {"error": {"code": scripted.stream_error_code, "message": scripted.stream_error,
                                   "type": "server_error"}}
                await response.write(f"data: {json.dumps(error)}\n\n".encode())
            elif not scripted.unfinished:
                reason = "tool_calls" if calls else scripted.finish_reason
                await response.write(f"data: {json.dumps({'choices': [{'index': 0, 'delta': {}, 'finish_reason': reason}]})}\n\n".encode())
                if (body.get("stream_options") or {}).get("include_usage"):
                    usage = scripted.usage or estimated_usage(body, content + json.dumps(calls or ""))
                    await response.write(f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n".encode())
                if scripted.linger:
                    await self.stopping.wait()
                    return response
                await response.write(b"data: [DONE]\n\n")
            await response.write_eof()
        except ConnectionError:
            pass
        return response

    async def _default(self, body: dict[str, Any]) -> tuple[str | None, tuple[tuple[str, Any], ...] | None]:
        """The offline engine's answer, in the protocol the request asks for."""
        offered = offered_actions(body)
        messages = body.get("messages", [])
        text = await self._offline.complete(messages, offered)
        actions = json.loads(text)["actions"]
        reask = bool(messages) and '"type": "error"' in str(messages[-1].get("content", ""))
        if self.mistakes and not reask and self._rng.random() < self.mistakes:
            actions.append({"type": "teleport", "payload": {"to": "mars"}})  # no such action
            text = json.dumps({"actions": actions}, ensure_ascii=False)
        if body.get("tools"):
            calls = tuple((a["type"], a["payload"]) for a in actions)
            return (None, calls) if calls else ("", None)
        return text, None

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
        calls = scripted.tool_calls if scripted is not None else None
        if content is None and calls is None:
            content, calls = await self._default(request)
        usage = (scripted.usage if scripted is not None else None) or estimated_usage(
            request, (content or "") + json.dumps(calls or ""))
        return json.dumps(completion(
            content, request.get("model", "fake"), tool_calls=tool_call_list(calls) if calls else None,
            reasoning=scripted.reasoning if scripted is not None else None,
            finish_reason=scripted.finish_reason if scripted is not None else "stop", usage=usage)).encode()

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

    async def _props(self, request: web.Request) -> web.Response:
        if self.props_delay and await self._stopped_within(self.props_delay):
            raise web.HTTPServiceUnavailable()
        if self.props is None:
            raise web.HTTPNotFound()
        return web.json_response(self.props)

    async def _transcribe(self, request: web.Request) -> web.Response:
        fields: dict[str, Any] = {}
        async for part in await request.multipart():
            if part.name == "file":
                fields["file"] = (part.filename or "", part.headers.get("Content-Type", ""), await part.read())
            elif part.name:
                fields[part.name] = await part.text()
        if "file" not in fields:
            return web.json_response({"error": {"message": "no file", "type": "invalid_request_error"}}, status=400)
        name, kind, data = fields["file"]
        with self._lock:
            self.transcriptions.append(Transcription(str(fields.get("model", "")), name, kind, bytes(data),
                                                     dict(request.headers)))
            status, text = self.transcription_status, self.transcript
        if status != 200:
            return web.json_response({"error": {"message": f"scripted {status}", "type": "fake"}}, status=status)
        return web.json_response({"text": text})

    def routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/chat/completions", self._handle)
        app.router.add_post("/v1/audio/transcriptions", self._transcribe)
        app.router.add_get("/props", self._props)


def main() -> None:
    parser = argparse.ArgumentParser(description="A fake OpenAI-compatible LLM on 127.0.0.1")
    parser.add_argument("--port", type=int, default=8089)
    parser.add_argument("--delay", type=float, default=0.0, help="seconds per reply")
    parser.add_argument("--no-tools", action="store_true", help="refuse tools with a 400")
    parser.add_argument("--no-json-schema", action="store_true", help="refuse response_format with a 400")
    parser.add_argument("--mistakes", type=float, default=0.0,
                        help="fraction of answers that carry an invalid action besides the valid ones")
    args = parser.parse_args()
    FakeLLMServer(delay=args.delay, port=args.port, tools=not args.no_tools,
                  json_schema=not args.no_json_schema, mistakes=args.mistakes).serve_forever("fake LLM at http://127.0.0.1:{port}/v1")


if __name__ == "__main__":
    main()
