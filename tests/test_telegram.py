"""Telegram end to end: python-telegram-bot against a fake Bot API server on 127.0.0.1.

The bot and the fake share a ManualClock: a chat's pacing, a 429's retry_after and a
network error's backoff are timers of the runtime's clock, which the tests fire in turn
(``until``) instead of waiting."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from conftest import system_messages, wait_for

from autoresponse import Application
from autoresponse.actors.approvals import NOTHING_TO_CANCEL
from autoresponse.actors.conversation import CANCELLED
from autoresponse.actors.failures import FAILURE_NOTICE
from autoresponse.actors.journal import SqliteJournal
from autoresponse.actors.kernel import ManualClock
from autoresponse.actors.kernel.testkit import FaultInjector
from autoresponse.testing.fake_llm import FakeLLMServer, FakeResponse
from autoresponse.actors.routes import executor, sender
from autoresponse.interfaces.telegram import REFUSAL, utf16_len
from autoresponse.testing.fake_telegram import FakeTelegramServer
from autoresponse.messages import OriginalContext, OutboundMessage, UserRequest

ALLOWED = 7
CHAT = 42


@pytest.fixture
def fake_telegram(manual_clock: ManualClock) -> Iterator[FakeTelegramServer]:
    with FakeTelegramServer(clock=manual_clock) as server:
        yield server


@pytest.fixture
def bot(fake_llm: FakeLLMServer, fake_telegram: FakeTelegramServer,
        make_app: Callable[..., Application]) -> Application:
    # The servers come first so that they outlive the app: it stops before they do.
    return make_app(base_url=fake_llm.base_url, telegram={
        "token": "123456:TEST-TOKEN", "base_url": fake_telegram.base_url,
        "allowed_users": [ALLOWED], "poll_timeout": 1,
    }, clock=fake_telegram.clock)


def until(fake: FakeTelegramServer, condition: Callable[[], Any], timeout: float = 15.0) -> Any:
    """Fire the bot's timers (a chat's pacing, retry waits) in turn until ``condition()``
    holds; its value."""
    assert isinstance(fake.clock, ManualClock)
    assert fake.clock.advance_until(condition, timeout), "condition not met"
    return condition()


def settle(app: Application, fake: FakeTelegramServer, timeout: float = 15.0) -> None:
    """Fire the bot's timers in turn until nothing is in flight (a paced chunk, a retry)."""
    until(fake, lambda: app.runtime.inflight.count() == 0, timeout)
    assert app.runtime.wait_idle(timeout=timeout)




def reply_to(call: Any) -> Any:
    return call.params["reply_parameters"]["message_id"]


def actions(*items: dict[str, Any]) -> FakeResponse:
    return FakeResponse(content=json.dumps({"actions": list(items)}))


def tell(app: Application, text: str, chat_id: int = CHAT, **context: Any) -> None:
    ctx = OriginalContext(chat_id=chat_id, message_id=context.pop("message_id", 5),
                          interface_name="telegram", **context)
    app.runtime.send(sender("telegram"), OutboundMessage.reply(ctx, text))


def test_the_full_loop_through_python_telegram_bot(
    bot: Application, fake_llm: FakeLLMServer, fake_telegram: FakeTelegramServer
) -> None:
    fake_llm.script(actions({"type": "terminal", "payload": {"command": "df -h"}}),
                    actions({"type": "message_telegram_bot", "payload": {"text": "Your disks are fine."}}))
    message = fake_telegram.push_text("run df -h", chat_id=CHAT, user_id=ALLOWED)
    [sent] = until(fake_telegram, lambda: fake_telegram.sent(CHAT))
    settle(bot, fake_telegram, timeout=10)
    assert sent.params["text"] == "Your disks are fine."
    assert reply_to(sent) == message["message_id"]
    assert sent.params["reply_parameters"]["allow_sending_without_reply"] is True
    assert len(fake_telegram.sent()) == 1
    # The LLM saw the Telegram context and the command's real output.
    delivery = json.loads(fake_llm.requests[1].messages[-1]["content"])["system_message"]
    assert delivery["original_context"]["chat_id"] == CHAT
    assert delivery["original_context"]["interface_name"] == "telegram"
    assert "Filesystem" in delivery["outputs"][0]["output"]
    assert "message_telegram_bot" in delivery["full_json_instructions"]


def test_a_reply_to_a_new_update_is_sent_once_without_reading_the_journal(
    bot: Application, fake_llm: FakeLLMServer, fake_telegram: FakeTelegramServer
) -> None:
    """The sender asks whether a chunk went out already from its delivery task on the event
    loop; for an update the journal accepted as new the answer is in memory, and the loop,
    which carries every chat's I/O, never waits on a read of SQLite for it."""
    assert isinstance(bot.journal, SqliteJournal)
    reads: list[str] = []
    bot.journal._reader.set_trace_callback(reads.append)
    fake_llm.script(actions({"type": "message_telegram_bot", "payload": {"text": "Hello there."}}))
    fake_telegram.push_text("hi", chat_id=CHAT, user_id=ALLOWED)
    [sent] = until(fake_telegram, lambda: fake_telegram.sent(CHAT))
    settle(bot, fake_telegram, timeout=10)
    assert sent.params["text"] == "Hello there." and len(fake_telegram.sent()) == 1
    assert reads == []


def test_a_long_reply_arrives_as_ordered_chunks(bot: Application, fake_telegram: FakeTelegramServer) -> None:
    code = "```python\n" + "".join(f"print({n})  # 🐍\n" for n in range(120)) + "```"
    text = ("Intro 👋\n\n" + "Lorem ipsum 😀 dolor sit amet. " * 150 + "\n\n" + code + "\n\n"
            + "Family 👨‍👩‍👧 time. " * 200)
    assert len(text) >= 10_000
    tell(bot, text)
    chunks = until(fake_telegram, lambda: len(fake_telegram.sent(CHAT)) >= 3 and fake_telegram.sent(CHAT), timeout=30)
    settle(bot, fake_telegram, timeout=30)
    texts = [c.params["text"] for c in fake_telegram.sent(CHAT)]
    assert all(utf16_len(t) <= 4096 for t in texts)
    assert sum(code in t for t in texts) == 1  # the code block is whole, in one chunk
    assert all(t.count("```") % 2 == 0 for t in texts)
    assert "".join(texts).count("👨‍👩‍👧") == 200  # no emoji sequence broken
    assert "".join(t.replace("\n", "").replace(" ", "") for t in texts) == text.replace("\n", "").replace(" ", "")
    assert reply_to(chunks[0]) == 5 and all("reply_parameters" not in c.params for c in chunks[1:])


def test_a_429_holds_back_only_its_own_chat(bot: Application, fake_telegram: FakeTelegramServer) -> None:
    fake_telegram.fail_next("sendMessage", 429, "Too Many Requests: retry after 2", chat_id=1,
                            parameters={"retry_after": 2})
    tell(bot, "to A", chat_id=1)
    wait_for(lambda: fake_telegram.calls_to("sendMessage"))  # refused: A waits 2 s on the clock
    tell(bot, "to B", chat_id=2)
    wait_for(lambda: fake_telegram.sent(2))  # while no time passes
    until(fake_telegram, lambda: fake_telegram.sent(1))
    settle(bot, fake_telegram, timeout=10)
    [refused] = [c for c in fake_telegram.calls_to("sendMessage") if not c.ok]
    [to_a], [to_b] = fake_telegram.sent(1), fake_telegram.sent(2)
    assert to_a.time - refused.time >= 2.0 - 1e-9  # the wait was obeyed (a float sum on the clock)
    assert to_b.time < to_a.time and to_b.time - refused.time < 1.0  # B was not held back


def test_replies_to_one_chat_are_spaced_a_second_apart(bot: Application, fake_telegram: FakeTelegramServer) -> None:
    for n in range(5):
        tell(bot, f"reply {n}")
    sent = until(fake_telegram, lambda: len(fake_telegram.sent(CHAT)) == 5 and fake_telegram.sent(CHAT), timeout=30)
    assert [c.params["text"] for c in sent] == [f"reply {n}" for n in range(5)]
    gaps = [b.time - a.time for a, b in zip(sent, sent[1:], strict=False)]
    assert all(gap >= 1.0 - 1e-9 for gap in gaps), gaps  # (float sums on the manual clock)


def test_an_unparsable_reply_is_resent_once_as_plain_text(
    bot: Application, fake_telegram: FakeTelegramServer
) -> None:
    fake_telegram.fail_next("sendMessage", 400, "Bad Request: can't parse entities: can't find end of "
                                                "the entity starting at byte offset 3")
    tell(bot, "a *broken markdown reply")
    until(fake_telegram, lambda: fake_telegram.sent(CHAT))
    settle(bot, fake_telegram, timeout=10)
    first, second = fake_telegram.calls_to("sendMessage")
    assert (first.ok, first.params["parse_mode"]) == (False, "Markdown")
    assert second.ok and "parse_mode" not in second.params
    assert second.params["text"] == "a *broken markdown reply"


def test_a_too_long_message_is_split_further(bot: Application, fake_telegram: FakeTelegramServer) -> None:
    fake_telegram.fail_next("sendMessage", 400, "Bad Request: message is too long")
    text = "first half. " * 20 + "second half. " * 20
    tell(bot, text)
    until(fake_telegram, lambda: fake_telegram.sent(CHAT))
    settle(bot, fake_telegram, timeout=15)
    sent = fake_telegram.sent(CHAT)
    assert len(sent) > 1 and len(fake_telegram.calls_to("sendMessage")) == len(sent) + 1
    assert "".join(c.params["text"] for c in sent).replace(" ", "") == text.replace(" ", "")


def test_a_blocked_chat_is_marked_and_dead_lettered_without_retries(
    bot: Application, fake_telegram: FakeTelegramServer
) -> None:
    fake_telegram.fail_next("sendMessage", 403, "Forbidden: bot was blocked by the user")
    tell(bot, "hello?")
    until(fake_telegram, lambda: bot.runtime.dead_letters.letters())
    tell(bot, "are you there?")
    settle(bot, fake_telegram, timeout=10)
    letters = bot.runtime.dead_letters.letters()
    assert [d.reason for d in letters] == ["chat unreachable", "chat unreachable"]
    assert "bot was blocked by the user" in letters[0].detail
    assert "blocked the bot earlier" in letters[1].detail
    assert len(fake_telegram.calls_to("sendMessage")) == 1


def test_a_migrated_chat_is_re_targeted(bot: Application, fake_telegram: FakeTelegramServer) -> None:
    fake_telegram.fail_next("sendMessage", 400, "Bad Request: group chat was upgraded to a supergroup chat",
                            chat_id=-5, parameters={"migrate_to_chat_id": -1005})
    tell(bot, "first", chat_id=-5, chat_type="group")
    until(fake_telegram, lambda: fake_telegram.sent(-1005))
    tell(bot, "second", chat_id=-5, chat_type="group")
    until(fake_telegram, lambda: len(fake_telegram.sent(-1005)) == 2)
    assert fake_telegram.sent(-5) == []


def test_network_errors_are_retried(bot: Application, fake_telegram: FakeTelegramServer) -> None:
    fake_telegram.fail_next("sendMessage", 502, "Bad Gateway", times=2)
    tell(bot, "eventually")
    [sent] = until(fake_telegram, lambda: fake_telegram.sent(CHAT))
    assert sent.params["text"] == "eventually"
    assert len(fake_telegram.calls_to("sendMessage")) == 3


def test_forum_replies_stay_in_their_topic(
    bot: Application, fake_llm: FakeLLMServer, fake_telegram: FakeTelegramServer
) -> None:
    message = fake_telegram.push_text("@synth_bot hello", chat_id=-100, user_id=ALLOWED,
                                      chat_type="supergroup", thread_id=77)
    [sent] = until(fake_telegram, lambda: fake_telegram.sent(-100))
    assert sent.params["message_thread_id"] == 77
    assert reply_to(sent) == message["message_id"]
    assert fake_llm.requests[0].messages[-1]["content"] == "hello"  # the mention is not part of the request


def test_strangers_get_a_refusal_and_nothing_runs(
    bot: Application, fake_llm: FakeLLMServer, fake_telegram: FakeTelegramServer
) -> None:
    with bot.runtime.probe(executor("terminal")) as ran:
        message = fake_telegram.push_text("run df -h", chat_id=99, user_id=99)
        [sent] = until(fake_telegram, lambda: fake_telegram.sent(99))
        settle(bot, fake_telegram, timeout=10)
        assert ran.envelopes == []
    assert sent.params["text"] == REFUSAL
    assert reply_to(sent) == message["message_id"]
    assert fake_llm.requests == []


def test_in_groups_the_bot_answers_only_when_addressed(
    bot: Application, fake_llm: FakeLLMServer, fake_telegram: FakeTelegramServer
) -> None:
    fake_telegram.push_text("run df -h", chat_id=-300, user_id=ALLOWED, chat_type="group")
    fake_telegram.push_text("nice weather", chat_id=-300, user_id=ALLOWED, chat_type="group")
    fake_telegram.push_text("hi there", chat_id=-300, user_id=ALLOWED, chat_type="group", reply_to_bot=True)
    [sent] = until(fake_telegram, lambda: fake_telegram.sent(-300))
    settle(bot, fake_telegram, timeout=10)
    assert [r.messages[-1]["content"] for r in fake_llm.requests] == ["hi there"]
    assert "Hello!" in sent.params["text"]


def test_in_groups_a_command_addressed_to_the_bot_is_taken(
    bot: Application, fake_llm: FakeLLMServer, fake_telegram: FakeTelegramServer
) -> None:
    fake_telegram.push_text("/cancel@someone_else_bot", chat_id=-301, user_id=ALLOWED, chat_type="group")
    fake_telegram.push_text("/cancel@synth_bot", chat_id=-301, user_id=ALLOWED, chat_type="group")
    [sent] = until(fake_telegram, lambda: fake_telegram.sent(-301))
    settle(bot, fake_telegram, timeout=10)
    assert sent.params["text"] == NOTHING_TO_CANCEL  # taken as /cancel, never sent to the LLM
    assert fake_llm.requests == []


async def test_a_group_gets_at_most_twenty_messages_a_minute_on_a_controllable_clock(
    fake_telegram: FakeTelegramServer,
) -> None:
    from telegram import Bot

    from autoresponse.interfaces.telegram import TelegramDelivery

    now = [1000.0]
    sent_at: list[float] = []

    async def sleep(seconds: float) -> None:  # virtual time: waiting advances the clock
        now[0] += seconds

    delivery = TelegramDelivery(Bot("1:TOKEN", base_url=fake_telegram.base_url),
                                clock=lambda: now[0], sleep=sleep)
    await delivery.start()
    try:
        group = OriginalContext(chat_id=-77, interface_name="telegram", chat_type="supergroup")
        for n in range(25):
            await delivery.deliver(OutboundMessage.reply(group, f"message {n}"))
            sent_at.append(now[0])
    finally:
        await delivery.aclose()
    assert len(fake_telegram.sent(-77)) == 25
    gaps = [b - a for a, b in zip(sent_at, sent_at[1:], strict=False)]
    assert all(gap >= 1.0 for gap in gaps)  # and one a second per chat
    # Any 21 consecutive sends span at least a minute.
    assert all(sent_at[i + 20] - sent_at[i] >= 60.0 for i in range(len(sent_at) - 20))


# ---------------------------------------------------------------- hostile input


def test_a_malformed_update_is_dead_lettered_acknowledged_and_the_rest_flow_on(
    bot: Application, fake_telegram: FakeTelegramServer
) -> None:
    poison = fake_telegram.push_update({"message": {"message_id": "notanint", "chat": "garbage"}})
    fake_telegram.push_text("run echo after the poison", chat_id=CHAT, user_id=ALLOWED)
    [sent] = until(fake_telegram, lambda: fake_telegram.sent(CHAT), timeout=20)
    assert "after the poison" in json.dumps(sent.params)
    [letter] = [d for d in bot.runtime.dead_letters.letters() if d.reason == "malformed update"]
    assert '"notanint"' in letter.record["body"]["raw"] and letter.actor == "interface.telegram"
    # Acknowledged: later polls ask for what comes after it, so it is never read twice.
    until(fake_telegram, lambda: any(int(c.params.get("offset") or 0) > poison
                         for c in fake_telegram.calls_to("getUpdates")))
    assert len([d for d in bot.runtime.dead_letters.letters() if d.reason == "malformed update"]) == 1
    assert bot.runtime.cell("interface.telegram").restarts == 0


def test_an_update_the_interface_crashes_on_every_time_tells_its_user_once_and_no_stranger(
    bot: Application, fake_llm: FakeLLMServer, fake_telegram: FakeTelegramServer
) -> None:
    """A message that crashes the Telegram interface on every attempt never becomes a
    request: it is a dead letter, and its sender, who is allowed, hears FAILURE_NOTICE once,
    in reply to it. A stranger's, crashing the same way, gets nothing."""
    attempts = bot.settings.supervision.message_attempts
    bot.runtime.fault = FaultInjector(actors={"interface.telegram"}, times=2 * attempts)
    fake_telegram.push_text("run df -h", chat_id=99, user_id=99)  # a stranger (strangers = "refuse")
    message = fake_telegram.push_text("run df -h", chat_id=CHAT, user_id=ALLOWED)
    until(fake_telegram, lambda: len(bot.runtime.dead_letters.letters()) == 2 and fake_telegram.sent(CHAT))
    settle(bot, fake_telegram, timeout=10)
    [sent] = fake_telegram.sent()
    assert sent.params["chat_id"] == CHAT and sent.params["text"] == FAILURE_NOTICE
    assert reply_to(sent) == message["message_id"]
    letters = bot.runtime.dead_letters.letters()
    assert [(d.reason, d.actor) for d in letters] == [("crash", "interface.telegram")] * 2
    assert {d.envelope.body.chat_id for d in letters} == {99, CHAT}
    assert fake_llm.requests == []  # neither became a request
    assert bot.runtime.cell("interface.telegram").restarts == 2 * attempts


def test_an_unreadable_answer_to_getupdates_is_a_failed_poll_and_polling_goes_on(
    bot: Application, fake_telegram: FakeTelegramServer
) -> None:
    for body in (b'{"ok": true}', b'{"ok": false}', b"[" * 100_000 + b"]" * 100_000, b"\xff garbage"):
        fake_telegram.answer_next("getUpdates", body)
    fake_telegram.push_text("run echo after the garbage", chat_id=CHAT, user_id=ALLOWED)
    [sent] = until(fake_telegram, lambda: fake_telegram.sent(CHAT), timeout=30)
    assert "after the garbage" in json.dumps(sent.params)
    assert bot.runtime.cell("interface.telegram").restarts == 0  # backed off and polled again, not crashed


def test_an_update_with_text_that_is_not_unicode_is_answered_and_acknowledged(
    bot: Application, fake_llm: FakeLLMServer, fake_telegram: FakeTelegramServer
) -> None:
    # A lone surrogate (a JSON "\ud800" escape) cannot be journaled as it is: once it stopped
    # polling, then it was a dead letter; it is read as U+FFFD, and the update answered.
    fake_llm.script(*[actions({"type": "message_telegram_bot", "payload": {"text": f"Answer {n}."}})
                      for n in (1, 2)])
    bad = fake_telegram.push_update({"message": {"message_id": 9, "date": 0, "text": "hello \ud800",
                                                 "chat": {"id": CHAT, "type": "private"},
                                                 "from": {"id": ALLOWED, "is_bot": False, "first_name": "A\udfff"}}})
    fake_telegram.push_text("and after the surrogate", chat_id=CHAT, user_id=ALLOWED)
    sent = until(fake_telegram, lambda: len(fake_telegram.sent(CHAT)) == 2 and fake_telegram.sent(CHAT), timeout=20)
    assert sorted(s.params["text"] for s in sent) == ["Answer 1.", "Answer 2."]
    assert [d for d in bot.runtime.dead_letters.letters() if d.reason == "malformed input"] == []
    until(fake_telegram, lambda: any(int(c.params.get("offset") or 0) > bad for c in fake_telegram.calls_to("getUpdates")))
    assert bot.runtime.cell("interface.telegram").restarts == 0
    settle(bot, fake_telegram, timeout=10)
    assert bot.runtime.intake.free() == bot.runtime.intake.capacity  # its place was given back


def test_a_blocked_bot_is_reachable_again_once_its_user_writes(
    bot: Application, fake_llm: FakeLLMServer, fake_telegram: FakeTelegramServer
) -> None:
    fake_telegram.fail_next("sendMessage", 403, "Forbidden: bot was blocked by the user", chat_id=CHAT)
    fake_telegram.push_text("hello", chat_id=CHAT, user_id=ALLOWED)
    until(fake_telegram, lambda: any(d.reason == "chat unreachable" for d in bot.runtime.dead_letters.letters()))
    settle(bot, fake_telegram, timeout=10)
    fake_telegram.push_text("hello again", chat_id=CHAT, user_id=ALLOWED)  # they unblocked us
    [sent] = until(fake_telegram, lambda: fake_telegram.sent(CHAT), timeout=20)
    assert sent.params["chat_id"] == CHAT


def test_a_longer_username_is_not_a_mention_of_the_bot(
    bot: Application, fake_llm: FakeLLMServer, fake_telegram: FakeTelegramServer
) -> None:
    group = -100
    fake_telegram.push_text("@synth_botnet run echo not-me", chat_id=group, user_id=ALLOWED, chat_type="group")
    fake_telegram.push_text("@synth_bot run echo me", chat_id=group, user_id=ALLOWED, chat_type="group")
    [sent] = until(fake_telegram, lambda: fake_telegram.sent(group), timeout=20)
    settle(bot, fake_telegram, timeout=10)
    assert len(fake_telegram.sent(group)) == 1
    asked = [r.messages[-1]["content"] for r in fake_llm.requests if r.messages[-1]["content"].startswith("run")]
    assert asked == ["run echo me"]  # the other one never reached the LLM


def test_edits_are_not_new_requests_and_allowed_updates_says_so(
    bot: Application, fake_llm: FakeLLMServer, fake_telegram: FakeTelegramServer
) -> None:
    fake_telegram.push_text("run echo original", chat_id=CHAT, user_id=ALLOWED, message_id=77)
    until(fake_telegram, lambda: fake_telegram.sent(CHAT), timeout=20)
    fake_telegram.push_text("run echo edited", chat_id=CHAT, user_id=ALLOWED, message_id=77, edited=True)
    fake_telegram.push_text("run echo next", chat_id=CHAT, user_id=ALLOWED)
    until(fake_telegram, lambda: len(fake_telegram.sent(CHAT)) == 2, timeout=20)
    settle(bot, fake_telegram, timeout=10)
    assert not any("edited" in json.dumps(r.body) for r in fake_llm.requests)
    assert all(c.params["allowed_updates"] == ["message"] for c in fake_telegram.calls_to("getUpdates"))


def test_a_huge_retry_after_parks_only_that_reply(bot: Application, fake_telegram: FakeTelegramServer) -> None:
    fake_telegram.fail_next("sendMessage", 429, "Too Many Requests: retry after 999999", chat_id=CHAT,
                            parameters={"retry_after": 999999})
    tell(bot, "the parked one", message_id=1)
    tell(bot, "the next one", message_id=2)
    [sent] = until(fake_telegram, lambda: fake_telegram.sent(CHAT), timeout=20)
    assert sent.params["text"] == "the next one"
    settle(bot, fake_telegram, timeout=10)
    [letter] = [d for d in bot.runtime.dead_letters.letters() if d.reason == "flood control"]
    assert "999999" in letter.detail


def test_an_update_waiting_at_start_is_handled_exactly_once_even_on_a_slow_start(
    fake_llm: FakeLLMServer, fake_telegram: FakeTelegramServer, make_app: Callable[..., Application],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Resuming the journal never races with intake: an update polled while the journal is
    being resumed would otherwise be both accepted and resumed, and run twice."""
    from autoresponse.actors.kernel.intake import Intake

    slow_resume = Intake.resume

    def resume(self: Intake) -> int:
        time.sleep(1.5)  # a busy machine: polling has all the time it needs to race
        return slow_resume(self)

    monkeypatch.setattr(Intake, "resume", resume)
    # A slow LLM keeps the update's work in flight (its journal item open) while resume reads.
    fake_llm.script(FakeResponse(delay=3, content=json.dumps(
        {"actions": [{"type": "terminal", "payload": {"command": "echo once"}}]})))
    fake_telegram.push_text("run echo once", chat_id=CHAT, user_id=ALLOWED)
    app = make_app(base_url=fake_llm.base_url, telegram={
        "token": "123456:TEST-TOKEN", "base_url": fake_telegram.base_url,
        "allowed_users": [ALLOWED], "poll_timeout": 1})
    wait_for(lambda: fake_telegram.sent(CHAT), timeout=20)
    time.sleep(1.0)
    assert app.runtime.wait_idle(timeout=15)
    asked = [r for r in fake_llm.requests if r.messages[-1]["content"] == "run echo once"]
    ran = [o for m in system_messages(fake_llm, "output") for o in m["outputs"]]
    assert (len(asked), len(ran), len(fake_telegram.sent(CHAT))) == (1, 1, 1)


# ---------------------------------------------------------------- replies no rule of Telegram's lets hang


def split_in_a_child(text: str, limit: int = 4096, seconds: float = 60.0) -> Any:
    """``split_message(text, limit)`` in a child process: its chunks, or the name of what it
    raised. A split that never returns fails the test (the child is killed) instead of
    spinning on, and growing, in the suite."""
    code = ("import json, sys\n"
            "from autoresponse.interfaces.telegram import split_message\n"
            "text, limit = json.load(sys.stdin)\n"
            "try:\n    print(json.dumps(split_message(text, limit)))\n"
            "except Exception as exc:\n    print(json.dumps(type(exc).__name__))\n")
    try:
        done = subprocess.run([sys.executable, "-c", code], input=json.dumps([text, limit]),
                              capture_output=True, text=True, timeout=seconds, check=True)
    except subprocess.TimeoutExpired:
        pytest.fail(f"split_message did not return in {seconds:g}s")
    return json.loads(done.stdout)


@pytest.mark.parametrize(("text", "opening"), [
    ("```" + "a" * 5000, "```"),  # a fence, then one long line
    ("Here is the JSON: ```" + '{"k":"v"},' * 500 + "```", "```"),  # JSON on one line, in a block
    ("```python\n" + "a" * 5000 + "\n```", "```python\n"),  # one long line under its language
])
def test_a_code_block_of_one_long_line_is_split_and_reopened_with_its_language(text: str, opening: str) -> None:
    chunks = split_in_a_child(text)
    assert isinstance(chunks, list) and len(chunks) > 1
    assert all(utf16_len(c) <= 4096 for c in chunks)
    assert all(c.count("```") % 2 == 0 for c in chunks[:-1])  # each closes the block it cuts ...
    assert all(c.startswith(opening) for c in chunks[1:])  # ... and the next reopens it, and only that
    assert "".join(chunks).replace("```python", "").replace("```", "").replace("\n", "").replace(" ", "") == \
        text.replace("```python", "").replace("```", "").replace("\n", "").replace(" ", "")


def test_split_message_refuses_a_limit_no_chunk_fits_in() -> None:
    assert split_in_a_child("hello world", 4) == "ValueError"


def test_a_too_long_answer_for_a_short_reply_is_a_dead_letter_and_the_bot_goes_on(
    bot: Application, fake_telegram: FakeTelegramServer
) -> None:
    """Telegram (or a proxy) calls every message too long: splitting stops at a floor."""
    fake_telegram.fail_next("sendMessage", 400, "Bad Request: message is too long", chat_id=CHAT, times=100)
    tell(bot, "short reply text")
    [letter] = until(fake_telegram, lambda: bot.runtime.dead_letters.letters())
    assert letter.reason == "bad request" and "too long" in letter.detail
    tell(bot, "to another chat", chat_id=1)
    until(fake_telegram, lambda: fake_telegram.sent(1))
    assert len(fake_telegram.calls_to("sendMessage")) == 2  # one for each reply, no split to pieces


@pytest.mark.parametrize("refusal", ["Bad Request: message to edit not found",
                                     "Bad Request: message can't be edited"])
def test_a_reply_whose_preview_its_user_deleted_is_sent_as_a_new_message(
    bot: Application, fake_telegram: FakeTelegramServer, refusal: str
) -> None:
    ctx = OriginalContext(chat_id=CHAT, message_id=5, interface_name="telegram")
    bot.runtime.send(sender("telegram"), OutboundMessage.reply(ctx, "Your disks", key="turn-1", preview=True))
    until(fake_telegram, lambda: fake_telegram.sent(CHAT))
    fake_telegram.fail_next("editMessageText", 400, refusal)  # the user deleted the preview
    bot.runtime.send(sender("telegram"), OutboundMessage.reply(ctx, "Your disks are fine.", key="turn-1"))
    until(fake_telegram, lambda: len(fake_telegram.sent(CHAT)) == 2)
    settle(bot, fake_telegram)
    preview, final = fake_telegram.sent(CHAT)
    assert final.params["text"] == "Your disks are fine." and reply_to(final) == 5
    assert bot.runtime.dead_letters.letters() == []


def test_a_revoked_token_makes_each_reply_one_dead_letter_that_says_so(
    bot: Application, fake_telegram: FakeTelegramServer
) -> None:
    fake_telegram.revoke("123456:TEST-TOKEN")
    for chat in (100, 101, 102):
        tell(bot, f"reply to {chat}", chat_id=chat)
    until(fake_telegram, lambda: len(bot.runtime.dead_letters.letters()) >= 3)
    settle(bot, fake_telegram)
    letters = bot.runtime.dead_letters.letters()
    assert [d.reason for d in letters] == ["refused"] * 3  # not a crash, and no retries
    assert all("revoked" in d.detail and "@BotFather" in d.detail for d in letters)
    assert len(fake_telegram.calls_to("sendMessage")) == 3


def test_an_answer_without_a_message_id_is_a_dead_letter_and_the_chat_goes_on(
    bot: Application, fake_telegram: FakeTelegramServer
) -> None:
    fake_telegram.answer_next("sendMessage", json.dumps({"ok": True, "result": {}}).encode())
    tell(bot, "the first", message_id=1)
    [letter] = until(fake_telegram, lambda: bot.runtime.dead_letters.letters())
    assert letter.reason == "bad answer" and "message id" in letter.detail
    tell(bot, "the second", message_id=2)
    until(fake_telegram, lambda: any(c.params["text"] == "the second" for c in fake_telegram.sent(CHAT)))
    settle(bot, fake_telegram)
    assert len(bot.runtime.dead_letters.letters()) == 1  # one for the reply, none for a crash


@pytest.mark.parametrize("answers", [{None: -1005}, {-5: -1005, -1005: -5}],
                         ids=["to-the-same-chat", "back-and-forth"])
def test_a_chat_that_keeps_migrating_is_followed_a_few_times_then_dead_lettered(
    bot: Application, fake_telegram: FakeTelegramServer, answers: dict[int | None, int]
) -> None:
    for chat, new in answers.items():
        fake_telegram.fail_next("sendMessage", 400, "Bad Request: group chat was upgraded to a supergroup chat",
                                chat_id=chat, parameters={"migrate_to_chat_id": new}, times=100)
    tell(bot, "hello", chat_id=-5, chat_type="group")
    [letter] = until(fake_telegram, lambda: bot.runtime.dead_letters.letters())
    assert letter.reason == "chat migrated" and "not followed" in letter.detail
    assert len(fake_telegram.calls_to("sendMessage")) <= 3


def test_in_a_group_an_album_mentioning_the_bot_on_its_last_item_is_answered_whole(
    bot: Application, fake_llm: FakeLLMServer, fake_telegram: FakeTelegramServer
) -> None:
    """The items before the one whose caption mentions the bot were dropped: the LLM saw one
    file of three. They are held for the album's gather window and come along; an
    album that never mentions the bot is held as long, then dropped without a word."""
    group = -303
    fake_llm.script(actions({"type": "message_telegram_bot", "payload": {"text": "Compared."}}))
    chatter = dict(media_group_id="other-album", chat_id=group, user_id=ALLOWED, chat_type="group")
    fake_telegram.push_document(b"not for the bot", file_name="x.txt", **chatter)
    album = dict(media_group_id="docs-1", chat_id=group, user_id=ALLOWED, chat_type="group")
    fake_telegram.push_document(b"first file body", file_name="a.txt", **album)
    fake_telegram.push_document(b"second file body", file_name="b.txt", **album)
    members = [c.name for c in bot.runtime.cells if c.name.startswith("conversations.")]
    probes = [bot.runtime.probe(name) for name in members]
    try:
        last = fake_telegram.push_document(b"third file body", file_name="c.txt",
                                           caption="@synth_bot compare these", **album)
        # The album's last item reaches the chat's conversation before its gathering window is let close.
        wait_for(lambda: any(r.text == "compare these" for p in probes for r in p.bodies(UserRequest)))
        [sent] = until(fake_telegram, lambda: fake_telegram.sent(group), timeout=30)
        settle(bot, fake_telegram)
    finally:
        for probe in probes:
            probe.close()
    assert sent.params["text"] == "Compared." and reply_to(sent) == last["message_id"]
    [asked] = fake_llm.requests  # one turn: the album, not the chatter
    turn = json.dumps(asked.messages[-1]["content"])
    assert [name for name in ("a.txt", "b.txt", "c.txt", "x.txt") if name in turn] == ["a.txt", "b.txt", "c.txt"]
    assert bot.runtime.dead_letters.letters() == []


def test_an_update_without_a_usable_update_id_is_one_dead_letter_and_polling_backs_off(
    bot: Application, fake_telegram: FakeTelegramServer
) -> None:
    """Such an update cannot be acknowledged, so the Bot API sends it again on every call:
    polling spun on it, thousands of dead letters and warnings a second, a core busy. Now
    a poll that acknowledged nothing is a failed one: backed off, and after a few the
    interface shows as failing, saying why; the update is one dead letter. (Nothing can
    move the Bot API past it: the updates behind it still come, with it, between waits.)"""
    def letters() -> list[Any]:
        return [d for d in bot.runtime.dead_letters.letters() if d.reason == "malformed update"]

    fake_telegram.push_update({"update_id": "x", "message": {"message_id": 1}})
    cell = bot.runtime.cell("interface.telegram")
    until(fake_telegram, lambda: len(fake_telegram.calls_to("getUpdates")) >= 3)  # it came back twice
    time.sleep(0.5)  # real time, in which a spinning poller would call again and again
    assert len(letters()) == 1
    assert len(fake_telegram.calls_to("getUpdates")) < 20  # each waits its backoff on the clock
    failing = wait_for(lambda: cell.failing)  # three failed polls in a row
    assert "without a usable update_id" in failing.reason
    [letter] = letters()
    assert letter.detail == "it has no update_id" and '"x"' in letter.record["body"]["raw"]
    fake_telegram.push_text("run echo after the unreadable", chat_id=CHAT, user_id=ALLOWED)
    [sent] = until(fake_telegram, lambda: fake_telegram.sent(CHAT), timeout=60)
    assert "after the unreadable" in json.dumps(sent.params)
    assert len(letters()) == 1 and cell.restarts == 0


def test_in_a_group_another_bots_cancel_does_not_cancel_ours_even_as_a_reply_to_it(
    fake_llm: FakeLLMServer, fake_telegram: FakeTelegramServer, make_app: Callable[..., Application]
) -> None:
    """A reply to our bot is addressed to it, and /cancel@OtherBot read as our /cancel: it
    called off our running request. A command naming another bot is that bot's."""
    group = -304
    fake_llm.script(FakeResponse(hang=True))
    make_app(base_url=fake_llm.base_url, llm={"read_timeout": 60, "stream": False}, telegram={
        "token": "123456:TEST-TOKEN", "base_url": fake_telegram.base_url, "allowed_users": [ALLOWED],
        "poll_timeout": 1}, clock=fake_telegram.clock)
    fake_telegram.push_text("@synth_bot a long question", chat_id=group, user_id=ALLOWED, chat_type="group")
    wait_for(lambda: len(fake_llm.requests) == 1)
    fake_telegram.push_text("/cancel@OtherBot", chat_id=group, user_id=ALLOWED, chat_type="group",
                            reply_to_bot=True)
    ours = fake_telegram.push_text("/cancel@Synth_Bot", chat_id=group, user_id=ALLOWED, chat_type="group",
                                   reply_to_bot=True)
    [sent] = wait_for(lambda: fake_telegram.sent(group))
    assert (sent.params["text"], reply_to(sent)) == (CANCELLED, ours["message_id"])


@pytest.mark.parametrize("journal", [True, False], ids=["journal", "no-journal"])
def test_a_text_with_a_lone_surrogate_is_answered_with_it_read_as_a_replacement_character(
    fake_llm: FakeLLMServer, fake_telegram: FakeTelegramServer, make_app: Callable[..., Application],
    journal: bool,
) -> None:
    """JSON's "\\ud800" decodes to a character no UTF-8 holds: every hop that encoded the
    text failed on it (a crash three times, a dead letter, "something went wrong")."""
    make_app(base_url=fake_llm.base_url, journal={"enabled": journal}, clock=fake_telegram.clock, telegram={
        "token": "123456:TEST-TOKEN", "base_url": fake_telegram.base_url, "allowed_users": [ALLOWED],
        "poll_timeout": 1})
    fake_llm.script(actions({"type": "message_telegram_bot", "payload": {"text": "Hello to you."}}))
    fake_telegram.push_text("hello \ud800 there", chat_id=CHAT, user_id=ALLOWED,
                            first_name="Ada \udc00")
    [sent] = until(fake_telegram, lambda: fake_telegram.sent(CHAT))
    assert sent.params["text"] == "Hello to you."
    assert fake_llm.requests[0].messages[-1]["content"] == "hello \ufffd there"
