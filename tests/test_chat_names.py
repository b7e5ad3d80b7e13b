"""Chats the LLM names by title or @username: names that name nothing are refused, never guessed.

The bot and the fake Bot API share a ManualClock: re-asks and a chat's pacing are timers of
the runtime's clock, fired in turn (``until``) rather than waited for."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from conftest import system_messages

from autoresponse import Application
from autoresponse.actors.kernel import ManualClock
from autoresponse.actors.limits import CHAT_CANDIDATES_SHOWN
from autoresponse.testing.fake_llm import FakeLLMServer, FakeResponse
from autoresponse.testing.fake_telegram import FakeTelegramServer


@pytest.fixture
def fake_telegram(manual_clock: ManualClock) -> Iterator[FakeTelegramServer]:
    with FakeTelegramServer(clock=manual_clock) as server:
        yield server


def until(fake: FakeTelegramServer, condition: Callable[[], Any], timeout: float = 15.0) -> Any:
    """Fire the bot's timers (re-asks, a chat's pacing) in turn until ``condition()`` holds."""
    assert isinstance(fake.clock, ManualClock)
    assert fake.clock.advance_until(condition, timeout), "condition not met"
    return condition()


def settle(app: Application, fake: FakeTelegramServer, timeout: float = 15.0) -> None:
    """Fire the bot's timers in turn until nothing is in flight."""
    until(fake, lambda: app.runtime.inflight.count() == 0, timeout)
    assert app.runtime.wait_idle(timeout=timeout)


@pytest.fixture
def bot(fake_llm: FakeLLMServer, fake_telegram: FakeTelegramServer, make_app: Callable[..., Application]) -> Application:
    app = make_app(base_url=fake_llm.base_url, retry={"backoff_min": 0.01}, telegram={
        "token": "123456:TEST-TOKEN", "base_url": fake_telegram.base_url, "allowed_users": [7], "poll_timeout": 1},
        clock=fake_telegram.clock)
    # The bot has seen one titled group, "Ops".
    fake_telegram.push_text("@synth_bot hi", chat_id=-100, user_id=7, chat_type="supergroup", title="Ops")
    until(fake_telegram, lambda: fake_telegram.sent(-100))
    settle(app, fake_telegram, timeout=10)
    return app


def to(target: Any) -> FakeResponse:
    return FakeResponse(content=json.dumps({"actions": [
        {"type": "message_telegram_bot", "payload": {"text": "psst", "target": target}}]}))


@pytest.mark.parametrize(("target", "error"), [
    ("", '"target" names no chat'),
    ("@", '"target" names no chat'),
    ("  ", '"target" names no chat'),
    ("²", "no chat named '²'"),     # a digit to str.isdigit, and no chat id
    ("-٣", "no chat named '-٣'"),
])
def test_a_name_that_names_no_chat_is_an_error_for_the_llm_not_a_guess(
    bot: Application, fake_llm: FakeLLMServer, fake_telegram: FakeTelegramServer, target: str, error: str
) -> None:
    fake_llm.script(to(target), FakeResponse(content=json.dumps({"actions": [
        {"type": "message_telegram_bot", "payload": {"text": "I could not tell which chat you meant."}}]})))
    fake_telegram.push_text("tell them", chat_id=42, user_id=7)
    until(fake_telegram, lambda: fake_telegram.sent(42))
    settle(bot, fake_telegram, timeout=10)
    [message] = system_messages(fake_llm, "error")
    assert error in message["errors"][0]
    assert len(fake_telegram.sent(-100)) == 1  # only the bot's first answer there: nothing misdelivered
    assert fake_telegram.sent(42)[-1].params["text"] == "I could not tell which chat you meant."


def test_an_ambiguous_name_lists_a_bounded_number_of_chats(
    bot: Application, fake_llm: FakeLLMServer, fake_telegram: FakeTelegramServer
) -> None:
    for n in range(CHAT_CANDIDATES_SHOWN + 5):
        fake_telegram.push_text("@synth_bot hi", chat_id=-200 - n, user_id=7, chat_type="supergroup",
                                title=f"Team {n}")
    until(fake_telegram, lambda: len(fake_telegram.sent()) == CHAT_CANDIDATES_SHOWN + 6, timeout=30)
    settle(bot, fake_telegram, timeout=10)
    fake_llm.script(to("team"), FakeResponse(content=json.dumps({"actions": [
        {"type": "message_telegram_bot", "payload": {"text": "Which team?"}}]})))
    fake_telegram.push_text("tell the team", chat_id=42, user_id=7)
    until(fake_telegram, lambda: fake_telegram.sent(42))
    [message] = system_messages(fake_llm, "error")
    assert message["errors"][0].count("(id -2") == CHAT_CANDIDATES_SHOWN
    assert "and 5 more" in message["errors"][0]
