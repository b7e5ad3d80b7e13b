"""The LLM HTTP client against a real fake server on 127.0.0.1."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import logging
import random
import socket
import time
import urllib.request
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from autoresponse.actors.limits import LLM_MAX_TOKENS
from conftest import ask, free_port

from autoresponse import Application, Settings
from autoresponse.actors.limits import LLM_MAX_RESPONSE_BYTES
from autoresponse.actors.llm import HttpEngine, LLMError
from autoresponse.actors.llm.budget import NarrowedChats
from autoresponse.actors.llm.client import TOO_LONG_NOTICE, UNREACHABLE_NOTICE
from autoresponse.actors.llm.http import _DISCOVERY_MISSES
from autoresponse.testing.fake_llm import FakeLLMServer, FakeResponse
from autoresponse.actors.retry import OUTCOME_NOTICES
from autoresponse.actors.routes import DISPATCHER, LLM, executor, sender
from autoresponse.interfaces.console import Console
from autoresponse.actors.prompts import build_chat_request
from autoresponse.messages import LLMReply, OriginalContext, OutboundMessage, PromptRequest, Turn

MESSAGES = [{"role": "user", "content": "hello"}]
CONSOLE = OriginalContext(interface_name="console", chat_id="console", user_id="me")


def engine_for(server: FakeLLMServer, **kwargs: object) -> HttpEngine:
    options = {"model": "fake", "read_timeout": 5.0, "max_attempts": 3, **kwargs}
    return HttpEngine(server.base_url, **options)  # type: ignore[arg-type]


async def test_a_429_with_retry_after_is_waited_out_then_answered(fake_llm: FakeLLMServer) -> None:
    fake_llm.script(FakeResponse(status=429, headers={"Retry-After": "1"}),
                    FakeResponse(content="after the wait"))
    async with engine_for(fake_llm) as engine:
        started = time.monotonic()
        assert await engine.complete(MESSAGES) == "after the wait"
        waited = time.monotonic() - started
    assert len(fake_llm.requests) == 2
    assert fake_llm.requests[1].time - fake_llm.requests[0].time >= 0.95
    assert waited >= 0.95


async def test_a_500_is_retried(fake_llm: FakeLLMServer) -> None:
    fake_llm.script(FakeResponse(status=500), FakeResponse(content="recovered"))
    async with engine_for(fake_llm) as engine:
        assert await engine.complete(MESSAGES) == "recovered"
    assert len(fake_llm.requests) == 2


@pytest.mark.parametrize("status", [400, 401, 404, 422])
async def test_other_4xx_are_never_retried(fake_llm: FakeLLMServer, status: int) -> None:
    fake_llm.script(FakeResponse(status=status, body='{"error": {"message": "nope"}}'))
    async with engine_for(fake_llm) as engine:
        with pytest.raises(LLMError, match=f"HTTP {status}") as caught:
            await engine.complete(MESSAGES)
    assert caught.value.status == status
    assert len(fake_llm.requests) == 1


async def test_an_exhausted_quota_is_not_retried(fake_llm: FakeLLMServer) -> None:
    fake_llm.script(FakeResponse(status=429, body='{"error": {"code": "insufficient_quota"}}'))
    async with engine_for(fake_llm) as engine:
        with pytest.raises(LLMError, match="quota exhausted"):
            await engine.complete(MESSAGES)
    assert len(fake_llm.requests) == 1


async def test_a_server_that_never_answers_is_a_timeout_not_a_hang(fake_llm: FakeLLMServer) -> None:
    fake_llm.script(FakeResponse(hang=True), FakeResponse(hang=True))
    async with engine_for(fake_llm, read_timeout=0.3, max_attempts=2) as engine:
        with pytest.raises(LLMError, match="timed out"):
            await engine.complete(MESSAGES)
    assert len(fake_llm.requests) == 2


async def test_kept_alive_connections_closed_under_a_request_are_passed_over_at_once(
    fake_llm: FakeLLMServer,
) -> None:
    """A pooled connection the server had just closed (llama.cpp's closes one after each
    stream) is not the server's absence: the request goes on the next one at once, and
    then on a new one, and none of that costs an attempt."""
    async with engine_for(fake_llm, max_attempts=1) as engine:
        await asyncio.gather(*(engine.complete(MESSAGES) for _ in range(3)))  # three connections kept
        fake_llm.script(*[FakeResponse(drop=True)] * 3, FakeResponse(content="on a new connection"))
        assert await engine.complete(MESSAGES) == "on a new connection"
    assert len(fake_llm.requests) == 3 + 4


async def test_a_new_connection_closed_without_an_answer_is_an_attempt(fake_llm: FakeLLMServer) -> None:
    """Only a reused connection can be stale: a server that drops every request gets one
    pass over the connection kept, then its attempts, and the call fails in bounded tries."""
    fake_llm.script(FakeResponse(content="first"), *[FakeResponse(drop=True)] * 6)
    async with engine_for(fake_llm, max_attempts=2) as engine:
        assert await engine.complete(MESSAGES) == "first"
        with pytest.raises(LLMError, match="cannot reach the LLM"):
            await engine.complete(MESSAGES)
    assert len(fake_llm.requests) == 1 + 3  # the kept connection, then two attempts on new ones


async def test_an_unreachable_server_is_retried_then_reported() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    async with HttpEngine(f"http://127.0.0.1:{port}/v1", model="fake", max_attempts=2) as engine:
        with pytest.raises(LLMError, match="cannot reach the LLM"):
            await engine.complete(MESSAGES)


async def test_the_api_key_is_sent_but_never_shown(fake_llm: FakeLLMServer) -> None:
    secret = "sk-test-very-secret-0123456789"
    fake_llm.script(FakeResponse(status=401))
    async with engine_for(fake_llm, api_key=secret) as engine:
        with pytest.raises(LLMError) as caught:
            await engine.complete(MESSAGES)
    assert fake_llm.requests[0].headers["Authorization"] == f"Bearer {secret}"
    assert secret not in str(caught.value)
    assert secret not in repr(engine)


async def test_the_request_is_openai_shaped(fake_llm: FakeLLMServer) -> None:
    async with engine_for(fake_llm, temperature=0.2) as engine:
        await engine.complete(MESSAGES)
    body = fake_llm.requests[0].body
    # Every call is bounded: max_tokens is always sent.
    assert body == {"model": "fake", "messages": MESSAGES, "temperature": 0.2, "max_tokens": LLM_MAX_TOKENS}


async def test_a_malformed_response_is_a_clear_error(fake_llm: FakeLLMServer) -> None:
    fake_llm.script(FakeResponse(status=200, body='{"choices": []}'))
    async with engine_for(fake_llm) as engine:
        with pytest.raises(LLMError, match="malformed LLM response"):
            await engine.complete(MESSAGES)
    assert len(fake_llm.requests) == 1


# --- Hostile servers: every one ends in an LLMError, never another exception. ---


async def test_content_sent_as_a_list_of_parts_is_its_text(fake_llm: FakeLLMServer) -> None:
    """Some OpenAI-compatible servers answer with content parts, as a request may send them."""
    parts = [{"type": "text", "text": "Paris"}, {"type": "image_url", "image_url": {"url": "x"}},
             {"type": "text", "text": " it is."}]
    fake_llm.script(FakeResponse(body=json.dumps({"choices": [{"index": 0, "finish_reason": "stop", "message": {
        "role": "assistant", "content": parts}}]})), FakeResponse(body=json.dumps({"choices": [{"index": 0,
        "finish_reason": "stop", "message": {"role": "assistant", "content": [{"type": "text", "text": 3}]}}]})))
    async with engine_for(fake_llm, max_attempts=1) as engine:
        assert await engine.complete(MESSAGES) == "Paris it is."
        with pytest.raises(LLMError, match="malformed LLM response"):
            await engine.complete(MESSAGES)


async def test_a_body_that_is_not_utf8_is_an_llm_error(fake_llm: FakeLLMServer) -> None:
    fake_llm.script(FakeResponse(raw=b"\xff\xfe garbage"))
    async with engine_for(fake_llm) as engine:
        with pytest.raises(LLMError, match="not valid UTF-8") as caught:
            await engine.complete(MESSAGES)
    assert not caught.value.retryable
    assert len(fake_llm.requests) == 1


def test_a_body_that_is_not_utf8_gives_the_user_a_notice(
    make_app: Callable[..., Application], fake_llm: FakeLLMServer
) -> None:
    # Enough copies that an actor crashing and replaying the call meets the same body.
    fake_llm.script(*[FakeResponse(raw=b"\xff\xfe garbage")] * 4)
    app = make_app(base_url=fake_llm.base_url)
    with app.runtime.probe(sender("console")) as out:
        ask(app, "hello")
        [notice] = out.bodies(OutboundMessage)
    assert notice.notice and notice.text == UNREACHABLE_NOTICE
    [letter] = app.runtime.dead_letters.letters()
    assert letter.reason == "llm unavailable" and "UTF-8" in letter.detail


def test_a_request_the_llm_finds_too_long_is_told_so_not_unreachable(
    make_app: Callable[..., Application], fake_llm: FakeLLMServer
) -> None:
    fake_llm.script(FakeResponse(status=413))
    app = make_app(base_url=fake_llm.base_url)
    with app.runtime.probe(sender("console")) as out:
        ask(app, "hello " * 1000)
        [notice] = out.bodies(OutboundMessage)
    assert notice.notice and notice.text == TOO_LONG_NOTICE
    assert len(fake_llm.requests) == 1  # a 413 is not retried


@pytest.mark.parametrize("status", [503, 413], ids=["unreachable", "too-long"])
def test_a_delivery_turn_the_llm_fails_tells_the_user_the_command_ran(
    make_app: Callable[..., Application], fake_llm: FakeLLMServer, status: int
) -> None:
    """The command ran, and the LLM fails only the turn that tells its output (away, or
    finding it too long): the user hears it is done, not "could not reach the language
    model" or "send it shorter", which would have them ask again and run it twice."""
    def fail_the_delivery(body: dict[str, Any]) -> FakeResponse | None:
        told = "system_message" in str(body["messages"][-1].get("content"))
        return FakeResponse(status=status) if told else None

    fake_llm.responder = fail_the_delivery
    app = make_app(base_url=fake_llm.base_url)
    with app.runtime.probe(executor("terminal")) as ran, app.runtime.probe(sender("console")) as out:
        ask(app, "run echo ran-once")
        sent = out.bodies(OutboundMessage)
        assert len(ran.envelopes) == 1
    assert [(m.notice, m.text) for m in sent] == [(True, OUTCOME_NOTICES["done"])]
    [letter] = app.runtime.dead_letters.letters()
    assert letter.reason == "llm unavailable"


class BrokenEngine:
    """An engine with a bug: it raises something other than LLMError."""

    async def answer(self, prompt: object, on_text: object = None) -> str:
        raise RuntimeError("engine bug")

    async def aclose(self) -> None:
        pass


def test_an_unexpected_engine_error_is_a_failure_not_a_crash(tmp_path: Path) -> None:
    config = Settings.load(admin={"enabled": False}, events={"enabled": False},
                           data_dir=tmp_path / "data", terminal={"enabled": False})
    app = Application(config, console=Console(io.StringIO()), engine=BrokenEngine()).start()
    try:
        with app.runtime.probe(sender("console")) as out:
            ask(app, "hello")
            [notice] = out.bodies(OutboundMessage)
        assert notice.notice and notice.text == UNREACHABLE_NOTICE
        [letter] = app.runtime.dead_letters.letters()
        assert letter.reason == "llm unavailable"
        assert letter.detail == "unexpected RuntimeError: engine bug"
        assert app.runtime.cell(LLM).restarts == 0
    finally:
        app.stop()


async def test_a_dripping_server_is_cut_off_by_the_request_timeout(fake_llm: FakeLLMServer) -> None:
    # A byte every 0.3 s never trips the 5 s read timeout; the whole reply would take a minute.
    fake_llm.script(FakeResponse(drip=0.3))
    async with engine_for(fake_llm, request_timeout=1.0, max_attempts=1) as engine:
        started = time.monotonic()
        with pytest.raises(LLMError, match="timed out"):
            await asyncio.wait_for(engine.complete(MESSAGES), 30)
        assert time.monotonic() - started < 10
    assert len(fake_llm.requests) == 1


async def test_the_deadline_bounds_every_attempt_together(fake_llm: FakeLLMServer) -> None:
    fake_llm.script(*[FakeResponse(hang=True)] * 4)
    async with engine_for(fake_llm, read_timeout=30.0, request_timeout=30.0, deadline=1.0,
                          max_attempts=4) as engine:
        started = time.monotonic()
        with pytest.raises(LLMError, match="timed out: no answer within the 1s deadline"):
            await asyncio.wait_for(engine.complete(MESSAGES), 30)
        assert time.monotonic() - started < 10


async def test_the_deadline_bounds_the_waits_between_attempts(fake_llm: FakeLLMServer) -> None:
    fake_llm.script(FakeResponse(status=429, headers={"Retry-After": "30"}))
    async with engine_for(fake_llm, deadline=1.0) as engine:
        started = time.monotonic()
        with pytest.raises(LLMError, match="deadline .* last error: LLM answered HTTP 429"):
            await asyncio.wait_for(engine.complete(MESSAGES), 30)
        assert time.monotonic() - started < 10
    assert len(fake_llm.requests) == 1


async def test_a_turn_asked_again_shares_its_deadline_and_says_why_it_was_asked_again(
    fake_llm: FakeLLMServer,
) -> None:
    """A grammar that breaks late, then a server that hangs: the turn still ends at its one
    deadline (not a second deadline for the second call), and its error says both."""
    fake_llm.script(FakeResponse(delay=1.6, status=500, body='{"error": {"message": "got exception: '
                                 'Unexpected empty grammar stack after accepting piece"}}'),
                    FakeResponse(hang=True))
    prompt = build_chat_request("hello", CONSOLE, allowed_actions=["message_console"])
    async with engine_for(fake_llm, read_timeout=30.0, request_timeout=30.0, deadline=2.0,
                          protocol="json_schema") as engine:
        started = time.monotonic()
        with pytest.raises(LLMError, match=r"2s deadline .*asked again after: .*grammar") as caught:
            await asyncio.wait_for(engine.answer(prompt), 30)
        elapsed = time.monotonic() - started
    assert not caught.value.constraint_failed  # the turn failed by its deadline, not its grammar
    assert [("response_format" in r.body) for r in fake_llm.requests] == [True, False]
    # Its own deadline would have run to 3.6 s; the turn's ends at 2 s (and a loaded machine's lag).
    assert elapsed < 3.2


async def test_finding_out_what_the_server_is_counts_against_the_turns_deadline(fake_llm: FakeLLMServer) -> None:
    fake_llm.props_delay = 30.0  # past discovery's own 5 s bound, and the turn's
    prompt = build_chat_request("hello", CONSOLE, allowed_actions=["message_console"])
    async with engine_for(fake_llm, deadline=1.0) as engine:
        with pytest.raises(LLMError, match="1s deadline .*still finding out what the server is"):
            await asyncio.wait_for(engine.answer(prompt), 30)
    assert fake_llm.requests == []  # nothing was asked after its deadline


async def test_a_call_waiting_for_a_free_slot_is_cut_off_by_its_deadline(fake_llm: FakeLLMServer) -> None:
    """The wait for one of ``max_in_flight`` slots is part of the call: a call queued behind
    a slow one ends at its own deadline, and says it never got to ask."""
    fake_llm.script(FakeResponse(hang=True), FakeResponse(content="too late"))
    async with engine_for(fake_llm, max_in_flight=1, deadline=5.0, read_timeout=30.0) as engine:
        slow = asyncio.ensure_future(engine.complete(MESSAGES))
        while not fake_llm.requests:  # the slow call holds the one slot
            await asyncio.sleep(0.01)
        with pytest.raises(LLMError, match="still waiting for one of the 1 calls in flight"):
            await asyncio.wait_for(engine.chat({"messages": MESSAGES},
                                               until=asyncio.get_running_loop().time() + 0.5), 30)
        slow.cancel()
        with pytest.raises(asyncio.CancelledError):
            await slow
    assert len(fake_llm.requests) == 1


@pytest.mark.parametrize("location", ["/v1/chat/completions", "http://127.0.0.1:9/v1/chat/completions"],
                         ids=["itself", "a dead port"])
async def test_a_redirect_is_a_clear_error_never_followed(fake_llm: FakeLLMServer, location: str) -> None:
    """An LLM endpoint that redirects is a base URL to fix: said once, with where it leads,
    never followed (a hop on a new connection would pass for a stale kept-alive one)."""
    fake_llm.script(*[FakeResponse(status=307, headers={"Location": location})] * 3)
    async with engine_for(fake_llm) as engine:
        with pytest.raises(LLMError, match=r"HTTP 307: it redirects to .*point the base URL there") as caught:
            await engine.complete(MESSAGES)
    assert location in str(caught.value)
    assert len(fake_llm.requests) == 1


@pytest.mark.parametrize("status", [500, 503])
async def test_a_5xx_naming_a_grammar_is_retried_as_such_when_the_request_had_none(
    fake_llm: FakeLLMServer, status: int,
) -> None:
    """Only a request that carried a grammar can have broken one: any other 5xx that says
    the word (a proxy's page) is retried like every 5xx."""
    fake_llm.script(FakeResponse(status=status, body="upstream grammar-service unavailable"),
                    FakeResponse(content="recovered"))
    async with engine_for(fake_llm) as engine:
        assert await engine.complete(MESSAGES) == "recovered"
    assert len(fake_llm.requests) == 2


async def test_an_error_event_in_a_stream_is_never_learnt_as_a_refusal(fake_llm: FakeLLMServer) -> None:
    """A 400 in the middle of a stream is a failure of that answer: the server had taken
    the request, so the engine does not step its protocol down for it."""
    fake_llm.script(FakeResponse(content="x" * 40, stream_error_code=400,
                                 stream_error="Failed to parse tool call arguments"),
                    FakeResponse(content="{}"))
    prompt = build_chat_request("hello", CONSOLE, allowed_actions=["message_console"])
    async with engine_for(fake_llm, stream=True, protocol="auto") as engine:
        with pytest.raises(LLMError, match="in its stream: .*Failed to parse tool call") as caught:
            await engine.answer(prompt, lambda text: None)
        assert caught.value.status == 400
        assert engine.mode == "tools" and engine.refused == set()
    assert len(fake_llm.requests) == 1


async def test_a_stream_line_too_long_to_read_is_a_malformed_stream(fake_llm: FakeLLMServer) -> None:
    fake_llm.script(FakeResponse(content="x" * 700_000, piece=700_000))  # one delta, one line of 700 kB
    async with engine_for(fake_llm, stream=True, max_attempts=1) as engine:
        with pytest.raises(LLMError, match="malformed LLM stream: a line too long"):
            await engine.chat({"messages": MESSAGES}, lambda text: None)


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
async def test_a_body_over_the_size_cap_is_an_llm_error(
    fake_llm: FakeLLMServer, chunked: bool
) -> None:
    # A well-formed completion, just too big: reading it whole is the danger.
    fake_llm.script(FakeResponse(content="x" * LLM_MAX_RESPONSE_BYTES, chunked=chunked))
    async with engine_for(fake_llm) as engine:
        with pytest.raises(LLMError, match=f"larger than {LLM_MAX_RESPONSE_BYTES} bytes"):
            await engine.complete(MESSAGES)
    assert len(fake_llm.requests) == 1


async def test_a_big_error_body_is_cut_not_refused(fake_llm: FakeLLMServer) -> None:
    fake_llm.script(FakeResponse(status=503, body="x" * 5000, chunked=True),
                    FakeResponse(content="recovered"))
    async with engine_for(fake_llm, max_response_bytes=1000) as engine:
        assert await engine.complete(MESSAGES) == "recovered"
    assert len(fake_llm.requests) == 2


async def test_credentials_in_the_base_url_are_never_shown(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    url = f"http://user:s3cret@127.0.0.1:{free_port()}/v1"
    async with HttpEngine(url, model="fake", max_attempts=2) as engine:
        with pytest.raises(LLMError, match="cannot reach the LLM") as caught:
            await engine.complete(MESSAGES)
    shown = [str(caught.value), repr(caught.value), str(caught.value.__cause__),
             repr(caught.value.__cause__), repr(engine), engine.url, caplog.text]
    assert not [text for text in shown if "s3cret" in text]
    assert "http://127.0.0.1:" in str(caught.value)


async def test_credentials_in_the_base_url_are_sent_as_basic_auth(fake_llm: FakeLLMServer) -> None:
    url = f"http://us%40er:s3c%3Aret@127.0.0.1:{fake_llm.port}/v1"
    async with HttpEngine(url, model="fake") as engine:
        await engine.complete(MESSAGES)
    expected = "Basic " + base64.b64encode(b"us@er:s3c:ret").decode()
    assert fake_llm.requests[0].headers["Authorization"] == expected


def test_an_api_key_and_url_credentials_together_are_refused() -> None:
    with pytest.raises(ValueError, match="not both") as caught:
        HttpEngine("http://user:s3cret@127.0.0.1:1/v1", model="fake", api_key="sk-key")
    assert "s3cret" not in str(caught.value)


async def test_a_deeply_nested_body_is_malformed_not_a_recursion_error(
    fake_llm: FakeLLMServer,
) -> None:
    depth = 100_000
    fake_llm.script(FakeResponse(body='{"choices": ' + "[" * depth + "]" * depth + "}"))
    async with engine_for(fake_llm) as engine:
        with pytest.raises(LLMError, match="malformed LLM response"):
            await engine.complete(MESSAGES)
    assert len(fake_llm.requests) == 1


# --- A field of the wrong type in an answer: unknown where it only informs, a malformed
# answer where the reply depends on it; never an exception that crashes the llm actor. ---


class RawStreamLLM(FakeLLMServer):
    """Streams each answer as the chunks given, verbatim (what follows ``data: ``), then
    ``[DONE]``: what a hostile server can send and ``FakeResponse`` cannot say (a model
    that is not text, JSON's ``1e999``)."""

    def __init__(self, *streams: list[str]) -> None:
        super().__init__()
        self.streams = deque(streams)

    async def _events(self, request: web.Request, scripted: FakeResponse,
                      body: dict[str, Any]) -> web.StreamResponse:
        if not self.streams:
            return await super()._events(request, scripted, body)
        response = web.StreamResponse(status=200)
        response.content_type = "text/event-stream"
        await response.prepare(request)
        for chunk in [*self.streams.popleft(), "[DONE]"]:
            await response.write(f"data: {chunk}\n\n".encode())
        await response.write_eof()
        return response


def hello(**fields: str) -> str:
    """A whole completion saying "Hello there.", with ``fields`` (raw JSON) put in."""
    choice = fields.pop("choice", "")
    return ('{"choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello there."}'
            + (f", {choice}" if choice else ', "finish_reason": "stop"') + "}]"
            + "".join(f', "{name}": {value}' for name, value in fields.items()) + "}")


HELLO_CHUNK = '{"model": "fake", "choices": [{"index": 0, "delta": {"content": "Hello there."}}]}'


def answered(app: Application) -> tuple[list[OutboundMessage], list[LLMReply]]:
    """What the console got for one "hello", and the replies the llm actor passed on."""
    with app.runtime.probe(sender("console")) as out, app.runtime.probe(DISPATCHER) as passed:
        ask(app, "hello")
        return out.bodies(OutboundMessage), passed.bodies(LLMReply)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_model_or_finish_reason_that_is_not_text_is_unknown_never_a_crash(
    make_app: Callable[..., Application], stream: bool
) -> None:
    """Both only inform: the user gets the answer, the configured model's name stands in,
    why it stopped is unknown, and the llm actor never restarts over them."""
    whole = hello(choice='"finish_reason": {"why": "stop"}', model="42")
    chunks = ['{"model": 42, "choices": [{"index": 0, "delta": {"content": "Hello there."}}]}',
              '{"model": ["x"], "choices": [{"index": 0, "delta": {}, "finish_reason": 7}]}']
    with RawStreamLLM(chunks) as llm:
        llm.script(*([] if stream else [FakeResponse(body=whole)] * 3))
        app = make_app(base_url=llm.base_url, llm={"stream": stream, "model": "configured"})
        sent, [reply] = answered(app)
        assert [m.text for m in sent if not m.preview] == ["Hello there."]
        assert (reply.model, reply.finish_reason) == ("configured", None)
        assert app.runtime.dead_letters.letters() == []
        assert app.runtime.cell(LLM).restarts == 0
        assert len(llm.requests) == 1


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("huge", ["1e999", "1" + "0" * 5000], ids=["1e999", "5000-digits"])
def test_usage_too_large_to_read_is_unknown_never_a_crash(
    make_app: Callable[..., Application], stream: bool, huge: str
) -> None:
    """JSON's ``1e999`` reads as an infinite float, which no count is, and so does an
    integer of more digits than Python reads as one: the usage is unknown (as any
    unreadable usage), the answer stands, and nobody is told the LLM was away."""
    usage = f'{{"prompt_tokens": {huge}, "completion_tokens": 3, "total_tokens": {huge}}}'
    with RawStreamLLM([HELLO_CHUNK, '{"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}',
                       f'{{"choices": [], "usage": {usage}}}']) as llm:
        llm.script(*([] if stream else [FakeResponse(body=hello(usage=usage))] * 3))
        app = make_app(base_url=llm.base_url, llm={"stream": stream})
        sent, [reply] = answered(app)
        assert [m.text for m in sent if not m.preview] == ["Hello there."]
        assert reply.usage is None and reply.finish_reason == "stop"
        assert app.runtime.dead_letters.letters() == []
        assert app.runtime.cell(LLM).restarts == 0


def test_a_streamed_tool_call_whose_index_is_null_is_read_as_one_without_an_index(
    make_app: Callable[..., Application],
) -> None:
    """A null index is read as one left out (the next call): the user gets the answer."""
    call = {"index": None, "id": "c1", "type": "function",
            "function": {"name": "message_console", "arguments": json.dumps({"text": "Hello there."})}}
    chunk = json.dumps({"model": "fake", "choices": [{"index": 0, "delta": {"tool_calls": [call]}}]})
    done = '{"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}'
    with RawStreamLLM([chunk, done]) as llm:
        app = make_app(base_url=llm.base_url, llm={"stream": True})
        sent, _ = answered(app)
        assert [(m.notice, m.text) for m in sent if not m.preview] == [(False, "Hello there.")]
        assert app.runtime.dead_letters.letters() == []


@pytest.mark.parametrize("piece", [
    '{"index": 1e999, "id": "call_0", "function": {"name": "message_console", "arguments": "{}"}}',
    '{"index": -1, "id": "call_0", "function": {"name": "message_console", "arguments": "{}"}}',
    '{"index": 0, "id": 5, "function": {"name": "message_console", "arguments": "{}"}}',
    '{"index": 0, "id": "call_0", "function": {"name": {"a": 1}, "arguments": "{}"}}',
], ids=["index-1e999", "index-negative", "id-number", "name-object"])
def test_a_streamed_tool_call_that_cannot_be_read_is_a_malformed_stream_never_a_crash(
    make_app: Callable[..., Application], piece: str
) -> None:
    """Which call a piece belongs to, and its id and name, are the reply itself: one that
    cannot be read is a malformed answer for that call (not retried, as any malformed
    answer), the user gets the notice, and the llm actor goes on."""
    chunk = f'{{"model": "fake", "choices": [{{"index": 0, "delta": {{"tool_calls": [{piece}]}}}}]}}'
    done = '{"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}'
    with RawStreamLLM(*[[chunk, done]] * 3) as llm:
        app = make_app(base_url=llm.base_url, llm={"stream": True})
        sent, replies = answered(app)
        assert [(m.notice, m.text) for m in sent if not m.preview] == [(True, UNREACHABLE_NOTICE)]
        assert replies == []
        [letter] = app.runtime.dead_letters.letters()
        assert letter.reason == "llm unavailable" and "malformed LLM stream" in letter.detail
        assert app.runtime.cell(LLM).restarts == 0
        assert len(llm.requests) == 1


@pytest.mark.parametrize("call", [
    '{"id": 5, "type": "function", "function": {"name": "message_console", "arguments": "{}"}}',
    '{"id": "call_0", "type": "function", "function": {"name": ["message_console"], "arguments": "{}"}}',
], ids=["id-number", "name-list"])
async def test_a_tool_call_whose_id_or_name_is_not_text_is_a_malformed_response(
    fake_llm: FakeLLMServer, call: str
) -> None:
    fake_llm.script(FakeResponse(body='{"choices": [{"index": 0, "message": {"role": "assistant", '
                                      f'"content": null, "tool_calls": [{call}]}}, "finish_reason": "tool_calls"}}]}}'))
    async with engine_for(fake_llm) as engine:
        with pytest.raises(LLMError, match="malformed LLM response"):
            await engine.complete(MESSAGES)
    assert len(fake_llm.requests) == 1


@pytest.mark.parametrize("props", [
    {"default_generation_settings": [1], "chat_template_caps": "tools"},
    {"n_ctx": float("inf"), "default_generation_settings": {"n_ctx": -5}},
    {"n_ctx": True},
], ids=["members-not-objects", "windows-not-counts", "window-a-truth-value"])
async def test_what_a_server_says_of_itself_unreadably_is_unknown_never_a_failed_call(
    props: dict[str, Any],
) -> None:
    """Discovery never fails a call: a /props whose members are of the wrong type says
    nothing, and the call goes on unfitted."""
    with FakeLLMServer(props=props) as llm:
        prompt = build_chat_request("hello", CONSOLE, allowed_actions=["message_console"])
        async with engine_for(llm) as engine:
            await engine.answer(prompt)
            assert engine.context_tokens is None and engine.server_facts == {"server": "llama.cpp",
                                                                              "context_tokens": None}


class PropsCountingLLM(FakeLLMServer):
    """Counts the requests for /props, and answers the first ``unavailable`` of them with
    a 503 (as llama.cpp's server does while it loads the model)."""

    def __init__(self, *, unavailable: int = 0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.unavailable = unavailable
        self.props_asked = 0

    async def _props(self, request: web.Request) -> web.Response:
        self.props_asked += 1
        if self.props_asked <= self.unavailable:
            raise web.HTTPServiceUnavailable()
        return await super()._props(request)


#: llama.cpp's /props for a model whose chat template has no tool support.
NO_TOOLS_PROPS = {"default_generation_settings": {"n_ctx": 4096}, "chat_template_caps": {"supports_tools": False}}


def test_a_daemon_started_before_its_llm_server_learns_what_it_is_once_it_is_up(
    make_app: Callable[..., Application],
) -> None:
    """A reboot, a service order: the daemon's first message finds no server. Once the
    server is up, the daemon learns what it is, as one started after it would: its
    template has no tools, so ``auto`` speaks json_schema, within its window; and it
    asks the server what it is only once."""
    port = free_port()
    app = make_app(base_url=f"http://127.0.0.1:{port}/v1", admin={"enabled": True, "port": 0})
    with app.runtime.probe(sender("console")) as out:
        ask(app, "uptime")
        [notice] = out.bodies(OutboundMessage)
    assert notice.notice and notice.text == UNREACHABLE_NOTICE
    with PropsCountingLLM(port=port, props=NO_TOOLS_PROPS) as llm:
        with app.runtime.probe(sender("console")) as out:
            ask(app, "uptime")
            ask(app, "hello")
            assert not any(m.notice for m in out.bodies(OutboundMessage))
        assert llm.requests and all("response_format" in r.body and "tools" not in r.body for r in llm.requests)
        with urllib.request.urlopen(f"{app.admin.url}/status", timeout=10) as response:
            [engine] = json.load(response)["reports"]["llm"]["engines"]
        assert engine["protocol"] == "json_schema" and engine["context_tokens"] == 4096
        assert engine["server"] == "llama.cpp"
        assert llm.props_asked == 1


async def test_a_server_that_cannot_say_yet_is_asked_again_at_the_next_call_once_for_calls_waiting() -> None:
    """A 5xx is no answer (llama.cpp loading its model): the next call asks again. Calls
    that waited behind a try that got no answer do not each ask again; and once the
    server answered, it is not asked again."""
    with PropsCountingLLM(props=NO_TOOLS_PROPS, unavailable=1) as llm:
        prompt = build_chat_request("hello", CONSOLE, allowed_actions=["message_console"])
        async with engine_for(llm) as engine:
            await asyncio.wait_for(asyncio.gather(*[engine.answer(prompt) for _ in range(3)]), 30)
            assert llm.props_asked == 1 and engine.mode == "tools" and engine.context_tokens is None
            assert engine.server_facts == {}
            for _ in range(2):
                assert (await asyncio.wait_for(engine.answer(prompt), 30)).protocol == "json_schema"
            assert engine.context_tokens == 4096 and engine.server_facts["supports_tools"] is False
    assert llm.props_asked == 2


async def test_tools_chosen_for_a_template_without_them_is_kept_and_said_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The operator set protocol tools; the server's template has none, so no command
    would ever run: one warning says so and what to do, the engine keeps it for the
    status, and the protocol chosen stays."""
    caplog.set_level(logging.WARNING, logger="autoresponse.llm")
    with PropsCountingLLM(props=NO_TOOLS_PROPS) as llm:
        prompt = build_chat_request("uptime", CONSOLE, allowed_actions=["message_console", "terminal"])
        async with engine_for(llm, protocol="tools") as engine:
            for _ in range(2):
                assert (await asyncio.wait_for(engine.answer(prompt), 30)).protocol == "tools"
    assert all("tools" in r.body for r in llm.requests)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "does not support tools" in warnings[0]
    assert "PROTOCOL=auto or json_schema" in warnings[0] and "--jinja" in warnings[0]
    assert engine.problem == warnings[0]
    from autoresponse.app import engine_status
    from autoresponse.cli import _llm_labels

    [main] = engine_status(engine)["engines"]
    assert main["problem"] == warnings[0]
    assert any("does not support tools" in row and row.startswith("[red]") for row in _llm_labels({"engines": [main]}))


async def test_a_404_says_the_server_has_nothing_to_say_and_is_not_asked_again() -> None:
    with PropsCountingLLM() as llm:  # no /props, no /v1/models, no /api/show: a plain server
        prompt = build_chat_request("hello", CONSOLE, allowed_actions=["message_console"])
        async with engine_for(llm) as engine:
            for _ in range(3):
                assert (await asyncio.wait_for(engine.answer(prompt), 30)).protocol == "tools"
    assert llm.props_asked == 1


async def test_a_server_that_answers_calls_but_never_what_it_is_is_no_longer_asked() -> None:
    """A /props that always fails while chats work (a proxy in between) would slow every
    call: after a few calls it answered, the engine stops asking, and goes on unfitted."""
    with PropsCountingLLM(props=NO_TOOLS_PROPS, unavailable=1_000) as llm:
        prompt = build_chat_request("hello", CONSOLE, allowed_actions=["message_console"])
        async with engine_for(llm) as engine:
            for _ in range(_DISCOVERY_MISSES + 2):
                assert (await asyncio.wait_for(engine.answer(prompt), 30)).protocol == "tools"
            assert engine.context_tokens is None
    assert llm.props_asked == _DISCOVERY_MISSES


# --- Event streams framed as the SSE spec allows (an event's data over several lines,
# lines ended by a lone CR), and as hostile servers frame them. ---


class SSEBytesLLM(FakeLLMServer):
    """Streams every answer as the ``writes`` given, verbatim, with ``pause`` seconds after
    each (so each reaches the client on its own); then ends the body, or with ``linger``
    keeps it open (until the server stops)."""

    def __init__(self, *writes: bytes, pause: float = 0.0, linger: bool = False) -> None:
        super().__init__()
        self.writes, self.pause, self.linger = writes, pause, linger

    async def _events(self, request: web.Request, scripted: FakeResponse,
                      body: dict[str, Any]) -> web.StreamResponse:
        response = web.StreamResponse(status=200)
        response.content_type = "text/event-stream"
        await response.prepare(request)
        try:
            for piece in self.writes:
                await response.write(piece)
                if self.pause and await self._stopped_within(self.pause):
                    return response
            if self.linger:
                await self.stopping.wait()
                return response
            await response.write_eof()
        except ConnectionError:  # the client gave up on the stream
            pass
        return response


#: "Hello there." as a stream sends it: two deltas, the finish reason, the usage.
REPLY_CHUNKS: list[dict[str, Any]] = [
    {"model": "fake", "choices": [{"index": 0, "delta": {"content": "Hello"}}]},
    {"model": "fake", "choices": [{"index": 0, "delta": {"content": " there."}}]},
    {"model": "fake", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
    {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}},
]


async def streamed_reply(llm: FakeLLMServer,
                         **options: object) -> tuple[str, str | None, int | None, list[str]]:
    """The text, finish reason and total tokens of one streamed answer, and its previews."""
    previews: list[str] = []
    async with engine_for(llm, stream=True, max_attempts=1, **options) as engine:
        completion = await engine.chat({"messages": MESSAGES}, previews.append)
    total = completion.usage.total_tokens if completion.usage is not None else None
    return completion.text, completion.finish_reason, total, previews


async def test_a_finish_reason_on_every_chunk_before_the_first_token_ends_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A proxy that puts the finish reason on every chunk, the first (the role, no text)
    too, and a model slow to its first token: the end's grace starts only once some of
    the reply came, so the user gets the whole answer, not an empty one."""
    monkeypatch.setattr("autoresponse.actors.llm.http.LLM_STREAM_END_GRACE_SECONDS", 0.2)
    deltas = [{"role": "assistant", "content": ""}, {"content": "Lisbon in May "}, {"content": "is warm."}]
    events = [b"data: %s\n\n" % json.dumps({"model": "fake", "choices": [
        {"index": 0, "delta": delta, "finish_reason": "stop"}]}).encode() for delta in deltas]
    with SSEBytesLLM(*events, b"data: [DONE]\n\n", pause=0.6) as llm:  # each write 0.6 s after the last
        text, reason, _, _ = await asyncio.wait_for(streamed_reply(llm), 30)
    assert (text, reason) == ("Lisbon in May is warm.", "stop")


async def test_a_reply_streamed_as_multi_line_data_events_is_received_whole() -> None:
    """Each chunk pretty-printed, a data line per line of it, among a comment and the
    fields we skip: one event each, dispatched at its blank line."""
    events = [b": the model is warm\n", b"event: message\nid: 1\nretry: 1000\n"]
    for chunk in REPLY_CHUNKS:
        lines = json.dumps(chunk, indent=2).splitlines()
        events.append(b"".join(b"data:" + line.encode() + b"\n" for line in lines) + b"\n")
    with SSEBytesLLM(*events, b"data: [DONE]\n\n") as llm:
        assert await streamed_reply(llm) == ("Hello there.", "stop", 8, ["Hello"])


async def test_a_reply_streamed_with_lines_ended_by_a_lone_cr_is_received_whole() -> None:
    """CR-only line ends, as the spec allows: each event is read as it comes, the last
    one too, though the stream is left open and no LF ever comes."""
    events = [b": ping\r", *(b"data: %s\r\r" % json.dumps(chunk).encode() for chunk in REPLY_CHUNKS)]
    with SSEBytesLLM(*events, b"data: [DONE]\r\r", linger=True) as llm:
        started = time.monotonic()
        assert await streamed_reply(llm) == ("Hello there.", "stop", 8, ["Hello"])
        assert time.monotonic() - started < 1.5  # at [DONE]: no end's grace, no read timeout


async def test_a_stream_that_starts_with_a_byte_order_mark_is_read_whole() -> None:
    """The spec drops a UTF-8 BOM before the first line; read as part of it, the first
    event (here the one that opens the reply) would be lost."""
    events = [b"data: %s\n\n" % json.dumps(chunk).encode() for chunk in REPLY_CHUNKS]
    with SSEBytesLLM(b"\xef\xbb\xbf" + events[0], *events[1:], b"data: [DONE]\n\n") as llm:
        assert await streamed_reply(llm) == ("Hello there.", "stop", 8, ["Hello"])


async def test_a_crlf_split_between_two_writes_ends_one_line_not_two() -> None:
    """A CR at the end of one read and its LF at the start of the next: had they been two
    line ends, the blank line between would end each two-line event after its first line."""
    stream = b""
    for chunk in REPLY_CHUNKS:
        first, rest = json.dumps(chunk).split(", ", 1)  # the data over two lines
        stream += b"data: %s,\r\ndata: %s\r\n\r\n" % (first.encode(), rest.encode())
    stream += b"data: [DONE]\r\n\r\n"
    writes = [piece + b"\r" for piece in stream.split(b"\r")[:-1]]  # each write ends with the CR
    assert all(piece.startswith(b"\n") for piece in writes[1:])
    with SSEBytesLLM(*writes, pause=0.02) as llm:
        assert await streamed_reply(llm) == ("Hello there.", "stop", 8, ["Hello"])


@pytest.mark.parametrize("writes", [
    [b'data: {"choices": [\n', *[b'data: {"index": 0},\n' * 4096] * 8],
    [b"\r" * 65536] * 16,
], ids=["an-event-that-never-ends", "nothing-but-line-ends"])
async def test_an_event_without_end_or_a_stream_of_line_ends_is_cut_at_the_size_cap(
    writes: list[bytes],
) -> None:
    """What the reader keeps without end (an event's data lines) or loops over without end
    (blank lines) ends in an LLMError at the size cap, at once: never a hang, nor memory
    past the cap."""
    with SSEBytesLLM(*writes) as llm:
        started = time.monotonic()
        with pytest.raises(LLMError, match="larger than 262144 bytes"):
            await streamed_reply(llm, max_response_bytes=256 * 1024)
        assert time.monotonic() - started < 4


def garbage(size: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(size)


@pytest.mark.parametrize("writes", [
    [garbage(64 * 1024, seed) for seed in range(16)],
    [b'data: {"choices": [\r', *(b"data: " + garbage(512, seed).translate(None, b"\r\n") + b"\r"
                                  for seed in range(8)), b"\r"],
], ids=["random-bytes", "random-bytes-in-an-event"])
async def test_garbage_in_a_stream_is_an_llm_error(writes: list[bytes]) -> None:
    """Bytes that mean nothing, alone or as an event's data: skipped to the size cap, or
    a malformed stream, at once."""
    with SSEBytesLLM(*writes) as llm:
        started = time.monotonic()
        with pytest.raises(LLMError, match="larger than|malformed LLM stream"):
            await streamed_reply(llm, max_response_bytes=256 * 1024)
        assert time.monotonic() - started < 4


@pytest.mark.parametrize(("writes", "linger"), [
    ([*(b"data: %s\n" % json.dumps(chunk).encode() for chunk in REPLY_CHUNKS), b"data: [DONE]\n"], True),
    ([*(b"data: %s\n\n" % json.dumps(chunk).encode() for chunk in REPLY_CHUNKS[:3]),
      b"data: %s" % json.dumps(REPLY_CHUNKS[3]).encode()], False),
], ids=["no-blank-lines-and-held-open", "the-last-event-unended"])
async def test_events_not_ended_by_a_blank_line_are_read_as_before(writes: list[bytes], linger: bool) -> None:
    """Servers that leave out the blank lines (one data line an event, back to back, and a
    ``[DONE]`` with the stream left open), or end the body without the last one: each
    object is still an event of its own, read as it comes."""
    with SSEBytesLLM(*writes, linger=linger) as llm:
        started = time.monotonic()
        assert await streamed_reply(llm) == ("Hello there.", "stop", 8, ["Hello"])
        assert time.monotonic() - started < 1.5  # at [DONE] or the end: no end's grace


# ------------------------------------------------------------------ a window smaller than estimated


def story(turns: int, start: int = 0) -> tuple[Turn, ...]:
    """A chat's memory of ``turns`` long exchanges: more than the window holds."""
    return tuple(Turn(role=role, content=f"{role} part {n}: " + "once upon a time " * 24)
                 for n in range(start, start + turns) for role in ("user", "assistant"))


def refused(server: FakeLLMServer, since: int) -> int:
    """Requests the server refused as too big for its context, since its ``since``-th."""
    return sum(server.refusal(r.body) is not None for r in server.requests[since:])


async def test_a_chat_once_refused_as_too_big_starts_its_next_turns_at_the_size_that_fitted() -> None:
    """A server whose window is smaller than the estimate allows refuses a long chat's
    request once; the smaller one fits, and that chat's later turns start at the size that
    fitted: no refused request (a whole prompt evaluation on a local model) every turn.
    Another chat's first request is still sent at full size."""
    chat = OriginalContext(interface_name="console", chat_id="alice")
    other = OriginalContext(interface_name="console", chat_id="bob")
    with FakeLLMServer(context=1_900) as llm:  # counts four characters a token: fewer than we do
        async with engine_for(llm, context_tokens=3_000, max_tokens=200, protocol="text") as engine:
            asked = []  # the requests each turn of the chat took
            for turn in range(3):  # the chat grows by an exchange a turn
                before = len(llm.requests)
                prompt = build_chat_request(f"and then? ({turn})", chat, allowed_actions=["message_console"],
                                            turns=story(30 + turn))
                assert "offline" in (await asyncio.wait_for(engine.answer(prompt), 30)).text
                asked.append(len(llm.requests) - before)
            first = llm.requests[0].messages
            fitted = llm.requests[-1].messages
            before = len(llm.requests)
            prompt = build_chat_request("and then? (0)", other, allowed_actions=["message_console"],
                                        turns=story(30))
            assert "offline" in (await asyncio.wait_for(engine.answer(prompt), 30)).text
    assert asked == [2, 1, 1]  # one refusal, then the size that fitted from the start
    assert refused(llm, 0) == 2  # the chat's first turn, and the other chat's first request
    # The other chat: as much of its memory as the chat's first request had, not the fitted size.
    assert len(llm.requests[before].messages) == len(first)
    assert len(fitted) < len(first)


def later_turn(chat: OriginalContext, memory: tuple[Turn, ...]) -> PromptRequest:
    """A turn of ``chat`` with ``memory``."""
    return build_chat_request("and then?", chat, allowed_actions=["message_console"], turns=memory)


async def refusals(engine: HttpEngine, server: FakeLLMServer, prompt: PromptRequest) -> int:
    """The requests ``server`` refused as too big while ``engine`` answered ``prompt``."""
    before = len(server.requests)
    assert "offline" in (await asyncio.wait_for(engine.answer(prompt), 30)).text
    return refused(server, before)


async def test_a_chat_whose_memory_was_cleared_starts_at_the_whole_size_again() -> None:
    """A chat's narrower start goes with its memory (a /forget, its retention passed):
    grown long again, it is asked at the whole size first, as a new chat is."""
    chat = OriginalContext(interface_name="console", chat_id="alice")
    with FakeLLMServer(context=1_900) as llm:
        async with engine_for(llm, context_tokens=3_000, max_tokens=200, protocol="text") as engine:
            assert await refusals(engine, llm, later_turn(chat, story(30))) == 1
            assert await refusals(engine, llm, later_turn(chat, story(31))) == 0  # started smaller
            assert await refusals(engine, llm, later_turn(chat, ())) == 0  # its memory cleared ...
            assert await refusals(engine, llm, later_turn(chat, story(30))) == 1  # ... its narrower start too


async def test_past_the_most_narrowed_chats_remembered_the_oldest_starts_at_the_whole_size() -> None:
    """The narrowed chats are bounded: past the most remembered, the one narrowed or asked
    for longest ago is forgotten, and pays one refused request again."""
    chats = [OriginalContext(interface_name="console", chat_id=name) for name in ("alice", "bob", "carol")]
    with FakeLLMServer(context=1_900) as llm:
        async with engine_for(llm, context_tokens=3_000, max_tokens=200, protocol="text") as engine:
            engine._narrowed = NarrowedChats(most=2)
            assert [await refusals(engine, llm, later_turn(chat, story(30))) for chat in chats] == [1, 1, 1]
            assert await refusals(engine, llm, later_turn(chats[2], story(31))) == 0  # remembered
            assert await refusals(engine, llm, later_turn(chats[0], story(31))) == 1  # the oldest: forgotten
            assert await refusals(engine, llm, later_turn(chats[2], story(32))) == 0  # still remembered


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_model_name_too_long_is_cut(make_app: Callable[..., Application], stream: bool) -> None:
    """The server decides the model's name its reply gives: the user gets the answer, and the
    name goes on (to the usage meter, the status, spans) cut to LLM_MODEL_NAME_CHARS."""
    from autoresponse.actors.limits import LLM_MODEL_NAME_CHARS

    model = json.dumps("qwen-" + "M" * 5000)
    chunks = [HELLO_CHUNK.replace('"fake"', model),
              '{"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}']
    with RawStreamLLM(chunks) as llm:
        llm.script(*([] if stream else [FakeResponse(body=hello(model=model))]))
        app = make_app(base_url=llm.base_url, llm={"stream": stream})
        sent, [reply] = answered(app)
        assert [m.text for m in sent if not m.preview] == ["Hello there."]
        assert reply.model == ("qwen-" + "M" * 5000)[:LLM_MODEL_NAME_CHARS]
