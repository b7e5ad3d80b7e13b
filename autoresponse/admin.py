"""The admin endpoint: status, metrics, dead letters and injection over loopback HTTP.

Routes (JSON unless said otherwise)::

    GET  /healthz                      liveness
    GET  /status                       the supervision tree (see status.Status)
    GET  /metrics                      Prometheus text
    GET  /deadletters?limit=N          counts by reason and the newest letters
    POST /deadletters/{id}/replay      send a dead letter again, as a new attempt
    POST /inject/{actor}?type=Name     a JSON message, validated against the actor's types;
         &correlation=ID               journaled before the 202: a retry with the same ID is
                                       acknowledged again, not run twice

It binds to 127.0.0.1 by default. Binding anywhere else requires a token, and
when a token is set every request must carry ``Authorization: Bearer <token>``.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import json
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from pydantic import BaseModel, ValidationError

from autoresponse.actors import Cell, Runtime
from autoresponse.actors.routes import SENDER_PREFIX
from autoresponse.messages import Crash
from autoresponse.config import AdminSettings
from autoresponse.supervisors.status import snapshot

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


#: Messages every actor handles; injected only when asked for by name (``?type=Crash``),
#: never guessed from a body that happens to fit.
CONTROL_MESSAGES = (Crash,)


def message_types(cell: Cell, *, control: bool = True) -> list[type[BaseModel]]:
    """The pydantic message classes an actor handles: its own first, then control ones."""
    handled = [t for t in cell.actor_class._handlers if isinstance(t, type) and issubclass(t, BaseModel)]
    own = [t for t in handled if t not in CONTROL_MESSAGES]
    return own + [t for t in handled if t in CONTROL_MESSAGES] if control else own


class RuntimeCollector:
    """Prometheus metrics read from the runtime at scrape time."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime

    def collect(self) -> Any:
        processed = CounterMetricFamily("autoresponse_messages_processed", "Messages handled, per actor",
                                        labels=["actor"])
        restarts = CounterMetricFamily("autoresponse_restarts", "Actor restarts", labels=["actor"])
        mailbox = GaugeMetricFamily("autoresponse_mailbox_depth", "Letters waiting, per actor",
                                    labels=["actor"])
        deliveries = CounterMetricFamily("autoresponse_deliveries",
                                         "Messages delivered by outbound senders", labels=["interface"])
        for cell in self.runtime.cells:
            processed.add_metric([cell.name], cell.processed)
            restarts.add_metric([cell.name], cell.restarts)
            mailbox.add_metric([cell.name], len(cell.mailbox))
            if cell.name.startswith(SENDER_PREFIX):
                deliveries.add_metric([cell.name.removeprefix(SENDER_PREFIX)], cell.processed)
        dead = CounterMetricFamily("autoresponse_dead_letters", "Dead letters, by reason",
                                   labels=["reason"])
        for reason, count in self.runtime.dead_letters.counts().items():
            dead.add_metric([reason], count)
        in_flight = GaugeMetricFamily("autoresponse_in_flight", "Messages in flight")
        in_flight.add_metric([], self.runtime.inflight.count())
        return [processed, restarts, mailbox, deliveries, dead, in_flight]


def _error(status: int, message: str, **extra: Any) -> web.Response:
    return web.json_response({"error": message, **extra}, status=status)


class AdminServer:
    """Runs on the runtime's event loop; closed with it."""

    def __init__(self, runtime: Runtime, settings: AdminSettings) -> None:
        if not is_loopback(settings.host) and settings.token is None:
            raise ValueError(
                f"the admin endpoint may bind to {settings.host!r} only with a token: "
                "set AUTORESPONSE_ADMIN__TOKEN, or bind to 127.0.0.1"
            )
        self.runtime = runtime
        self.settings = settings
        self.port = settings.port
        self._token = settings.token.get_secret_value().encode() if settings.token else None
        self._runner: web.AppRunner | None = None
        self._registry = CollectorRegistry(auto_describe=True)
        self._registry.register(RuntimeCollector(runtime))  # type: ignore[arg-type]

    @property
    def url(self) -> str:
        return self.settings.model_copy(update={"port": self.port}).url

    def start(self) -> str:
        self.runtime.io.run(self._start(), timeout=10)
        self.runtime.io.add_closer(self._stop)
        return self.url

    async def _start(self) -> None:
        app = web.Application(middlewares=[self._authorize])
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/status", self._status)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/deadletters", self._deadletters)
        app.router.add_post("/deadletters/{id}/replay", self._replay)
        app.router.add_post("/inject/{actor}", self._inject)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.settings.host, self.settings.port)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    async def _stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    @web.middleware
    async def _authorize(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if self._token is not None:
            given = request.headers.get("Authorization", "").removeprefix("Bearer ").encode()
            if not hmac.compare_digest(given, self._token):
                return _error(401, "unauthorized: send Authorization: Bearer <AUTORESPONSE_ADMIN__TOKEN>")
        return await handler(request)

    async def _healthz(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def _status(self, request: web.Request) -> web.Response:
        return web.json_response(snapshot(self.runtime).model_dump(mode="json"))

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(self._registry),
                            headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def _deadletters(self, request: web.Request) -> web.Response:
        try:
            limit = int(request.query.get("limit", "100"))
        except ValueError:
            return _error(400, "limit must be a whole number")
        letters = self.runtime.dead_letters.letters()[-limit:] if limit > 0 else []
        return web.json_response({"counts": self.runtime.dead_letters.counts(),
                                  "letters": [d.summary() for d in letters]})

    async def _replay(self, request: web.Request) -> web.Response:
        try:
            letter_id = int(request.match_info["id"])
            envelope = self.runtime.replay(letter_id)
        except (ValueError, KeyError):
            return _error(404, f"no replayable dead letter #{request.match_info['id']}")
        if envelope is None:
            return _error(409, "the replay was refused; see the new dead letter")
        return web.json_response({"message_id": envelope.message_id,
                                  "correlation_id": envelope.correlation_id,
                                  "attempt": envelope.attempt}, status=202)

    async def _inject(self, request: web.Request) -> web.Response:
        name = request.match_info["actor"]
        if not self.runtime.has(name):
            return _error(404, f"no actor named {name!r}", actors=[c.name for c in self.runtime.cells])
        try:
            data = await request.json()
        except json.JSONDecodeError as exc:
            return _error(400, f"the body is not JSON: {exc}")
        wanted = request.query.get("type")
        types = message_types(self.runtime.cell(name), control=wanted is not None)
        if wanted is not None:
            types = [t for t in types if t.__name__ == wanted]
            if not types:
                return _error(400, f"{name} does not handle {wanted!r}",
                              accepts=[t.__name__ for t in message_types(self.runtime.cell(name))])
        problems = {}
        for message_type in types:
            try:
                message = message_type.model_validate(data)
            except ValidationError as exc:
                problems[message_type.__name__] = [
                    f"{'.'.join(map(str, e['loc'])) or 'body'}: {e['msg']}" for e in exc.errors()]
                continue
            # Journaled before the 202; a client retrying with the same ?correlation= is
            # acknowledged again without the work being started twice.
            envelope = await asyncio.wrap_future(
                self.runtime.accept(name, message, correlation_id=request.query.get("correlation")))
            return web.json_response({"type": message_type.__name__, "message_id": envelope.message_id,
                                      "correlation_id": envelope.correlation_id}, status=202)
        return _error(422, f"the body fits none of the messages {name} handles", problems=problems)
