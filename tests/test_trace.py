"""A trace for every request: each hop recorded, in causal order, with timings that add up."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from conftest import ask, console_text, environment, wait_for
from pydantic import BaseModel

from autoresponse import Application
from autoresponse.actors.kernel import ManualClock, TypedActor, handles
from autoresponse.actors.kernel.testkit import Recorder, running
from autoresponse.messages import Envelope

ADMIN = {"enabled": True, "host": "127.0.0.1", "port": 0}


def cli(app: Application, *args: str) -> subprocess.CompletedProcess[str]:
    assert app.admin is not None
    return subprocess.run([sys.executable, "-m", "autoresponse", *args, "--url", app.admin.url],
                          check=False, capture_output=True, text=True, timeout=60, env=environment(COLUMNS="200"))


def test_one_request_is_traced_hop_by_hop_in_causal_order(make_app: Callable[..., Application]) -> None:
    app = make_app(admin=ADMIN)
    envelope = ask(app, "run date")
    done = cli(app, "trace", envelope.correlation_id, "--json")
    assert done.returncode == 0, done.stderr
    hops = json.loads(done.stdout)["hops"]
    steps = [(h["actor"].split(".")[0] if h["actor"].startswith("conversations") else h["actor"], h["type"])
             for h in hops]
    # The whole loop: the chat turn, the command, the delivery turn, the reply, remembered.
    assert steps[:4] == [("interface.console", "ConsoleInput"), ("conversations", "UserRequest"),
                         ("conversations", "UserRequest"), ("llm", "UserRequest")]
    for step in [("llm", "LLMReply"), ("dispatcher", "LLMReply"), ("executor.terminal", "ActionRequest"),
                 ("executor.terminal", "ActionResult"), ("builder", "ActionOutput"), ("llm", "LLMRequest"),
                 ("sender.console", "OutboundMessage"), ("conversations", "ReplyDelivered")]:
        assert step in steps, step
    assert steps.index(("executor.terminal", "ActionRequest")) < steps.index(("builder", "ActionOutput")) \
        < steps.index(("llm", "LLMRequest")) < steps.index(("sender.console", "OutboundMessage"))
    assert all(h["outcome"] == "handled" for h in hops)
    # Causal order, and timings that add up: each hop was queued while (or after) its cause
    # was handled, started after it was queued, ended after it started.
    by_id: dict[str, dict] = {}
    for hop in hops:
        cause = by_id.get(hop["causation_id"])
        if cause is not None:
            assert hop["queued"] >= cause["started"]
        assert hop["queued"] <= hop["started"] <= hop["ended"]
        by_id.setdefault(hop["message_id"], hop)
    assert all(h["causation_id"] in by_id or h is hops[0] for h in hops[1:] if h["causation_id"])
    pretty = cli(app, "trace", envelope.correlation_id)
    total = 1000 * (max(h["ended"] for h in hops) - min(h["queued"] for h in hops))
    assert f"{len(hops)} hops in {total:.1f} ms" in pretty.stdout
    assert "executor.terminal" in pretty.stdout and "OutboundMessage" in pretty.stdout


def test_a_finished_trace_is_kept_in_the_journal(make_app: Callable[..., Application], tmp_path: Path) -> None:
    app = make_app(data_dir=tmp_path / "data")
    envelope = ask(app, "hello")
    assert app.journal is not None and app.runtime.tracer is not None
    app.journal.mark_sent("flush").result(5)  # the journal writes in order: the trace is in
    in_memory = app.runtime.trace(envelope.correlation_id)
    app.runtime.tracer._traces.clear()  # as if it had left the memory: only the journal has it
    hops = app.runtime.trace(envelope.correlation_id)
    assert [h["type"] for h in hops][:2] == ["ConsoleInput", "UserRequest"]
    assert hops == in_memory  # kept as recorded, put together the same way when read back
    # A journal written before traces were kept as their events holds the hops themselves.
    app.journal.record_trace("from-an-older-version", in_memory).result(5)
    assert app.runtime.trace("from-an-older-version") == in_memory


def test_an_unknown_request_has_no_trace(make_app: Callable[..., Application]) -> None:
    app = make_app(admin=ADMIN)
    done = cli(app, "trace", "no-such-request")
    assert done.returncode == 2 and "no trace of 'no-such-request'" in done.stderr


def test_a_trace_shows_where_a_request_died(
    make_app: Callable[..., Application], fake_llm: Any, manual_clock: ManualClock
) -> None:
    # The LLM never answers with JSON: every re-ask is rejected until the retries give up.
    fake_llm.responder = lambda body: "not {json at all"
    app = make_app(base_url=fake_llm.base_url, clock=manual_clock)  # re-ask delays: timers on that clock
    envelope = ask(app, "hello", clock=manual_clock)
    hops = app.runtime.trace(envelope.correlation_id)
    [letter] = app.runtime.dead_letters.letters(envelope.correlation_id)
    [dead] = [h for h in hops if h["outcome"] == f"dead letter: {letter.reason}"]
    assert dead["message_id"] == letter.record["message_id"] and dead["type"] == letter.record["body_type"]


def test_a_finished_trace_costs_the_garbage_collector_nothing(make_app: Callable[..., Application]) -> None:
    """The traces kept for /trace (thousands) stay out of the collector's walks once their
    request has finished, or every collection walks them (they were the pipeline's p99),
    and they read back the same."""
    import gc

    app = make_app()
    envelope = ask(app, "run date")
    assert app.runtime.wait_idle(envelope.correlation_id, timeout=10)
    tracer = app.runtime.tracer
    assert tracer is not None
    events = tracer._traces[envelope.correlation_id]
    wait_for(lambda: all(type(event) is tuple for event in events))  # finished just after idle
    before = tracer.trace(envelope.correlation_id)
    gc.collect()
    assert events and not any(gc.is_tracked(event) for event in events)
    assert tracer.trace(envelope.correlation_id) == before
    assert all(hop["ended"] is not None for hop in before)


class Ping(BaseModel):
    n: int


class Held(TypedActor):
    """Holds each message until its gate opens (and says it has one in hand), then answers."""

    def __init__(self, gate: threading.Event, holding: threading.Event) -> None:
        super().__init__()
        self.gate, self.holding = gate, holding

    @handles
    def on_ping(self, ping: Ping, env: Envelope) -> None:
        self.holding.set()
        assert self.gate.wait(10)
        self.send("sink", Ping(n=ping.n * 10), cause=env)


def test_a_trace_read_in_flight_shows_what_is_handled_now_and_what_waits_behind_it() -> None:
    """A hop is recorded when it ends: one still being handled, or still queued, is read off
    its actor and its mailbox, so a stuck request shows where it is stuck."""
    gate, holding = threading.Event(), threading.Event()
    with running(("held", Held, gate, holding), ("sink", Recorder)) as rt:
        first = rt.send("held", Ping(n=1))
        assert first is not None
        second = rt.send("held", Ping(n=2), correlation_id=first.correlation_id)
        assert second is not None and holding.wait(10)
        now = {h["message_id"]: h for h in rt.trace(first.correlation_id)}
        assert set(now) == {first.message_id, second.message_id}
        handling, waiting = now[first.message_id], now[second.message_id]
        assert handling["actor"] == "held" and handling["queued"] <= handling["started"]
        assert handling["ended"] is None and handling["outcome"] is None
        assert waiting["actor"] == "held" and waiting["queued"] >= handling["queued"]
        assert waiting["started"] is None and waiting["ended"] is None
        gate.set()
        assert rt.wait_idle(timeout=10)
        hops = rt.trace(first.correlation_id)
        assert [(h["actor"], h["outcome"]) for h in hops] == [("held", "handled"), ("sink", "handled")] * 2
        assert [h["message_id"] for h in hops][::2] == [first.message_id, second.message_id]
        assert all(h["queued"] <= h["started"] <= h["ended"] for h in hops)


def test_traces_in_flight_stay_while_newer_ones_finish_and_the_oldest_finished_go_first() -> None:
    """A burst deeper than the traces kept must not forget a request's trace before it ends
    (its later hops would be lost, or start a partial trace that pushes out a whole one)."""
    from autoresponse.actors.kernel.trace import TraceRecorder

    tracer = TraceRecorder(keep=2, in_flight=3)

    def hop(correlation: str) -> None:
        env = Envelope.new(Ping(n=0), correlation_id=correlation)
        tracer.queued(env, "a")
        tracer.handled(tracer.now(), env, "Ping", "handled", "a")

    hop("slow")  # in flight throughout
    for correlation in ("one", "two", "three"):
        hop(correlation)
        tracer.finished(correlation)
    hop("slow")  # its later hop still lands in its trace
    assert tracer.correlations() == ["slow", "two", "three"]  # "one", the oldest finished, went
    assert len(tracer.trace("slow")) == 2 and tracer.trace("one") == []
    for correlation in ("four", "five", "six"):  # more in flight than it may hold: the oldest goes
        hop(correlation)
    assert tracer.correlations() == ["two", "three", "four", "five", "six"]


def test_dead_letters_that_never_went_anywhere_are_kept_as_finished_traces_not_in_flight_ones() -> None:
    """A message to no such actor, sent from outside, is never in flight, so its correlation
    never finishes: its trace is kept among the finished (the newest few), or a stream of
    them would fill the room kept for traces in flight."""
    from autoresponse.actors.kernel.trace import TraceRecorder

    tracer = TraceRecorder(keep=3, in_flight=1_000)
    sent = [Envelope.new(Ping(n=n)) for n in range(50)]
    for env in sent:
        tracer.dead_letter(env, "no such actor", "nobody")
    assert tracer.correlations() == [env.correlation_id for env in sent[-3:]]
    [hop] = tracer.trace(sent[-1].correlation_id)
    assert (hop["actor"], hop["type"], hop["outcome"]) == ("nobody", "Ping", "dead letter: no such actor")
    assert hop["queued"] == hop["ended"] and hop["started"] is None


class FailsFirst(TypedActor):
    """Crashes on a message's first attempt, and on every one of ``Ping(n=0)`` while ``failing``
    is set; else passes it on."""

    def __init__(self, failing: threading.Event) -> None:
        super().__init__()
        self.failing = failing

    @handles
    def on_ping(self, ping: Ping, env: Envelope) -> None:
        if env.attempt == 1 or (ping.n == 0 and self.failing.is_set()):
            raise RuntimeError("this attempt fails")
        self.send("sink", ping, cause=env)


def test_a_retried_attempt_and_a_replayed_dead_letter_are_hops_of_their_request() -> None:
    """A message's next attempt after a crash is a hop of its own; a dead letter replayed
    long after its trace was let go (for newer ones) starts its request's trace again."""
    from autoresponse.actors.kernel import Runtime
    from autoresponse.actors.kernel.trace import TraceRecorder
    from autoresponse.supervisors import (
        BackoffPolicy,
        ChildSpec,
        RestartIntensity,
        Strategy,
        Supervisor,
        SupervisorSpec,
    )

    failing = threading.Event()
    failing.set()
    rt = Runtime(message_attempts=2)
    rt.tracer = TraceRecorder(keep=2, in_flight=2, now=rt.clock.time)
    rt.dead_letters.observers = [rt.tracer.dead_letter]
    spec = SupervisorSpec("top", Strategy.ONE_FOR_ONE, [ChildSpec("flaky", FailsFirst, args=(failing,))],
                          intensity=RestartIntensity(max_restarts=100, period=60),
                          backoff=BackoffPolicy(min=0, max=0, jitter=0))
    with running(("sink", Recorder), ("top", Supervisor, spec), runtime=rt):
        retried = rt.send("flaky", Ping(n=1))
        assert retried is not None and rt.wait_idle(timeout=10)
        assert [(h["actor"], h["attempt"], h["outcome"]) for h in rt.trace(retried.correlation_id)] == [
            ("flaky", 1, "crash"), ("flaky", 2, "handled"), ("sink", 1, "handled")]

        dead = rt.send("flaky", Ping(n=0), correlation_id="dies")
        assert dead is not None
        wait_for(lambda: any(d.correlation_id == "dies" for d in rt.dead_letters.letters()))
        [letter] = [d for d in rt.dead_letters.letters() if d.correlation_id == "dies"]
        for n in range(3, 9):  # newer requests push its trace out
            rt.send("sink", Ping(n=n))
        assert rt.wait_idle(timeout=10) and "dies" not in rt.tracer.correlations()
        failing.clear()
        rt.replay(letter.id)
        assert rt.wait_idle(timeout=10)
        assert [(h["actor"], h["attempt"], h["outcome"]) for h in rt.trace("dies")] == [
            ("flaky", 3, "handled"), ("sink", 1, "handled")]


def test_a_daemon_with_runtime_trace_off_serves_and_says_it_keeps_no_trace(
    make_app: Callable[..., Application], tmp_path: Path
) -> None:
    from autoresponse.page import Feed, render_requests

    def lost_id(app: Application) -> str:
        [letter] = app.runtime.dead_letters.letters()
        return letter.correlation_id

    app = make_app(admin=ADMIN, runtime={"trace": False})
    envelope = ask(app, "run echo untraced-but-served")
    assert "untraced-but-served" in console_text(app)  # the user is answered all the same
    assert app.runtime.tracer is None and app.runtime.trace(envelope.correlation_id) == []
    # Each place that shows traces says why there is none, not "unknown".
    done = cli(app, "trace", envelope.correlation_id)
    assert done.returncode == 2 and "records none (runtime.trace = false)" in done.stderr
    status = cli(app, "status")
    assert status.returncode == 0 and "untraced" in status.stdout.splitlines()[0]
    assert json.loads(cli(app, "status", "--json").stdout)["traced"] is False
    lost = app.runtime.send("no-such-actor", "hello")  # a dead letter, for the page's table
    assert lost is None
    page = Feed(app.runtime).changes()
    assert "Not traced: runtime.trace = false." in page["requests"] and lost_id(app) in page["deadletters"]
    assert "#trace/" not in page["requests"] + page["deadletters"]  # no link to a trace there is not
    assert "#trace/" not in render_requests([envelope.correlation_id], [], traced=False)
    # Traced, as by default, the same request has its trace, and the status says nothing of it.
    traced = make_app(admin=ADMIN, data_dir=tmp_path / "traced")
    again = ask(traced, "run echo traced")
    assert cli(traced, "trace", again.correlation_id).returncode == 0
    assert "untraced" not in cli(traced, "status").stdout
    assert f"#trace/{again.correlation_id}" in render_requests([], [again.correlation_id])
