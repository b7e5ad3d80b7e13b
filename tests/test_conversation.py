"""Conversation context: memory in every turn, one delivery turn per reply, no repeats,
chats by name, merged bursts, topics, silent turns."""

from __future__ import annotations

import dataclasses
import io
import json
import logging
import sqlite3
import time
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import Gate, ask, console_text, system_message, system_messages, wait_for

from autoresponse import Application, Settings
from autoresponse.actors.cancellation import is_cancelled
from autoresponse.actors.kernel import ManualClock
from autoresponse.actors.kernel.probe import Probe
from autoresponse.actors.kernel.testkit import InjectedFault
from autoresponse.actors.limits import CONVERSATION_POOL_SIZE
from autoresponse.actors.conversation import CANCELLED, FORGOTTEN, TurnEnded
from autoresponse.testing.fake_llm import FakeLLMServer, FakeResponse
from autoresponse.actors.memory import ConversationStore, estimate_tokens
from autoresponse.actors.prompts import SUGGESTED_RESPONSE_FORMAT
from autoresponse.actors.routes import CONVERSATIONS, sender
from autoresponse.interfaces.console import Console, ConsoleInput
from autoresponse.interfaces.events import EventStore, due_in
from autoresponse.interfaces.events.actions import EventPayload
from autoresponse.testing.fake_telegram import FakeTelegramServer
from autoresponse.messages import (
    MAX_MESSAGE_CHARS,
    Envelope,
    OriginalContext,
    OutboundMessage,
    UserRequest,
    parse_action,
)

MakeApp = Callable[..., Application]


def actions(*items: dict[str, Any]) -> FakeResponse:
    return FakeResponse(content=json.dumps({"actions": list(items)}))


def say(text: str, **payload: Any) -> dict[str, Any]:
    return {"type": "message_console", "payload": {"text": text, **payload}}


def chat_turns(llm: FakeLLMServer) -> list[Any]:
    """The LLM requests of chat turns (a user's text last, not a system message)."""
    return [r for r in llm.requests if system_message(r) is None]


def test_a_follow_up_sees_the_first_exchange_even_after_a_restart(fake_llm: FakeLLMServer, tmp_path: Path) -> None:
    def start() -> Application:
        settings = Settings.load(llm={"base_url": fake_llm.base_url}, admin={"enabled": False},
                                 events={"enabled": False}, console={"read_stdin": False},
                                 terminal={"enabled": True, "allowed_commands": ["df"]}, data_dir=tmp_path)
        return Application(settings, console=Console(io.StringIO())).start()

    first = start()
    ask(first, "run df -h")
    reply = console_text(first).split("bot    ↳#1 │ ")[1].split("\n")[0]
    first.stop()

    second = start()  # the memory is on disk: a restart loses none of it
    try:
        ask(second, "and in MB?")
    finally:
        second.stop()
    follow_up = chat_turns(fake_llm)[-1].messages
    assert [m["role"] for m in follow_up] == ["system", "user", "user", "assistant", "user"]
    assert follow_up[1]["content"] == "run df -h"
    assert follow_up[2]["content"].startswith("[ran `df -h`: exit 0]")  # a compact record, not the output
    assert follow_up[3]["content"].startswith(reply)  # the reply as delivered
    assert follow_up[4]["content"] == "and in MB?"


def test_a_delivery_turn_sees_the_earlier_turns_and_the_suggested_format(
    make_app: MakeApp, fake_llm: FakeLLMServer
) -> None:
    app = make_app(base_url=fake_llm.base_url)
    ask(app, "hello")
    ask(app, "run uptime")
    delivery = [r for r in fake_llm.requests if system_message(r) is not None][-1]
    roles = [m["role"] for m in delivery.messages]
    assert roles == ["system", "user", "assistant", "user", "user"]
    assert delivery.messages[1]["content"] == "hello"
    assert "Hello! I'm synth" in delivery.messages[2]["content"]
    assert delivery.messages[3]["content"] == "run uptime"
    assert SUGGESTED_RESPONSE_FORMAT in delivery.messages[0]["content"]
    assert system_message(delivery)["type"] == "output"


def test_two_commands_of_one_reply_come_back_in_one_delivery_turn_and_one_reply(
    make_app: MakeApp, fake_llm: FakeLLMServer
) -> None:
    fake_llm.script(actions({"type": "terminal", "payload": {"command": "echo one"}},
                            {"type": "terminal", "payload": {"command": "echo two"}}))
    app = make_app(base_url=fake_llm.base_url)
    with app.runtime.probe(sender("console")) as out:
        ask(app, "run both")
        replies = out.bodies(OutboundMessage)
    [delivery] = system_messages(fake_llm, "output")
    assert [o["command"] for o in delivery["outputs"]] == ["echo one", "echo two"]
    assert len(replies) == 1
    assert "echo one" in replies[0].text and "echo two" in replies[0].text


def test_a_command_still_running_at_the_wait_is_named_and_follows_on_its_own(
    make_app: MakeApp, fake_llm: FakeLLMServer, manual_clock: ManualClock, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The batch's wait is a timer on the runtime's (manual) clock; the slow command is a
    real process that ends only when the test opens its gate."""
    gate = Gate(tmp_path / "gate")
    fake_llm.script(actions({"type": "terminal", "payload": {"command": "echo quick"}},
                            {"type": "terminal", "payload": {"command": gate.command}}))
    # The command timeout is real time: generous, so a slow machine never kills the gated `cat`.
    monkeypatch.setenv("AUTORESPONSE_TERMINAL__TIMEOUT", "300")
    app = make_app(base_url=fake_llm.base_url, allowed=["echo", "cat"], runtime={"batch_wait": 30},
                   clock=manual_clock)
    with app.runtime.probe(sender("console")) as out:
        envelope = app.runtime.send("interface.console", ConsoleInput(text="run both"))
        assert envelope is not None
        assert manual_clock.wait_for_sleepers(1)  # `echo quick` is in: the wait for the rest began
        assert manual_clock.pending() == [30.0]
        manual_clock.advance(30)  # the wait is over while the gated `cat` still runs
        wait_for(lambda: system_messages(fake_llm, "output"))  # what was done went out, without it
        gate.open()
        assert app.runtime.wait_idle(envelope.correlation_id, timeout=15)
        replies = out.bodies(OutboundMessage)
    first, late = system_messages(fake_llm, "output")
    assert [o.get("command") for o in first["outputs"]] == ["echo quick", None]
    assert f"still running after 30s: `{gate.command}`" in first["outputs"][1]["output"]
    assert [o["command"] for o in late["outputs"]] == [gate.command]
    assert "let through" in late["outputs"][0]["output"]
    assert len(replies) == 2


def test_a_re_ask_that_rewords_a_delivered_message_sends_nothing_twice(
    make_app: MakeApp, fake_llm: FakeLLMServer, manual_clock: ManualClock
) -> None:
    fake_llm.script(actions(say("part one"), {"type": "teleport", "payload": {}}),
                    actions(say("Part one."), say("part two")))
    app = make_app(base_url=fake_llm.base_url, clock=manual_clock)  # the re-ask's delay: on the clock
    with app.runtime.probe(sender("console")) as out:
        ask(app, "two parts please", clock=manual_clock)
        sent = [m.text for m in out.bodies(OutboundMessage)]
    assert sent == ["part one", "part two"]


def test_a_different_message_in_a_re_ask_is_still_sent(
    make_app: MakeApp, fake_llm: FakeLLMServer, manual_clock: ManualClock
) -> None:
    fake_llm.script(actions(say("Your disk is fine"), {"type": "teleport", "payload": {}}),
                    actions(say("And the backup ran at noon")))
    app = make_app(base_url=fake_llm.base_url, clock=manual_clock)
    with app.runtime.probe(sender("console")) as out:
        ask(app, "status", clock=manual_clock)
        assert [m.text for m in out.bodies(OutboundMessage)] == ["Your disk is fine", "And the backup ran at noon"]


@pytest.fixture
def fake_telegram() -> Iterator[FakeTelegramServer]:
    with FakeTelegramServer() as server:
        yield server


@pytest.fixture
def bot(fake_llm: FakeLLMServer, fake_telegram: FakeTelegramServer, make_app: MakeApp) -> Application:
    return make_app(base_url=fake_llm.base_url, retry={"backoff_min": 0.01}, telegram={
        "token": "123456:TEST-TOKEN", "base_url": fake_telegram.base_url,
        "allowed_users": [7], "poll_timeout": 1})


def tg(text: str, **payload: Any) -> dict[str, Any]:
    return {"type": "message_telegram_bot", "payload": {"text": text, **payload}}


def test_a_chat_named_by_title_or_username_is_found_and_an_ambiguous_name_is_asked_back(
    bot: Application, fake_llm: FakeLLMServer, fake_telegram: FakeTelegramServer
) -> None:
    # The bot has seen a group titled "Ops" and private chats with @ops and @maintainers.
    fake_telegram.push_text("@synth_bot hi", chat_id=-100, user_id=7, chat_type="supergroup", title="Ops")
    fake_telegram.push_text("hi", chat_id=55, user_id=7, username="ops")
    fake_telegram.push_text("hi", chat_id=56, user_id=7, username="maintainers")
    wait_for(lambda: len(fake_telegram.sent()) == 3)
    assert bot.runtime.wait_idle(timeout=10)

    # A unique name resolves.
    fake_llm.script(actions(tg("the build is green", target="@maintainers")))
    fake_telegram.push_text("tell the maintainers", chat_id=42, user_id=7)
    wait_for(lambda: fake_telegram.sent(56) and len(fake_telegram.sent(56)) == 2)

    # An ambiguous one yields one error turn listing both; the LLM picks, that chat gets it.
    fake_llm.script(actions(tg("deploy at 5", target="ops")), actions(tg("deploy at 5", target=-100)))
    fake_telegram.push_text("tell ops", chat_id=42, user_id=7)
    wait_for(lambda: len(fake_telegram.sent(-100)) == 2)
    assert bot.runtime.wait_idle(timeout=10)
    [error] = system_messages(fake_llm, "error")
    assert "'Ops' (id -100)" in error["errors"][0] and "@ops (id 55)" in error["errors"][0]
    assert fake_telegram.sent(-100)[-1].params["text"] == "deploy at 5"
    assert len(fake_telegram.sent(55)) == 1  # only the first "hi"


@pytest.mark.parametrize("target", [-100, "-100", None])
def test_a_topic_payload_validates_and_the_reply_lands_in_that_topic(
    bot: Application, fake_llm: FakeLLMServer, fake_telegram: FakeTelegramServer, target: Any
) -> None:
    payload = {"text": "in the topic", "message_thread_id": 7, **({"target": target} if target else {})}
    assert parse_action({"type": "message_telegram_bot", "payload": payload}).payload.message_thread_id == 7
    fake_llm.script(actions(tg(**payload)))
    fake_telegram.push_text("@synth_bot post it", chat_id=-100, user_id=7, chat_type="supergroup",
                            forum=True, thread_id=3)
    [sent] = wait_for(lambda: fake_telegram.sent(-100))
    assert sent.params["message_thread_id"] == 7


def test_a_topic_in_a_private_chat_is_dropped_and_the_reply_lands_at_once(
    bot: Application, fake_llm: FakeLLMServer, fake_telegram: FakeTelegramServer
) -> None:
    """A small model copies the message id into message_thread_id: a private chat has no
    topics, so the field is dropped (the trace says so), and nobody is re-asked."""
    fake_llm.script(actions(tg("hi", message_thread_id=10005)))
    with bot.runtime.probe(sender("telegram")) as out:
        fake_telegram.push_text("hello", chat_id=42, user_id=7)
        [sent] = wait_for(lambda: fake_telegram.sent(42))
    assert sent.params["text"] == "hi" and "message_thread_id" not in sent.params
    assert len(fake_llm.requests) == 1 and system_messages(fake_llm, "error") == []
    notes = [n for hop in bot.runtime.trace(out.envelopes[0].correlation_id) for n in hop.get("notes", ())]
    assert any("cannot apply in this chat" in n for n in notes), notes


def _burst_during_a_slow_turn(make_app: MakeApp, fake_llm: FakeLLMServer, burst: list[str]) -> Application:
    """A console app whose first message ("slow one") takes the LLM 1.5 s to answer, and
    ``burst`` sent while it does; returned once all of it is over."""
    fake_llm.script(FakeResponse(delay=1.5, content=json.dumps({"actions": [say("first answer")]})))
    app = make_app(base_url=fake_llm.base_url)
    first = app.runtime.send("interface.console", ConsoleInput(text="slow one"))
    time.sleep(0.3)
    for text in burst:
        app.runtime.send("interface.console", ConsoleInput(text=text))
    assert first is not None and app.runtime.wait_idle(timeout=30)
    return app


def test_a_burst_that_arrives_during_a_turn_is_answered_together(
    make_app: MakeApp, fake_llm: FakeLLMServer
) -> None:
    app = _burst_during_a_slow_turn(make_app, fake_llm, ["and also", "one more thing", "last bit"])
    turns = chat_turns(fake_llm)
    assert [t.messages[-1]["content"] for t in turns] == ["slow one", "and also\none more thing\nlast bit"]
    printed = console_text(app)
    assert printed.count("bot    ↳#") == 2
    assert "bot    ↳#4 │" in printed  # threaded to the last of the three


def test_a_burst_longer_than_one_message_is_answered_over_several_turns_each_message_once(
    make_app: MakeApp, fake_llm: FakeLLMServer
) -> None:
    burst = [f"part {n} " + "x" * (MAX_MESSAGE_CHARS // 4) for n in range(10)]  # 2.5 messages' worth
    app = _burst_during_a_slow_turn(make_app, fake_llm, burst)
    asked = [t.messages[-1]["content"] for t in chat_turns(fake_llm)][1:]
    assert len(asked) > 1 and all(len(text) <= MAX_MESSAGE_CHARS for text in asked)
    assert [part for text in asked for part in text.split("\n")] == burst  # each once, in order
    assert app.runtime.dead_letters.letters() == []


def due_reminder(tmp_path: Path, description: str) -> tuple[Path, Callable[[], str]]:
    """A reminder of Ada's in the console, due 5 s ago, stored where the app will look (the
    data directory returned), and how to read its state from the store."""
    data = tmp_path / "data"
    store = EventStore(data / "events.sqlite3")
    owner = OriginalContext(chat_id="console", message_id=3, interface_name="console", user_name="ada",
                            original_command=f"remind me: {description}")
    date, at = due_in(-5)
    event = store.add(EventPayload(date=date, time=at, description=description), owner)
    store.close()

    def state() -> str:
        events = EventStore(data / "events.sqlite3")
        try:
            return events.get(event.id).state  # type: ignore[union-attr]
        finally:
            events.close()
    return data, state


def test_a_silent_event_sends_nothing_and_is_handled(
    make_app: MakeApp, fake_llm: FakeLLMServer, tmp_path: Path
) -> None:
    data, state = due_reminder(tmp_path, "nothing to say")
    fake_llm.script(FakeResponse(content='{"actions": []}'))
    app = make_app(base_url=fake_llm.base_url, data_dir=data, events={"check_seconds": 0.1})
    wait_for(lambda: state() == "delivered")
    assert "bot " not in console_text(app) and "note" not in console_text(app)
    [message] = system_messages(fake_llm, "event")
    assert message["original_context"]["user_name"] == "ada"  # the event's owner, never None
    assert len(fake_llm.requests) == 1  # no re-ask: silence was a valid answer


@pytest.mark.parametrize("nothing", [
    FakeResponse(content=""),
    FakeResponse(content="", reasoning="The reminder is due, so I should tell Ada to ...", finish_reason="length"),
], ids=["empty", "cut-off"])
def test_a_reminder_answered_with_nothing_is_asked_again_never_marked_delivered_unsent(
    make_app: MakeApp, fake_llm: FakeLLMServer, tmp_path: Path, nothing: FakeResponse
) -> None:
    """Only a whole ``{"actions": []}`` is a reminder's silence: an empty answer, or a
    reasoning model's cut off at its token limit, marked the reminder delivered unsent."""
    data, state = due_reminder(tmp_path, "stretch")
    fake_llm.script(nothing, actions(say("Time to stretch, Ada.")))
    app = make_app(base_url=fake_llm.base_url, data_dir=data, events={"check_seconds": 0.1})
    wait_for(lambda: state() == "delivered")
    assert "Time to stretch, Ada." in console_text(app)
    first, reask = fake_llm.requests
    assert "there is nothing to say" in system_message(reask)["errors"][-1]


def test_an_autonomous_turn_may_stay_silent_and_may_not_run_commands(
    make_app: MakeApp, fake_llm: FakeLLMServer
) -> None:
    fake_llm.script(FakeResponse(content='{"actions": []}'))
    app = make_app(base_url=fake_llm.base_url)
    ctx = OriginalContext(chat_id="public", message_id=1, interface_name="console", autonomous=True)
    with app.runtime.probe(sender("console")) as out:
        envelope = app.runtime.send(CONVERSATIONS, UserRequest(text="nice bot", context=ctx))
        assert envelope is not None and app.runtime.wait_idle(envelope.correlation_id, 10)
        assert out.bodies(OutboundMessage) == []
    [request] = fake_llm.requests
    assert [t["function"]["name"] for t in request.body["tools"]] == ["message_console"]
    assert app.runtime.dead_letters.letters() == []


def test_forget_clears_the_chats_memory(make_app: MakeApp, fake_llm: FakeLLMServer) -> None:
    app = make_app(base_url=fake_llm.base_url)
    ask(app, "my name is Ada")
    ask(app, "/forget")
    assert "I have forgotten our conversation" in console_text(app)
    ask(app, "what is my name?")
    last = chat_turns(fake_llm)[-1].messages
    assert [m["role"] for m in last] == ["system", "user"]  # nothing remembered before it


def test_a_forget_queued_before_a_cancel_still_clears_the_memory(
    make_app: MakeApp, fake_llm: FakeLLMServer
) -> None:
    fake_llm.script(actions(say("noted")), FakeResponse(hang=True))
    app = make_app(base_url=fake_llm.base_url, llm={"read_timeout": 60, "stream": False})
    assert app.memory is not None
    ask(app, "my password is hunter2")
    with app.runtime.probe(sender("console")) as out:
        running = app.runtime.send("interface.console", ConsoleInput(text="tell me a long story"))
        wait_for(lambda: len(fake_llm.requests) == 2)
        app.runtime.send("interface.console", ConsoleInput(text="/forget"))  # it waits for the story
        app.runtime.send("interface.console", ConsoleInput(text="/cancel"))
        assert running is not None and app.runtime.wait_idle(running.correlation_id, timeout=10)
        wait_for(lambda: len(out.bodies(OutboundMessage)) == 2)
        assert app.runtime.wait_idle(timeout=10)
        replies = sorted(m.text for m in out.bodies(OutboundMessage))
    assert replies == sorted([CANCELLED, FORGOTTEN])
    assert app.memory.history("console:console:") == []  # the password is gone


DRAGONS = "Write a long story about dragons"


def test_a_cancelled_turn_is_forgotten_and_the_next_question_is_not_answered_about_it(
    make_app: MakeApp, fake_llm: FakeLLMServer
) -> None:
    fake_llm.script(actions(say("Hi Ada.")), FakeResponse(hang=True), actions(say("An apple.")))
    app = make_app(base_url=fake_llm.base_url, llm={"read_timeout": 60, "stream": False})
    assert app.memory is not None
    ask(app, "hello, I am Ada")
    with app.runtime.probe(sender("console")) as out:
        story = app.runtime.send("interface.console", ConsoleInput(text=DRAGONS))
        wait_for(lambda: len(fake_llm.requests) == 2)  # its turn is under way
        app.runtime.send("interface.console", ConsoleInput(text="/cancel"))
        assert story is not None and app.runtime.wait_idle(story.correlation_id, timeout=10)
        wait_for(lambda: [m.text for m in out.bodies(OutboundMessage)] == [CANCELLED])
    ask(app, "Name a fruit.")
    fruit = chat_turns(fake_llm)[-1].messages
    assert [m["content"] for m in fruit[1:]] == ["hello, I am Ada", "Hi Ada.", "Name a fruit."]
    assert [(e.role, e.content) for e in app.memory.history("console:console:")] == [
        ("user", "hello, I am Ada"), ("assistant", "Hi Ada."),
        ("user", "Name a fruit."), ("assistant", "An apple.")]  # nothing of the dragons


def test_a_cancelled_turn_leaves_none_of_its_replies_in_the_memory(
    make_app: MakeApp, fake_llm: FakeLLMServer
) -> None:
    # The first reply is confirmed before the /cancel, the second only after it.
    fake_llm.script(actions(say("Chapter one."), say("Chapter two.")), actions(say("An apple.")))
    app = make_app(base_url=fake_llm.base_url)
    assert app.memory is not None
    chat = "console:console:"
    held: list[str] = []

    def hold_chapter_two(actor: str, env: Envelope) -> None:
        """The console's sender sends chapter two only once its turn is cancelled."""
        if (actor == sender("console") and isinstance(env.body, OutboundMessage)
                and env.body.text == "Chapter two."):
            held.append(env.correlation_id)
            wait_for(lambda: is_cancelled(app.runtime, env.correlation_id), timeout=20)

    app.runtime.fault = hold_chapter_two
    story = app.runtime.send("interface.console", ConsoleInput(text=DRAGONS))
    wait_for(lambda: held and len(app.memory.history(chat)) == 2)  # its message, chapter one
    ask(app, "/cancel")
    assert story is not None and app.runtime.wait_idle(story.correlation_id, timeout=10)
    assert app.memory.history(chat) == []  # nor chapter two, confirmed after the /cancel
    ask(app, "Name a fruit.")
    assert [m["content"] for m in chat_turns(fake_llm)[-1].messages[1:]] == ["Name a fruit."]
    assert [(e.role, e.content) for e in app.memory.history(chat)] == [
        ("user", "Name a fruit."), ("assistant", "An apple.")]


def fail_the_memory(path: Path, how: str) -> None:
    """Make the memory's SQLite file fail: every write refused as if the disk were full,
    or its chat index damaged (every read and write of a chat's memory fails)."""
    ConversationStore(path).close()
    db = sqlite3.connect(path)
    try:
        if how == "full":
            for table in ("memory", "chats"):
                db.execute(f"CREATE TRIGGER full_{table} BEFORE INSERT ON {table} "
                           "BEGIN SELECT RAISE(ABORT, 'database or disk is full'); END")
            db.commit()
            return
        [(page,)] = db.execute("SELECT rootpage FROM sqlite_master WHERE name = 'memory_chat'")
        [(page_size,)] = db.execute("PRAGMA page_size")
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        db.close()
    with path.open("r+b") as file:
        file.seek((page - 1) * page_size)
        file.write(b"\xff" * page_size)


@pytest.mark.parametrize("how", ["full", "damaged"])
def test_a_failing_memory_store_leaves_the_chat_without_memory_not_without_answers(
    make_app: MakeApp, fake_llm: FakeLLMServer, tmp_path: Path, caplog: pytest.LogCaptureFixture, how: str
) -> None:
    fail_the_memory(tmp_path / "data" / "memory.sqlite3", how)
    fake_llm.script(actions(say("Hi Ada.")), actions(say("Still here.")))
    app = make_app(base_url=fake_llm.base_url)
    with caplog.at_level(logging.WARNING, logger="autoresponse.conversation"):
        ask(app, "hello, I am Ada")
        ask(app, "are you there?")
    printed = console_text(app)
    assert "Hi Ada." in printed and "Still here." in printed
    assert "went wrong" not in printed
    assert app.runtime.dead_letters.letters() == []
    conversations = [c for c in app.runtime.cells if c.name.startswith(CONVERSATIONS)]
    assert conversations and all(c.restarts == 0 for c in conversations)  # no chat's queue was lost
    logged = [r.getMessage() for r in caplog.records if r.name == "autoresponse.conversation"]
    assert logged and all("console:console:" in line for line in logged)
    assert not any("Ada" in line or "are you there" in line for line in logged)  # no message text


def test_memory_stays_within_its_budget_dropping_the_oldest_first(tmp_path: Path) -> None:
    store = ConversationStore(tmp_path / "memory.sqlite3", max_tokens=500)
    try:
        for n in range(1000):
            store.append("console:console:", "user" if n % 2 == 0 else "assistant", f"turn number {n}")
        kept = store.history("console:console:")
        assert sum(e.tokens for e in kept) <= 500
        assert kept[-1].content == "turn number 999"
        numbers = [int(e.content.split()[-1]) for e in kept]
        assert numbers == list(range(numbers[0], 1000))  # the newest, contiguous: the oldest went
        assert numbers[0] > 900
        assert estimate_tokens("abcd" * 100) == 104
    finally:
        store.close()


def test_history_shows_a_chats_memory(make_app: MakeApp, tmp_path: Path) -> None:
    import subprocess
    import sys

    from conftest import environment

    app = make_app(data_dir=tmp_path / "data")
    ask(app, "hello there")
    app.stop()
    env = environment(AUTORESPONSE_DATA_DIR=str(tmp_path / "data"))
    listing = subprocess.run([sys.executable, "-m", "autoresponse", "history"], capture_output=True,
                             text=True, env=env, timeout=60)
    assert listing.returncode == 0 and "console:console:  (2 entries)" in listing.stdout
    shown = subprocess.run([sys.executable, "-m", "autoresponse", "history", "console", "--json"],
                           capture_output=True, text=True, env=env, timeout=60)
    entries = json.loads(shown.stdout)
    assert [(e["role"], e["kind"]) for e in entries] == [("user", "message"), ("assistant", "reply")]
    assert entries[0]["content"] == "hello there"
    missing = subprocess.run([sys.executable, "-m", "autoresponse", "history", "nobody"], capture_output=True,
                             text=True, env=env, timeout=60)
    assert missing.returncode == 1 and "no memory of chat 'nobody'" in missing.stderr


def test_forget_in_a_burst_takes_its_turn_and_leaves_nothing_before_it(
    make_app: MakeApp, fake_llm: FakeLLMServer
) -> None:
    fake_llm.script(FakeResponse(delay=1.0, content=json.dumps({"actions": [say("ack first")]})),
                    FakeResponse(delay=1.0, content=json.dumps({"actions": [say("ack password")]})))
    app = make_app(base_url=fake_llm.base_url)
    assert app.memory is not None
    chat = "console:console:"
    remembered_when_told: list[list[str]] = []

    def on_reply(env: Any) -> None:  # what memory holds the moment the user is told
        if isinstance(env.body, OutboundMessage) and env.body.text == FORGOTTEN:
            remembered_when_told.append([e.content for e in app.memory.history(chat)])

    stop_watching = app.runtime.watch(sender("console"), on_reply)
    try:
        with app.runtime.probe(sender("console")) as out:
            app.runtime.send("interface.console", ConsoleInput(text="first"))
            time.sleep(0.3)
            app.runtime.send("interface.console", ConsoleInput(text="my password is hunter2"))
            app.runtime.send("interface.console", ConsoleInput(text="/forget"))
            assert app.runtime.wait_idle(timeout=20)
            replies = [m.text for m in out.bodies(OutboundMessage)]
    finally:
        stop_watching()
    assert replies == ["ack first", "ack password", FORGOTTEN]  # in the chat's order
    assert remembered_when_told == [[]]
    assert app.memory.history(chat) == []
    # The message before /forget was answered on its own, not merged with it.
    assert [t.messages[-1]["content"] for t in chat_turns(fake_llm)] == ["first", "my password is hunter2"]

    ask(app, "what is my password?")
    assert [m["role"] for m in chat_turns(fake_llm)[-1].messages] == ["system", "user"]


@pytest.mark.parametrize("terminal", [True, False])
def test_the_offline_engine_offers_only_commands_it_can_run(make_app: MakeApp, terminal: bool) -> None:
    app = make_app(terminal=terminal)  # base_url None: the built-in offline engine
    ask(app, "hello")
    greeting = console_text(app)
    assert "Hello! I'm synth" in greeting
    assert ("`run df -h`" in greeting) is terminal
    if not terminal:
        assert "The terminal executor is off" in greeting


@pytest.mark.parametrize(("column", "value"), [("role", "robot"), ("content", b"\xff\xfe"), ("tokens", "many")])
def test_a_damaged_memory_row_is_left_out_and_the_chat_goes_on(
    make_app: MakeApp, fake_llm: FakeLLMServer, tmp_path: Path, column: str, value: object
) -> None:
    import sqlite3

    app = make_app(base_url=fake_llm.base_url, data_dir=tmp_path / "data")
    ask(app, "the first question")
    app.stop()
    with sqlite3.connect(tmp_path / "data" / "memory.sqlite3") as db:  # damaged by hand, or another version
        db.execute(f"UPDATE memory SET {column} = ? WHERE content = 'the first question'", (value,))
    again = make_app(base_url=fake_llm.base_url, data_dir=tmp_path / "data")
    ask(again, "the second question")
    ask(again, "the third question")
    assert again.runtime.dead_letters.letters() == []
    last = chat_turns(fake_llm)[-1].messages
    said = [m["content"] for m in last if m["role"] == "user"]
    assert "the second question" in said and said[-1] == "the third question"
    assert "the first question" not in said


def test_two_peoples_albums_sent_at_once_are_a_turn_each(
    make_app: MakeApp, fake_llm: FakeLLMServer, manual_clock: ManualClock
) -> None:
    """Albums two people send into a group at the same moment arrive interleaved: each
    person's album is one turn of its own (never one turn of both, nor a turn a photo)."""
    from autoresponse.messages import OriginalContext, UserRequest
    from autoresponse.messages.media import Attachment

    app = make_app(base_url=fake_llm.base_url, clock=manual_clock)
    for n, user in enumerate([1, 2, 1, 2, 1], start=1):
        context = OriginalContext(chat_id="group-1", message_id=n, interface_name="console", chat_type="group",
                                  user_id=user, user_name=f"user{user}")
        app.runtime.send(CONVERSATIONS, UserRequest(text=f"caption {user}-{n}", context=context,
                                                    media_group=f"album-{user}",
                                                    attachments=(Attachment(kind="photo", file_id=f"f{n}"),)))
    assert manual_clock.advance_until(lambda: len(fake_llm.requests) == 2 and app.runtime.inflight.count() == 0, 15)
    turns = sorted(r.messages[-1]["content"] for r in fake_llm.requests)
    assert turns[0].startswith("caption 1-1\ncaption 1-3\ncaption 1-5") and "caption 2" not in turns[0]
    assert turns[1].startswith("caption 2-2\ncaption 2-4") and "caption 1" not in turns[1]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_the_console_shows_control_characters_from_the_model_and_never_obeys_them(
    make_app: MakeApp, fake_llm: FakeLLMServer, stream: bool
) -> None:
    """An escape sequence in a reply cleared the operator's screen, or could rewrite a line
    above it; a bidi override reordered what they read."""
    answer = actions(say("done\x00 \x1b[2J\x1b]52;c;cm0gLXJm\x07 \u202eok\r\nnext line"))
    # Streamed slowly enough to be shown as it is written (a preview a second).
    fake_llm.script(dataclasses.replace(answer, piece=6, every=0.2) if stream else answer)
    app = make_app(base_url=fake_llm.base_url, llm={"stream": stream})
    ask(app, "tidy up")
    shown = console_text(app)
    assert not any(c in shown for c in "\x00\x1b\x07\r\u202e")
    assert "done\\x00 \\x1b[2J\\x1b]52;c;cm0gLXJm\\x07 \\u202eok" in shown
    assert shown.rstrip("\n").rsplit("\n", 1)[-1].endswith("│ next line")  # a line end stays one
    assert "\\x0d" not in shown  # CRLF is a line end, streamed or whole


def replies_to(out: Probe, chat: str) -> list[str]:
    """The texts sent to the console ``chat`` so far (its replies and notices, no previews)."""
    return [m.text for m in out.bodies(OutboundMessage) if m.chat_id == chat and not m.preview]


def a_chat_beside(chat: str) -> str:
    """A console chat whose messages the same conversation actor of the pool takes as
    ``chat``'s (the pool routes by chat)."""
    def child(name: str) -> int:
        return zlib.crc32(f"console:{name}:".encode()) % CONVERSATION_POOL_SIZE
    return next(f"other{n}" for n in range(1000) if child(f"other{n}") == child(chat))


def crash_once_on(text: str, crashed: list[str],
                  actor_of: dict[str, str]) -> Callable[[str, Envelope], None]:
    """A fault hook: the conversation actor handling a request of ``text`` crashes, once
    (its retry then goes through); the actor's name goes into ``crashed``, and the actor
    of each chat's requests into ``actor_of`` (by chat id)."""
    def fault(actor: str, env: Envelope) -> None:
        if actor.startswith(f"{CONVERSATIONS}.") and isinstance(env.body, UserRequest):
            actor_of[str(env.body.context.chat_id)] = actor
            if env.body.text == text and not crashed:
                crashed.append(actor)
                raise InjectedFault(f"injected fault in {actor}")
    return fault


def test_a_crash_caused_by_another_chat_keeps_a_chats_turns_in_order(
    make_app: MakeApp, fake_llm: FakeLLMServer
) -> None:
    def respond(body: dict[str, Any]) -> FakeResponse:
        said = body["messages"][-1]["content"] or ""
        return FakeResponse(delay=4 if said == "first" else 0,
                            content=json.dumps({"actions": [say(f"answer to {said!r}")]}))

    fake_llm.responder = respond
    app = make_app(base_url=fake_llm.base_url)
    crashed: list[str] = []
    actor_of: dict[str, str] = {}
    app.runtime.fault = crash_once_on("crash here", crashed, actor_of)
    with app.runtime.probe(sender("console")) as out:
        sent = [app.runtime.send("interface.console", ConsoleInput(text="first", chat_id="A"))]
        wait_for(lambda: len(fake_llm.requests) == 1)  # the first turn is under way
        for text in ("second", "third"):  # they wait for it, to be answered together
            sent.append(app.runtime.send("interface.console", ConsoleInput(text=text, chat_id="A")))
        sent.append(app.runtime.send("interface.console",
                                     ConsoleInput(text="crash here", chat_id=a_chat_beside("A"))))
        wait_for(lambda: crashed)
        assert not replies_to(out, "A")  # it crashed while the first turn ran
        for env in sent:
            assert env is not None and app.runtime.wait_idle(env.correlation_id, timeout=30)
        replies = replies_to(out, "A")
    assert crashed == [actor_of["A"]] and app.runtime.cell(crashed[0]).restarts == 1
    asked = [t.messages[-1]["content"] for t in chat_turns(fake_llm)]
    assert [a for a in asked if a != "crash here"] == ["first", "second\nthird"]
    assert replies == ["answer to 'first'", "answer to 'second\\nthird'"]


def test_a_cancel_after_a_crash_still_cancels_the_turn_under_way(
    make_app: MakeApp, fake_llm: FakeLLMServer
) -> None:
    fake_llm.script(FakeResponse(hang=True))
    app = make_app(base_url=fake_llm.base_url, llm={"read_timeout": 60, "stream": False})
    crashed: list[str] = []
    actor_of: dict[str, str] = {}
    app.runtime.fault = crash_once_on("crash here", crashed, actor_of)
    with app.runtime.probe(sender("console")) as out:
        story = app.runtime.send("interface.console", ConsoleInput(text="tell me a long story", chat_id="A"))
        wait_for(lambda: len(fake_llm.requests) == 1)
        app.runtime.send("interface.console", ConsoleInput(text="crash here", chat_id=a_chat_beside("A")))
        wait_for(lambda: crashed)
        app.runtime.send("interface.console", ConsoleInput(text="/cancel", chat_id="A"))
        assert wait_for(lambda: replies_to(out, "A")) == [CANCELLED]
        assert story is not None and app.runtime.wait_idle(story.correlation_id, timeout=30)
        again = app.runtime.send("interface.console", ConsoleInput(text="are you there?", chat_id="A"))
        assert again is not None and app.runtime.wait_idle(again.correlation_id, timeout=30)
        assert len(replies_to(out, "A")) == 2  # the chat goes on after its cancelled turn
    assert crashed == [actor_of["A"]] and app.runtime.cell(crashed[0]).restarts == 1


def test_a_turn_whose_end_is_lost_to_crashes_holds_its_chat_no_longer(
    make_app: MakeApp, fake_llm: FakeLLMServer
) -> None:
    fake_llm.script(actions(say("first answer")), actions(say("second answer")))
    app = make_app(base_url=fake_llm.base_url, supervision={"message_attempts": 2})
    crashes: list[str] = []

    def lose_the_first_turns_end(actor: str, env: Envelope) -> None:
        if isinstance(env.body, TurnEnded) and len(crashes) < 2:  # each attempt: a dead letter
            crashes.append(actor)
            raise InjectedFault(f"injected fault in {actor}")

    app.runtime.fault = lose_the_first_turns_end
    ask(app, "hello")
    [letter] = wait_for(lambda: app.runtime.dead_letters.letters())
    assert (letter.reason, letter.actor) == ("crash", crashes[0])
    with app.runtime.probe(sender("console")) as out:
        ask(app, "are you still there?")  # not held for ever behind a turn long over
        assert [m.text for m in out.bodies(OutboundMessage) if not m.preview] == ["second answer"]


def test_an_album_being_gathered_when_its_actor_crashes_is_still_one_turn(
    make_app: MakeApp, fake_llm: FakeLLMServer, manual_clock: ManualClock
) -> None:
    from autoresponse.messages.media import Attachment

    app = make_app(base_url=fake_llm.base_url, clock=manual_clock)
    crashed: list[str] = []
    actor_of: dict[str, str] = {}
    app.runtime.fault = crash_once_on("crash here", crashed, actor_of)
    for n in range(1, 4):
        context = OriginalContext(chat_id="A", message_id=n, interface_name="console", user_id=1)
        app.runtime.send(CONVERSATIONS, UserRequest(text=f"photo {n}", context=context, media_group="album",
                                                    attachments=(Attachment(kind="photo", file_id=f"f{n}"),)))
    beside = OriginalContext(chat_id=a_chat_beside("A"), message_id=9, interface_name="console", user_id=2)
    app.runtime.send(CONVERSATIONS, UserRequest(text="crash here", context=beside))
    wait_for(lambda: crashed)  # while the album is gathered: the clock has not moved
    assert manual_clock.advance_until(lambda: len(fake_llm.requests) == 2 and app.runtime.inflight.count() == 0, 15)
    asked = [r.messages[-1]["content"] for r in fake_llm.requests]
    [album] = [a for a in asked if a != "crash here"]  # one turn, each photo once, in order
    assert album.startswith("photo 1\nphoto 2\nphoto 3\n") and album.count("[photo") == 3
    assert crashed == [actor_of["A"]] and app.runtime.cell(crashed[0]).restarts == 1


def test_a_turn_resumed_after_a_stop_holds_its_message_once(fake_llm: FakeLLMServer, tmp_path: Path) -> None:
    """The stop's drain runs out while the LLM holds the turn: the next start resumes it
    from the journal. Its message is in the memory once, and the resumed request carries
    it once (not also as an earlier turn of the chat)."""
    def start() -> Application:
        settings = Settings.load(llm={"base_url": fake_llm.base_url, "read_timeout": 30},
                                 admin={"enabled": False}, events={"enabled": False},
                                 console={"read_stdin": False}, runtime={"drain_seconds": 0},
                                 data_dir=tmp_path)
        return Application(settings, console=Console(io.StringIO())).start()

    fake_llm.script(FakeResponse(hang=True))  # the first start never hears back
    first = start()
    story = first.runtime.accept("interface.console", ConsoleInput(text="tell me a story")).result(timeout=10)
    wait_for(lambda: chat_turns(fake_llm))
    first.stop()

    second = start()
    try:
        assert second.runtime.wait_idle(story.correlation_id, timeout=30)
    finally:
        second.stop()
    resumed = chat_turns(fake_llm)[-1].messages
    assert len(chat_turns(fake_llm)) == 2
    assert [m["content"] for m in resumed].count("tell me a story") == 1
    store = ConversationStore(tmp_path / "memory.sqlite3")
    try:
        said = [e.content for e in store.history("console:console:") if e.role == "user"]
    finally:
        store.close()
    assert said == ["tell me a story"]
