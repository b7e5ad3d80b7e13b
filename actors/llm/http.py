"""An OpenAI-compatible chat completions client over aiohttp.

>>> async with HttpEngine("http://127.0.0.1:11434/v1", model="llama3") as engine:  # doctest: +SKIP
...     await engine.complete([{"role": "user", "content": "hi"}])

Retries 408, 409, 429, 5xx, timeouts and connection errors a bounded number of
times, waiting as ``Retry-After`` says when the server says; never retries
other 4xx, nor a 429 that reports an exhausted quota.

Every way a call can go wrong ends in an ``LLMError``: each attempt has a total
timeout, the whole call a deadline, the body a size cap, and a body that is not
text or not JSON (however deeply nested) is a malformed response. Credentials
in the base URL are sent as basic auth and never appear in a message or repr.
"""

from __future__ import annotations

import asyncio
import base64
import email.utils
import json
import time
from collections.abc import Callable

import aiohttp
from pydantic import SecretStr
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, stop_after_attempt
from yarl import URL

from autoresponse.actors.kernel.backoff import BackoffPolicy
from autoresponse.actors.limits import (
    LLM_CONNECT_TIMEOUT_SECONDS,
    LLM_DEADLINE_SECONDS,
    LLM_MAX_ATTEMPTS,
    LLM_MAX_IN_FLIGHT,
    LLM_MAX_RESPONSE_BYTES,
    LLM_MAX_RETRY_AFTER_SECONDS,
    LLM_READ_TIMEOUT_SECONDS,
    LLM_REQUEST_TIMEOUT_SECONDS,
    STREAM_WATCH_SECONDS,
)
from autoresponse.actors.llm.engine import LLMError

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
    except (TypeError, ValueError, IndexError, OverflowError):  # whatever a bad date raises
        return None
    return max(0.0, when.timestamp() - time.time())


def split_credentials(base_url: str) -> tuple[str, str | None]:
    """``base_url`` without its userinfo, and that userinfo as a basic Authorization value.

    aiohttp would send URL credentials itself, but then the URL it carries (and
    puts in its errors) still has them; stripping them here keeps them out of
    every message. A URL without credentials is returned as given.
    """
    try:
        url = URL(base_url)
    except ValueError:
        # yarl's message may quote the URL, secret and all.
        raise ValueError("the LLM base URL is not a valid URL") from None
    if url.raw_user is None and url.raw_password is None:
        return base_url, None
    userinfo = f"{url.user or ''}:{url.password or ''}".encode()  # RFC 7617: UTF-8
    return str(url.with_user(None)), "Basic " + base64.b64encode(userinfo).decode("ascii")


def _wait(state: RetryCallState) -> float:
    exc = state.outcome.exception() if state.outcome else None
    if isinstance(exc, LLMError) and exc.retry_after is not None:
        return exc.retry_after
    return RETRY_BACKOFF.delay(state.attempt_number)


def _retryable(exc: BaseException) -> bool:
    return isinstance(exc, LLMError) and exc.retryable


class HttpEngine:
    """One long-lived aiohttp session per engine, created on the runtime's loop.

    ``read_timeout`` bounds each wait for data, ``request_timeout`` one whole
    attempt (connect, send, read the body), ``deadline`` the whole call: every
    attempt and every wait between them.
    """

    def __init__(
        self,
        base_url: str,
        *,
        model: str,
        api_key: SecretStr | str | None = None,
        connect_timeout: float = LLM_CONNECT_TIMEOUT_SECONDS,
        read_timeout: float = LLM_READ_TIMEOUT_SECONDS,
        request_timeout: float = LLM_REQUEST_TIMEOUT_SECONDS,
        deadline: float = LLM_DEADLINE_SECONDS,
        max_response_bytes: int = LLM_MAX_RESPONSE_BYTES,
        max_attempts: int = LLM_MAX_ATTEMPTS,
        max_in_flight: int = LLM_MAX_IN_FLIGHT,
        temperature: float | None = None,
        stream: bool = False,
    ) -> None:
        base, basic_auth = split_credentials(base_url)
        self.url = base.rstrip("/") + "/chat/completions"
        self.model = model
        key = api_key.get_secret_value() if isinstance(api_key, SecretStr) else api_key
        if key and basic_auth is not None:
            # One Authorization header: refuse now rather than fail every request.
            raise ValueError("give the LLM either an api_key or credentials in the base URL, "
                             "not both")
        # A SecretStr, so that no repr or dump of the engine shows it.
        self._authorization = SecretStr(f"Bearer {key}" if key else basic_auth or "")
        self._timeout = aiohttp.ClientTimeout(
            total=request_timeout, connect=connect_timeout,
            sock_connect=connect_timeout, sock_read=read_timeout,
        )
        self._timeouts_text = (f"connect {connect_timeout:g}s, read {read_timeout:g}s, "
                               f"whole request {request_timeout:g}s")
        self.deadline = deadline
        self.max_response_bytes = max_response_bytes
        self.max_attempts = max_attempts
        self.max_in_flight = max_in_flight
        self.temperature = temperature
        #: Ask for the reply as a stream (server-sent events) when a caller watches it grow.
        self.stream = stream
        self._session: aiohttp.ClientSession | None = None
        self._slots: asyncio.Semaphore | None = None

    def __repr__(self) -> str:  # never shows the key: the URL has no credentials left
        return f"HttpEngine({self.url!r}, model={self.model!r})"

    def _open(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            headers = {"Content-Type": "application/json"}
            if self._authorization.get_secret_value():
                headers["Authorization"] = self._authorization.get_secret_value()
            connector = aiohttp.TCPConnector(limit=self.max_in_flight)
            self._session = aiohttp.ClientSession(
                headers=headers, timeout=self._timeout, connector=connector
            )
            self._slots = asyncio.Semaphore(self.max_in_flight)
        return self._session

    async def complete(self, messages: list[dict[str, str]],
                       on_text: Callable[[str], None] | None = None) -> str:
        """The reply's text. With ``on_text`` (and ``stream`` on), the reply is streamed and
        ``on_text`` sees the text so far each time it grows; the whole text is returned."""
        session = self._open()
        assert self._slots is not None
        body: dict[str, object] = {"model": self.model, "messages": messages}
        if self.temperature is not None:
            body["temperature"] = self.temperature
        watch = on_text if self.stream else None
        if watch is not None:
            body["stream"] = True
        payload = json.dumps(body, ensure_ascii=False).encode()
        retrying = AsyncRetrying(
            stop=stop_after_attempt(self.max_attempts),
            wait=_wait,
            retry=retry_if_exception(_retryable),
            reraise=True,
        )
        attempts = 0  # these two for the deadline's message
        last: BaseException | None = None
        async with self._slots:
            try:
                # The deadline cancels whatever is under way: an attempt or a wait.
                async with asyncio.timeout(self.deadline):
                    async for attempt in retrying:
                        attempts += 1
                        with attempt:
                            return await self._post(session, payload, watch)
                        # tenacity keeps the error in the outcome (and clears it before
                        # the next wait); keep it for the deadline's message.
                        outcome = attempt.retry_state.outcome
                        last = outcome.exception() if outcome is not None else None
            except TimeoutError as exc:  # _post turns its own timeouts into LLMError
                raise self._deadline_error(attempts, last) from exc
        raise AssertionError("unreachable: tenacity reraises the last error")

    def _deadline_error(self, attempts: int, last: BaseException | None) -> LLMError:
        """The deadline passed: say how many attempts were made and how the last one ended."""
        because = f"; last error: {last}" if isinstance(last, LLMError) else ""
        return LLMError(f"LLM request timed out: no answer within the {self.deadline:g}s "
                        f"deadline ({attempts} attempt(s)){because}")

    async def _post(self, session: aiohttp.ClientSession, payload: bytes,
                    on_text: Callable[[str], None] | None = None) -> str:
        try:
            async with session.post(self.url, data=payload) as resp:
                if resp.status == 200 and resp.content_type == "text/event-stream":
                    return await self._streamed(resp, on_text)
                raw = await self._read(resp)
                if resp.status != 200:
                    # Only the start of an error body is shown; bad bytes are fine there.
                    text = raw.decode("utf-8", errors="replace")
                    raise self._http_error(resp.status, resp.headers.get("Retry-After"), text)
                encoding = resp.charset or "utf-8"  # JSON is UTF-8 unless the server says
        except asyncio.TimeoutError as exc:
            raise LLMError(f"LLM request timed out ({self._timeouts_text})",
                           retryable=True) from exc
        except aiohttp.ClientError as exc:
            raise LLMError(f"cannot reach the LLM at {self.url}: {exc}", retryable=True) from exc
        return self._content(raw, encoding)

    async def _streamed(self, resp: aiohttp.ClientResponse, on_text: Callable[[str], None] | None) -> str:
        """The text of an OpenAI-style stream: ``data:`` lines of deltas, then ``[DONE]``.

        Bounded like a whole body; a line that is not a delta is an error, and so is a
        stream cut before its end (retried). ``on_text`` sees the text so far at most
        every STREAM_WATCH_SECONDS, so a long reply is not joined once per delta.
        """
        text: list[str] = []
        size, seen, finished = 0, -STREAM_WATCH_SECONDS, False
        clock = asyncio.get_running_loop().time
        async for raw_line in resp.content:
            size += len(raw_line)
            if size > self.max_response_bytes:
                raise LLMError(f"LLM response is larger than {self.max_response_bytes} bytes")
            line = raw_line.strip()
            if not line.startswith(b"data:"):
                continue  # comments, blank lines between events
            data = line[5:].strip()
            if data == b"[DONE]":
                finished = True
                break
            try:
                choice = json.loads(data)["choices"][0]
                delta = choice.get("delta", {}).get("content") or ""
                finished = finished or choice.get("finish_reason") is not None
            except (ValueError, KeyError, IndexError, TypeError, AttributeError, RecursionError) as exc:
                raise LLMError(f"malformed LLM stream: {data[:200]!r}") from exc
            if not isinstance(delta, str):
                raise LLMError(f"malformed LLM stream: {data[:200]!r}")
            if delta:
                text.append(delta)
                if on_text is not None and clock() - seen >= STREAM_WATCH_SECONDS:
                    seen = clock()
                    on_text("".join(text))
        if not finished:
            raise LLMError("the LLM's stream ended before the reply did", retryable=True)
        return "".join(text)

    async def _read(self, resp: aiohttp.ClientResponse) -> bytes:
        """The body, at most ``max_response_bytes`` of it.

        An answer (200) that is bigger is an error; an error body that is bigger is
        cut, since only its start is ever shown.
        """
        limit = self.max_response_bytes
        too_big = LLMError(f"LLM response is larger than {limit} bytes")
        if resp.status == 200 and resp.content_length is not None and resp.content_length > limit:
            raise too_big  # said so up front: no need to read it
        body = bytearray()
        async for chunk in resp.content.iter_any():
            body += chunk
            if len(body) > limit:
                if resp.status == 200:
                    raise too_big
                return bytes(body[:limit])
        return bytes(body)

    @staticmethod
    def _content(raw: bytes, encoding: str) -> str:
        """The reply text of a completion body; LLMError for anything else."""
        try:
            text = raw.decode(encoding)
        except (UnicodeDecodeError, LookupError) as exc:  # bad bytes, or a charset Python lacks
            raise LLMError(f"LLM response is not valid {encoding.upper()} text: "
                           f"{raw[:100]!r}") from exc
        try:
            content = json.loads(text)["choices"][0]["message"]["content"]
        except (ValueError, KeyError, IndexError, TypeError, RecursionError) as exc:
            # RecursionError: json nests as deep as the server likes.
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
