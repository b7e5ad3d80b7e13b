"""OpenTelemetry: a request's hops are spans of one trace named by its correlation id, its
LLM calls GenAI spans; sent through the real OTLP/HTTP exporter to a receiver on 127.0.0.1,
across daemons through NATS headers; and with it off, nothing of OpenTelemetry is loaded."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from aiohttp import web
from conftest import NatsServer, ask, environment, wait_for

pytest.importorskip("opentelemetry.sdk.trace", reason="the otel extra is not installed")

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest  # noqa: E402
from opentelemetry.sdk.trace import ReadableSpan  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402
from opentelemetry.trace import SpanKind, StatusCode  # noqa: E402

from autoresponse import Application, otel  # noqa: E402
from autoresponse.actors.loopback import LoopbackServer  # noqa: E402
from autoresponse.config import OtelSettings  # noqa: E402
from autoresponse.interfaces.console import ConsoleInput  # noqa: E402
from autoresponse.messages import Envelope  # noqa: E402


@pytest.fixture(autouse=True)
def no_otel_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test says which OTEL_ variables it has."""
    for key in list(os.environ):
        if key.startswith("OTEL_"):
            monkeypatch.delenv(key)


@pytest.fixture
def memory(make_app: Callable[..., Application]) -> Iterator[Callable[[Application], InMemorySpanExporter]]:
    """Spans of an app, kept in memory (exported one by one, as each ends)."""
    installed: list[otel.Telemetry] = []

    def install(app: Application) -> InMemorySpanExporter:
        exporter = InMemorySpanExporter()
        installed.append(otel.install(app.runtime, exporter=exporter, simple=True))
        return exporter

    yield install
    for telemetry in installed:
        telemetry.shutdown()


def of(spans: tuple[ReadableSpan, ...] | list[ReadableSpan], correlation: str) -> list[ReadableSpan]:
    return [s for s in spans if (s.attributes or {}).get("autoresponse.correlation_id") == correlation]


def test_ids_come_from_the_correlation_and_message_ids() -> None:
    trace_id = otel.trace_id_of("telegram-42-7")
    assert trace_id == otel.trace_id_of("telegram-42-7") != otel.trace_id_of("telegram-42-8")
    assert 0 < trace_id < 2**128 and 0 < otel.span_id_of("ab12-1") < 2**64
    header = otel.traceparent(trace_id, otel.span_id_of("ab12-1"))
    assert header == f"00-{trace_id:032x}-{otel.span_id_of('ab12-1'):016x}-01"
    assert otel.parse_traceparent(header) == (trace_id, otel.span_id_of("ab12-1"), 1)
    for bad in (None, "", "00-0-0-01", f"00-{0:032x}-{1:016x}-01", f"ff-{1:032x}-{1:016x}-01", "00-xyz"):
        assert otel.parse_traceparent(bad) is None


def test_it_is_on_when_asked_or_when_an_endpoint_is_set() -> None:
    endpoint = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}
    assert not otel.wanted(OtelSettings(), {})
    assert otel.wanted(OtelSettings(), endpoint)
    assert otel.wanted(OtelSettings(), {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4318/v1/traces"})
    assert otel.wanted(OtelSettings(enabled=True), {})
    assert not otel.wanted(OtelSettings(enabled=False), endpoint)
    assert not otel.wanted(OtelSettings(enabled=True), {"OTEL_SDK_DISABLED": "true"})
    assert not otel.wanted(OtelSettings(), {**endpoint, "OTEL_TRACES_EXPORTER": "none"})


def test_a_request_is_one_trace_of_hop_spans_with_its_llm_calls_as_genai_spans(
    make_app: Callable[..., Application], fake_llm: Any, memory: Callable[[Application], InMemorySpanExporter]
) -> None:
    app = make_app(base_url=fake_llm.base_url, llm={"model": "fake-model"})
    exporter = memory(app)
    envelope = ask(app, "run uptime")
    correlation = envelope.correlation_id
    spans = exporter.get_finished_spans()
    mine = of(spans, correlation)
    trace_id = otel.trace_id_of(correlation)
    assert mine and all(s.context.trace_id == trace_id for s in mine)
    assert all(s.attributes["autoresponse.message_id"] for s in mine)

    # One span per hop of the trace ring, same actors and types.
    hops = [s for s in mine if s.kind is SpanKind.CONSUMER]
    ring = app.runtime.trace(correlation)
    assert sorted((h["actor"], h["type"]) for h in ring) == sorted(
        (s.attributes["autoresponse.actor"], s.attributes["autoresponse.message.type"]) for s in hops)
    assert all(s.attributes["autoresponse.outcome"] == "handled" for s in hops)
    assert all(s.start_time <= e.timestamp <= s.end_time for s in hops for e in s.events if e.name == "started")

    # Parent and child by causation: one root (the console's input), every other hop's
    # parent is the first hop of the message that caused it.
    by_span = {s.context.span_id: s for s in mine}
    roots = [s for s in hops if s.parent is None]
    assert [s.attributes["autoresponse.message.type"] for s in roots] == ["ConsoleInput"]
    assert roots[0].context.span_id == otel.span_id_of(envelope.message_id)
    for span in hops:
        if span.parent is None:
            continue
        assert span.parent.span_id in by_span and span.parent.trace_id == trace_id
        cause = span.attributes.get("autoresponse.causation_id")
        if span.context.span_id == otel.span_id_of(span.attributes["autoresponse.message_id"]):
            assert span.parent.span_id == otel.span_id_of(cause)  # a message's first hop
        else:  # a later hop of the same message (the result of its I/O)
            assert by_span[span.parent.span_id].attributes["autoresponse.message_id"] == \
                span.attributes["autoresponse.message_id"]

    # The LLM calls (a chat turn, then the delivery of the command's output).
    calls = [s for s in mine if s.kind is SpanKind.CLIENT]
    assert len(calls) == len(fake_llm.requests) == 2
    for call in calls:
        attributes = call.attributes
        assert call.name == "chat fake-model"
        assert attributes["gen_ai.operation.name"] == "chat"
        assert attributes["gen_ai.system"] == "openai"
        assert attributes["gen_ai.request.model"] == "fake-model"
        assert attributes["gen_ai.response.model"] == "fake-model"  # the fake answers as the model asked
        assert attributes["gen_ai.usage.input_tokens"] > 0 and attributes["gen_ai.usage.output_tokens"] > 0
        parent = by_span[call.parent.span_id]
        assert parent.attributes["autoresponse.actor"] == "llm" and parent.start_time <= call.start_time
    assert sorted(c.attributes["autoresponse.llm.turn"] for c in calls) == ["chat", "delivery"]
    tokens = sum(c.attributes["gen_ai.usage.input_tokens"] + c.attributes["gen_ai.usage.output_tokens"]
                 for c in calls)
    assert tokens == app.usage.status()["tokens_total"]


def test_a_failed_llm_call_and_a_dead_letter_are_error_spans(
    make_app: Callable[..., Application], fake_llm: Any, memory: Callable[[Application], InMemorySpanExporter]
) -> None:
    from autoresponse.testing.fake_llm import FakeResponse

    app = make_app(base_url=fake_llm.base_url)
    exporter = memory(app)
    fake_llm.script(*[FakeResponse(status=400)] * 4)
    envelope = ask(app, "hello")
    mine = of(exporter.get_finished_spans(), envelope.correlation_id)
    failed = [s for s in mine if s.kind is SpanKind.CLIENT]
    assert failed and failed[0].status.status_code is StatusCode.ERROR
    assert failed[0].attributes["error.type"] == "400"
    dead = [s for s in mine if str(s.attributes.get("autoresponse.outcome", "")).startswith("dead letter")]
    assert dead and all(s.status.status_code is StatusCode.ERROR for s in dead)
    assert {s.context.trace_id for s in mine} == {otel.trace_id_of(envelope.correlation_id)}


class OtlpReceiver(LoopbackServer):
    """An OTLP/HTTP traces receiver: ``POST /v1/traces`` (protobuf), decoded."""

    def __init__(self) -> None:
        super().__init__(name="otlp-receiver")
        self.exports: list[ExportTraceServiceRequest] = []

    def routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/traces", self._traces)

    async def _traces(self, request: web.Request) -> web.Response:
        assert request.content_type == "application/x-protobuf"
        export = ExportTraceServiceRequest()
        export.ParseFromString(await request.read())
        self.exports.append(export)
        return web.Response(body=b"", content_type="application/x-protobuf")

    def spans(self) -> list[tuple[dict[str, Any], Any]]:
        """Every span received, with its resource's attributes."""
        return [({a.key: _value(a.value) for a in rs.resource.attributes}, span)
                for export in list(self.exports) for rs in export.resource_spans
                for ss in rs.scope_spans for span in ss.spans]


def _value(value: Any) -> Any:
    return getattr(value, value.WhichOneof("value")) if value.WhichOneof("value") else None


def test_the_spans_reach_an_otlp_receiver_through_the_real_exporter(
    make_app: Callable[..., Application], fake_llm: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    with OtlpReceiver() as receiver:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{receiver.port}")
        monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
        monkeypatch.setenv("OTEL_SERVICE_NAME", "bot-under-test")
        app = make_app(base_url=fake_llm.base_url)  # on: the endpoint is set
        assert app.telemetry is not None
        envelope = ask(app, "run date")
        trace_id = otel.trace_id_of(envelope.correlation_id).to_bytes(16, "big")
        assert app.telemetry.force_flush()
        received = wait_for(lambda: [(r, s) for r, s in receiver.spans() if s.trace_id == trace_id])
        assert {r["service.name"] for r, _ in received} == {"bot-under-test"}
        spans = [s for _, s in received]
        attributes = [{a.key: _value(a.value) for a in s.attributes} for s in spans]
        assert {a["autoresponse.correlation_id"] for a in attributes} == {envelope.correlation_id}
        llm = [a for a in attributes if a.get("gen_ai.operation.name") == "chat"]
        assert len(llm) == 2 and all(a["gen_ai.usage.output_tokens"] > 0 for a in llm)
        ids = {s.span_id for s in spans}
        assert all(s.parent_span_id in ids for s in spans if s.parent_span_id)  # nothing dangles
        app.stop()  # and what is left is sent at the stop
        assert app.telemetry.runtime.tracer.spans is None


def test_a_work_item_carries_its_traceparent_through_nats(
    make_app: Callable[..., Application], fake_llm: Any, nats_server: NatsServer,
    memory: Callable[[Application], InMemorySpanExporter]
) -> None:
    app = make_app(base_url=fake_llm.base_url, journal={"backend": "nats"}, nats={"url": nats_server.url})
    exporter = memory(app)
    seen: list[Envelope] = []
    app.runtime.watch("interface.console", seen.append)
    accepted = app.runtime.accept("interface.console", ConsoleInput(text="run uptime"),
                                  correlation_id="otel-nats-1").result(10)
    assert accepted.traceparent is not None  # published with the item, as a header
    wait_for(lambda: seen and app.runtime.wait_idle("otel-nats-1", 0.1) and len(fake_llm.requests) == 2)
    taken = seen[0]
    assert taken.traceparent == accepted.traceparent and taken.message_id != accepted.message_id
    spans = of(exporter.get_finished_spans(), "otel-nats-1")
    trace_id = otel.trace_id_of("otel-nats-1")
    assert {s.context.trace_id for s in spans} == {trace_id}
    published = [s for s in spans if s.kind is SpanKind.PRODUCER]
    assert len(published) == 1 and published[0].context.span_id == otel.span_id_of(accepted.message_id)
    first = next(s for s in spans if s.context.span_id == otel.span_id_of(taken.message_id))
    assert first.parent is not None and first.parent.is_remote
    assert first.parent.span_id == published[0].context.span_id


def test_with_otel_off_nothing_of_opentelemetry_is_loaded(tmp_path: Any) -> None:
    """A request through the app, with an endpoint set but OTel turned off by its setting,
    and with nothing set: no opentelemetry module is imported, and no hop has a listener."""
    code = """
import io, json, sys
from autoresponse import Application, Settings
from autoresponse.interfaces.console import Console, ConsoleInput
app = Application(Settings.load(admin={"enabled": False}, journal={"enabled": False}, events={"enabled": False},
                                data_dir=sys.argv[1], **json.loads(sys.argv[2])),
                  console=Console(io.StringIO())).start()
try:
    env = app.runtime.send("interface.console", ConsoleInput(text="hello"))
    assert app.runtime.wait_idle(env.correlation_id, 15)
    assert app.telemetry is None and app.runtime.tracer.spans is None
finally:
    app.stop()
print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] == "opentelemetry")))
"""
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("AUTORESPONSE_", "OTEL_"))}
    for settings, endpoint in (({"otel": {"enabled": False}}, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"}),
                               ({}, {})):
        done = subprocess.run([sys.executable, "-c", code, str(tmp_path), json.dumps(settings)],
                              capture_output=True, text=True, timeout=120, cwd="/", env={**environ, **endpoint})
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout.strip().splitlines()[-1]) == []


@pytest.mark.asyncio
async def test_an_llm_call_that_raises_is_an_error_span_and_still_raises() -> None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    exporter = InMemorySpanExporter()
    ids = otel._Ids()
    provider = TracerProvider(id_generator=ids, shutdown_on_exit=False)  # type: ignore[arg-type]
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    spans = otel.OtelSpans(provider, ids)
    env = Envelope.new("a prompt", correlation_id="c-raise")

    async def call() -> None:
        raise asyncio.CancelledError

    with pytest.raises(asyncio.CancelledError):
        await spans.llm_call(env, call(), engine=None)
    (span,) = exporter.get_finished_spans()
    assert span.status.status_code is StatusCode.ERROR and span.attributes["error.type"] == "CancelledError"
    assert span.context.trace_id == otel.trace_id_of("c-raise")
    assert span.parent is not None and span.parent.span_id == otel.span_id_of(env.message_id)
    provider.shutdown()


def test_an_endpoint_in_the_environment_with_runtime_trace_off_runs_without_spans_and_says_why(
    make_app: Callable[..., Application], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # Asked for by the environment (a setting would be refused as the config loads).
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
    with caplog.at_level("WARNING", logger="autoresponse.otel"):
        app = make_app(runtime={"trace": False})
    assert app.telemetry is None and app.runtime.tracer is None
    assert any("runtime.trace = false" in r.getMessage() for r in caplog.records)
    envelope = app.runtime.send("interface.console", ConsoleInput(text="run echo spanless"))
    assert envelope is not None and app.runtime.wait_idle(envelope.correlation_id, timeout=15)


class TroubledCollector(OtlpReceiver):
    """An OTLP receiver in trouble, as ``mode`` says: ``hang`` (takes the export, never
    answers until it stops), ``503`` (refuses every export, as a collector starting or
    overloaded), ``record`` (works)."""

    def __init__(self, mode: str) -> None:
        super().__init__()
        self.mode = mode
        self.hits = 0

    async def _traces(self, request: web.Request) -> web.Response:
        self.hits += 1
        if self.mode == "hang":
            await self.stopping.wait()
        if self.mode != "record":
            await request.read()
            return web.Response(status=503)
        return await super()._traces(request)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def _otel_records(caplog: pytest.LogCaptureFixture, level: int) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name.startswith("opentelemetry") and r.levelno >= level]


def test_a_collector_that_hangs_holds_a_stop_for_the_flush_budget_at_most(
    make_app: Callable[..., Application], fake_llm: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    with TroubledCollector("hang") as collector:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", collector.url)
        monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
        app = make_app(base_url=fake_llm.base_url)
        ask(app, "run date")
        wait_for(lambda: collector.hits)  # an export under way, never answered
        ask(app, "run date")  # and spans waiting behind it
        started = time.monotonic()
        app.stop()
        took = time.monotonic() - started
    # The SDK alone waits out that export (10 s, the exporter's timeout) and then the next.
    assert took < otel.FLUSH_AT_STOP_SECONDS + 5, f"the stop took {took:.1f} s"


def test_an_llm_error_quoting_the_api_key_reaches_the_collector_redacted(
    make_app: Callable[..., Application], fake_llm: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from autoresponse.testing.fake_llm import FakeResponse

    key = "sk-otel-test-key-4242"
    quoted = json.dumps({"error": {"message": f"Invalid API key provided: Bearer {key}"}})
    with OtlpReceiver() as receiver:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{receiver.port}")
        monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
        app = make_app(base_url=fake_llm.base_url, llm={"api_key": key, "max_attempts": 1})
        fake_llm.script(*[FakeResponse(status=401, body=quoted)] * 4)
        envelope = ask(app, "hello")
        assert app.telemetry is not None and app.telemetry.force_flush()
        trace_id = otel.trace_id_of(envelope.correlation_id).to_bytes(16, "big")
        spans = wait_for(lambda: [s for _, s in receiver.spans() if s.trace_id == trace_id
                                  and any(a.key == "gen_ai.operation.name" for a in s.attributes)])
        assert "[secret]" in spans[0].status.message  # the LLM server's answer, as it said it
        assert all(key not in str(export) for export in receiver.exports)


def test_the_collectors_password_and_headers_are_never_logged_and_are_redacted(
    make_app: Callable[..., Application], fake_llm: Any, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture
) -> None:
    password, api_key, token = "pa55-w0rd-otel", "hdr-secret-1234", "tok-abcdef-5678"
    with OtlpReceiver() as receiver:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://bot:{password}@127.0.0.1:{receiver.port}/")
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", f"x-api-key={api_key},Authorization=Bearer%20{token}")
        with caplog.at_level("INFO"):
            app = make_app(base_url=fake_llm.base_url)
        assert app.telemetry is not None
        assert password not in caplog.text and "bot:" not in caplog.text
        assert f"exporter otlp, http://127.0.0.1:{receiver.port}/" in caplog.text  # where it goes, still said
        # The redactor of what leaves (dead letters, spans) knows them.
        said = app.runtime.dead_letters.redact(f"401: {password} x-api-key: {api_key}, auth: Bearer {token}")
        assert password not in said and api_key not in said and token not in said and "[secret]" in said


def test_a_collector_refusing_for_many_batches_is_one_warning_and_one_line_as_it_works_again(
    make_app: Callable[..., Application], fake_llm: Any, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture
) -> None:
    with TroubledCollector("503") as collector:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", collector.url)
        monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "2")  # a batch given up in ~2 s: many batches
        with caplog.at_level("INFO"):
            app = make_app(base_url=fake_llm.base_url)
            wait_for(lambda: ask(app, "run date") and collector.hits >= 6, timeout=90)
            assert len(_otel_records(caplog, logging.WARNING)) <= 1  # the SDK: a line a try and a batch
            collector.mode = "record"
            ask(app, "run date")
            wait_for(lambda: collector.exports and "takes spans again" in caplog.text, timeout=30)
        assert len(_otel_records(caplog, logging.WARNING)) <= 1


def test_only_the_otlp_headers_that_carry_a_credential_are_secrets() -> None:
    """Honeycomb's usual headers: its team key is hidden everywhere, its dataset's name
    (a word every log line may hold) is not."""
    environ = {"OTEL_EXPORTER_OTLP_HEADERS": "x-honeycomb-team=hcKEY0123456789,x-honeycomb-dataset=autoresponse,"
                                             "X-Scope-OrgID=prod"}
    assert otel.secrets(environ) == ["hcKEY0123456789", "hcKEY0123456789"]


def test_an_otlp_endpoint_that_is_no_url_is_one_line_naming_it(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "autoresponse", "config", "show"], capture_output=True, text=True,
                          timeout=60, stdin=subprocess.DEVNULL, env=environment(
                              OTEL_EXPORTER_OTLP_ENDPOINT="http://[::1:4318", AUTORESPONSE_DATA_DIR=str(tmp_path)))
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip().splitlines() == ["autoresponse: OTEL_EXPORTER_OTLP_ENDPOINT is not a URL: "
                                                "Invalid IPv6 URL"]
