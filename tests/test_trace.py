"""A trace for every request: each hop recorded, in causal order, with timings that add up."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from conftest import ask, environment, wait_for

from autoresponse import Application
from autoresponse.actors.kernel import ManualClock

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
