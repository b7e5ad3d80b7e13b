"""OpenTelemetry: every hop of a request is a span, every LLM call a GenAI span, sent over OTLP.

Off unless asked for, and then free: without ``pip install autoresponse[otel]``, or with
no exporter configured, no ``opentelemetry`` module is imported and a hop costs one
attribute check (``TraceRecorder.spans`` is None). On when ``AUTORESPONSE_OTEL__ENABLED``
is true, or (unset) when ``OTEL_EXPORTER_OTLP_ENDPOINT`` or
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` is set; ``OTEL_SDK_DISABLED=true`` and
``OTEL_TRACES_EXPORTER=none`` turn it off. The exporter is the SDK's OTLP/HTTP one, so
the standard variables (``OTEL_EXPORTER_OTLP_*``, ``OTEL_SERVICE_NAME``,
``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_BSP_*``, ``OTEL_TRACES_SAMPLER``) apply as usual::

    >>> telemetry = setup(app.runtime, settings.otel)   # app.py does it  # doctest: +SKIP

How the spans are made, with no context to carry between actors:

* The trace id of a request is a hash of its correlation id (``trace_id_of``), so every
  daemon, and a resumed run, puts a request's spans in the same trace; each span keeps the
  correlation id as ``autoresponse.correlation_id``, and its message's id.
* A span is one hop: a message at an actor, from when it was queued to when its handling
  ended (a ``started`` event marks the end of the wait), with its outcome as the status.
  The first hop of a message has the span id ``span_id_of(message id)``; its parent is the
  first hop of the message that caused it (its ``causation_id``). A retry and the results of
  its I/O are later hops of the same message, children of its first.
* Across daemons the W3C ``traceparent`` travels in the ``Envelope`` and in the NATS work
  item's headers: the daemon that accepts an item records a ``publish`` span, and the hop
  that runs it on another daemon is its child.
* The LLM call is a client span (``chat <model>``) under the hop that made it, with the
  GenAI semantic conventions: ``gen_ai.operation.name``, ``gen_ai.system``,
  ``gen_ai.request.model``, ``gen_ai.response.model``, ``gen_ai.usage.input_tokens`` and
  ``gen_ai.usage.output_tokens``.

The spans are built from the same events as the trace ring (``actors/kernel/trace.py``),
which keeps serving ``autoresponse trace`` and the status page, OpenTelemetry or not.

What leaves through them is the daemon's to guard: every status, event text and string
attribute goes through its ``Redactor`` (an LLM server's error may quote the API key), and
the endpoint's password and the OTLP headers' values are secrets it knows (``secrets``).
A collector that is down or hangs costs a stop at most ``FLUSH_AT_STOP_SECONDS``, and the
log one line as the outage starts and one as it ends (``_OutageLog``).
"""

from __future__ import annotations

import hashlib
import logging
import os
import random
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Coroutine, Mapping
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import unquote, urlsplit

from autoresponse.actors.limits import TRACES_KEPT
from autoresponse.messages.envelope import Envelope

if TYPE_CHECKING:
    from autoresponse.actors.kernel import Runtime
    from autoresponse.config import OtelSettings

log = logging.getLogger("autoresponse.otel")

T = TypeVar("T")

#: Longest text kept in a span's attributes and events (an error, a trace note).
MAX_TEXT = 1000

#: The longest a stop waits for the spans still buffered to reach the collector: one that
#: hangs or is down would hold it for 30 s (the SDK's own wait), past systemd's TimeoutStopSec.
FLUSH_AT_STOP_SECONDS = 5.0

#: The loggers the OTLP/HTTP exporter says each failed try and batch on (``_OutageLog``).
EXPORTER_LOGGERS = ("opentelemetry.exporter.otlp.proto.http.trace_exporter",
                    "opentelemetry.exporter.otlp.common.http")

#: Where the OTLP exporter takes its endpoints and headers from (``secrets``).
ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
HEADER_VARIABLES = ("OTEL_EXPORTER_OTLP_HEADERS", "OTEL_EXPORTER_OTLP_TRACES_HEADERS")


# ---------------------------------------------------------------- ids (no OpenTelemetry needed)


def trace_id_of(correlation_id: str) -> int:
    """The 128-bit trace id of a request: a hash of its correlation id (never 0)."""
    digest = hashlib.blake2b(correlation_id.encode("utf-8", "surrogatepass"), digest_size=16).digest()
    return int.from_bytes(digest, "big") or 1


def span_id_of(message_id: str) -> int:
    """The 64-bit span id of a message's first hop: a hash of its message id (never 0)."""
    digest = hashlib.blake2b(message_id.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "big") or 1


def traceparent(trace_id: int, span_id: int, sampled: bool = True) -> str:
    """The W3C ``traceparent`` header of a span."""
    return f"00-{trace_id:032x}-{span_id:016x}-{'01' if sampled else '00'}"


def parse_traceparent(header: str | None) -> tuple[int, int, int] | None:
    """(trace id, span id, flags) of a W3C ``traceparent``, or None when it is not one."""
    if not header:
        return None
    parts = header.strip().split("-")
    if len(parts) < 4 or len(parts[0]) != 2 or parts[0] == "ff" or len(parts[1]) != 32 or len(parts[2]) != 16:
        return None
    try:
        trace, span, flags = int(parts[1], 16), int(parts[2], 16), int(parts[3][:2], 16)
    except ValueError:
        return None
    if trace == 0 or span == 0 or (parts[0] == "00" and len(parts) != 4):
        return None
    return trace, span, flags


def wanted(settings: OtelSettings, environ: Mapping[str, str] = os.environ) -> bool:
    """Whether OpenTelemetry is asked for: the setting, else an OTLP endpoint in the
    environment; ``OTEL_SDK_DISABLED`` and ``OTEL_TRACES_EXPORTER=none`` win."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true" or settings.enabled is False:
        return False
    if environ.get("OTEL_TRACES_EXPORTER", "").strip().lower() == "none":
        return False
    if settings.enabled:
        return True
    return bool(environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))


def secrets(environ: Mapping[str, str] = os.environ) -> list[str]:
    """What the OTLP exporter is told that no log or span may show: the password of an
    endpoint's ``user:password@``, and the values of the OTLP headers that carry a
    credential (``Authorization``, an API key or token, Honeycomb's team; a ``Bearer
    <token>``'s token on its own too), not a dataset's or a tenant's name, which would
    hide every word like it. Nothing of OpenTelemetry is imported. An endpoint that is no
    URL is a ``ConfigError`` naming its variable."""
    from autoresponse.config import ConfigError

    found: list[str] = []
    for name in ENDPOINT_VARIABLES:
        try:
            password = urlsplit(environ.get(name, "")).password
        except ValueError as exc:  # "http://[::1:4318": the exporter could not use it either
            raise ConfigError(f"{name} is not a URL: {exc}") from None
        if password:
            found += [password, unquote(password)]
    for name in HEADER_VARIABLES:
        for header in environ.get(name, "").split(","):
            key, _, value = header.partition("=")
            value = unquote(value).strip()
            if value and _CREDENTIAL_HEADER.search(unquote(key)):
                found += [value, value.split()[-1]]
    return found


#: The OTLP headers whose values are credentials (``secrets``).
_CREDENTIAL_HEADER = re.compile(r"auth|key|token|secret|passw|team|signature|credential|cookie", re.IGNORECASE)


def setup(runtime: Runtime, settings: OtelSettings, environ: Mapping[str, str] = os.environ,
          redact: Callable[[str], str] | None = None) -> Telemetry | None:
    """Spans for ``runtime`` when OpenTelemetry is asked for and installed; else None, and
    nothing of OpenTelemetry is imported. ``redact`` (the daemon's ``Redactor``) cleans
    every text a span carries."""
    if not wanted(settings, environ):
        return None
    if runtime.tracer is None:  # asked for by the environment; the setting says otherwise
        log.warning("OpenTelemetry is asked for, but runtime.trace = false: its spans are made "
                    "from every hop's trace; running without it")
        return None
    try:
        import opentelemetry.exporter.otlp.proto.http.trace_exporter  # noqa: F401
        import opentelemetry.sdk.trace  # noqa: F401
    except ImportError as exc:
        log.warning("OpenTelemetry is asked for but not installed (%s): pip install 'autoresponse[otel]'; "
                    "running without it", exc)
        return None
    telemetry = install(runtime, service_name=settings.service_name, exporter=_exporter(environ), redact=redact)
    log.info("OpenTelemetry traces on (%s)", _describe_export(environ))
    return telemetry


def _exporter(environ: Mapping[str, str]) -> Any:
    """The exporter the environment asks for: OTLP over HTTP (protobuf), or ``console``."""
    chosen = [name.strip().lower() for name in environ.get("OTEL_TRACES_EXPORTER", "otlp").split(",") if name.strip()]
    if chosen == ["console"]:
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter()
    if chosen and chosen != ["otlp"]:
        log.warning("OTEL_TRACES_EXPORTER=%s: only otlp (and console) are supported; using otlp",
                    ",".join(chosen))
    protocol = environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
    if protocol and protocol.strip() != "http/protobuf":
        log.warning("OTEL_EXPORTER_OTLP_PROTOCOL=%s: autoresponse[otel] exports over http/protobuf", protocol)
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter()


def _describe_export(environ: Mapping[str, str]) -> str:
    endpoint = environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    where = _address(endpoint) if endpoint else "the default endpoint, http://localhost:4318"
    return f"exporter {environ.get('OTEL_TRACES_EXPORTER', 'otlp')}, {where}"


def _address(url: str) -> str:
    """Scheme, host, port and path of ``url``: no ``user:password@``, no query (a token)."""
    parts = urlsplit(url.strip())
    return f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}{parts.path}"


def install(runtime: Runtime, *, exporter: Any = None, simple: bool = False,
            service_name: str = "autoresponse", redact: Callable[[str], str] | None = None) -> Telemetry:
    """Record ``runtime``'s hops and LLM calls as spans, sent to ``exporter`` (default: OTLP
    over HTTP, as the ``OTEL_EXPORTER_OTLP_*`` variables say) in batches, or one by one when
    ``simple`` (tests); ``redact`` cleans their texts. ``Telemetry.shutdown`` flushes (for
    ``FLUSH_AT_STOP_SECONDS`` at most) and detaches."""
    if runtime.tracer is None:
        raise ValueError("OpenTelemetry spans are made from the runtime's trace events: "
                         "start the runtime with trace=True")
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExportResult

    from autoresponse import __version__

    if exporter is None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        exporter = OTLPSpanExporter()
    resource = Resource.create({"service.version": __version__})
    if str(resource.attributes.get("service.name", "")).startswith("unknown_service"):
        resource = resource.merge(Resource({"service.name": service_name}))
    ids = _Ids()
    provider = TracerProvider(resource=resource, id_generator=ids, shutdown_on_exit=False)
    watched = _Watched(exporter, SpanExportResult, _OUTAGE_LOG)
    for name in EXPORTER_LOGGERS:
        logging.getLogger(name).addFilter(_OUTAGE_LOG)  # once: the same filter each time
    provider.add_span_processor(SimpleSpanProcessor(watched) if simple else BatchSpanProcessor(watched))
    spans = OtelSpans(provider, ids, redact=redact)
    runtime.tracer.spans = spans
    return Telemetry(runtime, provider, spans, watched)


class Telemetry:
    """What ``install`` set up: ``force_flush`` sends what is buffered, ``shutdown`` (after
    the runtime stopped) sends it, for ``FLUSH_AT_STOP_SECONDS`` at most, and stops recording."""

    def __init__(self, runtime: Runtime, provider: Any, spans: OtelSpans, exporter: _Watched) -> None:
        self.runtime = runtime
        self.provider = provider
        self.spans = spans
        self.exporter = exporter

    def force_flush(self, timeout: float = 10.0) -> bool:
        return bool(self.provider.force_flush(int(timeout * 1000)))

    def shutdown(self) -> None:
        tracer = self.runtime.tracer
        if tracer is not None and tracer.spans is self.spans:
            tracer.spans = None
        # The SDK's shutdown waits 30 s for a collector that hangs, and its flush ignores
        # its timeout: it runs on a thread of its own, given up on past the budget.
        flush = threading.Thread(target=self.provider.shutdown, name="otel-shutdown", daemon=True)
        flush.start()
        flush.join(FLUSH_AT_STOP_SECONDS)
        if flush.is_alive():
            log.warning("OpenTelemetry: the collector took more than %.0f s; the spans not sent yet are "
                        "dropped", FLUSH_AT_STOP_SECONDS)
            # No more tries, no more batches: the thread ends once the export under way
            # does (the exporter's timeout at most), or with the process.
            self.exporter.shutdown()


class _OutageLog(logging.Filter):
    """On the exporter's loggers: of the warnings and errors of an outage (a collector down,
    hanging, refusing), the first is logged and the rest are not, until an export works,
    which is said once. The SDK logs each try (every 1-2 s) and each batch, without end."""

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self._since: float | None = None  # when the outage began (None: none)
        self._held = 0  # lines not logged since

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        with self._lock:
            if self._since is not None:
                self._held += 1
                return False
            self._since, self._held = time.monotonic(), 0
        record.msg = f"{record.msg} (nothing more of the exporter's failures is logged until an export works)"
        return True

    def exported(self) -> None:
        """An export worked: the outage, if any, is over."""
        with self._lock:
            since, held = self._since, self._held
            self._since = None
        if since is not None:
            log.info("OpenTelemetry: the collector takes spans again, after %.0f s (%d lines of the "
                     "exporter's about it not logged)", time.monotonic() - since, held)


_OUTAGE_LOG = _OutageLog()


class _Watched:
    """The exporter, telling ``_OutageLog`` when an export works; once shut down (the stop
    gave up on a collector), it fails what is left at once and says nothing of it."""

    def __init__(self, exporter: Any, results: Any, outage: _OutageLog) -> None:
        self._exporter = exporter
        self._results = results  # the SDK's SpanExportResult
        self._outage = outage
        self._shut = False

    def export(self, spans: Any) -> Any:
        if self._shut:
            return self._results.FAILURE
        result = self._exporter.export(spans)
        if result == self._results.SUCCESS:
            self._outage.exported()
        return result

    def shutdown(self) -> None:
        if not self._shut:  # the stop's, then the SDK's own
            self._shut = True
            self._exporter.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return bool(self._exporter.force_flush(timeout_millis))


# ---------------------------------------------------------------- spans


class _Ids:
    """The provider's id generator: random ids, except the ones a span is to have, which
    the caller sets (on its own thread) just before it starts the span."""

    def __init__(self) -> None:
        self._next = threading.local()
        self._random = random.SystemRandom()

    def generate_span_id(self) -> int:
        wanted_id = getattr(self._next, "span", None)
        if wanted_id is not None:
            self._next.span = None
            return int(wanted_id)
        return self._random.getrandbits(64) or 1

    def generate_trace_id(self) -> int:
        wanted_id = getattr(self._next, "trace", None)
        if wanted_id is not None:
            self._next.trace = None
            return int(wanted_id)
        return self._random.getrandbits(128) or 1

    def is_trace_id_random(self) -> bool:
        return False  # a hash of the correlation id

    def next(self, trace_id: int, span_id: int) -> None:
        self._next.trace, self._next.span = trace_id, span_id

    def random_span_id(self) -> int:
        return self._random.getrandbits(64) or 1


class _Hop:
    """A hop under way: what its span will say when it ends."""

    __slots__ = ("key", "span_id", "parent", "remote", "actor", "queued", "started", "notes", "env")

    def __init__(self, key: tuple[str, int, str], span_id: int, parent: int | None, remote: bool,
                 actor: str | None, queued: int, env: Envelope) -> None:
        self.key = key
        self.span_id = span_id
        self.parent = parent  # the parent span's id (None: the trace's root, or a link)
        self.remote = remote
        self.actor = actor
        self.queued = queued
        self.started: int | None = None
        self.notes: list[tuple[int, str]] = []
        self.env = env


class _Request:
    """One correlation's hops under way, and what its spans share."""

    __slots__ = ("trace_id", "sampled", "hops", "first", "actor_of", "delivery")

    def __init__(self, trace_id: int, sampled: bool) -> None:
        self.trace_id = trace_id
        self.sampled = sampled
        self.hops: dict[tuple[str, int, str], _Hop] = {}
        #: Each message's first hop: its span id is ``span_id_of(message id)``.
        self.first: dict[str, tuple[str, int, str]] = {}
        self.actor_of: dict[str, str] = {}
        #: (message, attempt) -> the span id of its delivery (the parent of its I/O's results).
        self.delivery: dict[tuple[str, int], int] = {}


class OtelSpans:
    """The trace recorder's second listener (``HopSpans``): spans for hops, LLM calls and
    published work. Called on every actor's thread and the loop's, so its state is locked;
    spans are made outside the lock. Their texts go through ``redact`` (``_text``)."""

    def __init__(self, provider: Any, ids: _Ids, keep: int = TRACES_KEPT,
                 redact: Callable[[str], str] | None = None) -> None:
        from opentelemetry import trace
        from opentelemetry.trace import Link, NonRecordingSpan, SpanContext, SpanKind, Status, StatusCode, TraceFlags

        self._trace, self._Link, self._NonRecordingSpan = trace, Link, NonRecordingSpan
        self._SpanContext, self._SpanKind, self._Status, self._StatusCode = SpanContext, SpanKind, Status, StatusCode
        self._TraceFlags = TraceFlags
        self._tracer = provider.get_tracer("autoresponse")
        self._sampler = provider.sampler
        self._ids = ids
        self._lock = threading.Lock()
        self._requests: dict[str, _Request] = {}
        self._order: deque[str] = deque()
        self._keep = keep
        self._redact = redact

    # ---------------------------------------------------------------- HopSpans

    def queued(self, env: Envelope, actor: str, kind: str | None) -> None:
        key = (env.message_id, env.attempt, kind or type(env.body).__name__)
        now = time.time_ns()
        with self._lock:
            request = self._request(env)
            hop = request.hops.get(key)
            if hop is not None:  # its handling began before the sender recorded the queueing
                hop.actor = hop.actor or actor
                return
            if request.first.get(env.message_id) == key:
                return  # the same race, and it has ended already
            request.actor_of.setdefault(env.message_id, actor)
            request.hops[key] = self._begin(request, env, key, actor, now)

    def started(self, env: Envelope, kind: str) -> None:
        key = (env.message_id, env.attempt, kind)
        now = time.time_ns()
        with self._lock:
            request = self._request(env)
            hop = request.hops.get(key)
            if hop is None:  # a retry (put back, not queued), or the sender has not recorded it yet
                hop = request.hops[key] = self._begin(request, env, key, request.actor_of.get(env.message_id), now)
            hop.started = now

    def ended(self, env: Envelope, kind: str, outcome: str) -> None:
        key = (env.message_id, env.attempt, kind)
        now = time.time_ns()
        with self._lock:
            request = self._request(env)
            hop = request.hops.pop(key, None)
            if hop is None:  # an outcome with no hop under way (a dead letter after it was handled)
                hop = self._begin(request, env, key, request.actor_of.get(env.message_id), now)
            trace_id, sampled = request.trace_id, request.sampled
        self._emit_hop(trace_id, sampled, hop, outcome, now)

    def note(self, env: Envelope, kind: str, text: str) -> None:
        with self._lock:
            request = self._requests.get(env.correlation_id)
            hop = request.hops.get((env.message_id, env.attempt, kind)) if request is not None else None
            if hop is not None:
                hop.notes.append((time.time_ns(), text))

    def finished(self, correlation: str) -> None:
        with self._lock:  # what never ended (a queueing recorded after its hop ended) is dropped
            self._requests.pop(correlation, None)

    def published(self, env: Envelope, actor: str) -> str:
        """A ``publish`` span for work handed to the cluster: its traceparent goes with it."""
        trace_id, span_id = trace_id_of(env.correlation_id), span_id_of(env.message_id)
        sampled = self._sampled(trace_id)
        now = time.time_ns()
        attributes = {**self._common(env), "messaging.operation.type": "publish", "messaging.system": "nats",
                      "autoresponse.actor": actor}
        self._ids.next(trace_id, span_id)
        span = self._tracer.start_span(f"publish {actor}", context=None, kind=self._SpanKind.PRODUCER,
                                       attributes=self._clean(attributes), start_time=now)
        span.end(end_time=now)
        return traceparent(trace_id, span_id, sampled)

    # ---------------------------------------------------------------- the LLM call

    def llm_call(self, env: Envelope, call: Coroutine[Any, Any, T], engine: Any) -> Coroutine[Any, Any, T]:
        """``call`` (the LLM client's, started while it handles ``env``) as a GenAI client span,
        a child of that hop."""
        key = (env.message_id, env.attempt, type(env.body).__name__)
        with self._lock:
            request = self._request(env)
            hop = request.hops.get(key)
            parent = hop.span_id if hop is not None else span_id_of(env.message_id)
            trace_id, sampled = request.trace_id, request.sampled
        return self._llm_span(env, call, engine, trace_id, parent, sampled)

    async def _llm_span(self, env: Envelope, call: Coroutine[Any, Any, T], engine: Any, trace_id: int,
                        parent: int, sampled: bool) -> T:
        start = time.time_ns()
        error: BaseException | None = None
        result: Any = None
        try:
            result = await call
            return result
        except BaseException as exc:
            error = exc
            raise
        finally:
            if result is not None or error is not None:  # None: nothing was asked
                try:
                    self._emit_llm(env, engine, trace_id, parent, sampled, start, result, error)
                except Exception:  # a span never breaks the call
                    log.exception("recording the LLM span failed")

    def _emit_llm(self, env: Envelope, engine: Any, trace_id: int, parent: int, sampled: bool, start: int,
                  result: Any, error: BaseException | None) -> None:
        from autoresponse.actors.llm.usage import turn_kind

        system, request_model, max_tokens = engine_facts(engine)
        attributes: dict[str, Any] = {**self._common(env), "gen_ai.operation.name": "chat",
                                      "gen_ai.system": system, "gen_ai.provider.name": system}
        if request_model:
            attributes["gen_ai.request.model"] = request_model
        if max_tokens:
            attributes["gen_ai.request.max_tokens"] = int(max_tokens)
        prompt = getattr(result, "prompt", None)
        if prompt is not None:
            attributes["autoresponse.llm.turn"] = turn_kind(prompt)
        status = None
        if error is not None:
            attributes["error.type"] = type(error).__name__
            status = self._Status(self._StatusCode.ERROR, self._text(f"{type(error).__name__}: {error}"))
        elif hasattr(result, "usage"):  # an LLMReply
            if result.model:
                attributes["gen_ai.response.model"] = result.model
            if result.usage is not None:
                attributes["gen_ai.usage.input_tokens"] = result.usage.prompt_tokens
                attributes["gen_ai.usage.output_tokens"] = result.usage.completion_tokens
            if result.finish_reason:
                attributes["gen_ai.response.finish_reasons"] = (result.finish_reason,)
            attributes["autoresponse.llm.engine"] = result.engine or "main"
            attributes["autoresponse.llm.protocol"] = result.protocol
        else:  # an LLMFailure
            attributes["error.type"] = str(result.status) if result.status else "LLMFailure"
            status = self._Status(self._StatusCode.ERROR, self._text(result.error))
        self._ids.next(trace_id, self._ids.random_span_id())
        span = self._tracer.start_span(f"chat {request_model}" if request_model else "chat",
                                       context=self._parent_context(trace_id, parent, sampled, remote=False),
                                       kind=self._SpanKind.CLIENT, attributes=self._clean(attributes),
                                       start_time=start)
        if status is not None:
            span.set_status(status)
        span.end(end_time=time.time_ns())

    # ---------------------------------------------------------------- inside

    def _request(self, env: Envelope) -> _Request:
        """Under the lock: the correlation's state, made on its first event (the oldest is
        forgotten past ``keep``, like the ring)."""
        request = self._requests.get(env.correlation_id)
        if request is None:
            trace_id = trace_id_of(env.correlation_id)
            remote = parse_traceparent(env.traceparent)
            sampled = bool(remote[2] & 1) if remote is not None and remote[0] == trace_id else self._sampled(trace_id)
            request = self._requests[env.correlation_id] = _Request(trace_id, sampled)
            self._order.append(env.correlation_id)
            while len(self._order) > self._keep:
                self._requests.pop(self._order.popleft(), None)
        return request

    def _sampled(self, trace_id: int) -> bool:
        """The sampler's word on a trace's root (the same on every daemon for the ratio
        samplers: the trace id is the correlation's hash)."""
        try:
            return bool(self._sampler.should_sample(None, trace_id, "request").decision.is_sampled())
        except Exception:
            return True

    def _begin(self, request: _Request, env: Envelope, key: tuple[str, int, str], actor: str | None,
               now: int) -> _Hop:
        """Under the lock: a hop starts. A message's first hop has its own span id and its
        cause's first hop (or the remote span it continues) as parent; later hops (a retry,
        its I/O's results) are children of the first, or of their attempt's delivery."""
        message_id = env.message_id
        delivered = key[2] == type(env.body).__name__
        if message_id not in request.first:
            request.first[message_id] = key
            span_id = span_id_of(message_id)
            parent, remote = self._cause_of(env, request)
        else:
            span_id = self._ids.random_span_id()
            parent = span_id_of(message_id) if delivered else request.delivery.get(
                (message_id, env.attempt), span_id_of(message_id))
            remote = False
        if delivered:
            request.delivery.setdefault((message_id, env.attempt), span_id)
        return _Hop(key, span_id, parent, remote, actor, now, env)

    def _cause_of(self, env: Envelope, request: _Request) -> tuple[int | None, bool]:
        if env.causation_id is not None:
            return span_id_of(env.causation_id), False
        remote = parse_traceparent(env.traceparent)
        if remote is not None and remote[0] == request.trace_id:
            return remote[1], True
        return None, False

    def _common(self, env: Envelope) -> dict[str, Any]:
        """What every span of a message says (few: the SDK checks each attribute it is given)."""
        attributes: dict[str, Any] = {
            "autoresponse.correlation_id": env.correlation_id,
            "autoresponse.message_id": env.message_id,
            "autoresponse.attempt": env.attempt,
        }
        if env.causation_id is not None:
            attributes["autoresponse.causation_id"] = env.causation_id
        return attributes

    def _text(self, text: str) -> str:
        """Text as it leaves in a span: redacted (an LLM server's error may quote the API
        key, or the user), then cut to ``MAX_TEXT``."""
        if self._redact is not None:
            text = self._redact(text)
        return text if len(text) <= MAX_TEXT else text[:MAX_TEXT - 1] + "…"

    def _clean(self, attributes: dict[str, Any]) -> dict[str, Any]:
        """``attributes`` with every string (and every string of a tuple) through ``_text``."""
        return {key: self._clean_value(value) for key, value in attributes.items()}

    def _clean_value(self, value: Any) -> Any:
        if isinstance(value, str):
            return self._text(value)
        if isinstance(value, tuple):
            return tuple(self._clean_value(v) for v in value)
        return value

    def _parent_context(self, trace_id: int, parent: int | None, sampled: bool, *, remote: bool) -> Any:
        if parent is None:
            return None
        flags = self._TraceFlags(self._TraceFlags.SAMPLED if sampled else self._TraceFlags.DEFAULT)
        context = self._SpanContext(trace_id, parent, is_remote=remote, trace_flags=flags)
        return self._trace.set_span_in_context(self._NonRecordingSpan(context))

    def _emit_hop(self, trace_id: int, sampled: bool, hop: _Hop, outcome: str, end: int) -> None:
        env, (message_id, attempt, kind) = hop.env, hop.key
        actor = hop.actor or "?"
        attributes = {**self._common(env), "autoresponse.actor": actor, "autoresponse.message.type": kind,
                      "autoresponse.outcome": outcome}
        links = ()
        remote = parse_traceparent(env.traceparent) if env.causation_id is None else None
        if remote is not None and remote[0] != trace_id:  # a span of another trace led here
            flags = self._TraceFlags(remote[2] & 1)
            links = (self._Link(self._SpanContext(remote[0], remote[1], is_remote=True, trace_flags=flags)),)
        self._ids.next(trace_id, hop.span_id)
        span = self._tracer.start_span(f"{actor} {kind}", kind=self._SpanKind.CONSUMER,
                                       attributes=self._clean(attributes),
                                       context=self._parent_context(trace_id, hop.parent, sampled, remote=hop.remote),
                                       links=links, start_time=hop.queued)
        if hop.started is not None:
            span.add_event("started", timestamp=hop.started)
        for at, text in hop.notes:
            span.add_event("note", {"text": self._text(text)}, timestamp=at)
        if outcome == "crash" or outcome.startswith("dead letter"):
            span.set_status(self._Status(self._StatusCode.ERROR, self._text(outcome)))
        span.end(end_time=end)


def engine_facts(engine: Any) -> tuple[str, str, int | None]:
    """(gen_ai.system, the model requested, max_tokens) of an engine; a chain's are its
    first engine's."""
    from autoresponse.actors.llm import EngineChain, HttpEngine

    main = engine.engines[0][1] if isinstance(engine, EngineChain) and engine.engines else engine
    if isinstance(main, HttpEngine):  # any OpenAI-compatible server
        return "openai", main.model or "", getattr(main, "max_tokens", None)
    return "autoresponse.offline", getattr(main, "model", "") or "", getattr(main, "max_tokens", None)
