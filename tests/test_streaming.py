"""Streamed replies: a slow answer is shown as it grows, then becomes the final reply.

Real time: the fake LLM streams in real time and the LLM client spaces its previews by the
runtime's clock, real here too, but for the quick reply's test, whose clock stands still, and
the tests of previews Telegram pushes back on, whose clock moves only as they move it."""

from __future__ import annotations

import itertools
import json
import logging
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from conftest import console_text, wait_for

from autoresponse import Application
from autoresponse.actors.kernel import ManualClock
from autoresponse.actors.llm.engine import LLMError
from autoresponse.testing.fake_llm import FakeLLMServer, FakeResponse
from autoresponse.actors.llm.http import HttpEngine
from autoresponse.actors.routes import interface, sender
from autoresponse.actors.streaming import preview_text, withdrawal
from autoresponse.interfaces.console import ConsoleInput
from autoresponse.interfaces.telegram import utf16_len
from autoresponse.interfaces.telegram.settings import TELEGRAM_PREVIEW_WITHDRAWN_TEXT
from autoresponse.messages import OriginalContext, OutboundMessage
from autoresponse.testing.fake_telegram import Call, FakeTelegramServer

CHAT, ALLOWED = 42, 7
ANSWER = ("Your disks are fine: the root filesystem is 41% full, /home has 120 GB free, "
          "and nothing else is mounted.")


def slowly(text: str, *, action: str = "message_telegram_bot", **more: object) -> FakeResponse:
    """A reply streamed in small pieces over about three seconds."""
    options = {k: more.pop(k) for k in ("unfinished",) if k in more}
    content = json.dumps({"actions": [{"type": action, "payload": {"text": text, **more}}]})
    return FakeResponse(content=content, piece=6, every=0.15, **options)  # type: ignore[arg-type]


def test_the_text_of_a_half_written_reply_is_read_without_waiting_for_its_end() -> None:
    start = '{"actions": [{"type": "message_telegram_bot", "payload": {"text": "Line one\\nand \\"quo'
    assert preview_text(start) == ("message_telegram_bot", 'Line one\nand "quo')
    assert preview_text(start[:-5] + "\\u00e") == ("message_telegram_bot", "Line one\nand ")
    assert preview_text('{"actions": [{"type": "message_x", "payload": {"text": "done"}, "x": 1') == (
        "message_x", "done")
    assert preview_text('{"actions": [{"type": "terminal", "payload": {"command": "ls"}}') is None
    assert preview_text("Sure! Here is") is None


async def test_a_stream_cut_short_is_an_error_not_half_a_reply(fake_llm: FakeLLMServer) -> None:
    fake_llm.script(FakeResponse(content="a whole sentence that never ends", piece=4, unfinished=True))
    seen: list[str] = []
    engine = HttpEngine(fake_llm.base_url, model="fake", max_attempts=1, stream=True)
    try:
        with pytest.raises(LLMError, match="stream ended before the reply did"):
            await engine.complete([{"role": "user", "content": "hi"}], seen.append)
    finally:
        await engine.aclose()
    assert seen and "a whole sentence that never ends".startswith(seen[-1])


async def test_a_whole_reply_is_answered_though_its_stream_stays_open(fake_llm: FakeLLMServer) -> None:
    """A proxy that keeps the stream open after the reply's end (no ``[DONE]``, no close):
    the reply is whole once its finish reason came, and is not lost to the read timeout."""
    fake_llm.script(FakeResponse(content="The capital of France is Paris.", piece=8, linger=True))
    seen: list[str] = []
    engine = HttpEngine(fake_llm.base_url, model="fake", max_attempts=1, stream=True, read_timeout=20.0)
    try:
        answer = await engine.complete([{"role": "user", "content": "capital of France?"}], seen.append)
    finally:
        await engine.aclose()
    assert answer == "The capital of France is Paris." and seen
    assert len(fake_llm.requests) == 1 and fake_llm.requests[0].body["stream"]


async def test_a_pause_in_a_stream_that_says_finished_on_every_chunk_loses_nothing(
    fake_llm: FakeLLMServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Some proxies put a finish reason on every chunk: the wait for what follows a whole
    reply only starts once a chunk says so and carries nothing more of it."""
    monkeypatch.setattr("autoresponse.actors.llm.http.LLM_STREAM_END_GRACE_SECONDS", 0.2)
    answer = "Part one of the answer. Part two, after the model paused."
    fake_llm.script(FakeResponse(content=answer, piece=30, every=0.6, finish_on_every_chunk=True))
    seen: list[str] = []
    engine = HttpEngine(fake_llm.base_url, model="fake", max_attempts=1, stream=True, read_timeout=20.0)
    try:
        assert await engine.complete([{"role": "user", "content": "tell me"}], seen.append) == answer
    finally:
        await engine.aclose()


@pytest.fixture
def telegram() -> Iterator[FakeTelegramServer]:
    with FakeTelegramServer() as server:
        yield server


def telegram_settings(telegram: FakeTelegramServer) -> dict[str, object]:
    return {"token": "123456:TEST-TOKEN", "base_url": telegram.base_url,
            "allowed_users": [ALLOWED], "poll_timeout": 1}


@pytest.fixture
def bot(fake_llm: FakeLLMServer, telegram: FakeTelegramServer, make_app: Callable[..., Application]) -> Application:
    return make_app(base_url=fake_llm.base_url, telegram=telegram_settings(telegram))


def shown(telegram: FakeTelegramServer) -> tuple[Call, list[Call]]:
    """The one message sent to the chat, and the edits made to it."""
    [first] = telegram.sent(CHAT)
    edits = [c for c in telegram.calls_to("editMessageText") if c.ok]
    assert {int(e.params["message_id"]) for e in edits} <= {first.message_id}
    return first, edits


def test_a_slow_reply_grows_in_one_telegram_message_and_ends_as_the_final_text(
    bot: Application, fake_llm: FakeLLMServer, telegram: FakeTelegramServer
) -> None:
    fake_llm.script(slowly(ANSWER))
    question = telegram.push_text("how are my disks?", chat_id=CHAT, user_id=ALLOWED)
    wait_for(lambda: any(c.params["text"] == ANSWER for c in telegram.calls_to("editMessageText")))
    assert bot.runtime.wait_idle(timeout=10)
    first, edits = shown(telegram)  # shown early, edited as it grew, never sent twice
    assert first.params["reply_parameters"]["message_id"] == question["message_id"]
    texts = [first.params["text"], *(e.params["text"] for e in edits)]
    assert len(texts) >= 2 and texts[-1] == ANSWER
    assert all(ANSWER.startswith(t) for t in texts) and texts == sorted(texts, key=len)
    times = [first.time, *(e.time for e in edits)]
    assert all(b - a >= 0.9 for a, b in itertools.pairwise(times))  # Telegram's one a second per chat
    assert fake_llm.requests[0].body["stream"] is True
    assert not telegram.calls_to("deleteMessage")


def test_a_quick_reply_is_just_sent(
    fake_llm: FakeLLMServer, telegram: FakeTelegramServer, make_app: Callable[..., Application],
    manual_clock: ManualClock,
) -> None:
    # Previews are paced by the runtime's clock. Standing still, it makes this answer quick
    # however long the real round trip takes on a loaded machine; the pieces still come over
    # real time, so the previewer does see the text grow (it is looked at every 0.1 s).
    bot = make_app(base_url=fake_llm.base_url, telegram=telegram_settings(telegram), clock=manual_clock)
    fake_llm.script(FakeResponse(content=slowly(ANSWER).content, piece=6, every=0.02))
    telegram.push_text("how are my disks?", chat_id=CHAT, user_id=ALLOWED)
    wait_for(lambda: telegram.sent(CHAT))
    assert bot.runtime.wait_idle(timeout=10)
    first, edits = shown(telegram)
    assert first.params["text"] == ANSWER and not edits


def test_a_shown_reply_that_turns_out_wrong_is_taken_back_and_the_corrected_one_sent(
    bot: Application, fake_llm: FakeLLMServer, telegram: FakeTelegramServer
) -> None:
    # The reply streams to the user's chat, but its target is a chat nobody knows:
    # the dispatcher rejects it, the preview is deleted, and the re-ask's answer is sent.
    fake_llm.script(slowly(ANSWER, target="@nobody_we_know"),
                    FakeResponse(content=json.dumps({"actions": [{"type": "message_telegram_bot",
                                                                  "payload": {"text": "Corrected."}}]})))
    telegram.push_text("tell nobody about my disks", chat_id=CHAT, user_id=ALLOWED)
    wait_for(lambda: [c for c in telegram.sent(CHAT) if c.params["text"] == "Corrected."])
    assert bot.runtime.wait_idle(timeout=10)
    preview, _corrected = telegram.sent(CHAT)
    [deleted] = telegram.calls_to("deleteMessage")
    assert int(deleted.params["message_id"]) == preview.message_id
    assert ANSWER.startswith(preview.params["text"]) and preview.params["text"] != ANSWER


def test_a_stream_cut_short_is_asked_again_and_its_preview_becomes_the_reply(
    bot: Application, fake_llm: FakeLLMServer, telegram: FakeTelegramServer
) -> None:
    fake_llm.script(slowly(ANSWER, unfinished=True), FakeResponse(content=slowly(ANSWER).content))
    telegram.push_text("how are my disks?", chat_id=CHAT, user_id=ALLOWED)
    wait_for(lambda: any(c.params["text"] == ANSWER for c in telegram.calls_to("editMessageText")))
    assert bot.runtime.wait_idle(timeout=10)
    _, edits = shown(telegram)
    assert edits[-1].params["text"] == ANSWER and len(fake_llm.requests) == 2
    assert not telegram.calls_to("deleteMessage")


def test_the_console_prints_a_slow_reply_as_it_is_written(
    fake_llm: FakeLLMServer, make_app: Callable[..., Application]
) -> None:
    app = make_app(base_url=fake_llm.base_url)
    fake_llm.script(slowly(ANSWER, action="message_console"))
    envelope = app.runtime.send(interface("console"), ConsoleInput(text="how are my disks?"))
    assert envelope is not None
    partial = wait_for(lambda: "Your disks" in console_text(app) and console_text(app))
    assert ANSWER not in partial  # printed before the LLM had finished
    assert app.runtime.wait_idle(envelope.correlation_id, 15)
    text = console_text(app)
    assert text.count("Your disks") == 1  # the line grew; nothing was printed twice
    [line] = [line for line in text.splitlines() if "Your disks" in line]
    assert line.startswith("bot") and line.endswith("│ " + ANSWER)


def test_a_console_preview_replaced_by_another_answer_is_marked_as_taken_back(
    fake_llm: FakeLLMServer, make_app: Callable[..., Application]
) -> None:
    """A small model loops inside the enforced JSON until its token limit: the console has
    printed that reply as it grew, and the answer asked again is another text. What was
    printed stays (the console cannot unprint it), so a mark says it is not the reply."""
    looped = "Hello, Alice." + " I'm here to help with your project." * 20 + " I'm"
    cut_off = '{"actions": [{"type": "message_console", "payload": {"text": "' + looped
    answer = "I'm glad to help. What's your name?"
    fake_llm.script(FakeResponse(content=cut_off, piece=8, every=0.03, finish_reason="length"),
                    FakeResponse(content=answer))
    app = make_app(base_url=fake_llm.base_url, llm={"protocol": "json_schema", "stream": True})
    envelope = app.runtime.send(interface("console"), ConsoleInput(text="My name is Alice."))
    assert envelope is not None
    assert app.runtime.wait_idle(envelope.correlation_id, 20)
    lines = console_text(app).splitlines()
    [preview] = [n for n, line in enumerate(lines) if "Hello, Alice" in line]
    assert lines[preview].startswith("bot")  # shown as it grew, then abandoned
    mark, reply = lines[preview + 1:]  # and nothing else after it
    assert mark.startswith("note") and mark.endswith("│ (the reply above was taken back)")
    assert reply.startswith("bot") and reply.endswith("│ " + answer)
    first, second = fake_llm.requests
    assert "response_format" in first.body and "response_format" not in second.body


def test_a_streamed_reply_past_telegrams_limit_still_arrives_in_chunks(
    bot: Application, fake_llm: FakeLLMServer, telegram: FakeTelegramServer
) -> None:
    long = " ".join(f"line {n:04d} of the disk report." for n in range(200))  # ~5,800 characters
    content = json.dumps({"actions": [{"type": "message_telegram_bot", "payload": {"text": long}}]})
    fake_llm.script(FakeResponse(content=content, piece=400, every=0.25))
    telegram.push_text("the whole report please", chat_id=CHAT, user_id=ALLOWED)
    wait_for(lambda: len(telegram.sent(CHAT)) == 2)
    assert bot.runtime.wait_idle(timeout=10)
    first, rest = telegram.sent(CHAT)
    edits = [c for c in telegram.calls_to("editMessageText") if c.ok]
    assert edits and {int(e.params["message_id"]) for e in edits} == {first.message_id}
    assert all(utf16_len(c.params["text"]) <= 4096 for c in [first, rest, *edits])
    assert edits[-1].params["text"] + " " + rest.params["text"] == long  # split at a space, nothing lost


# ---------------------------------------------------------------- previews Telegram pushes back on


@pytest.fixture
def paced_telegram(manual_clock: ManualClock) -> Iterator[FakeTelegramServer]:
    """The fake Bot API, timing its calls on the bot's clock: one that moves only when told."""
    with FakeTelegramServer(clock=manual_clock) as server:
        yield server


@pytest.fixture
def paced_bot(fake_llm: FakeLLMServer, paced_telegram: FakeTelegramServer,
              make_app: Callable[..., Application]) -> Application:
    return make_app(base_url=fake_llm.base_url, telegram=telegram_settings(paced_telegram),
                    clock=paced_telegram.clock)


def settle(app: Application, telegram: FakeTelegramServer, condition: Callable[[], Any]) -> None:
    """Fire the bot's timers in turn (a chat's pacing, a flood wait) until ``condition()``
    holds and nothing is in flight."""
    clock = telegram.clock
    assert isinstance(clock, ManualClock)
    assert clock.advance_until(lambda: condition() and app.runtime.inflight.count() == 0, 15), "not settled"
    assert app.runtime.wait_idle(timeout=10)


def chat_shows(telegram: FakeTelegramServer) -> list[str]:
    """What the user sees in the chat now: each message sent, as last edited, unless deleted."""
    seen: dict[int, str] = {}
    for call in [c for c in telegram.calls if c.ok and str(c.params.get("chat_id")) == str(CHAT)]:
        if call.method == "sendMessage" and call.message_id is not None:
            seen[call.message_id] = call.params["text"]
        elif call.method == "editMessageText" and int(call.params["message_id"]) in seen:
            seen[int(call.params["message_id"])] = call.params["text"]
        elif call.method == "deleteMessage":
            seen.pop(int(call.params["message_id"]), None)
    return list(seen.values())


REPLY_TO = OriginalContext(chat_id=CHAT, message_id=5, interface_name="telegram")


def show_then_take_back(bot: Application, telegram: FakeTelegramServer) -> None:
    """A half reply is shown; then it is taken back (the dispatcher rejected it), and the
    corrected reply is sent."""
    to = sender("telegram")
    bot.runtime.send(to, OutboundMessage.reply(REPLY_TO, "Deleting all your fil", key="turn-1", preview=True))
    settle(bot, telegram, lambda: telegram.sent(CHAT))
    bot.runtime.send(to, withdrawal(REPLY_TO, "turn-1"))
    bot.runtime.send(to, OutboundMessage.reply(REPLY_TO, "Corrected.", key="turn-2"))
    settle(bot, telegram, lambda: len(telegram.sent(CHAT)) == 2)


def test_a_taken_back_preview_whose_delete_meets_flood_control_is_deleted_after_the_wait(
    paced_bot: Application, paced_telegram: FakeTelegramServer
) -> None:
    paced_telegram.fail_next("deleteMessage", 429, "Too Many Requests: retry after 5",
                             parameters={"retry_after": 5})
    show_then_take_back(paced_bot, paced_telegram)
    deletes = paced_telegram.calls_to("deleteMessage")
    assert [d.ok for d in deletes] == [False, True]
    assert deletes[1].time - deletes[0].time >= 5  # Telegram's wait, on the bot's clock
    assert chat_shows(paced_telegram) == ["Corrected."]


@pytest.mark.parametrize(("status", "refusal", "parameters"), [
    (400, "Bad Request: message can't be deleted for everyone", None),
    (429, "Too Many Requests: retry after 3600", {"retry_after": 3600}),  # longer than the bot waits
])
def test_a_taken_back_preview_telegram_will_not_delete_says_it_was_withdrawn(
    paced_bot: Application, paced_telegram: FakeTelegramServer, caplog: pytest.LogCaptureFixture,
    status: int, refusal: str, parameters: dict[str, Any] | None,
) -> None:
    paced_telegram.fail_next("deleteMessage", status, refusal, parameters=parameters)
    with caplog.at_level(logging.WARNING, "autoresponse.telegram"):
        show_then_take_back(paced_bot, paced_telegram)
    assert chat_shows(paced_telegram) == [TELEGRAM_PREVIEW_WITHDRAWN_TEXT, "Corrected."]
    assert len([r for r in caplog.records if "withdrawn preview" in r.getMessage()]) == 1


def test_a_preview_telegram_calls_too_long_is_not_shown_and_the_reply_arrives_once(
    paced_bot: Application, paced_telegram: FakeTelegramServer
) -> None:
    to = sender("telegram")
    paced_telegram.fail_next("sendMessage", 400, "Bad Request: message is too long")
    paced_bot.runtime.send(to, OutboundMessage.reply(REPLY_TO, "Your disks are " + "x" * 300, key="turn-1",
                                                     preview=True))
    settle(paced_bot, paced_telegram, lambda: paced_telegram.calls_to("sendMessage"))
    paced_bot.runtime.send(to, OutboundMessage.reply(REPLY_TO, "Your disks are fine.", key="turn-1"))
    settle(paced_bot, paced_telegram, lambda: paced_telegram.sent(CHAT))
    assert chat_shows(paced_telegram) == ["Your disks are fine."]
    assert paced_bot.runtime.cell(sender("telegram")).restarts == 0
    assert paced_bot.runtime.dead_letters.letters() == []
