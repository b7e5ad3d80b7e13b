"""The admin endpoint: status, metrics, dead letters and injection over loopback HTTP.

Routes (JSON unless said otherwise)::

    GET  /                             the status page, HTML (see page.py)
    GET  /events                       its live updates, Server-Sent Events
    GET  /healthz                      health: 200, or 503 with a one-line reason (an actor
                                       down, a platform refusing us)
    GET  /readyz                       started: 200 once the tree is up and the intake open,
                                       healthy or not (it says which)
    GET  /status                       the supervision tree (see status.Status)
    GET  /metrics                      Prometheus text
    GET  /deadletters?limit=N          counts by reason and the newest letters
    GET  /trace/{correlation}          every hop of one request, in causal order
    GET  /requests                     the requests in flight, and the newest traced
    POST /deadletters/{id}/replay      send a dead letter again, as a new attempt
    POST /inject/{actor}?type=Name     a JSON message, validated against the actor's own types
         &correlation=ID               (and ``Crash`` by name, to any actor with a supervisor:
                                       never the root's; never the supervision protocol), a key
                                       no field has refused; journaled before the 202: a retry
                                       with the same ID is acknowledged again, not run twice

It binds to 127.0.0.1 by default. Binding anywhere else requires a token, and
when a token is set every request must carry ``Authorization: Bearer <token>``,
or the page's cookie: a browser cannot send the header, so GET /?token=<token>
sets an HttpOnly, SameSite=Strict cookie and redirects to / (the token leaves the
address bar). Without a token, the Host must be this machine (a page on another
site that points its own name at 127.0.0.1 reads nothing). Either way a POST a
browser sends from another site (its Origin or Sec-Fetch-Site says so) is refused.

Whatever a client sends gets a 4xx with a JSON reason, never a 500: a body that
is not UTF-8, not JSON, or nested deeper than ``MAX_BODY_DEPTH``; a header or
query that is not UTF-8; a body that has not arrived whole within ``HTTP_IDLE_SECONDS``
(408). While ``ADMIN_MAX_BODIES_READ`` bodies are being read, another request with one
gets 503 at once. A request that is not HTTP at all gets aiohttp's 400, and such requests
are one WARNING at most every ``MALFORMED_LOG_SECONDS`` (``actors.serverlog``).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import ipaddress
import logging
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import urlsplit

from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from pydantic import BaseModel, ValidationError

from autoresponse.actors.journal import JournalFailing
from autoresponse.actors.kernel import Cell, IntakeFull, NotReplayable, Runtime, Unstorable
from autoresponse.actors.llm.usage import UsageMeter
from autoresponse.actors.jsonbody import BodyReads, read_json_body
from autoresponse.actors.serverlog import ServerLog
from autoresponse.actors.limits import (
    ADMIN_MAX_BODIES_READ,
    HTTP_CLOSE_SECONDS,
    HTTP_IDLE_SECONDS,
    INTAKE_RETRY_AFTER_SECONDS,
    JSON_BODY_MAX_DEPTH,
)
from autoresponse.actors.routes import SENDER_PREFIX, interface

#: Inbound interfaces are named ``interface.<platform>``.
INTERFACE_PREFIX = interface("")
from autoresponse.config import AdminSettings
from autoresponse.messages import Crash, Exit
from autoresponse.page import StatusPage
from autoresponse.supervisors.status import snapshot
from autoresponse.supervisors.supervisor import RestartDue, StartChild

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

log = logging.getLogger("autoresponse.admin")

#: Deepest nesting of lists and objects an injected body may have (messages are shallow).
MAX_BODY_DEPTH = JSON_BODY_MAX_DEPTH


def unsafe_bind(settings: AdminSettings) -> str | None:
    """Why the endpoint must not listen as configured (outside loopback without a
    token), or None. The CLI asks before anything starts; AdminServer refuses too."""
    if is_loopback(settings.host) or settings.token is not None:
        return None
    return (f"the admin endpoint may bind to {settings.host!r} only with a token: "
            "set AUTORESPONSE_ADMIN__TOKEN, or bind to 127.0.0.1")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


#: Messages every actor handles; injected only when asked for by name (``?type=Crash``),
#: never guessed from a body that happens to fit, and only to an actor with a supervisor to
#: restart it: the root has none, and its crash would stop the daemon.
CONTROL_MESSAGES = (Crash,)
#: The supervision protocol, which only the kernel and supervisors send: never injected. A
#: forged Exit leaves a running actor counted as down, and a StartChild that fails (any
#: JSON object is one) stops its supervisor: at the root, the whole daemon.
SUPERVISION_MESSAGES = (Exit, RestartDue, StartChild)


def message_types(cell: Cell, *, control: bool = True) -> list[type[BaseModel]]:
    """The pydantic message classes an actor takes by inject: its own first, then control
    ones (for an actor with a supervisor to restart it: never the root's); never the
    supervision protocol."""
    handled = [t for t in cell.actor_class._handlers if isinstance(t, type) and issubclass(t, BaseModel)
               and t not in SUPERVISION_MESSAGES]
    own = [t for t in handled if t not in CONTROL_MESSAGES]
    return own + [t for t in handled if t in CONTROL_MESSAGES] if control and cell.supervisor is not None else own


def unknown_keys(message_type: type[BaseModel], data: Any) -> list[str]:
    """The keys of a body that ``message_type`` has no field for. Most messages ignore such
    keys, so that any body would fit one whose fields all have defaults; checked here, not
    with ``extra="forbid"`` on the validation, which would refuse them in nested models
    that take them (a context's platform fields)."""
    if not isinstance(data, dict) or message_type.model_config.get("extra") == "allow":
        return []
    fields = message_type.model_fields
    known = set(fields) | {f.alias for f in fields.values() if f.alias}
    return [key for key in data if key not in known]


class RuntimeCollector:
    """Prometheus metrics read from the runtime at scrape time."""

    def __init__(self, runtime: Runtime, usage: UsageMeter | None = None) -> None:
        self.runtime = runtime
        self.usage = usage

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
        return [processed, restarts, mailbox, deliveries, dead, in_flight, *self._health(), *self._llm(),
                *self._cluster()]

    def _health(self) -> list[GaugeMetricFamily]:
        """Each inbound interface (and any actor that watches something outside): 1 while it
        runs and nothing fails it, 0 otherwise; while it fails, since when and why."""
        healthy = GaugeMetricFamily("autoresponse_interface_healthy",
                                    "1 while the interface runs and its platform accepts it, else 0",
                                    labels=["interface"])
        since = GaugeMetricFamily("autoresponse_interface_failing_since_seconds",
                                  "When the interface began failing (Unix time), and why",
                                  labels=["interface", "reason"])
        for cell in self.runtime.cells:
            if not (cell.name.startswith(INTERFACE_PREFIX) or cell.reports_health):
                continue
            label = cell.name.removeprefix(INTERFACE_PREFIX)
            failing = cell.failing
            healthy.add_metric([label], 1 if failing is None and cell.state == "running" and cell.alive else 0)
            if failing is not None:
                since.add_metric([label, failing.reason[:200]], failing.since)
        return [healthy, since]

    def _llm(self) -> list[Any]:
        """Tokens by turn kind and model, replies by engine, and each engine's circuit."""
        usage = self.usage
        if usage is None:
            return []
        tokens = CounterMetricFamily("autoresponse_llm_tokens", "LLM tokens used, by turn kind and model",
                                     labels=["kind", "model", "direction"])
        for (kind, model, direction), count in sorted(usage.tokens.items()):
            tokens.add_metric([kind, model, direction], count)
        replies = CounterMetricFamily("autoresponse_llm_replies", "LLM replies, by the engine that answered",
                                      labels=["engine"])
        for engine, count in sorted(usage.replies.items()):
            replies.add_metric([engine], count)
        return [tokens, replies]

    def _cluster(self) -> list[GaugeMetricFamily]:
        """Several daemons on NATS: the work consumer's lag (items not yet taken by any
        worker) and the items taken and not finished."""
        journal = self.runtime.journal
        if not getattr(journal, "distributed", False):
            return []
        try:
            cluster = journal.status(timeout=2.0)  # type: ignore[union-attr]
        except Exception:  # the server is away: /status says so; no stale figures here
            return []
        lag = GaugeMetricFamily("autoresponse_cluster_consumer_lag", "Work items waiting for a worker")
        lag.add_metric([], cluster["pending"])
        taken = GaugeMetricFamily("autoresponse_cluster_in_progress", "Work items taken, not finished")
        taken.add_metric([], cluster["in_progress"])
        return [lag, taken]


def _busy(message: str, retry_after: float = INTAKE_RETRY_AFTER_SECONDS) -> web.Response:
    response = _error(503, message)
    response.headers["Retry-After"] = str(max(1, round(retry_after)))
    return response


def _error(status: int, message: str, **extra: Any) -> web.Response:
    return web.json_response({"error": message, **extra}, status=status)


def _unsupervised_crash(runtime: Runtime, name: str, wanted: str) -> web.Response:
    """The 400 for a control message (``wanted``) to an actor no supervisor restarts: the
    root, whose crash would stop the daemon. It names the actors a drill can crash instead."""
    targets = [cell.name for cell in runtime.cells if cell.supervisor is not None]
    return _error(400, f"{name} has no supervisor to restart it (it is the root of the tree): a {wanted} "
                       "there would stop the daemon; a drill can crash any other actor (listed in targets)",
                  targets=targets)


def _same(given: str, expected: bytes) -> bool:
    """Constant-time. aiohttp keeps header bytes that are not UTF-8 as surrogates; they are
    encoded back the same way, so that such a header is a mismatch, not a UnicodeEncodeError."""
    return hmac.compare_digest(given.encode("utf-8", "surrogateescape"), expected)


def cross_site(request: web.Request) -> bool:
    """A browser sent it from another origin: Sec-Fetch-Site says so, or Origin differs
    from the Host. Clients that send neither (the CLI, curl) are not browsers."""
    site = request.headers.get("Sec-Fetch-Site")
    if site is not None and site not in ("same-origin", "none"):
        return True
    origin = request.headers.get("Origin")
    if origin is None:
        return False
    try:
        return urlsplit(origin).netloc != request.headers.get("Host")
    except ValueError:  # an Origin that does not parse ("http://[::1") is nobody's: not this one
        return True


class AdminServer:
    """Runs on the runtime's event loop; closed with it."""

    def __init__(self, runtime: Runtime, settings: AdminSettings, usage: UsageMeter | None = None) -> None:
        problem = unsafe_bind(settings)
        if problem is not None:
            raise ValueError(problem)
        self.runtime = runtime
        self.settings = settings
        self.port = settings.port
        self._token = settings.token.get_secret_value().encode() if settings.token else None
        # The page's cookie holds a value derived from the token, not the token: it is always
        # cookie-safe, and changes with the token. Its name has the port in it, since browsers
        # share cookies between the ports of a host.
        self._cookie = b""
        if self._token is not None:
            self._cookie = hmac.new(self._token, b"status page", hashlib.sha256).hexdigest().encode()
        self.page = StatusPage(runtime)
        #: False once the application stops: injects get 503 while the drain runs.
        self.accepting = True
        self._bodies = BodyReads(ADMIN_MAX_BODIES_READ, HTTP_IDLE_SECONDS)
        self._runner: web.AppRunner | None = None
        self._registry = CollectorRegistry(auto_describe=True)
        self._registry.register(RuntimeCollector(runtime, usage))  # type: ignore[arg-type]

    @property
    def url(self) -> str:
        return self.settings.model_copy(update={"port": self.port}).url

    @property
    def cookie_name(self) -> str:
        return f"autoresponse-admin-{self.port}"

    def start(self) -> str:
        self.runtime.io.run(self._start(), timeout=10)
        self.runtime.io.add_closer(self._stop)
        return self.url

    async def _start(self) -> None:
        app = web.Application(middlewares=[self._authorize])
        app.router.add_get("/", self.page.page)
        app.router.add_get("/events", self.page.events)
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        app.router.add_get("/status", self._status)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/deadletters", self._deadletters)
        app.router.add_post("/deadletters/{id}/replay", self._replay)
        app.router.add_post("/inject/{actor}", self._inject)
        app.router.add_get("/trace/{correlation}", self._trace)
        app.router.add_get("/requests", self._requests)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False,
                                     keepalive_timeout=HTTP_IDLE_SECONDS, shutdown_timeout=HTTP_CLOSE_SECONDS,
                                     logger=ServerLog("request(s)", self.runtime.clock.monotonic))
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.settings.host, self.settings.port)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    async def _stop(self) -> None:
        if self._runner is not None:
            self.page.close()  # open event streams end now, or cleanup would wait for them
            await self._runner.cleanup()
            self._runner = None

    @web.middleware
    async def _authorize(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if self._token is None:
            if not self._local_host(request):
                return _error(403, "without a token, the Host must be this machine (127.0.0.1 or localhost)")
        elif not self._authorized(request):
            return _error(401, "unauthorized: send Authorization: Bearer <AUTORESPONSE_ADMIN__TOKEN>, "
                               "or open /?token=<AUTORESPONSE_ADMIN__TOKEN> in a browser")
        if request.method == "POST" and cross_site(request):
            return _error(403, "refused: a cross-site request")
        if request.path == "/" and "token" in request.query:
            return self._sign_in()
        try:
            return await handler(request)
        except web.HTTPRequestEntityTooLarge as exc:  # aiohttp's own is plain text
            return _error(413, exc.text or "the body is too large")
        except ConnectionResetError:  # the client hung up (mid-body): nobody to answer, nothing wrong here
            log.debug("%s %s: the client hung up", request.method, request.path)
            return _error(400, "the client hung up")

    def _authorized(self, request: web.Request) -> bool:
        """The bearer header, the page's cookie, or (to get that cookie) GET /?token=."""
        assert self._token is not None
        return (_same(request.headers.get("Authorization", "").removeprefix("Bearer "), self._token)
                or _same(request.cookies.get(self.cookie_name, ""), self._cookie)
                or (request.path == "/" and _same(request.query.get("token", ""), self._token)))

    def _local_host(self, request: web.Request) -> bool:
        """The Host names this machine. Without it, DNS rebinding would let a page on another
        site, whose name it points at 127.0.0.1, read and post as if it were this one."""
        host = request.headers.get("Host")
        if host is None:  # HTTP/1.0 without a Host: not a browser
            return True
        try:
            name = urlsplit(f"//{host}").hostname
        except ValueError:
            return False
        return name is not None and (is_loopback(name) or name == self.settings.host)

    def _sign_in(self) -> web.Response:
        """GET /?token=... (checked already): the cookie, and a redirect to / so the token
        leaves the address bar and the history."""
        response = web.Response(status=303, headers={"Location": "/", "Cache-Control": "no-store",
                                                     "Referrer-Policy": "no-referrer"})
        if self._token is not None:
            response.set_cookie(self.cookie_name, self._cookie.decode(), httponly=True, samesite="Strict",
                                path="/")
        return response

    async def _healthz(self, request: web.Request) -> web.Response:
        """200 while every actor runs and none fails; 503 while some are down (a crashed
        actor restarting, an inbound loop that died), naming them; 503 with a one-line
        ``reason`` while an actor reports failing (a platform refusing its token, a lease it
        cannot renew); 503 while the daemon stops."""
        status = snapshot(self.runtime, details=False)  # never waits for a NATS server that is away
        if self.runtime.stopping or not self.accepting:
            return web.json_response({"status": "stopping"}, status=503)
        if status.failing:
            failing = {name: f.model_dump() for name, f in status.failing.items()}
            return web.json_response({"status": "failing", "reason": status.problem(), "failing": failing,
                                      **({"down": status.down} if status.down else {})}, status=503)
        if not status.healthy:
            return web.json_response({"status": "degraded", "down": status.down}, status=503)
        return web.json_response({"status": "ok"})

    async def _readyz(self, request: web.Request) -> web.Response:
        """Started, apart from healthy: 200 once the tree is up and the intake open (a
        failing platform does not make the daemon unready: it answers what reaches it), with
        ``healthy`` and, when not, the ``reason``; 503 while it starts or stops."""
        if self.runtime.stopping or not self.accepting:
            return web.json_response({"status": "stopping", "ready": False}, status=503)
        if self.runtime.intake.paused:
            return web.json_response({"status": "starting", "ready": False}, status=503)
        status = snapshot(self.runtime, details=False)
        body: dict[str, Any] = {"status": "started", "ready": True, "healthy": status.healthy}
        if not status.healthy:
            body["reason"] = status.problem()
        return web.json_response(body)

    # The readers below may wait (for a NATS server that is away, up to its timeout; for
    # the journal's disk): in a worker thread, so the event loop, which carries every
    # delivery's I/O and /healthz, never waits with them.

    async def _status(self, request: web.Request) -> web.Response:
        status = await asyncio.to_thread(snapshot, self.runtime)
        return web.json_response(status.model_dump(mode="json"))

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=await asyncio.to_thread(generate_latest, self._registry),
                            headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def _deadletters(self, request: web.Request) -> web.Response:
        try:
            limit = int(request.query.get("limit", "100"))
        except ValueError:
            return _error(400, "limit must be a whole number")
        letters = (await asyncio.to_thread(self.runtime.dead_letters.letters))[-limit:] if limit > 0 else []
        return web.json_response({"counts": self.runtime.dead_letters.counts(),
                                  "letters": [d.summary() for d in letters]})

    async def _trace(self, request: web.Request) -> web.Response:
        correlation = request.match_info["correlation"]
        hops = await asyncio.to_thread(self.runtime.trace, correlation)
        if not hops:
            if self.runtime.tracer is None:
                return _error(404, f"no trace of {correlation!r}: "
                                   "this daemon records none (runtime.trace = false)")
            return _error(404, f"no trace of {correlation!r}: unknown, or older than what is kept")
        return web.json_response({"correlation_id": correlation, "hops": hops})

    async def _requests(self, request: web.Request) -> web.Response:
        """The requests in flight now, and the newest ones traced."""
        tracer = self.runtime.tracer
        recent = tracer.correlations()[-50:] if tracer is not None else []
        return web.json_response({"in_flight": self.runtime.inflight.correlations()[:200],
                                  "recent": list(reversed(recent)), "traced": tracer is not None})

    async def _replay(self, request: web.Request) -> web.Response:
        try:
            letter_id = int(request.match_info["id"])
            envelope = self.runtime.replay(letter_id)
        except NotReplayable as exc:  # none, or one nothing can run: it says which
            return _error(404, str(exc))
        except (ValueError, KeyError, OverflowError):  # OverflowError: an id past SQLite's integers
            return _error(404, f"no replayable dead letter #{request.match_info['id']}")
        if envelope is None:
            return _error(409, "the replay was refused; see the new dead letter")
        return web.json_response({"message_id": envelope.message_id,
                                  "correlation_id": envelope.correlation_id,
                                  "attempt": envelope.attempt}, status=202)

    async def _read_json(self, request: web.Request) -> Any:
        """The request body as JSON. TimeoutError when it has not arrived whole within
        HTTP_IDLE_SECONDS (a client dribbling it a byte at a time is never idle); ValueError
        (``MalformedJson``) with a one-line reason when it is not UTF-8, not JSON, or nested
        deeper than MAX_BODY_DEPTH."""
        return read_json_body(await self._bodies.read(request.read), MAX_BODY_DEPTH)

    async def _inject(self, request: web.Request) -> web.Response:
        name = request.match_info["actor"]
        if not self.runtime.has(name):
            return _error(404, f"no actor named {name!r}", actors=[c.name for c in self.runtime.cells])
        correlation = request.query.get("correlation")
        if correlation is not None and "\ufffd" in correlation:  # what undecodable bytes (%ff) read as
            return _error(400, "the correlation is not UTF-8: two such would read as the same one")
        if correlation is not None and not correlation.isprintable():  # a newline would forge log lines
            return _error(400, "the correlation must be printable: no newline or other control character")
        if self._bodies.full:
            return _busy(f"busy: {self._bodies.limit} requests are sending their bodies; try again")
        try:
            data = await self._read_json(request)
        except TimeoutError:
            return _error(408, f"the body did not arrive whole within {self._bodies.seconds:g}s")
        except ValueError as exc:
            return _error(400, str(exc))
        wanted = request.query.get("type")
        cell = self.runtime.cell(name)
        accepts = [t.__name__ for t in message_types(cell)]
        types = message_types(cell, control=wanted is not None)
        if wanted is not None:
            types = [t for t in types if t.__name__ == wanted]
            if cell.supervisor is None and any(t.__name__ == wanted for t in CONTROL_MESSAGES):
                return _unsupervised_crash(self.runtime, name, wanted)
            if not types:
                return _error(400, f"{name} does not take {wanted!r} by inject; it takes "
                                   f"{', '.join(accepts) or 'none'}", accepts=accepts)
        elif not accepts:  # the root: nothing supervises it, and it takes no work
            return _error(400, f"{name} takes no message by inject (a Crash drill can target any other "
                               "actor)", accepts=accepts)
        elif not types:  # a supervisor: it takes only control messages, each asked for by name
            return _error(400, f"{name} takes no message by inject without ?type=; it takes "
                               f"{', '.join(f'?type={a}' for a in accepts)}", accepts=accepts)
        problems = {}
        for message_type in types:
            wrong = [f"{key}: Extra inputs are not permitted" for key in unknown_keys(message_type, data)]
            try:
                message = message_type.model_validate(data)
            except ValidationError as exc:
                wrong = [f"{'.'.join(map(str, e['loc'])) or 'body'}: {e['msg']}" for e in exc.errors()] + wrong
            if wrong:
                problems[message_type.__name__] = wrong
                continue
            if not self.accepting:
                return _busy("stopping: the daemon takes no new work while it stops")
            # Journaled before the 202; a client retrying with the same ?correlation= is
            # acknowledged again without the work being started twice.
            try:
                envelope = await asyncio.wrap_future(
                    self.runtime.accept(name, message, correlation_id=correlation))
            except (IntakeFull, JournalFailing) as exc:  # the client waits and retries, nothing is dropped
                return _busy(str(exc), exc.retry_after)
            except Unstorable as exc:
                return _error(400, str(exc))
            return web.json_response({"type": message_type.__name__, "message_id": envelope.message_id,
                                      "correlation_id": envelope.correlation_id}, status=202)
        return _error(422, f"the body fits none of the messages {name} handles", problems=problems,
                      accepts=accepts)
