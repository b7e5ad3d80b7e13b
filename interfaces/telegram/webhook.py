"""Telegram's webhook calls, received: a small aiohttp server that a TelegramInterface
incarnation owns.

Telegram POSTs each update as JSON to the public https URL given to setWebhook; a TLS
proxy in front forwards the call here (loopback by default), path unchanged. Every call
must carry the secret token given to setWebhook::

    >>> server = WebhookServer(("127.0.0.1", 8443), "https://bot.example.com/telegram",
    ...                        secret, receive=interface._receive,
    ...                        malformed=interface._malformed)     # doctest: +SKIP
    >>> await server.start()   # bound now: a port in use fails here   # doctest: +SKIP
    >>> await server.serve()   # until cancelled; then closed          # doctest: +SKIP

What a call gets:

- 401 without ``X-Telegram-Bot-Api-Secret-Token`` or with a wrong one; nothing is read
  and nothing happens.
- 413 for a body over ``TELEGRAM_WEBHOOK_MAX_BYTES``.
- 408 for a body that has not arrived whole within ``HTTP_IDLE_SECONDS`` (a caller
  dribbling it a byte at a time), and 503 at once, unread, while
  ``TELEGRAM_WEBHOOK_MAX_BODIES_READ`` bodies are being read. Nothing is journaled;
  Telegram, which sends a body at once over at most 40 connections, meets neither
  unless such callers hold every place, and then sends the update again later.
- 200 once ``receive`` returns, that is once the update is journaled: Telegram resends
  what it has no 200 for, so an update we have not stored is never forgotten. A body
  that cannot be an update (not UTF-8, not JSON, nested deeper than
  ``JSON_BODY_MAX_DEPTH``) is dead-lettered (``malformed``) and answered 200 too,
  or Telegram would resend the poison forever.
- 404 for any other path, 405 for any other method.
- 400 from aiohttp for a call that is not HTTP; such calls are one WARNING line at most
  every ``MALFORMED_LOG_SECONDS`` (``actors.serverlog``: aiohttp logs each as an ERROR with a traceback).
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from pydantic import SecretStr
from yarl import URL

from autoresponse.actors.jsonbody import BodyReads, MalformedJson, read_json_body
from autoresponse.actors.serverlog import ServerLog
from autoresponse.actors.limits import HTTP_CLOSE_SECONDS, HTTP_IDLE_SECONDS
from autoresponse.interfaces.telegram.settings import TELEGRAM_WEBHOOK_MAX_BODIES_READ, TELEGRAM_WEBHOOK_MAX_BYTES

log = logging.getLogger("autoresponse.telegram")

#: The header Telegram carries the webhook's secret token in.
SECRET_HEADER = "X-Telegram-Bot-Api-Secret-Token"
#: At close, calls under way get this long to finish (a journal write takes milliseconds);
#: then they are cut, unanswered, and Telegram sends them again.
CLOSE_SECONDS = HTTP_CLOSE_SECONDS
#: Refused calls are logged at most this often, so that a scanner cannot flood the log.
REFUSED_LOG_SECONDS = 60.0


class WebhookServer:
    """Serves ``url``'s path on ``listen``; runs on the runtime's event loop.

    ``receive`` journals one update as Telegram sent it (a parsed JSON value) and
    returns once it is stored or dead-lettered; ``malformed`` dead-letters a body that
    is no JSON value at all, with the reason.
    """

    def __init__(self, listen: tuple[str, int], url: str, secret: SecretStr, *,
                 receive: Callable[[Any], Awaitable[object]],
                 malformed: Callable[[Any, str], None],
                 monotonic: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time) -> None:
        self.host, self.port = listen
        #: The path Telegram posts to; the proxy forwards it as it is.
        self.path = URL(url).path or "/"
        self._secret = secret.get_secret_value().encode()
        self._receive = receive
        self._malformed = malformed
        self._monotonic = monotonic  # the runtime's clock: how often refusals are logged
        self._wall = wall
        #: When (the runtime clock's ``time()``) the last call with the right secret came.
        self.last_call: float | None = None
        self._bodies = BodyReads(TELEGRAM_WEBHOOK_MAX_BODIES_READ, HTTP_IDLE_SECONDS)
        self._runner: web.AppRunner | None = None
        self._closed: asyncio.Future[None] | None = None
        self._refused = 0  # calls refused since the last log line about them
        self._refused_logged = float("-inf")

    @property
    def url(self) -> str:
        """Where the proxy forwards to."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}{self.path}"

    async def start(self) -> None:
        """Listen; OSError (saying where) when the address cannot be bound."""
        app = web.Application(client_max_size=TELEGRAM_WEBHOOK_MAX_BYTES)
        # One route for everything, so that the path is compared as Telegram sent it (an
        # aiohttp route would read "{...}" in it as a pattern) and every refusal is ours.
        app.router.add_route("*", "/{tail:.*}", self._call)
        # Not cancelled when Telegram hangs up: a call waiting for room is still journaled
        # once there is room, and Telegram's retry of it is then recognised, not run twice.
        runner = web.AppRunner(app, access_log=None, handle_signals=False, keepalive_timeout=HTTP_IDLE_SECONDS,
                               shutdown_timeout=CLOSE_SECONDS, handler_cancellation=False,
                               logger=ServerLog("Telegram webhook call(s)", self._monotonic))
        await runner.setup()
        try:
            site = web.TCPSite(runner, self.host, self.port)
            await site.start()
        except OSError as exc:
            await runner.cleanup()
            raise OSError(exc.errno, f"cannot listen for Telegram webhooks on {self.url}: "
                                     f"{exc.strerror or exc}") from None
        self._runner = runner

    async def serve(self) -> None:
        """Wait until cancelled (the owning incarnation ends), then close."""
        try:
            await asyncio.Event().wait()
        finally:
            await self.close()

    async def close(self) -> None:
        """Stop listening, and give the calls under way CLOSE_SECONDS to finish. Idempotent:
        the owner's task and its teardown both call it, and both wait for the same close."""
        if self._closed is None:
            self._closed = asyncio.ensure_future(self._close())
        await asyncio.shield(self._closed)

    async def _close(self) -> None:
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    # ---------------------------------------------------------------- one call

    async def _call(self, request: web.Request) -> web.Response:
        if request.path != self.path:
            return web.Response(status=404, text="not found")
        if request.method != "POST":
            return web.Response(status=405, text="method not allowed", headers={"Allow": "POST"})
        if not self._authentic(request):
            self._log_refused(request)
            return web.Response(status=401, text="unauthorized")
        self.last_call = self._wall()  # Telegram reaches us: the webhook is alive
        if (request.content_length or 0) > TELEGRAM_WEBHOOK_MAX_BYTES:
            return self._too_large(request.content_length)
        if self._bodies.full:
            log.warning("refused a Telegram webhook call: %d calls are sending their bodies",
                        self._bodies.limit)
            return web.Response(status=503, text="busy: too many calls are sending their bodies")
        try:
            body = await self._bodies.read(request.read)
        except web.HTTPRequestEntityTooLarge:  # no Content-Length, and more than the limit
            return self._too_large(None)
        except TimeoutError:
            log.warning("refused a Telegram webhook call whose body did not arrive whole within %gs",
                        self._bodies.seconds)
            return web.Response(status=408, text="request timeout")
        except ConnectionResetError:  # the caller hung up mid-body: nobody to answer, nothing wrong here
            log.debug("a Telegram webhook caller hung up before its body was whole")
            return web.Response(status=400, text="the caller hung up")
        try:
            update = read_json_body(body)  # a real update nests about eight deep
        except MalformedJson as exc:
            self._malformed(exc.text, str(exc))
            return web.Response(status=200)
        # When the runtime is full this waits for room, as polling does, rather than answer
        # 429 or 503: Telegram gives an update up after some failed attempts, so a refusal
        # could lose it, while a waiting call costs one connection (Telegram opens at most
        # 40) and is journaled the moment there is room.
        await self._receive(update)
        return web.Response(status=200)

    def _authentic(self, request: web.Request) -> bool:
        """The call carries our secret token. Constant-time; aiohttp keeps header bytes that
        are not UTF-8 as surrogates, encoded back the same way, so such a header is a
        mismatch rather than a UnicodeEncodeError."""
        given = request.headers.get(SECRET_HEADER)
        return given is not None and hmac.compare_digest(given.encode("utf-8", "surrogateescape"),
                                                         self._secret)

    def _log_refused(self, request: web.Request) -> None:
        self._refused += 1
        now = self._monotonic()
        if now - self._refused_logged >= REFUSED_LOG_SECONDS:
            log.warning("refused %d Telegram webhook call(s) without the right secret token "
                        "(the last from %s)", self._refused, request.remote)
            self._refused, self._refused_logged = 0, now

    @staticmethod
    def _too_large(size: int | None) -> web.Response:
        log.warning("refused a Telegram webhook call of %s bytes (at most %d are read)",
                    size if size is not None else "more than that", TELEGRAM_WEBHOOK_MAX_BYTES)
        return web.Response(status=413, text="request entity too large")
