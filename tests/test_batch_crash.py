"""A builder crash in the middle of a batch: every output still delivered once, the
correlation finishes, the chat keeps answering."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from conftest import ask, console_text, system_messages, wait_for

from autoresponse import Application
from autoresponse.testing.fake_llm import FakeLLMServer, FakeResponse
from autoresponse.actors.routes import BUILDER, interface, sender
from autoresponse.interfaces.console import ConsoleInput
from autoresponse.messages import ActionOutput, Crash, Envelope, OutboundMessage

MakeApp = Callable[..., Application]

WAIT = 3.0  # batch_wait: `sleep 1.5` is in before it, `sleep 5` after it
COMMANDS = ("echo one", "sleep 1.5", "sleep 5")


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


def run_batch(app: Application, fake_llm: FakeLLMServer) -> Envelope:
    fake_llm.script(FakeResponse(content=json.dumps(
        {"actions": [{"type": "terminal", "payload": {"command": c}} for c in COMMANDS]})))
    envelope = app.runtime.send(interface("console"), ConsoleInput(text="run the three"))
    assert envelope is not None
    return envelope


def outputs(fake_llm: FakeLLMServer) -> list[list[Any]]:
    """The commands of each delivery turn, in order (None for a note)."""
    return [[o.get("command") for o in m["outputs"]] for m in system_messages(fake_llm, "output")]


@pytest.mark.parametrize("when", ["while gathering", "after the wait ran out"])
def test_a_builder_crash_mid_batch_loses_nothing_and_repeats_nothing(
    make_app: MakeApp, fake_llm: FakeLLMServer, when: str
) -> None:
    app = make_app(base_url=fake_llm.base_url, allowed=["echo", "sleep"], runtime={"batch_wait": WAIT})
    arrivals = Arrivals()
    unwatch = app.runtime.watch(BUILDER, arrivals)
    try:
        with app.runtime.probe(sender("console")) as out:
            started = run_batch(app, fake_llm)
            if when == "while gathering":
                wait_for(lambda: len(arrivals) == 2)  # `echo one` and `sleep 1.5` held, the wait on
            else:
                wait_for(lambda: outputs(fake_llm))  # delivered; `sleep 5` still running
                assert len(arrivals) == 2
            app.runtime.send(BUILDER, Crash(reason="mid batch"))
            assert app.runtime.wait_idle(started.correlation_id, 15), "the batch never finished"
            replies = out.bodies(OutboundMessage)
        assert app.runtime.cell(BUILDER).restarts == 1
    finally:
        unwatch()
    # What was done at the wait went out together, the rest on its own: each once.
    assert outputs(fake_llm) == [["echo one", "sleep 1.5", None], ["sleep 5"]]
    first = system_messages(fake_llm, "output")[0]
    assert "still running after 3s: `sleep 5`" in first["outputs"][2]["output"]
    assert len(replies) == 2
    # The wait is counted from the first output, not started again by the crash.
    delivered = [r.time for r in fake_llm.requests if r.messages[-1]["content"].startswith('{"system_message"')]
    assert delivered[0] - arrivals.times[0] < WAIT + 1.0
    assert app.runtime.dead_letters.letters() == []

    # The chat keeps answering.
    fake_llm.script(FakeResponse(content=json.dumps(
        {"actions": [{"type": "message_console", "payload": {"text": "still here"}}]})))
    ask(app, "are you there?", timeout=10)
    assert "still here" in console_text(app)
