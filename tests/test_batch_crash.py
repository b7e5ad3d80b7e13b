"""A builder crash in the middle of a batch: every output still delivered once, the
correlation finishes, the chat keeps answering.

The batch's wait is a timer on the runtime's clock, a ManualClock here: the test ends the
wait by advancing it. The commands are real processes; the slow one (`cat` of a FIFO) is
still running when the wait ends, whatever the machine's load, because both the wait and
that command end only when the test says."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import Gate, ask, console_text, system_messages, wait_for

from autoresponse import Application
from autoresponse.actors.kernel import ManualClock
from autoresponse.testing.fake_llm import FakeLLMServer, FakeResponse
from autoresponse.actors.routes import BUILDER, interface, sender
from autoresponse.interfaces.console import ConsoleInput
from autoresponse.messages import ActionOutput, Crash, Envelope, OutboundMessage

MakeApp = Callable[..., Application]

WAIT = 30.0  # batch_wait, on the manual clock: `echo two` is in before it, the gated `cat` after it


class Arrivals:
    """The ActionOutputs delivered to the builder, with when they came."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.times: list[float] = []

    def __call__(self, env: Envelope) -> None:
        if isinstance(env.body, ActionOutput):
            with self._lock:
                self.times.append(time.monotonic())

    def __len__(self) -> int:
        with self._lock:
            return len(self.times)


def run_batch(app: Application, fake_llm: FakeLLMServer, commands: list[str]) -> Envelope:
    fake_llm.script(FakeResponse(content=json.dumps(
        {"actions": [{"type": "terminal", "payload": {"command": c}} for c in commands]})))
    envelope = app.runtime.send(interface("console"), ConsoleInput(text="run the three"))
    assert envelope is not None
    return envelope


def outputs(fake_llm: FakeLLMServer) -> list[list[Any]]:
    """The commands of each delivery turn, in order (None for a note)."""
    return [[o.get("command") for o in m["outputs"]] for m in system_messages(fake_llm, "output")]


@pytest.mark.parametrize("when", ["while gathering", "after the wait ran out"])
def test_a_builder_crash_mid_batch_loses_nothing_and_repeats_nothing(
    make_app: MakeApp, fake_llm: FakeLLMServer, manual_clock: ManualClock, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch, when: str,
) -> None:
    gate = Gate(tmp_path / "gate")
    # The command timeout is real time: generous, so a slow machine never kills the gated `cat`.
    monkeypatch.setenv("AUTORESPONSE_TERMINAL__TIMEOUT", "300")
    app = make_app(base_url=fake_llm.base_url, allowed=["echo", "cat"],
                   runtime={"batch_wait": WAIT}, supervision={"backoff_min": 1, "backoff_max": 1, "backoff_jitter": 0}, clock=manual_clock)
    arrivals = Arrivals()
    unwatch = app.runtime.watch(BUILDER, arrivals)
    try:
        with app.runtime.probe(sender("console")) as out:
            started = run_batch(app, fake_llm, ["echo one", "echo two", gate.command])
            wait_for(lambda: len(arrivals) == 2)  # `echo one` and `echo two` are in
            assert manual_clock.wait_for_sleepers(1)  # the wait for the rest, from the first output
            manual_clock.advance(10)
            if when == "after the wait ran out":
                manual_clock.advance(WAIT - 10)
                wait_for(lambda: outputs(fake_llm))  # delivered; the gated `cat` still running
            app.runtime.send(BUILDER, Crash(reason="mid batch"))
            wait_for(lambda: manual_clock.pending() == [1.0])  # the restart's backoff, and nothing else
            manual_clock.advance(1)
            wait_for(lambda: app.runtime.cell(BUILDER).restarts == 1 and app.runtime.cell(BUILDER).alive)
            if when == "while gathering":
                # The new incarnation gathers the outputs again, and waits only what was left.
                wait_for(lambda: manual_clock.pending() == [WAIT - 11])
                manual_clock.advance(WAIT - 11)
            wait_for(lambda: outputs(fake_llm))  # what was done at the wait went out, without it
            gate.open()  # only now may the slow command end, and its output come on its own
            assert app.runtime.wait_idle(started.correlation_id, 15), "the batch never finished"
            replies = out.bodies(OutboundMessage)
        assert app.runtime.cell(BUILDER).restarts == 1
    finally:
        unwatch()
    # What was done at the wait went out together, the rest on its own: each once.
    assert outputs(fake_llm) == [["echo one", "echo two", None], [gate.command]]
    first, late = system_messages(fake_llm, "output")
    assert f"still running after 30s: `{gate.command}`" in first["outputs"][2]["output"]
    assert "let through" in late["outputs"][0]["output"]
    assert len(replies) == 2
    assert len(arrivals) == 3  # each output came once (the crash put held ones back, not anew)
    assert app.runtime.dead_letters.letters() == []

    # The chat keeps answering.
    fake_llm.script(FakeResponse(content=json.dumps(
        {"actions": [{"type": "message_console", "payload": {"text": "still here"}}]})))
    ask(app, "are you there?", timeout=10)
    assert "still here" in console_text(app)


def test_an_action_its_executor_fails_on_every_time_is_a_failed_result_of_its_batch(
        make_app: MakeApp, fake_llm: FakeLLMServer) -> None:
    """Two commands in one reply; the executor crashes on the second on every attempt. The
    first one's output does not wait for the batch's time to run out (on this manual clock,
    it never would) beside a second called "still running": the batch is delivered as soon
    as the second is a dead letter, which it reports as failed, and the user gets no notice
    to ask again (which would run the first one twice)."""
    from autoresponse.actors.failures import FAILURE_NOTICE
    from autoresponse.messages import ActionRequest

    broken = [True]

    def fault(actor: str, env: Envelope) -> None:
        body = env.body
        if broken[0] and isinstance(body, ActionRequest) and getattr(body.action.payload, "command", None) == "whoami":
            raise RuntimeError("an executor bug")

    clock = ManualClock()
    app = make_app(base_url=fake_llm.base_url, clock=clock,
                   supervision={"message_attempts": 2, "backoff_min": 0, "backoff_max": 0})
    app.runtime.fault = fault
    envelope = run_batch(app, fake_llm, ["uname -s", "whoami"])
    assert app.runtime.wait_idle(envelope.correlation_id, timeout=15)
    [delivery] = system_messages(fake_llm, "output")
    ran, died = delivery["outputs"]
    assert (ran["command"], ran["ok"], ran["output"].strip()) == ("uname -s", True, "Linux")
    assert (died["command"], died["ok"]) == ("whoami", False)
    assert died["output"].startswith("not carried out: executor.terminal failed on it (crash)")
    assert FAILURE_NOTICE not in console_text(app)
    [letter] = app.runtime.dead_letters.letters()  # the operator still sees what died, and why
    assert (letter.reason, letter.actor) == ("crash", "executor.terminal")

    # The cause fixed, the operator replays it: its output comes on its own, at once, and
    # nothing calls the first command, delivered long ago, still running.
    broken[0] = False
    replayed = app.runtime.replay(letter.id)
    assert replayed is not None and app.runtime.wait_idle(replayed.correlation_id, timeout=15)
    [_, again] = system_messages(fake_llm, "output")
    assert [(o["command"], o["ok"]) for o in again["outputs"]] == [("whoami", True)]
    assert clock.pending() == []  # no batch waiting for commands that are done


def test_a_builder_crash_while_it_delivers_a_batch_still_delivers_it_as_one_turn(
        make_app: MakeApp, fake_llm: FakeLLMServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """The builder crashes once as it delivers a complete batch (its memory failed, say):
    the outputs it held come back, and go to the LLM as one turn again, each once (they went
    one by one, one of them twice, once the batch counted as over before its delivery)."""
    from autoresponse.actors import builder as builder_module

    deliver = builder_module.AutoResponseBuilder._deliver_output
    crashed: list[bool] = []

    def crashing_once(self: Any, ctx: Any, results: Any, env: Envelope) -> None:
        results = tuple(results)
        if len(results) > 1 and not crashed:
            crashed.append(True)
            raise RuntimeError("the memory failed as the batch was delivered")
        deliver(self, ctx, results, env)

    monkeypatch.setattr(builder_module.AutoResponseBuilder, "_deliver_output", crashing_once)
    app = make_app(base_url=fake_llm.base_url, clock=ManualClock(),
                   supervision={"backoff_min": 0, "backoff_max": 0})
    envelope = run_batch(app, fake_llm, ["echo one", "echo two"])
    assert app.runtime.wait_idle(envelope.correlation_id, timeout=15)
    assert crashed and app.runtime.cell(BUILDER).restarts == 1
    assert outputs(fake_llm) == [["echo one", "echo two"]]
