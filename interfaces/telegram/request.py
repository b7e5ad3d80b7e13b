"""python-telegram-bot's HTTP transport on aiohttp, instead of httpx.

PTB's default ``HTTPXRequest`` costs about 3.5 ms of CPU per request here: its
connection pool scans every connection on each request, and httpcore looks for
``sniffio`` on every lock it makes. This ``BaseRequest`` sends the same requests
on one long-lived aiohttp session per bot, on the runtime's event loop, and maps
aiohttp's failures to PTB's own errors, so every Telegram rule (RetryAfter,
BadRequest, Forbidden, ...) works as before::

    >>> from telegram import Bot
    >>> token = "123456:ABC-DEF"
    >>> bot = Bot(token, request=AiohttpRequest(), get_updates_request=AiohttpRequest(connections=1))
"""

from __future__ import annotations

import asyncio
import functools
from typing import Any

import aiohttp
from telegram._utils.defaultvalue import DefaultValue
from telegram.error import NetworkError, TimedOut
from telegram.request import BaseRequest, RequestData

from autoresponse.actors.jsonbody import dump_json
from autoresponse.interfaces.telegram.settings import TELEGRAM_MAX_CONCURRENT_SENDS

#: Seconds to connect, and to wait for a response or to send a request, unless PTB says.
CONNECT_TIMEOUT_SECONDS = 5.0
READ_TIMEOUT_SECONDS = 5.0
WRITE_TIMEOUT_SECONDS = 5.0


def _given(value: Any, default: float | None) -> float | None:
    return default if isinstance(value, DefaultValue) else value


class AiohttpRequest(BaseRequest):
    """One aiohttp session, made in ``initialize`` (on the loop that will use it)."""

    def __init__(self, *, connections: int = TELEGRAM_MAX_CONCURRENT_SENDS,
                 read_timeout: float | None = READ_TIMEOUT_SECONDS) -> None:
        self._connections = connections
        self._read_timeout = read_timeout
        self._session: aiohttp.ClientSession | None = None

    @property
    def read_timeout(self) -> float | None:
        return self._read_timeout

    async def initialize(self) -> None:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(limit=self._connections, enable_cleanup_closed=True)
            self._session = aiohttp.ClientSession(connector=connector,
                                                  headers={"User-Agent": self.USER_AGENT})

    async def shutdown(self) -> None:
        if self._session is not None and not self._session.closed:
            await self._session.close()
        self._session = None

    async def do_request(self, url: str, method: str, request_data: RequestData | None = None,
                         read_timeout: Any = BaseRequest.DEFAULT_NONE,
                         write_timeout: Any = BaseRequest.DEFAULT_NONE,
                         connect_timeout: Any = BaseRequest.DEFAULT_NONE,
                         pool_timeout: Any = BaseRequest.DEFAULT_NONE) -> tuple[int, bytes]:
        if self._session is None or self._session.closed:
            raise RuntimeError("this AiohttpRequest is not initialized")
        read = _given(read_timeout, self._read_timeout)
        connect = _given(connect_timeout, CONNECT_TIMEOUT_SECONDS)
        pool = _given(pool_timeout, None)
        write = _given(write_timeout, WRITE_TIMEOUT_SECONDS)
        timeout = _timeout(read, connect, pool, write)
        try:
            async with self._session.request(method, url, data=_body(request_data), timeout=timeout) as response:
                return response.status, await response.read()
        except asyncio.TimeoutError as exc:
            raise TimedOut from exc
        except aiohttp.ClientError as exc:
            raise NetworkError(f"aiohttp.{type(exc).__name__}: {exc}") from exc


@functools.lru_cache(maxsize=32)
def _timeout(read: float | None, connect: float | None, pool: float | None,
             write: float | None) -> aiohttp.ClientTimeout:
    """aiohttp's timeouts for PTB's four: the same few on every request, so built once each."""
    # aiohttp has no separate write timeout: sending a small request is part of reading
    # its response; the whole request is still bounded by connect + write + read.
    total = None if read is None or write is None else (connect or 0) + write + read
    return aiohttp.ClientTimeout(total=total, connect=pool, sock_connect=connect, sock_read=read)


def _body(request_data: RequestData | None) -> Any:
    """The request's parameters as a JSON body (the Bot API takes one, and it costs far
    less to build than a URL-encoded form); with files, a multipart form."""
    if request_data is None:
        return None
    if not request_data.contains_files:
        return aiohttp.payload.BytesPayload(dump_json(request_data.parameters),
                                            content_type="application/json")
    form = aiohttp.FormData()
    for name, value in request_data.json_parameters.items():
        form.add_field(name, value)
    for name, part in request_data.multipart_data.items():
        filename, content, *mime = part
        form.add_field(name, content, filename=filename, content_type=mime[0] if mime else None)
    return form
