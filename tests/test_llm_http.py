"""The LLM HTTP client against a real fake server on 127.0.0.1."""

from __future__ import annotations

import socket
import time

import pytest

from autoresponse.actors.llm import HttpEngine, LLMError
from autoresponse.actors.llm.fake_server import FakeLLMServer, FakeResponse

MESSAGES = [{"role": "user", "content": "hello"}]


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
    assert body == {"model": "fake", "messages": MESSAGES, "temperature": 0.2}


async def test_a_malformed_response_is_a_clear_error(fake_llm: FakeLLMServer) -> None:
    fake_llm.script(FakeResponse(status=200, body='{"choices": []}'))
    async with engine_for(fake_llm) as engine:
        with pytest.raises(LLMError, match="malformed LLM response"):
            await engine.complete(MESSAGES)
    assert len(fake_llm.requests) == 1
