"""Chaos: every pipeline actor raises on 5% of its messages; nothing may vanish."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable

from conftest import console_text

from autoresponse import Application
from autoresponse.testing.fake_llm import FakeLLMServer
from autoresponse.actors.routes import interface, sender
from autoresponse.actors.kernel.testkit import FaultInjector
from autoresponse.interfaces.console import ConsoleInput
from autoresponse.messages import OutboundMessage

REQUESTS = 2000
PIPELINE = ["interface.console", "llm", "dispatcher", "executor.terminal", "builder", "sender.console"]


def test_two_thousand_deliveries_under_random_faults_are_each_delivered_once_or_dead_lettered(
    make_app: Callable[..., Application], fake_llm: FakeLLMServer
) -> None:
    app = make_app(
        base_url=fake_llm.base_url,
        allowed=["echo"],
        # A crash of the LLM client cancels every call its incarnation has in flight and asks
        # again; with 5% of messages crashing, 4 calls in flight keep that from snowballing.
        llm={"max_in_flight": 4},
        # Crashes are the point here: let supervisors restart as often as it takes, quickly.
        supervision={"max_restarts": 1_000_000, "backoff_min": 0.001, "backoff_max": 0.01},
    )
    faults = FaultInjector(actors=PIPELINE, rate=0.05, seed=2026)
    app.runtime.fault = faults
    sent = []
    with app.runtime.probe(sender("console")) as out:
        for n in range(REQUESTS):
            envelope = app.runtime.send(interface("console"),  # each its own chat: no turns merged
                                        ConsoleInput(text=f"run echo chaos-{n}", chat_id=f"chaos-{n}"))
            assert envelope is not None
            sent.append(envelope.correlation_id)
        assert app.runtime.wait_idle(timeout=240), f"{app.runtime.inflight.count()} still in flight"
        replies = [e for e in out.envelopes if isinstance(e.body, OutboundMessage) and not e.body.notice]

    dead = {d.correlation_id: d for d in app.runtime.dead_letters.letters()}
    printed = Counter(int(n) for n in re.findall(r"^bot +↳#(\d+) │", console_text(app), re.M))
    # Delivered means printed: map each printed reply back to its request.
    correlation_of = {e.body.reply_to_message_id: e.correlation_id for e in replies}
    delivered = Counter(correlation_of[n] for n in printed.elements())
    print(f"\nchaos: {len(faults.raised)} faults injected, {len(delivered)} delivered, "
          f"{len(dead)} dead-lettered: {Counter(d.reason for d in dead.values())}")

    assert len(faults.raised) > REQUESTS * 0.05 * 5  # the faults really were spread over the hops
    assert all(count == 1 for count in printed.values()), "a reply was printed twice"
    assert all(count == 1 for count in delivered.values()), "a request was answered twice"
    # An action that died is the one exception: its failed result goes on to the LLM, which answers.
    failed_actions = {d.correlation_id for d in app.runtime.dead_letters.letters() if d.actor == "executor.terminal"}
    assert not (set(delivered) & set(dead)) - failed_actions, "a request was both answered and dead-lettered"
    assert all(d.reason and (d.error or d.detail) for d in dead.values())
    missing = [c for c in sent if c not in delivered and c not in dead]
    assert missing == [], f"{len(missing)} requests vanished"
    restarts = {name: app.runtime.cell(name).restarts for name in PIPELINE}
    assert all(count > 0 for count in restarts.values()), restarts
