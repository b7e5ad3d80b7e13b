"""An OpenAI-compatible chat completions client over aiohttp.

>>> async with HttpEngine("http://127.0.0.1:11434/v1", model="llama3") as engine:  # doctest: +SKIP
...     await engine.complete([{"role": "user", "content": "hi"}])

Retries 408, 409, 429, 5xx, timeouts and connection errors a bounded number of
times, waiting as ``Retry-After`` says when the server says; never retries
other 4xx, nor a 429 that reports an exhausted quota.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import time

import aiohttp
from pydantic import SecretStr
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, stop_after_attempt

from autoresponse.actors.backoff import BackoffPolicy
from autoresponse.actors.llm.engine import LLMError
from autoresponse.actors.limits import (
    LLM_CONNECT_TIMEOUT_SECONDS,
    LLM_MAX_ATTEMPTS,
    LLM_MAX_IN_FLIGHT,
    LLM_MAX_RETRY_AFTER_SECONDS,
    LLM_READ_TIMEOUT_SECONDS,
)

RETRY_STATUSES = frozenset({408, 409, 429})
#: Wait between attempts when the server does not say (Retry-After): 0.5 s, doubling.
RETRY_BACKOFF = BackoffPolicy(min=0.5, max=8.0, jitter=0.5)


def parse_retry_after(value: str | None) -> float | None:
    """Seconds to wait from a Retry-After header (seconds or an HTTP date)."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def _wait(state: RetryCallState) -> float:
    exc = state.outcome.exception() if state.outcome else None
    if isinstance(exc, LLMError) and exc.retry_after is not None:
        return exc.retry_after
    return RETRY_BACKOFF.delay(state.attempt_number)


def _retryable(exc: BaseException) -> bool:
    return isinstance(exc, LLMError) and exc.retryable


class HttpEngine:
    """One long-lived aiohttp session per engine, created on the runtime's loop."""

    def __init__(
        self,
        base_url: str,
        *,
        model: str,
        api_key: SecretStr | str | None = None,
        connect_timeout: float = LLM_CONNECT_TIMEOUT_SECONDS,
        read_timeout: float = LLM_READ_TIMEOUT_SECONDS,
        max_attempts: int = LLM_MAX_ATTEMPTS,
        max_in_flight: int = LLM_MAX_IN_FLIGHT,
        temperature: float | None = None,
    ) -> None:
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model = model
        self._api_key = SecretStr(api_key) if isinstance(api_key, str) else api_key
        self._timeout = aiohttp.ClientTimeout(
            total=None, connect=connect_timeout, sock_connect=connect_timeout, sock_read=read_timeout
        )
        self._read_timeout = read_timeout
        self.max_attempts = max_attempts
        self.max_in_flight = max_in_flight
        self.temperature = temperature
        self._session: aiohttp.ClientSession | None = None
        self._slots: asyncio.Semaphore | None = None

    def __repr__(self) -> str:  # never shows the key
        return f"HttpEngine({self.url!r}, model={self.model!r})"

    def _open(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            headers = {"Content-Type": "application/json"}
            if self._api_key is not None and self._api_key.get_secret_value():
                headers["Authorization"] = f"Bearer {self._api_key.get_secret_value()}"
            connector = aiohttp.TCPConnector(limit=self.max_in_flight)
            self._session = aiohttp.ClientSession(
                headers=headers, timeout=self._timeout, connector=connector
            )
            self._slots = asyncio.Semaphore(self.max_in_flight)
        return self._session

    async def complete(self, messages: list[dict[str, str]]) -> str:
        session = self._open()
        assert self._slots is not None
        body: dict[str, object] = {"model": self.model, "messages": messages}
        if self.temperature is not None:
            body["temperature"] = self.temperature
        payload = json.dumps(body, ensure_ascii=False).encode()
        retrying = AsyncRetrying(
            stop=stop_after_attempt(self.max_attempts),
            wait=_wait,
            retry=retry_if_exception(_retryable),
            reraise=True,
        )
        async with self._slots:
            async for attempt in retrying:
                with attempt:
                    return await self._post(session, payload)
        raise AssertionError("unreachable: tenacity reraises the last error")

    async def _post(self, session: aiohttp.ClientSession, payload: bytes) -> str:
        try:
            async with session.post(self.url, data=payload) as resp:
                text = await resp.text()
                if resp.status != 200:
                    raise self._http_error(resp.status, resp.headers.get("Retry-After"), text)
        except asyncio.TimeoutError as exc:
            raise LLMError(f"LLM request timed out (read timeout {self._read_timeout:g}s)",
                           retryable=True) from exc
        except aiohttp.ClientError as exc:
            raise LLMError(f"cannot reach the LLM at {self.url}: {exc}", retryable=True) from exc
        try:
            content = json.loads(text)["choices"][0]["message"]["content"]
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            raise LLMError(f"malformed LLM response: {text[:200]!r}") from exc
        if not isinstance(content, str):
            raise LLMError(f"LLM response has no text content: {text[:200]!r}")
        return content

    @staticmethod
    def _http_error(status: int, retry_after_header: str | None, text: str) -> LLMError:
        retry_after = parse_retry_after(retry_after_header)
        quota = status == 429 and "insufficient_quota" in text
        retryable = (status in RETRY_STATUSES or status >= 500) and not quota
        if retry_after is not None and retry_after > LLM_MAX_RETRY_AFTER_SECONDS:
            retryable = False
        what = "quota exhausted" if quota else f"HTTP {status}"
        return LLMError(f"LLM answered {what}: {text[:200]}", status=status,
                        retry_after=retry_after, retryable=retryable)

    async def aclose(self) -> None:
        if self._session is not None and not self._session.closed:
            await self._session.close()
        self._session = None

    async def __aenter__(self) -> HttpEngine:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
