"""The benchmark cases. Every comparison runs side by side, in the same run, interleaved.

1. in process: the runtime (offline engine, null sender) against raw pykka carrying
   the same pydantic messages and doing the same work (what the runtime adds), and
   against raw pykka carrying tuples (the substrate's floor); CPU per delivery; and
   latency at a fixed offered load (half the measured peak), not in a burst.
2. loopback HTTP: the LLM client and the Telegram sender against fakes in their own
   processes, next to a hand-written asyncio client on python-telegram-bot's
   defaults, and plain aiohttp making the same two calls (the ceiling).
3. bound by LLM latency: a fake LLM taking 0.5 s, 1..256 chats, each in turn.
4. scale: a real daemon serving 10,000 Telegram chats once each: its threads and
   its memory per idle chat, with chat memory and Telegram lanes in play.
5. the journal: case 1 with the journal on and off; and with tracing off (its cost).
6. soak: 200,000 deliveries with the journal at a steady rate (a third of the
   measured peak), RSS and journal size every 20,000.
7. several daemons: 1, 2 and 3 real daemons sharing one bot through NATS JetStream,
   on a load bound by LLM latency, beside one daemon on SQLite; CPU per delivery of
   the daemons and of nats-server (the cost of the JetStream round trips).
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pykka

from autoresponse.actors.kernel import new_event_loop, tune_heap_for_serving
from autoresponse.actors.kernel._loop import EventLoopThread
from autoresponse.actors.dispatcher import echoes_runtime, message_key, turn_key
from autoresponse.actors.extractor import extract_actions
from autoresponse.actors.limits import MAX_ACTIONS_PER_REPLY
from autoresponse.actors.llm.client import chat_key
from autoresponse.actors.llm.usage import UsageMeter, turn_kind
from autoresponse.actors.journal import SendLedger, SqliteJournal
from autoresponse.actors.llm import HttpEngine, OfflineEngine
from autoresponse.actors.prompts import build_chat_request, render_openai_messages
from autoresponse.interfaces.telegram.settings import TELEGRAM_MAX_CONCURRENT_SENDS
from autoresponse.messages import (
    LLMReply,
    OriginalContext,
    OutboundMessage,
    PromptRequest,
    UserRequest,
    action_key,
)
from benchmarks.harness import (
    WARM_UP_SECONDS,
    Run,
    Tally,
    cpu_seconds_of,
    drive,
    machine_costs,
    median_run,
    offered,
    on_one_core,
    pace,
    pipeline,
    request,
    rss_kib,
    sized,
    spread,
    threads_of,
)

# ---------------------------------------------------------------- 1. in process


def _raw_run(first: Any, requests: int, finished: threading.Event, answered: dict[Any, float],
             message: Callable[[int], Any], rate: float | None = None) -> Run:
    """All at once, or ``rate`` a second evenly spaced after a warm-up of the same, not
    counted (as ``harness.offered`` paces the runtime); ``finished`` is set once all
    ``requests`` (and the warm-up's) are answered."""
    tune_heap_for_serving()  # as the runtime's pipeline does (harness.pipeline): the same collector
    warm = 0 if rate is None else int(rate * WARM_UP_SECONDS)
    sent: dict[int, float] = {}
    started = time.perf_counter()
    cpu, counted_from = time.process_time(), started
    for n in range(warm + requests):
        if rate is not None:
            pace(started + n / rate)
        at = time.perf_counter()
        if n == warm:
            cpu, counted_from = time.process_time(), at
        if n >= warm:
            sent[n] = at
        first.tell(message(n))
    if not finished.wait(300):
        raise SystemExit(f"raw pykka: {len(answered)} of {warm + requests} answered")
    elapsed, cpu = time.perf_counter() - counted_from, time.process_time() - cpu
    return Run(requests, elapsed, [answered[n] - t for n, t in sent.items()], cpu)


class _TupleHop(pykka.ThreadingActor):
    """A bare pykka actor that forwards tuples; the first one also crosses the loop once."""

    def __init__(self, following: Any, loop: EventLoopThread | None = None, done: Any = None) -> None:
        super().__init__()
        self.following, self.loop, self.done = following, loop, done

    def on_receive(self, message: Any) -> None:
        kind, n = message
        if kind == "request" and self.loop is not None:
            me = self.actor_ref
            self.loop.submit(asyncio.sleep(0), lambda _: me.tell(("io", n)))
        elif self.following is not None:
            self.following.tell(("forward", n))
        else:
            self.done(n)


def raw_pykka_tuples(requests: int) -> Run:
    """The runtime's hops (inbound → LLM actor with a loop round trip → dispatcher →
    sender), carrying tuples and doing nothing else: the floor of the substrate."""
    loop = EventLoopThread()
    loop.start()
    finished, answered = threading.Event(), {}

    def done(n: int) -> None:
        answered[n] = time.perf_counter()
        if len(answered) == requests:
            finished.set()

    last = _TupleHop.start(None, done=done)
    middle = _TupleHop.start(last)
    first = _TupleHop.start(middle, loop=loop)
    try:
        return _raw_run(first, requests, finished, answered, lambda n: ("request", n))
    finally:
        for ref in (first, middle, last):
            ref.stop()
        loop.stop()


class _LlmHop(pykka.ThreadingActor):
    """Raw pykka doing the LLM client's work: the chat's budget, the prompt, the engine on
    the loop, the reply and its usage counted (``LLMClient.on_user_request``, ``_complete``
    and ``on_llm_reply``, less what asks the runtime: cancellations, the senders there are)."""

    def __init__(self, dispatcher: Any, loop: EventLoopThread) -> None:
        super().__init__()
        self.dispatcher, self.loop, self.engine, self.meter = dispatcher, loop, OfflineEngine(), UsageMeter()

    def on_receive(self, message: Any) -> None:
        if isinstance(message, UserRequest):
            ctx = message.context
            if self.meter.over_budget(chat_key(ctx)):
                return
            prompt = build_chat_request(message.text, ctx, allowed_actions=("message_console",), turns=message.turns,
                                        now=time.time())
            me = self.actor_ref
            self.loop.submit(self._complete(prompt), lambda task: me.tell(task.outcome()))
        else:
            reply: LLMReply = message
            self.meter.add(chat_key(reply.prompt.original_context), kind=turn_kind(reply.prompt),
                           model=reply.model or "?", engine=reply.engine or "main", usage=reply.usage)
            self.dispatcher.tell(reply)

    async def _complete(self, prompt: PromptRequest) -> LLMReply:
        answer = await self.engine.answer(prompt)
        return LLMReply(prompt=prompt, text=answer.text, tool_calls=answer.tool_calls, usage=answer.usage,
                        engine=answer.engine, model=answer.model, finish_reason=answer.finish_reason,
                        protocol=answer.protocol)


class _DispatchHop(pykka.ThreadingActor):
    """Raw pykka doing the dispatcher's work for the actions of a reply: extract them,
    skip repeats, fit each to its chat and check it, key it by its turn, build the message
    (``ActionDispatcher.on_reply``, for a reply of message actions to its own chat)."""

    def __init__(self, sender: Any) -> None:
        super().__init__()
        self.sender = sender

    def on_receive(self, reply: LLMReply) -> None:
        prompt = reply.prompt
        ctx = prompt.original_context
        found = extract_actions(reply.text, prompt.allowed_actions, max_actions=MAX_ACTIONS_PER_REPLY,
                                may_stay_silent=prompt.may_stay_silent)
        turn = turn_key(str(ctx.message_id), prompt)
        carried_out, seen, sent = list(prompt.carried_out), set(), list(prompt.sent)
        for index, slot in enumerate(found.slots):
            action = slot.action
            if action is None:
                continue
            key = action_key(action)
            if key in carried_out or key in seen:
                continue
            seen.add(key)
            fitted = action.fitted(ctx)
            if fitted is not action:
                action, key = fitted, action_key(fitted)
            if action.check(ctx) or echoes_runtime(action.payload.text):
                continue
            self.sender.tell(OutboundMessage.reply(ctx, action.payload.text, key=message_key(turn, index)))
            sent.append((str(ctx.chat_id), action.payload.text))
            carried_out.append(key)


class _SendHop(pykka.ThreadingActor):
    """Raw pykka doing the null sender's work: its send ledger asked, as a real sender asks
    it (``harness.NullSender``; without a journal nothing was sent before)."""

    def __init__(self, done: Callable[[OutboundMessage], None]) -> None:
        super().__init__()
        self.done, self.ledger = done, SendLedger(None)

    def on_receive(self, message: OutboundMessage) -> None:
        if self.ledger.already_sent(message, 0):
            return
        self.ledger.confirm(message, 0)
        self.done(message)


def raw_pykka_same_work(requests: int, rate: float | None = None) -> Run:
    """The same hops with the same pydantic messages and the same work as the runtime
    (prompt, offline engine, JSON, extraction, validation), written on bare pykka: what
    the runtime's kernel adds or saves, and nothing else. ``rate``: offered at that rate."""
    loop = EventLoopThread()
    loop.start()
    finished, answered = threading.Event(), {}

    total = requests + (0 if rate is None else int(rate * WARM_UP_SECONDS))  # _raw_run's warm-up first

    def done(message: OutboundMessage) -> None:
        answered[message.reply_to_message_id] = time.perf_counter()
        if len(answered) == total:
            finished.set()

    send = _SendHop.start(done)
    dispatch = _DispatchHop.start(send)
    first = _LlmHop.start(dispatch, loop)
    try:
        return _raw_run(first, requests, finished, answered, lambda n: request(n, n), rate)
    finally:
        for ref in (first, dispatch, send):
            ref.stop()
        loop.stop()


def runtime_offline(requests: int, journal_dir: Path | None = None, *, trace: bool = True) -> Run:
    tally = Tally(expected=requests)
    journal = SqliteJournal(journal_dir / "journal.sqlite3") if journal_dir else None
    runtime = pipeline(OfflineEngine(), tally, journal, trace=trace)
    try:
        return drive(runtime, tally, chats=requests, per_chat=1, journaled=journal is not None)
    finally:
        runtime.stop(drain=5)
        if journal is not None:
            journal.close()


def _journaled(requests: int) -> Run:
    with tempfile.TemporaryDirectory() as tmp:
        return runtime_offline(requests, Path(tmp))


def runtime_untraced(requests: int) -> Run:
    """The runtime with ``runtime.trace = false``: what tracing every hop costs, beside it."""
    return runtime_offline(requests, trace=False)


#: Latency at a steady load is measured over this many windows; the median is kept.
LATENCY_WINDOWS = 3
#: The steady loads, as fractions of the journaled burst's peak, at which latency with
#: the journal is also measured: where p99 stays within its target, and what a delivery
#: costs at each (a steady load wakes every thread for each delivery; a burst does not).
LADDER = (0.1, 0.2, 0.3, 0.4)
#: The p99 a daemon's deliveries should stay within at half the peak (the target).
P99_TARGET_MS = 5.0
#: Each latency window lasts this long.
LATENCY_SECONDS = 3.0


def in_process(repeats: int, *, seconds: float) -> dict[str, Any]:
    """Case 1 and case 5, each variant sized to last ``seconds`` and run ``repeats`` times,
    interleaved; the median of each is kept. Then latency at a steady half of the runtime's
    peak, with the journal and without; and with it at steady loads from a tenth of its peak."""
    variants: dict[str, Callable[[int], Run]] = {
        "raw pykka, tuples": raw_pykka_tuples,
        "raw pykka, same work": raw_pykka_same_work,
        "raw pykka, same work, one core": on_one_core(raw_pykka_same_work),
        # As a daemon runs (runtime.cpu_core = "auto"): every thread on one core.
        "runtime": on_one_core(runtime_offline),
        "runtime, no trace": on_one_core(runtime_untraced),
        "runtime + journal": on_one_core(_journaled),
        # What that placement buys: the runtime left to the scheduler, on every core.
        "runtime, every core": runtime_offline,
    }
    sizes = {name: sized(one, seconds=seconds) for name, one in variants.items()}
    runs: dict[str, list[Run]] = {name: [] for name in variants}
    for _ in range(repeats):
        for name, one in variants.items():
            runs[name].append(one(sizes[name]))
    best = {name: median_run(r) for name, r in runs.items()}

    def steady(rate: float, journal: SqliteJournal | None) -> dict[str, Any]:
        @on_one_core
        def window(rate: float) -> Run:
            tally = Tally(expected=0)  # offered() sets how many it offers
            runtime = pipeline(OfflineEngine(), tally, journal)
            try:
                return offered(runtime, tally, rate=rate, seconds=LATENCY_SECONDS, journaled=journal is not None)
            finally:
                runtime.stop(drain=5)
        return latency_at(rate, window)

    peak = best["runtime + journal"].rate
    with tempfile.TemporaryDirectory() as tmp:  # what a daemon pays: its journal is always on
        journal = SqliteJournal(Path(tmp) / "journal.sqlite3")
        try:
            journaled_load = steady(peak * 0.5, journal)
            ladder = [{"of_peak": fraction, **steady(peak * fraction, journal)} for fraction in LADDER]
        finally:
            journal.close()
    ladder.append({"of_peak": 0.5, **journaled_load})
    within = None  # the highest load of the ladder at which p99 held, and at every load below it
    for rung in ladder:
        if rung["p99_ms"] > P99_TARGET_MS:
            break
        within = rung["per_second"]
    unjournaled_load = steady(best["runtime"].rate * 0.5, None)
    # The floor beside it: bare pykka doing the same work at the same rate (no journal), on one core too.
    raw_load = latency_at(journaled_load["per_second"],
                          on_one_core(lambda rate: raw_pykka_same_work(int(rate * LATENCY_SECONDS), rate)))
    return {
        "runs": {name: {**run.summary(), "spread_per_second": spread(runs[name])} for name, run in best.items()},
        # Like for like: both on one core. Beside it, raw pykka as the scheduler places it.
        "runtime_vs_same_work": best["runtime"].rate / best["raw pykka, same work, one core"].rate,
        "runtime_vs_same_work_every_core": best["runtime"].rate / best["raw pykka, same work"].rate,
        # A daemon with runtime.trace = false: nothing recorded, as raw pykka records nothing.
        "untraced_vs_same_work": best["runtime, no trace"].rate / best["raw pykka, same work, one core"].rate,
        "one_core_vs_every_core": best["runtime"].rate / best["runtime, every core"].rate,
        "runtime_vs_tuples": best["runtime"].rate / best["raw pykka, tuples"].rate,
        "journal_vs_none": best["runtime + journal"].rate / best["runtime"].rate,
        # What recording every hop of every request costs: 1 - traced / untraced.
        "trace_cost": 1 - best["runtime"].rate / best["runtime, no trace"].rate,
        "cpu_us_per_delivery": round(best["runtime"].cpu_us, 1),
        "journaled_cpu_us_per_delivery": round(best["runtime + journal"].cpu_us, 1),
        "offered_load": unjournaled_load,
        "journaled_offered_load": journaled_load,
        "raw_same_work_offered_load": raw_load,
        # Latency and CPU with the journal at steady loads up to half the burst's peak,
        # and the highest of them whose p99 stays within the target (None: not one).
        "journaled_ladder": ladder,
        "journaled_rate_within_p99_target": within,
        "p99_target_ms": P99_TARGET_MS,
        # What the machine charges for a hand-off, and for work on a core gone idle (harness).
        "machine_costs": machine_costs(),
    }


def latency_at(rate: float, window: Callable[[float], Run]) -> dict[str, Any]:
    """Latency at ``rate`` offered: ``LATENCY_WINDOWS`` windows, each a fresh ``window(rate)``;
    the median window's figures. One window's p99 rests on its slowest 1% (a few dozen
    deliveries): on a VM it moves between 3 and 10 ms from one window to the next."""
    windows = []
    for _ in range(LATENCY_WINDOWS):
        run = window(rate)
        windows.append((round(run.percentile(0.99) * 1000, 2), round(run.percentile(0.5) * 1000, 2), run.cpu_us))
    windows.sort()
    p99, p50, cpu_us = windows[len(windows) // 2]
    # The share of its one core the process kept busy at this load (CPU per delivery × rate).
    return {"per_second": round(rate, 1), "warm_up_s": WARM_UP_SECONDS, "p50_ms": p50, "p99_ms": p99,
            "p99_ms_windows": [w[0] for w in windows],
            "cpu_us_per_delivery": round(cpu_us, 1), "core_busy": round(cpu_us * rate / 1e6, 3)}


# ---------------------------------------------------------------- 3. bound by LLM latency


def latency_bound(levels: list[int], latency: float, max_in_flight: int) -> dict[str, Any]:
    """Deliveries/s against chats in parallel, with a fake LLM that takes ``latency`` s (in
    a process of its own, as a real LLM would be: it does not share our interpreter)."""
    points = []
    llm, port = _serve("autoresponse.testing.fake_llm", "--delay", str(latency))
    try:
        for chats in levels:
            tally = Tally(expected=2 * chats)
            engine = HttpEngine(f"http://127.0.0.1:{port}/v1", model="fake", max_in_flight=max_in_flight)
            runtime = pipeline(engine, tally)
            runtime.io.add_closer(engine.aclose)
            try:
                run = drive(runtime, tally, chats=chats, per_chat=2, in_turn=True, timeout=600)
            finally:
                runtime.stop(drain=5)
            target = 0.9 * min(chats, max_in_flight) / latency
            points.append({"chats": chats, "per_second": round(run.rate, 2), "target": round(target, 2),
                           "met": run.rate >= target, "order_kept": run.in_order,
                           "one_at_a_time": round(1 / latency, 2), **run.summary()})
    finally:
        llm.terminate()
        llm.wait(30)
    return {"latency_s": latency, "max_in_flight": max_in_flight, "points": points}


# ---------------------------------------------------------------- 2. loopback HTTP


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(module: str, *args: str) -> tuple[subprocess.Popen[bytes], int]:
    """A fake server in a process of its own, once it accepts connections."""
    port = _free_port()
    return _listening([sys.executable, "-m", module, "--port", str(port), *args], port, module), port


def _listening(command: list[str], port: int, what: str) -> subprocess.Popen[bytes]:
    """``command`` started, once something accepts connections on ``port``."""
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    until = time.monotonic() + 20
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc
        except OSError:
            if time.monotonic() > until or proc.poll() is not None:
                proc.kill()
                raise RuntimeError(f"{what} did not start") from None
            time.sleep(0.05)


TOKEN = "1:BENCH"


def _telegram_context(n: int) -> OriginalContext:
    return OriginalContext(chat_id=100_000 + n, message_id=n, interface_name="telegram", chat_type="private")


def _ours(requests: int, concurrency: int, llm_url: str, telegram_url: str) -> Run:
    from autoresponse.actors.routes import sender
    from autoresponse.interfaces.telegram import (
        TelegramDelivery,
        TelegramSender,
        TelegramSettings,
        make_bot,
    )

    tally = Tally(expected=requests)
    engine = HttpEngine(llm_url, model="fake", max_in_flight=concurrency)
    runtime = pipeline(engine, tally)
    delivery = TelegramDelivery(make_bot(TelegramSettings(token=TOKEN, base_url=telegram_url)), parse_mode=None,
                                overall_per_second=1e9)  # the fake has no flood limit to respect
    runtime.io.run(delivery.start())
    runtime.io.add_closer(delivery.aclose)
    runtime.io.add_closer(engine.aclose)
    runtime.spawn(sender("telegram"), TelegramSender, delivery)
    try:
        cpu, started = time.process_time(), time.perf_counter()
        for n in range(requests):
            runtime.send("llm", UserRequest(text="hello", context=_telegram_context(n)))
        if not runtime.wait_idle(timeout=300):
            raise SystemExit("case 2: the runtime did not finish")
        return Run(requests, time.perf_counter() - started, [], time.process_time() - cpu)
    finally:
        runtime.stop(drain=5)


def _llm_body() -> dict[str, Any]:
    prompt = build_chat_request("hello", _telegram_context(0), allowed_actions=["message_telegram_bot"])
    return {"model": "fake", "messages": render_openai_messages(prompt)}


def _baseline(requests: int, concurrency: int, llm_url: str, telegram_url: str) -> Run:
    """The same two HTTP calls per request, written by hand on the libraries' defaults:
    aiohttp to the LLM, then python-telegram-bot's send_message (on httpx)."""
    import aiohttp
    from telegram import Bot

    body = _llm_body()

    async def run() -> Run:
        asking, sending = asyncio.Semaphore(concurrency), asyncio.Semaphore(TELEGRAM_MAX_CONCURRENT_SENDS)
        connector = aiohttp.TCPConnector(limit=concurrency)
        async with aiohttp.ClientSession(connector=connector) as session, Bot(TOKEN, base_url=telegram_url) as bot:

            async def one(n: int) -> None:
                async with asking, session.post(f"{llm_url}/chat/completions", json=body) as response:
                    content = (await response.json())["choices"][0]["message"]["content"]
                text = json.loads(content)["actions"][0]["payload"]["text"]
                async with sending:
                    await bot.send_message(chat_id=100_000 + n, text=text, reply_to_message_id=n,
                                           allow_sending_without_reply=True)

            cpu, started = time.process_time(), time.perf_counter()
            await asyncio.gather(*(one(n) for n in range(requests)))
            return Run(requests, time.perf_counter() - started, [], time.process_time() - cpu)

    return asyncio.run(run())  # the defaults, the loop included


def _on_the_runtimes_loop(coro: Any) -> Run:
    """Run a hand-written client on the kind of event loop the runtime runs (uvloop's,
    where installed): the comparison is of the code, not of the loops."""
    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        return runner.run(coro)  # type: ignore[no-any-return]


def _ceiling(requests: int, concurrency: int, llm_url: str, telegram_url: str) -> Run:
    """The loopback ceiling: plain aiohttp making the same two calls, nothing else."""
    import aiohttp

    body = json.dumps(_llm_body()).encode()

    async def run() -> Run:
        asking, sending = asyncio.Semaphore(concurrency), asyncio.Semaphore(TELEGRAM_MAX_CONCURRENT_SENDS)
        connector = aiohttp.TCPConnector(limit=concurrency + TELEGRAM_MAX_CONCURRENT_SENDS)
        async with aiohttp.ClientSession(connector=connector) as session:

            async def one(n: int) -> None:
                async with asking, session.post(f"{llm_url}/chat/completions", data=body) as response:
                    content = json.loads(await response.read())["choices"][0]["message"]["content"]
                text = json.loads(content)["actions"][0]["payload"]["text"]
                async with sending, session.post(f"{telegram_url}{TOKEN}/sendMessage", json={
                        "chat_id": 100_000 + n, "text": text,
                        "reply_parameters": {"message_id": n, "allow_sending_without_reply": True}}) as sent:
                    json.loads(await sent.read())["result"]["message_id"]

            cpu, started = time.process_time(), time.perf_counter()
            await asyncio.gather(*(one(n) for n in range(requests)))
            return Run(requests, time.perf_counter() - started, [], time.process_time() - cpu)

    return _on_the_runtimes_loop(run())


def loopback_http(concurrency: int, repeats: int, *, seconds: float) -> dict[str, Any]:
    """Case 2: against fakes in their own processes, the three clients interleaved."""
    llm, llm_port = _serve("autoresponse.testing.fake_llm")
    telegram, telegram_port = _serve("autoresponse.testing.fake_telegram")
    llm_url, telegram_url = f"http://127.0.0.1:{llm_port}/v1", f"http://127.0.0.1:{telegram_port}/bot"
    # Each client on one core, as a daemon runs (the fakes, started before, on every core).
    variants = {"runtime": on_one_core(_ours), "asyncio + PTB defaults": on_one_core(_baseline),
                "plain aiohttp ceiling": on_one_core(_ceiling)}
    try:
        sizes = {name: sized(lambda n, one=one: one(n, concurrency, llm_url, telegram_url),
                             seconds=seconds, probe=300) for name, one in variants.items()}
        runs: dict[str, list[Run]] = {name: [] for name in variants}
        for _ in range(repeats):
            for name, one in variants.items():
                runs[name].append(one(sizes[name], concurrency, llm_url, telegram_url))
    finally:
        for proc in (llm, telegram):
            proc.terminate()
            proc.wait(10)
    best = {name: median_run(r) for name, r in runs.items()}
    return {
        "concurrency": concurrency,
        "runs": {name: {"per_second": round(run.rate, 1), "spread_per_second": spread(runs[name]),
                        "client_cpu_ms_per_delivery": round(run.cpu_us / 1000, 3)} for name, run in best.items()},
        "runtime_vs_ceiling": best["runtime"].rate / best["plain aiohttp ceiling"].rate,
        "runtime_vs_baseline": best["runtime"].rate / best["asyncio + PTB defaults"].rate,
    }


# ---------------------------------------------------------------- 4. scale, on the real daemon


def daemon_scale(chats: int, warm_up: int = 1_000) -> dict[str, Any]:
    """A real ``autoresponse run`` serving ``chats`` Telegram chats once each (fake Bot API,
    offline LLM), with its journal, chat memory and Telegram lanes: its threads, read from
    /proc, and its memory per idle chat once they are done."""
    from autoresponse.testing.fake_telegram import FakeTelegramServer

    with tempfile.TemporaryDirectory() as tmp, FakeTelegramServer() as telegram:
        port = _free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("AUTORESPONSE_")}
        env.update({"AUTORESPONSE_TELEGRAM__TOKEN": TOKEN, "AUTORESPONSE_TELEGRAM__BASE_URL": telegram.base_url,
                    "AUTORESPONSE_TELEGRAM__ALLOWED_USERS": "[7]", "AUTORESPONSE_TELEGRAM__POLL_TIMEOUT": "1",
                    "AUTORESPONSE_CONSOLE__ENABLED": "false",
                    "AUTORESPONSE_ADMIN__PORT": str(port), "AUTORESPONSE_DATA_DIR": tmp,
                    "AUTORESPONSE_LOG_LEVEL": "WARNING"})
        daemon = subprocess.Popen([sys.executable, "-m", "autoresponse", "run"], env=env,
                                  stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            _wait_healthy(port, daemon)

            def serve(first: int, count: int) -> float:
                started = time.perf_counter()
                for n in range(first, first + count):
                    telegram.push_text("hello", chat_id=n, user_id=7)
                until = time.monotonic() + 600
                while len(telegram.sent()) < first + count - 1_000_000:
                    if time.monotonic() > until:
                        raise SystemExit(f"case 4: only {len(telegram.sent())} answered")
                    time.sleep(0.2)
                return time.perf_counter() - started

            serve(1_000_000, warm_up)  # first-use allocations are not per-chat state
            time.sleep(1.0)
            before, threads_before = rss_kib(daemon.pid), threads_of(daemon.pid)
            peak_threads = threads_before
            seconds = 0.0
            for start in range(0, chats, 1_000):  # waves: the peak is the chats, not one burst
                seconds += serve(1_000_000 + warm_up + start, min(1_000, chats - start))
                peak_threads = max(peak_threads, threads_of(daemon.pid))
            time.sleep(1.0)
            after = rss_kib(daemon.pid)
        finally:
            daemon.terminate()
            daemon.wait(60)
    per_chat = (after - before) / chats
    return {"chats": chats, "threads": peak_threads, "rss_before_kib": before, "rss_after_kib": after,
            "kib_per_idle_chat": round(per_chat, 3), "per_second": round(chats / seconds, 1),
            "threads_met": peak_threads <= 64, "memory_met": per_chat <= 4}


def _wait_healthy(port: int, daemon: subprocess.Popen[bytes]) -> None:
    until = time.monotonic() + 60
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1):
                return
        except OSError:
            if daemon.poll() is not None or time.monotonic() > until:
                raise SystemExit("case 4: the daemon did not come up") from None
            time.sleep(0.1)


# ---------------------------------------------------------------- 6. soak


#: The soak's warm-up, in retention windows (see ``soak``).
WARM_UP_RETENTIONS = 4
#: The soak's offered load: this fraction of the peak it measures first. Half the peak (case
#: 1's latency) fell behind at moments on a shared 2-core machine (1,464 in flight), and the
#: rows waiting widened the window: the database stepped +11%.
SOAK_LOAD = 1 / 3
#: The measured part lasts at least this many retention windows: a run too short for it
#: (``--quick``) offers a lower rate, so that it shows the steady state all the same.
SOAK_RETENTIONS = 3
#: The burst that measures the peak, on a journal of its own.
SOAK_PEAK_PROBE = 10_000


def _soak_peak(retention: float) -> float:
    """Deliveries a second of the journaled pipeline in one burst (a fresh journal of its own,
    so that the burst's window does not size the soak's file)."""
    with tempfile.TemporaryDirectory() as tmp:
        journal = SqliteJournal(Path(tmp) / "peak.sqlite3", retention_seconds=retention,
                                compact_every=retention / 2)
        tally = Tally(expected=2**62, keep=False)
        runtime = pipeline(OfflineEngine(), tally, journal)
        try:
            started = time.perf_counter()
            for n in range(SOAK_PEAK_PROBE):
                runtime.accept("llm", request(n % 5_000, n), correlation_id=f"peak-{n}")
            until = time.monotonic() + 300
            while tally.count < SOAK_PEAK_PROBE:
                if time.monotonic() > until:
                    raise SystemExit(f"soak: the peak's burst, {tally.count} of {SOAK_PEAK_PROBE} answered")
                time.sleep(0.01)
            return SOAK_PEAK_PROBE / (time.perf_counter() - started)
        finally:
            runtime.stop(drain=5)
            journal.close()


def soak(deliveries: int, every: int, retention: float = 5.0) -> dict[str, Any]:
    """``deliveries`` through the journaled runtime at a steady offered rate, as a daemon
    under steady load, with a short retention so that the journal's periodic compaction
    (every half retention) is in play: RSS and the journal's files every ``every``.

    The rate is a third of the peak measured first (a burst on a journal of its own), lowered
    if need be so that the measured part lasts ``SOAK_RETENTIONS`` retention windows.
    Each delivery is offered on schedule, not in waves: a wave is accepted at once, its
    rows all sit in the journal together, and the file grows to the largest wave's
    window, which varied from run to run (the step of the runs before).

    What depends on the retention window: the database file holds the window's rows,
    rate × (retention + compaction interval) deliveries just before a compaction, and
    keeps its pages for reuse, so it is as large as the largest window it has held. A
    daemon's journal is bounded by its peak rate (with what waits, open) times its
    retention. What does not: the write-ahead log is checkpointed by SQLite every 1,000
    pages and compaction deletes in chunks of 500 rows, so the log stays near 4.5 MiB
    (1,000 pages and a chunk) at any rate or retention; and RSS, with nothing queued.
    A warm-up first runs the same load for ``WARM_UP_RETENTIONS`` retentions (the window
    fills by 1.5 of them; its rows are compacted away and their pages reused several
    times over); flat means every sample within ±10% of the first one, taken after it.
    """
    peak = _soak_peak(retention)
    rate = min(SOAK_LOAD * peak, deliveries / (SOAK_RETENTIONS * retention))
    compact_every = retention / 2
    samples: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "journal.sqlite3"
        journal = SqliteJournal(path, retention_seconds=retention, compact_every=compact_every)
        tally = Tally(expected=2**62, keep=False)  # a count: the harness must not grow either
        runtime = pipeline(OfflineEngine(), tally, journal)
        sent = 0
        schedule = time.perf_counter()

        def offer(until: int) -> None:
            """Send on schedule (one every 1 / rate seconds from the start) up to ``until`` sent."""
            nonlocal sent
            while sent < until:
                due = schedule + sent / rate
                if (now := time.perf_counter()) < due:
                    time.sleep(min(due - now, 0.001))
                    continue
                runtime.accept("llm", request(sent % 5_000, sent), correlation_id=f"soak-{sent}")
                sent += 1

        def size(suffix: str) -> int:
            file = Path(f"{path}{suffix}")
            return file.stat().st_size // 1024 if file.exists() else 0

        def sample(done: int, started: float) -> dict[str, Any]:
            gc.collect()
            db, wal, shm = size(""), size("-wal"), size("-shm")
            return {"deliveries": done, "seconds": round(time.perf_counter() - started, 1),
                    "rss_kib": rss_kib(), "journal_kib": db + wal + shm, "db_kib": db, "wal_kib": wal,
                    "in_flight": sent - tally.count}

        try:
            offer(round(rate * WARM_UP_RETENTIONS * retention))
            warm_up = {"deliveries": sent, "seconds": round(time.perf_counter() - schedule, 1)}
            first = sent
            started = time.perf_counter()
            samples.append(sample(0, started))
            while sent - first < deliveries:
                offer(min(sent + every, first + deliveries))
                samples.append(sample(sent - first, started))
            until = time.monotonic() + 300
            while tally.count < sent:
                if time.monotonic() > until:
                    raise SystemExit(f"soak: {tally.count} of {sent} answered")
                time.sleep(0.05)
        finally:
            runtime.stop(drain=5)
            journal.close()
    start = samples[0]

    def flat(key: str) -> bool:
        return all(abs(s[key] - start[key]) <= 0.1 * start[key] for s in samples)

    return {"deliveries": deliveries, "retention_s": retention, "compact_every_s": compact_every,
            "peak_per_second": round(peak, 1), "offered_per_second": round(rate, 1),
            "window_deliveries": round(rate * (retention + compact_every)), "warm_up": warm_up,
            "samples": samples, "rss_flat": flat("rss_kib"), "journal_flat": flat("journal_kib")}


# ---------------------------------------------------------------- 7. several daemons on NATS


def _start_nats(store: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = _free_port()
    binary = str(Path(sys.executable).parent / "nats-server")
    proc = _listening([binary, "-js", "-sd", str(store), "-a", "127.0.0.1", "-p", str(port)], port, "nats-server")
    return proc, f"nats://127.0.0.1:{port}"


def _cluster_point(workers: int, nats: bool, llm_url: str, in_flight: int, updates: int) -> dict[str, Any]:
    """``workers`` real daemons answering ``updates`` Telegram chats once each."""
    from autoresponse.testing.fake_telegram import FakeTelegramServer

    with tempfile.TemporaryDirectory() as tmp, FakeTelegramServer() as telegram:
        server, nats_url = _start_nats(Path(tmp)) if nats else (None, "")
        daemons: list[subprocess.Popen[bytes]] = []
        cores = sorted(os.sched_getaffinity(0))
        try:
            for n in range(workers):
                port = _free_port()
                env = {k: v for k, v in os.environ.items() if not k.startswith("AUTORESPONSE_")}
                env.update({"AUTORESPONSE_TELEGRAM__TOKEN": TOKEN, "AUTORESPONSE_TELEGRAM__BASE_URL": telegram.base_url,
                            "AUTORESPONSE_TELEGRAM__ALLOWED_USERS": "[7]", "AUTORESPONSE_TELEGRAM__POLL_TIMEOUT": "1",
                            "AUTORESPONSE_CONSOLE__ENABLED": "false", "AUTORESPONSE_EVENTS__ENABLED": "false",
                            "AUTORESPONSE_LLM__BASE_URL": llm_url, "AUTORESPONSE_LLM__STREAM": "false",
                            "AUTORESPONSE_LLM__MAX_IN_FLIGHT": str(in_flight),
                            "AUTORESPONSE_ADMIN__PORT": str(port), "AUTORESPONSE_DATA_DIR": f"{tmp}/d{n}",
                            "AUTORESPONSE_LOG_LEVEL": "WARNING",
                            # Each its own core, as docs/daemon.md asks of daemons that share a machine.
                            "AUTORESPONSE_RUNTIME__CPU_CORE": str(cores[n % len(cores)])})
                if nats:
                    env.update({"AUTORESPONSE_JOURNAL__BACKEND": "nats", "AUTORESPONSE_NATS__URL": nats_url,
                                "AUTORESPONSE_NATS__NODE": f"worker-{n}"})
                daemons.append(subprocess.Popen([sys.executable, "-m", "autoresponse", "run"], env=env,
                                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                                stderr=subprocess.DEVNULL))
                _wait_healthy(port, daemons[-1])

            def answer(first: int, count: int) -> float:
                started = time.perf_counter()
                for n in range(first, first + count):
                    telegram.push_text("hello", chat_id=n, user_id=7)
                until = time.monotonic() + 600
                while len({c.params["chat_id"] for c in telegram.sent()}) < first + count - 2_000_000:
                    if time.monotonic() > until:
                        raise SystemExit(f"case 7: only {len(telegram.sent())} answered")
                    time.sleep(0.05)
                return time.perf_counter() - started

            answer(2_000_000, 2 * workers * in_flight)  # warm-up: connections, first-use allocations
            pids = [d.pid for d in daemons]
            cpu_before = sum(cpu_seconds_of(p) for p in pids)
            nats_before = cpu_seconds_of(server.pid) if server else 0.0
            seconds = answer(2_000_000 + 2 * workers * in_flight, updates)
            daemon_cpu = sum(cpu_seconds_of(p) for p in pids) - cpu_before
            nats_cpu = (cpu_seconds_of(server.pid) - nats_before) if server else 0.0
        finally:
            for daemon in daemons:
                daemon.terminate()
            for daemon in daemons:
                daemon.wait(60)
            if server is not None:
                server.terminate()
                server.wait(30)
    return {"workers": workers, "backend": "nats" if nats else "sqlite", "updates": updates,
            "per_second": round(updates / seconds, 1), "seconds": round(seconds, 2),
            "daemon_cpu_ms_per_delivery": round(1000 * daemon_cpu / updates, 3),
            "nats_cpu_ms_per_delivery": round(1000 * nats_cpu / updates, 3)}


def cluster(levels: list[int], latency: float, in_flight: int, updates_per_worker: int) -> dict[str, Any]:
    """Case 7: 1, 2, 3 daemons sharing one bot through NATS JetStream on a load bound by
    LLM latency, beside one daemon on SQLite. Each daemon has ``in_flight`` LLM calls at
    once (kept under Telegram's 30 sends a second, which each daemon paces on its own)."""
    llm, llm_port = _serve("autoresponse.testing.fake_llm", "--delay", str(latency))
    llm_url = f"http://127.0.0.1:{llm_port}/v1"
    try:
        single = _cluster_point(1, False, llm_url, in_flight, updates_per_worker)
        points = []
        for workers in levels:
            point = _cluster_point(workers, True, llm_url, in_flight, updates_per_worker * workers)
            target = 0.9 * workers * in_flight / latency
            points.append({**point, "target": round(target, 1), "met": point["per_second"] >= target})
    finally:
        llm.terminate()
        llm.wait(30)
    return {"latency_s": latency, "in_flight_per_worker": in_flight, "cores": os.cpu_count(),
            "sqlite": single, "points": points,
            "nats_vs_sqlite_one_worker": round(points[0]["per_second"] / single["per_second"], 3),
            "round_trip_cpu_ms": round(points[0]["daemon_cpu_ms_per_delivery"]
                                       + points[0]["nats_cpu_ms_per_delivery"]
                                       - single["daemon_cpu_ms_per_delivery"], 3)}
