"""Streamed replies: a slow answer is shown as it grows, then becomes the final reply.

Real time: the fake LLM streams in real time and the LLM client spaces its previews by the
runtime's clock, real here too, but for the quick reply's test, whose clock stands still."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Iterator

import pytest
from conftest import console_text, wait_for

from autoresponse import Application
from autoresponse.actors.kernel import ManualClock
from autoresponse.actors.llm.engine import LLMError
from autoresponse.testing.fake_llm import FakeLLMServer, FakeResponse
from autoresponse.actors.llm.http import HttpEngine
from autoresponse.actors.routes import interface
from autoresponse.actors.streaming import preview_text
from autoresponse.interfaces.console import ConsoleInput
from autoresponse.interfaces.telegram import utf16_len
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
