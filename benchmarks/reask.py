"""Case 8: LLM calls per delivered reply (the re-ask rate), in the text and the tools
protocol, against a stand-in that adds an invalid action to 20% of its first answers.

The stand-in is the fake OpenAI-compatible server (real HTTP on 127.0.0.1); the runtime
is the real application with the console platform. A re-ask answers places: the stand-in,
told its valid action was delivered, answers "nothing more", so a mistake costs one call.
"""

from __future__ import annotations

import io
import time
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

from rich.console import Console as RichConsole

from autoresponse import Application, Settings
from autoresponse.actors.routes import CONVERSATIONS, sender
from autoresponse.interfaces.console import Console
from autoresponse.messages import OriginalContext, OutboundMessage, UserRequest
from autoresponse.testing.fake_llm import FakeLLMServer

MISTAKES = 0.2


def reask_rate(requests: int = 200, mistakes: float = MISTAKES) -> dict[str, Any]:
    """Calls and replies for ``requests`` chat turns in each protocol."""
    figures: dict[str, Any] = {"requests": requests, "mistakes": mistakes}
    for protocol in ("text", "tools"):
        figures[protocol] = _one(protocol, requests, mistakes)
    return figures


def _one(protocol: str, requests: int, mistakes: float) -> dict[str, Any]:
    with FakeLLMServer(mistakes=mistakes) as llm, TemporaryDirectory() as data:
        settings = Settings.load(
            data_dir=Path(data), admin={"enabled": False}, events={"enabled": False},
            terminal={"enabled": False}, memory={"enabled": False},
            llm={"base_url": llm.base_url, "model": "fake", "protocol": protocol, "stream": False},
            retry={"backoff_min": 0.0, "backoff_max": 0.0})
        app = Application(settings, console=Console(io.StringIO())).start()
        try:
            replies = 0
            with app.runtime.probe(sender("console")) as out:
                started = time.monotonic()
                # One chat each: a chat's burst would be merged into one turn.
                envelopes = [app.runtime.send(CONVERSATIONS, UserRequest(text=f"hello {n}", context=OriginalContext(
                    chat_id=f"chat-{n}", message_id=1, interface_name="console"))) for n in range(requests)]
                for envelope in envelopes:
                    assert envelope is not None and app.runtime.wait_idle(envelope.correlation_id, 60)
                seconds = time.monotonic() - started
                replies = sum(1 for m in out.bodies(OutboundMessage) if not m.notice and not m.preview)
            dead = len(app.runtime.dead_letters.letters())
        finally:
            app.stop()
        calls = len(llm.requests)
    return {"calls": calls, "replies": replies, "calls_per_reply": round(calls / max(1, replies), 3),
            "seconds": round(seconds, 2), "dead_letters": dead}


if __name__ == "__main__":
    RichConsole().print(reask_rate())
