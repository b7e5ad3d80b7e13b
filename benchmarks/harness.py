"""The pieces the benchmark cases share: a null sender, the pipeline, timed runs.

Every timed run lasts at least ``MIN_SECONDS`` (its size is calibrated first), is
repeated, and the median is kept; CPU is counted with ``time.process_time`` over
the whole process, so the work of every thread is in it.
"""

from __future__ import annotations

import os
import queue
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import autoresponse.interfaces  # noqa: F401  (registers the platforms' actions)
from autoresponse.actors.kernel import (
    Runtime,
    TypedActor,
    handles,
    run_on_all_cores,
    run_on_one_core,
    tune_heap_for_serving,
)
from autoresponse.actors.builder import AutoResponseBuilder
from autoresponse.actors.dispatcher import ActionDispatcher
from autoresponse.actors.extractor import extract_actions
from autoresponse.actors.journal import SendLedger, SqliteJournal
from autoresponse.actors.llm import LLMClient, LLMEngine
from autoresponse.actors.prompts import build_chat_request
from autoresponse.actors.routes import BUILDER, DISPATCHER, LLM, sender
from autoresponse.messages import Envelope, OriginalContext, OutboundMessage, UserRequest

T = TypeVar("T")

#: The shortest timed run; shorter ones measure noise.
MIN_SECONDS = 2.0
#: A steady load is offered this long before the deliveries that count: a pipeline just
#: started (its statements not yet prepared, its code not yet specialized, its journal's log
#: empty) is not the steady state, and its first tens of milliseconds were the slowest
#: 1% of a 3-second window at half the peak.
WARM_UP_SECONDS = 0.5


@dataclass
class Tally:
    """What the null sender saw: when each correlation was answered, in order per chat."""

    expected: int
    #: False: count the replies, keep nothing per reply (for long runs).
    keep: bool = True
    count: int = 0
    done: threading.Event = field(default_factory=threading.Event)
    answered: dict[str, float] = field(default_factory=dict)
    order: dict[Any, list[Any]] = field(default_factory=dict)
    #: Keep ``order`` (set by ``drive`` when a chat sends more than once): one list per
    #: chat otherwise, tens of thousands of them, that the collector walks in the runtime's
    #: time and that the bare-pykka baselines do not keep.
    ordered: bool = False
    #: Called with the chat id after each reply (in the sender's thread).
    on_answer: Callable[[Any], None] | None = None


class NullSender(TypedActor):
    """A sender that sends nothing: it records the time, and marks send keys like a real one."""

    def __init__(self, tally: Tally, journal: SqliteJournal | None = None) -> None:
        super().__init__()
        self.tally = tally
        self.ledger = SendLedger(journal)

    @handles
    def on_message(self, message: OutboundMessage, env: Envelope) -> None:
        if self.ledger.already_sent(message, 0):
            return
        self.ledger.confirm(message, 0)
        tally = self.tally
        tally.count += 1
        if tally.keep:
            tally.answered[env.correlation_id] = time.perf_counter()
            if tally.ordered:
                tally.order.setdefault(message.chat_id, []).append(message.reply_to_message_id)
        if tally.on_answer is not None:
            tally.on_answer(message.chat_id)
        if tally.count >= tally.expected:
            tally.done.set()


@dataclass
class Run:
    requests: int
    seconds: float
    latencies: list[float]
    cpu_seconds: float = 0.0
    in_order: bool = True

    @property
    def rate(self) -> float:
        return self.requests / self.seconds

    @property
    def cpu_us(self) -> float:
        """CPU of the whole process per delivery, in microseconds."""
        return 1e6 * self.cpu_seconds / self.requests

    def percentile(self, q: float) -> float:
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")

    def summary(self) -> dict[str, float]:
        return {"requests": self.requests, "seconds": round(self.seconds, 3),
                "per_second": round(self.rate, 1), "cpu_us_per_delivery": round(self.cpu_us, 1),
                "p50_ms": round(self.percentile(0.5) * 1000, 2), "p99_ms": round(self.percentile(0.99) * 1000, 2)}


def median_run(runs: list[Run]) -> Run:
    return sorted(runs, key=lambda run: run.rate)[len(runs) // 2]


def spread(runs: list[Run]) -> list[float]:
    return sorted(round(run.rate, 1) for run in runs)


def sized(one: Callable[[int], Run], *, seconds: float = MIN_SECONDS, probe: int = 500) -> int:
    """How many requests make ``one`` last at least ``seconds``: a short probe run first."""
    rate = one(probe).rate
    return max(probe, int(rate * seconds * 1.25))


def on_one_core(one: Callable[..., T]) -> Callable[..., T]:
    """``one``, its threads placed as ``autoresponse run`` places a daemon's
    (``runtime.cpu_core = "auto"``: every thread on one core, see actors.kernel.cores);
    the process has every core again after it."""
    def placed(*args: Any, **kwargs: Any) -> T:
        run_on_one_core()
        try:
            return one(*args, **kwargs)
        finally:
            run_on_all_cores()
    placed.__name__ = f"{one.__name__}_on_one_core"
    return placed


def pipeline(engine: LLMEngine, tally: Tally, journal: SqliteJournal | None = None,
             capacity: int = 100_000, *, trace: bool = True) -> Runtime:
    """The delivery path of the runtime: LLM client, dispatcher, builder, a null sender
    (every request traced hop by hop, as the daemon does, unless ``trace`` is off; the
    garbage collector set as the daemon sets it once started)."""
    runtime = Runtime(mailbox_capacity=capacity, max_open=1_000_000, trace=trace).start()
    runtime.journal = journal
    runtime.spawn(sender("console"), NullSender, tally, journal)
    runtime.spawn(DISPATCHER, ActionDispatcher)
    runtime.spawn(LLM, LLMClient, engine, 256)
    runtime.spawn(BUILDER, AutoResponseBuilder)
    tune_heap_for_serving()  # as the daemon does once started (autoresponse run)
    return runtime


def request(chat: Any, round_: int, interface: str = "console") -> UserRequest:
    return UserRequest(text=f"hello {round_}", context=OriginalContext(
        chat_id=chat, message_id=round_, interface_name=interface))


def drive(runtime: Runtime, tally: Tally, chats: int, per_chat: int, *, journaled: bool = False,
          in_turn: bool = False, timeout: float = 600.0) -> Run:
    """Send ``per_chat`` requests to each of ``chats`` chats and wait for every reply: all at
    once, or ``in_turn``, where each chat sends its next request once its reply is in."""
    sent_at: dict[str, float] = {}
    lock = threading.Lock()
    tally.ordered = per_chat > 1

    def send(chat: int, round_: int) -> None:
        body = request(chat, round_)
        if journaled:
            # Accepted concurrently, as interfaces do; the journal group-commits them.
            correlation = f"bench-{round_}-{chat}"
            runtime.accept(LLM, body, correlation_id=correlation)
        else:
            envelope = runtime.send(LLM, body)
            assert envelope is not None
            correlation = envelope.correlation_id
        with lock:
            sent_at[correlation] = time.perf_counter()

    rounds_sent = dict.fromkeys(range(chats), 1 if in_turn else per_chat)
    if in_turn:
        def next_request(chat: Any) -> None:
            if rounds_sent[chat] < per_chat:
                rounds_sent[chat] += 1
                send(chat, rounds_sent[chat] - 1)

        tally.on_answer = next_request
    cpu, started = time.process_time(), time.perf_counter()
    for round_ in range(1 if in_turn else per_chat):
        for chat in range(chats):
            send(chat, round_)
    if not tally.done.wait(timeout):
        raise SystemExit(f"only {len(tally.answered)} of {tally.expected} answered in {timeout}s")
    elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
    latencies = [tally.answered[c] - t for c, t in sent_at.items() if c in tally.answered]
    in_order = all(order == sorted(order) for order in tally.order.values())
    return Run(len(sent_at), elapsed, latencies, cpu, in_order)


def offered(runtime: Runtime, tally: Tally, rate: float, seconds: float, *, journaled: bool = False,
            warm_up: float = WARM_UP_SECONDS) -> Run:
    """Latency at a fixed offered load: ``rate`` requests a second, evenly spaced, for
    ``seconds`` after ``warm_up`` seconds of the same (not counted); each one's time from
    its send to its reply (not a burst's queue). ``journaled``: each is accepted as an
    interface does, journaled before it is handled. ``tally`` expects them all."""
    warm, count = int(rate * warm_up), int(rate * seconds)
    tally.expected = warm + count
    sent_at: dict[str, float] = {}
    started = time.perf_counter()
    cpu, counted_from = time.process_time(), started
    for n in range(warm + count):
        pace(started + n / rate)
        at = time.perf_counter()
        if n == warm:
            cpu, counted_from = time.process_time(), at
        if journaled:
            correlation = f"offered-{n}-{at}"
            runtime.accept(LLM, request(n, 1), correlation_id=correlation)
        else:
            envelope = runtime.send(LLM, request(n, 1))
            assert envelope is not None
            correlation = envelope.correlation_id
        if n >= warm:
            sent_at[correlation] = at
    if not tally.done.wait(60):
        raise SystemExit(f"offered load: only {len(tally.answered)} of {warm + count} answered")
    elapsed, cpu = time.perf_counter() - counted_from, time.process_time() - cpu
    return Run(count, elapsed, [tally.answered[c] - t for c, t in sent_at.items()], cpu)


#: Round trips timed by ``machine_costs``: back to back, and each after a pause.
HANDOFFS, HANDOFFS_FROM_IDLE = 4_000, 500
#: The pause before each round trip, or each piece of work, after idle: long enough for
#: the core to go idle (a delivery every 3 ms is a steady 333 a second).
IDLE_PAUSE = 0.003
#: A delivery's work timed back to back, and as many times each after a pause.
WORKS, WORKS_FROM_IDLE = 2_000, 300
#: The reply whose actions ``machine_costs`` extracts, as the dispatcher does.
_REPLY = '{"actions": [{"type": "message_console", "payload": {"text": "hello, here is the answer"}}]}'


def machine_costs() -> dict[str, float]:
    """What this machine charges for the pieces a delivery is made of, on one core, whatever
    the runtime's code (the floor under it):

    * ``round_trip_us``: CPU of a round trip between two threads both running (two switches);
    * ``wake_from_idle_us``: what a sleep on an idle core and the wake after it add to one
      (at a steady load, each delivery starts from one);
    * ``work_us`` and ``work_after_idle_us``: CPU of a slice of a delivery's own work (its
      prompt built, its reply's actions extracted), back to back, and each time after the
      core has been idle ``IDLE_PAUSE``: how much slower the same code runs on a core just
      back from idle (cold caches, or a core the host let slow down; from inside a VM the
      two look alike). At a steady load every thread of every delivery starts that way.
    """
    ping: queue.SimpleQueue[int | None] = queue.SimpleQueue()
    pong: queue.SimpleQueue[int] = queue.SimpleQueue()

    def echo() -> None:
        while (n := ping.get()) is not None:
            pong.put(n)

    def round_trips(count: int, pause: float) -> float:
        cpu = time.process_time()
        for n in range(count):
            if pause:
                time.sleep(pause)
            ping.put(n)
            pong.get()
        return 1e6 * (time.process_time() - cpu) / count

    def work() -> None:
        asked = request(1, 1)
        build_chat_request(asked.text, asked.context, allowed_actions=("message_console",))
        extract_actions(_REPLY, ("message_console",))

    def works(count: int, pause: float) -> float:
        spent = 0.0
        for _ in range(count):
            if pause:
                time.sleep(pause)
            started = time.thread_time()
            work()
            spent += time.thread_time() - started
        return 1e6 * spent / count

    @on_one_core
    def measure() -> dict[str, float]:
        thread = threading.Thread(target=echo, name="round-trip-echo")
        thread.start()
        try:
            busy = round_trips(HANDOFFS, 0.0)
            from_idle = round_trips(HANDOFFS_FROM_IDLE, IDLE_PAUSE)
        finally:
            ping.put(None)
            thread.join(10)
        works(WORKS // 10, 0.0)  # warm: the first calls build what later ones reuse
        return {"round_trip_us": round(busy, 1), "wake_from_idle_us": round(max(from_idle - busy, 0.0), 1),
                "work_us": round(works(WORKS, 0.0), 1), "work_after_idle_us": round(works(WORKS_FROM_IDLE, IDLE_PAUSE), 1),
                "idle_ms": IDLE_PAUSE * 1000}
    return measure()


def pace(due: float) -> None:
    """Wait until ``due`` (``time.perf_counter``), in steps of at most a millisecond."""
    while (now := time.perf_counter()) < due:
        time.sleep(min(due - now, 0.001))


def rss_kib(pid: int | str = "self") -> int:
    return _status_field(pid, "VmRSS")


def threads_of(pid: int | str = "self") -> int:
    return _status_field(pid, "Threads")


def cpu_seconds_of(pid: int | str = "self") -> float:
    """User plus system CPU of a process so far (from /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _status_field(pid: int | str, name: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{name}:"):
            return int(line.split()[1])
    return 0


def stats(values: list[float]) -> dict[str, float]:
    return {"median": round(statistics.median(values), 2), "min": round(min(values), 2),
            "max": round(max(values), 2)}
