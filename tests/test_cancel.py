"""A user's /cancel (or "stop" in a private chat): the chat's request in progress is
cancelled at once, ahead of its queued turns: the LLM call aborted, a running command
killed with its process group, queued turns dropped, a pending approval called off, and
the user told in one line; through the journal, so a restart does not bring it back.

The fake LLM's ``hang`` and ``delay`` are the server's own time, not a timer of the
runtime: a test that waits for them keeps real time, and says so."""

from __future__ import annotations

import io
import json
import os
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import console_text, system_messages, wait_for

from autoresponse import Application, Settings
from autoresponse.actors.approvals import NOTHING_PENDING
from autoresponse.actors.conversation import CANCELLED, NOTHING_TO_CANCEL
from autoresponse.actors.kernel import ManualClock
from autoresponse.actors.llm.client import UNREACHABLE_NOTICE
from autoresponse.interfaces.console import Console, ConsoleInput
from autoresponse.messages import Envelope
from autoresponse.testing.fake_llm import FakeLLMServer, FakeResponse
from autoresponse.testing.fake_telegram import FakeTelegramServer

MakeApp = Callable[..., Application]


def actions(*items: dict[str, Any]) -> FakeResponse:
    return FakeResponse(content=json.dumps({"actions": list(items)}))


def say(text: str) -> FakeResponse:
    return actions({"type": "message_console", "payload": {"text": text}})


def type_in(app: Application, text: str) -> Envelope:
    envelope = app.runtime.send("interface.console", ConsoleInput(text=text))
    assert envelope is not None
    return envelope


def typed(app: Application, text: str) -> Envelope:
    """A line read from stdin: journaled first (the intake), as the daemon reads it."""
    return app.runtime.accept("interface.console", ConsoleInput(text=text)).result(timeout=10)


def replies(app: Application) -> list[str]:
    """What the bot said (its replies and notices), in order."""
    return [line.split("│ ", 1)[1] for line in console_text(app).splitlines()
            if line.startswith(("bot ", "note ")) and "│ " in line]


def chat_turns(llm: FakeLLMServer) -> list[str]:
    """The user's text of each chat turn the LLM was asked."""
    return [r.messages[-1]["content"] for r in llm.requests if "system_message" not in r.messages[-1]["content"]]


def child_processes(*argv: str) -> list[int]:
    """The pids of this process's children running exactly ``argv``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")[:-1]
            parent = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        if parent == os.getpid() and cmdline == [a.encode() for a in argv]:
            found.append(int(entry))
    return found


def group_gone(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False


def test_cancel_aborts_the_llm_call_and_the_chat_goes_on(make_app: MakeApp, fake_llm: FakeLLMServer) -> None:
    # The LLM never answers; the client would wait a minute for it.
    fake_llm.script(FakeResponse(hang=True))
    app = make_app(base_url=fake_llm.base_url, llm={"read_timeout": 60, "stream": False})
    slow = type_in(app, "a question the model never answers")
    wait_for(lambda: len(fake_llm.requests) == 1)
    type_in(app, "/cancel")
    assert app.runtime.wait_idle(slow.correlation_id, timeout=5), "the call was not aborted"
    wait_for(lambda: CANCELLED in replies(app))
    fake_llm.script(say("Hello again."))
    type_in(app, "hello?")  # the chat is not held up behind the aborted call
    wait_for(lambda: "Hello again." in replies(app))
    assert replies(app) == [CANCELLED, "Hello again."]  # one line, and no failure notice
    assert UNREACHABLE_NOTICE not in console_text(app)


def test_stop_in_a_private_chat_cancels_too(make_app: MakeApp, fake_llm: FakeLLMServer) -> None:
    fake_llm.script(FakeResponse(hang=True))
    app = make_app(base_url=fake_llm.base_url, llm={"read_timeout": 60, "stream": False})
    slow = type_in(app, "think hard")
    wait_for(lambda: len(fake_llm.requests) == 1)
    type_in(app, "Stop!")  # the console is a private chat
    assert app.runtime.wait_idle(slow.correlation_id, timeout=5)
    wait_for(lambda: replies(app) == [CANCELLED])
    assert chat_turns(fake_llm) == ["think hard"]  # "stop" was no request for the model


def test_cancel_kills_a_running_command_and_its_process_group(make_app: MakeApp, fake_llm: FakeLLMServer) -> None:
    fake_llm.script(actions({"type": "terminal", "payload": {"command": "sleep 30"}}))
    app = make_app(base_url=fake_llm.base_url, allowed=("sleep",))
    request = type_in(app, "wait half a minute")
    [pid] = wait_for(lambda: child_processes("sleep", "30"))
    pgid = os.getpgid(pid)
    assert pgid == pid and pgid != os.getpgid(0)  # a group of its own
    type_in(app, "/cancel")
    wait_for(lambda: group_gone(pgid), timeout=5)  # killed and reaped: nothing of it is left
    assert app.runtime.wait_idle(request.correlation_id, timeout=5)
    wait_for(lambda: replies(app) == [CANCELLED])
    assert system_messages(fake_llm, "output") == []  # its end was no output for the model
    assert len(fake_llm.requests) == 1


def test_cancel_drops_the_queued_turns(make_app: MakeApp, fake_llm: FakeLLMServer) -> None:
    fake_llm.script(FakeResponse(hang=True))
    app = make_app(base_url=fake_llm.base_url, llm={"read_timeout": 60, "stream": False})
    running = type_in(app, "first")
    wait_for(lambda: len(fake_llm.requests) == 1)
    queued = [type_in(app, "second"), type_in(app, "third")]  # they wait for the first
    type_in(app, "/cancel")  # it does not wait: it cancels the first and drops the others
    for envelope in (running, *queued):
        assert app.runtime.wait_idle(envelope.correlation_id, timeout=5)
    wait_for(lambda: replies(app) == [CANCELLED])
    fake_llm.script(say("Fourth answered."))
    type_in(app, "fourth")
    wait_for(lambda: "Fourth answered." in replies(app))
    assert chat_turns(fake_llm) == ["first", "fourth"]  # second and third were never asked
    assert replies(app) == [CANCELLED, "Fourth answered."]


def test_cancel_after_the_request_finished_says_there_is_nothing_to_cancel(
    make_app: MakeApp, fake_llm: FakeLLMServer
) -> None:
    fake_llm.script(say("Done already."))
    app = make_app(base_url=fake_llm.base_url)
    done = type_in(app, "something quick")
    assert app.runtime.wait_idle(done.correlation_id, timeout=10)
    cancel = type_in(app, "/cancel")
    assert app.runtime.wait_idle(cancel.correlation_id, timeout=10)
    assert replies(app) == ["Done already.", NOTHING_TO_CANCEL]


def test_cancel_on_telegram_answers_in_the_chat(
    fake_llm: FakeLLMServer, make_app: MakeApp, manual_clock: ManualClock
) -> None:
    with FakeTelegramServer(clock=manual_clock) as telegram:
        fake_llm.script(FakeResponse(hang=True))
        make_app(base_url=fake_llm.base_url, llm={"read_timeout": 60, "stream": False}, telegram={
            "token": "123456:TEST-TOKEN", "base_url": telegram.base_url, "allowed_users": [7],
            "poll_timeout": 1}, clock=manual_clock)
        telegram.push_text("a long question", chat_id=42, user_id=7)
        wait_for(lambda: len(fake_llm.requests) == 1)
        cancel = telegram.push_text("/cancel", chat_id=42, user_id=7)
        [sent] = wait_for(lambda: telegram.sent(42))
        assert sent.params["text"] == CANCELLED
        assert sent.params["reply_parameters"]["message_id"] == cancel["message_id"]


def test_cancel_during_a_streamed_reply_takes_back_what_the_chat_saw_of_it(
    fake_llm: FakeLLMServer, make_app: MakeApp
) -> None:
    """The half reply shown as it was written stayed above "Cancelled", reading as the answer."""
    answer = "Your disks are fine: the root filesystem is 41% full, and /home has 120 GB free."
    fake_llm.script(FakeResponse(content=json.dumps({"actions": [
        {"type": "message_telegram_bot", "payload": {"text": answer}}]}), piece=6, every=0.3))
    with FakeTelegramServer() as telegram:
        make_app(base_url=fake_llm.base_url, llm={"stream": True}, telegram={
            "token": "123456:TEST-TOKEN", "base_url": telegram.base_url, "allowed_users": [7],
            "poll_timeout": 1})
        telegram.push_text("how are my disks?", chat_id=42, user_id=7)
        [preview] = wait_for(lambda: telegram.sent(42))  # shown as it is written
        assert answer.startswith(preview.params["text"]) and preview.params["text"] != answer
        telegram.push_text("/cancel", chat_id=42, user_id=7)
        wait_for(lambda: [c for c in telegram.calls_to("deleteMessage") if c.ok])

        def shown() -> list[str]:
            texts = {c.message_id: c.params["text"] for c in telegram.sent(42)}
            for edit in telegram.calls_to("editMessageText"):
                if edit.ok:
                    texts[int(edit.params["message_id"])] = edit.params["text"]
            for deleted in telegram.calls_to("deleteMessage"):
                if deleted.ok:
                    texts.pop(int(deleted.params["message_id"]), None)
            return list(texts.values())

        assert wait_for(lambda: shown() == [CANCELLED])


def test_a_cancel_survives_a_restart(fake_llm: FakeLLMServer, tmp_path: Path, manual_clock: ManualClock) -> None:
    """The request is cancelled while its work still waits (a re-ask's delay, on the clock);
    the daemon stops before that wait ends. Its journal item says cancelled, so the next
    start does not bring it back."""
    def start() -> Application:
        settings = Settings.load(
            llm={"base_url": fake_llm.base_url, "stream": False}, admin={"enabled": False},
            events={"enabled": False}, console={"read_stdin": False}, data_dir=tmp_path,
            runtime={"drain_seconds": 0.2}, terminal={"enabled": True, "allowed_commands": ["echo"]})
        return Application(settings, console=Console(io.StringIO()), clock=manual_clock).start()

    # An action of no known type: the reply is rejected, and the LLM re-asked after a delay.
    fake_llm.script(actions({"type": "launch_rockets", "payload": {}}))
    first = start()
    request = typed(first, "launch the rockets")
    wait_for(lambda: manual_clock.sleepers >= 1)  # the re-ask waits on the clock
    typed(first, "/cancel")
    wait_for(lambda: replies(first) == [CANCELLED])
    first.stop()  # the re-ask's wait is cut short: left to itself, its item would resume
    with sqlite3.connect(tmp_path / "journal.sqlite3") as db:
        [(state,)] = db.execute("SELECT state FROM items WHERE correlation = ?", (request.correlation_id,))
    assert state == "cancelled"

    second = start()
    try:
        fake_llm.script(say("Hello."))
        hello = typed(second, "hello")
        assert manual_clock.advance_until(lambda: "Hello." in replies(second), 15)
        assert second.runtime.wait_idle(hello.correlation_id, timeout=10)
        # Nothing of the cancelled request came back: one ask before the restart, one after.
        assert chat_turns(fake_llm) == ["launch the rockets", "hello"]
        assert replies(second) == ["Hello."]
    finally:
        second.stop()


def test_cancel_calls_off_a_pending_approval(
    fake_llm: FakeLLMServer, tmp_path: Path, manual_clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AUTORESPONSE_TERMINAL__APPROVAL", "ask")

    def start() -> Application:
        settings = Settings.load(llm={"base_url": fake_llm.base_url}, admin={"enabled": False},
                                 events={"enabled": False}, console={"read_stdin": False}, data_dir=tmp_path,
                                 terminal={"enabled": True, "allowed_commands": ["echo"]})
        return Application(settings, console=Console(io.StringIO()), clock=manual_clock).start()

    fake_llm.script(actions({"type": "terminal", "payload": {"command": "echo never"}}))
    first = start()
    try:
        typed(first, "print never")
        wait_for(lambda: any("Approval needed" in r for r in replies(first)))
        cancel = typed(first, "/cancel")
        assert first.runtime.wait_idle(cancel.correlation_id, timeout=10)
        assert replies(first)[-1] == "Cancelled: `echo never` will not run."
    finally:
        first.stop()
    second = start()  # the cancel was journaled: nothing waits any more
    try:
        answer = typed(second, "/approve")
        assert second.runtime.wait_idle(answer.correlation_id, timeout=10)
        assert replies(second) == [NOTHING_PENDING]
        assert system_messages(fake_llm, "output") == []  # it never ran
    finally:
        second.stop()
