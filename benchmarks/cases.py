"""The benchmark cases. Each comparison runs side by side in the same process run."""

from __future__ import annotations

import asyncio
import gc
import json
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import pykka

from autoresponse.actors._loop import EventLoopThread
from autoresponse.actors.journal import SqliteJournal
from autoresponse.actors.llm import HttpEngine, OfflineEngine
from autoresponse.actors.llm.fake_server import FakeLLMServer
from autoresponse.interfaces.telegram.settings import TELEGRAM_MAX_CONCURRENT_SENDS
from autoresponse.messages import OriginalContext, UserRequest
from benchmarks.harness import Run, Tally, drive, pipeline, rss_kib

# ---------------------------------------------------------------- 1. in process


class _RawHop(pykka.ThreadingActor):
    """A bare pykka actor that forwards tuples; the first one also crosses the loop once."""

    def __init__(self, following: Any, loop: EventLoopThread | None = None, done: Any = None) -> None:
        super().__init__()
        self.following, self.loop, self.done = following, loop, done

    def on_receive(self, message: Any) -> None:
        kind, n = message
        if kind == "request" and self.loop is not None:
            me = self.actor_ref
            self.loop.submit(asyncio.sleep(0)).add_done_callback(lambda _: me.tell(("io", n)))
        elif self.following is not None:
            self.following.tell(("forward", n))
        else:
            self.done(n)


def raw_pykka(requests: int) -> Run:
    """The same hops as the runtime's delivery path (inbound → LLM actor, a loop round trip,
    → dispatcher → sender), carrying plain tuples and doing nothing else."""
    loop = EventLoopThread()
    loop.start()
    finished = threading.Event()
    answered: dict[int, float] = {}

    def done(n: int) -> None:
        answered[n] = time.perf_counter()
        if len(answered) == requests:
            finished.set()

    last = _RawHop.start(None, done=done)
    middle = _RawHop.start(last)
    first = _RawHop.start(middle, loop=loop)
    try:
        sent: dict[int, float] = {}
        started = time.perf_counter()
        for n in range(requests):
            sent[n] = time.perf_counter()
            first.tell(("request", n))
        finished.wait(120)
        elapsed = time.perf_counter() - started
    finally:
        for ref in (first, middle, last):
            ref.stop()
        loop.stop()
    return Run(requests, elapsed, [answered[n] - t for n, t in sent.items()])


def runtime_offline(requests: int, journal_dir: Path | None = None) -> Run:
    tally = Tally(expected=requests)
    journal = SqliteJournal(journal_dir / "journal.sqlite3") if journal_dir else None
    runtime = pipeline(OfflineEngine(), tally, journal)
    try:
        return drive(runtime, tally, chats=requests, per_chat=1, journaled=journal is not None)
    finally:
        runtime.stop(drain=5)
        if journal is not None:
            journal.close()


def in_process(requests: int, repeats: int) -> dict[str, Any]:
    """Case 1 and case 5: the runtime against raw pykka, and with the journal on and off.
    Runs are interleaved, and the median of each is kept, so machine noise hits all alike."""
    runs: dict[str, list[Run]] = {"raw pykka": [], "runtime": [], "runtime + journal": []}
    for _ in range(repeats):
        runs["raw pykka"].append(raw_pykka(requests))
        runs["runtime"].append(runtime_offline(requests))
        with tempfile.TemporaryDirectory() as tmp:
            runs["runtime + journal"].append(runtime_offline(requests, Path(tmp)))
    best = {name: sorted(r, key=lambda run: run.rate)[len(r) // 2] for name, r in runs.items()}
    return {
        "runs": {name: run.summary() for name, run in best.items()},
        "runtime_vs_raw": best["runtime"].rate / best["raw pykka"].rate,
        "journal_vs_none": best["runtime + journal"].rate / best["runtime"].rate,
    }


# ---------------------------------------------------------------- 3. bound by LLM latency


def latency_bound(levels: list[int], latency: float, max_in_flight: int) -> dict[str, Any]:
    """Deliveries/s against chats in parallel, with a fake LLM that takes ``latency`` s."""
    points = []
    with FakeLLMServer(delay=latency) as llm:
        for chats in levels:
            tally = Tally(expected=2 * chats)
            engine = HttpEngine(llm.base_url, model="fake", max_in_flight=max_in_flight)
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
    return {"latency_s": latency, "max_in_flight": max_in_flight, "points": points}


# ---------------------------------------------------------------- 4. scale


def scale(chats: int, wave: int = 1_000) -> dict[str, Any]:
    """Threads and memory with ``chats`` chats that were each active once and are now idle."""
    tally = Tally(expected=chats + wave)
    runtime = pipeline(OfflineEngine(), tally)
    try:
        for n in range(wave):  # warm up: first-use allocations are not per-chat state
            runtime.send("llm", UserRequest(text="hello", context=OriginalContext(
                chat_id=-1 - n, message_id=1, interface_name="console")))
        runtime.wait_idle(timeout=120)
        tally.answered.clear()
        gc.collect()
        before = rss_kib()
        threads_idle = threading.active_count()
        for start in range(0, chats, wave):  # waves, so the peak is the chats, not one burst
            for n in range(start, min(chats, start + wave)):
                runtime.send("llm", UserRequest(text="hello", context=OriginalContext(
                    chat_id=n, message_id=1, interface_name="console")))
            runtime.wait_idle(timeout=120)
        threads_busy = threading.active_count()
        gc.collect()
        after = rss_kib()
    finally:
        runtime.stop(drain=5)
    return {"chats": chats, "threads": max(threads_idle, threads_busy), "rss_before_kib": before,
            "rss_after_kib": after, "kib_per_idle_chat": round((after - before) / chats, 3),
            "threads_met": max(threads_idle, threads_busy) <= 64,
            "memory_met": (after - before) / chats <= 4}



# ---------------------------------------------------------------- 2. loopback HTTP


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(module: str) -> tuple[subprocess.Popen[bytes], int]:
    """A fake server in a process of its own, once it accepts connections."""
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", module, "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    until = time.monotonic() + 20
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc, port
        except OSError:
            if time.monotonic() > until or proc.poll() is not None:
                proc.kill()
                raise RuntimeError(f"{module} did not start") from None
            time.sleep(0.05)


TOKEN = "1:BENCH"


def _telegram_context(n: int) -> OriginalContext:
    return OriginalContext(chat_id=100_000 + n, message_id=n, interface_name="telegram", chat_type="private")


def _ours(requests: int, concurrency: int, llm_url: str, telegram_url: str) -> float:
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
        started = time.perf_counter()
        for n in range(requests):
            runtime.send("llm", UserRequest(text="hello", context=_telegram_context(n)))
        if not runtime.wait_idle(timeout=300):
            raise SystemExit("case 2: the runtime did not finish")
        return time.perf_counter() - started
    finally:
        runtime.stop(drain=5)


def _baseline(requests: int, concurrency: int, llm_url: str, telegram_url: str) -> float:
    """The same two HTTP calls per request, written by hand: aiohttp to the LLM, then
    python-telegram-bot's send_message, with the same concurrency."""
    import aiohttp

    from autoresponse.actors.prompts import build_chat_request, render_openai_messages
    from autoresponse.interfaces.telegram import TelegramSettings, make_bot

    prompt = build_chat_request("hello", _telegram_context(0), allowed_actions=["message_telegram_bot"])
    body = {"model": "fake", "messages": render_openai_messages(prompt)}

    async def run() -> float:
        # The same shape of concurrency as the runtime: `concurrency` LLM calls and as
        # many Telegram sends (TELEGRAM_MAX_CONCURRENT_SENDS) in flight.
        asking, sending = asyncio.Semaphore(concurrency), asyncio.Semaphore(TELEGRAM_MAX_CONCURRENT_SENDS)
        connector = aiohttp.TCPConnector(limit=concurrency)
        async with aiohttp.ClientSession(connector=connector) as session, make_bot(
                TelegramSettings(token=TOKEN, base_url=telegram_url)) as bot:

            async def one(n: int) -> None:
                async with asking, session.post(f"{llm_url}/chat/completions", json=body) as response:
                    content = (await response.json())["choices"][0]["message"]["content"]
                text = json.loads(content)["actions"][0]["payload"]["text"]
                async with sending:
                    await bot.send_message(chat_id=100_000 + n, text=text, reply_to_message_id=n,
                                           allow_sending_without_reply=True)

            started = time.perf_counter()
            await asyncio.gather(*(one(n) for n in range(requests)))
            return time.perf_counter() - started

    return asyncio.run(run())


def loopback_http(requests: int, concurrency: int, repeats: int) -> dict[str, Any]:
    """Case 2: the LLM client and the Telegram sender against fakes in their own processes,
    next to a hand-written asyncio client making the same calls; runs interleaved."""
    llm, llm_port = _serve("autoresponse.actors.llm.fake_server")
    telegram, telegram_port = _serve("autoresponse.interfaces.telegram.fake_server")
    llm_url, telegram_url = f"http://127.0.0.1:{llm_port}/v1", f"http://127.0.0.1:{telegram_port}/bot"
    ours, baseline = [], []
    try:
        for _ in range(repeats):
            baseline.append(requests / _baseline(requests, concurrency, llm_url, telegram_url))
            ours.append(requests / _ours(requests, concurrency, llm_url, telegram_url))
    finally:
        for proc in (llm, telegram):
            proc.terminate()
            proc.wait(10)
    ours.sort()
    baseline.sort()
    middle = repeats // 2
    return {"requests": requests, "concurrency": concurrency,
            "runtime_per_second": round(ours[middle], 1), "baseline_per_second": round(baseline[middle], 1),
            "runtime_vs_baseline": ours[middle] / baseline[middle]}


def scale_in_fresh_process(chats: int) -> dict[str, Any]:
    """Case 4 in a process of its own, so earlier cases' memory does not blur the figure."""
    code = f"import json; from benchmarks.cases import scale; print(json.dumps(scale({chats})))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                          cwd=Path(__file__).parent.parent)
    if done.returncode != 0:
        raise SystemExit(f"case 4 failed: {done.stderr[-500:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])
