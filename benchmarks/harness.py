"""The pieces the benchmark cases share: a null sender, a pipeline, timing helpers."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import autoresponse.interfaces  # noqa: F401  (registers the platforms' actions)
from autoresponse.actors import Runtime, TypedActor, handles
from autoresponse.actors.builder import AutoResponseBuilder
from autoresponse.actors.dispatcher import ActionDispatcher
from autoresponse.actors.journal import SendLedger, SqliteJournal
from autoresponse.actors.llm import LLMClient, LLMEngine
from autoresponse.actors.routes import BUILDER, DISPATCHER, LLM, sender
from autoresponse.messages import Envelope, OriginalContext, OutboundMessage, UserRequest


@dataclass
class Tally:
    """What the null sender saw: when each correlation was answered, in order per chat."""

    expected: int
    done: threading.Event = field(default_factory=threading.Event)
    answered: dict[str, float] = field(default_factory=dict)
    order: dict[Any, list[Any]] = field(default_factory=dict)
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
        tally.answered[env.correlation_id] = time.perf_counter()
        tally.order.setdefault(message.chat_id, []).append(message.reply_to_message_id)
        if tally.on_answer is not None:
            tally.on_answer(message.chat_id)
        if len(tally.answered) >= tally.expected:
            tally.done.set()


@dataclass
class Run:
    requests: int
    seconds: float
    latencies: list[float]
    in_order: bool = True

    @property
    def rate(self) -> float:
        return self.requests / self.seconds

    def percentile(self, q: float) -> float:
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")

    def summary(self) -> dict[str, float]:
        return {"requests": self.requests, "seconds": round(self.seconds, 3),
                "per_second": round(self.rate, 1), "p50_ms": round(self.percentile(0.5) * 1000, 2),
                "p99_ms": round(self.percentile(0.99) * 1000, 2)}


def pipeline(engine: LLMEngine, tally: Tally, journal: SqliteJournal | None = None,
             capacity: int = 100_000) -> Runtime:
    """The delivery path of the runtime: LLM client, dispatcher, builder, a null sender."""
    runtime = Runtime(mailbox_capacity=capacity).start()
    runtime.journal = journal
    runtime.spawn(sender("console"), NullSender, tally, journal)
    runtime.spawn(DISPATCHER, ActionDispatcher)
    runtime.spawn(LLM, LLMClient, engine)
    runtime.spawn(BUILDER, AutoResponseBuilder)
    return runtime


def drive(runtime: Runtime, tally: Tally, chats: int, per_chat: int, *, journaled: bool = False,
          in_turn: bool = False, timeout: float = 300.0) -> Run:
    """Send ``per_chat`` requests to each of ``chats`` chats and wait for every reply: all at
    once, or ``in_turn``, where each chat sends its next request once its reply is in."""
    sent_at: dict[str, float] = {}
    lock = threading.Lock()

    def send(chat: int, round_: int) -> None:
        ctx = OriginalContext(chat_id=chat, message_id=round_, interface_name="console")
        body = UserRequest(text=f"hello {round_}", context=ctx)
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
    started = time.perf_counter()
    for round_ in range(1 if in_turn else per_chat):
        for chat in range(chats):
            send(chat, round_)
    if not tally.done.wait(timeout):
        raise SystemExit(f"only {len(tally.answered)} of {tally.expected} answered in {timeout}s")
    elapsed = time.perf_counter() - started
    latencies = [tally.answered[c] - t for c, t in sent_at.items() if c in tally.answered]
    in_order = all(order == sorted(order) for order in tally.order.values())
    return Run(len(sent_at), elapsed, latencies, in_order)


def rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0

