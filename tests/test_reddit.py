"""Reddit end to end: real asyncpraw against a fake Reddit API served by aiohttp on 127.0.0.1.

The bot and the fake share a ManualClock: the inbox is read on a timer, and a RATELIMIT is
waited out on one, so a test fires the timers (``until``) instead of waiting. Two tests keep
real time, each saying why: asyncprawcore paces by its own clock, and the kill -9 test runs
the daemon as a real process."""

from __future__ import annotations

import io
import json
import logging
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from asyncprawcore.rate_limit import RateLimiter
from conftest import Daemon, system_messages, wait_for

import autoresponse.interfaces
from autoresponse import Application, Settings
from autoresponse.actors.kernel import Clock, ManualClock
from autoresponse.testing.fake_llm import FakeLLMServer, FakeResponse
from autoresponse.actors.routes import executor, interface, sender
from autoresponse.app import StartError
from autoresponse.cli import RedactSecrets
from autoresponse.interfaces.reddit import PLATFORM, REFUSAL
from autoresponse.interfaces.reddit.client import CappedRateLimiter
from autoresponse.testing.fake_reddit import FakeRedditServer
from autoresponse.messages import OriginalContext, OutboundMessage
from autoresponse.supervisors import registered
from autoresponse.supervisors.status import snapshot

CLIENT_ID = "reddit-app-id"
CLIENT_SECRET = "reddit-client-secret-8c1f2a"
PASSWORD = "reddit-password-5e7d0b"
RATELIMIT = ("RATELIMIT", "Looks like you've been doing that a lot. Take a break for 2 seconds before "
                          "trying again.", "ratelimit")


@pytest.fixture(autouse=True, scope="module")
def reddit_platform() -> Iterator[None]:
    """Registered for these tests, unless it already is a built-in."""
    with registered(PLATFORM):
        yield


@pytest.fixture
def fake_reddit(manual_clock: ManualClock) -> Iterator[FakeRedditServer]:
    with FakeRedditServer(username="synth_bot", client_id=CLIENT_ID, client_secret=CLIENT_SECRET,
                          password=PASSWORD, clock=manual_clock) as server:
        yield server


def reddit_settings(fake: FakeRedditServer, **extra: Any) -> dict[str, Any]:
    return {"client_id": CLIENT_ID, "client_secret": CLIENT_SECRET, "username": "synth_bot",
            "password": PASSWORD, "oauth_url": fake.base_url, "reddit_url": fake.base_url,
            "allowed_users": ["Ada"], "poll_interval": 60, **extra}


@pytest.fixture
def bot(fake_llm: FakeLLMServer, fake_reddit: FakeRedditServer,
        make_app: Callable[..., Application]) -> Application:
    # The servers come first so that they outlive the app: it stops before they do.
    return make_app(base_url=fake_llm.base_url, reddit=reddit_settings(fake_reddit), clock=fake_reddit.clock)


def until(fake: FakeRedditServer, condition: Callable[[], Any], timeout: float = 15.0) -> Any:
    """Fire the bot's timers (the inbox's polling, RATELIMIT waits) in turn until
    ``condition()`` holds; its value."""
    assert isinstance(fake.clock, ManualClock)
    assert fake.clock.advance_until(condition, timeout), "condition not met"
    return condition()


def tell(app: Application, text: str, thing: str) -> None:
    """A reply for the sender, as the dispatcher would make it, to the inbox item ``thing``."""
    ctx = OriginalContext(chat_id="t3_post", message_id=thing, interface_name="reddit")
    app.runtime.send(sender("reddit"), OutboundMessage.reply(ctx, text))


def polls(fake: FakeRedditServer) -> int:
    return len(fake.calls_to("message/unread"))


def test_a_comment_reply_and_a_direct_message_are_each_answered_once_threaded(
    fake_reddit: FakeRedditServer, make_app: Callable[..., Application]
) -> None:
    journaled_when_read: list[tuple[list[str], set[str]]] = []
    with FakeLLMServer(delay=0.3) as llm:  # slow enough that the work is open when Reddit hears "read"
        app = make_app(base_url=llm.base_url, reddit=reddit_settings(fake_reddit), clock=fake_reddit.clock)
        assert app.journal is not None
        journal = app.journal
        fake_reddit.on_read = lambda names: journaled_when_read.append(
            (names, {item.correlation for item in journal.unfinished()}))
        comment = fake_reddit.push_comment("u/synth_bot run df -h", author="ada", subreddit="selfhosted")
        message = fake_reddit.push_message("run uptime", author="ada", subject="my server")
        until(fake_reddit, lambda: len(fake_reddit.replies()) == 2, timeout=30)
        assert app.runtime.wait_idle(timeout=15)
        seen = polls(fake_reddit)
        until(fake_reddit, lambda: polls(fake_reddit) >= seen + 5)  # later looks at the inbox change nothing
        app.stop()
    replies = {r.thing_id: r for r in fake_reddit.replies()}
    assert sorted(replies) == sorted([comment, message])  # each answered once, threaded under it
    assert "`df -h` finished" in replies[comment].text and "`uptime` finished" in replies[message].text
    assert fake_reddit.is_read(comment) and fake_reddit.is_read(message)
    # Marked read only once journaled: at that moment both were open work in the journal.
    assert journaled_when_read
    for names, journaled in journaled_when_read:
        assert {f"reddit-{name}" for name in names} <= journaled
    # The whole loop: a chat turn and a delivery turn each, the command's real output in
    # between, and the item's text, author, subreddit and fullname as the original context.
    chats = [r.messages[-1]["content"] for r in llm.requests if not r.messages[-1]["content"].startswith("{")]
    assert sorted(chats) == ["run df -h", "run uptime"]  # the mention is not part of the request
    deliveries = {m["original_context"]["fullname"]: m for m in system_messages(llm, "output")}
    assert deliveries[comment]["original_context"].items() >= {
        "interface_name": "reddit", "original_command": "u/synth_bot run df -h", "user_name": "ada",
        "subreddit": "selfhosted", "item_kind": "comment_reply", "message_id": comment}.items()
    assert deliveries[message]["original_context"]["subject"] == "my server"
    assert "Filesystem" in deliveries[comment]["outputs"][0]["output"]
    assert "message_reddit" in deliveries[message]["full_json_instructions"]


def test_a_long_reply_is_cut_at_paragraphs_and_threaded_in_order(
    bot: Application, fake_reddit: FakeRedditServer
) -> None:
    paragraphs = [f"**Part {n}.** " + ("Lorem ipsum dolor sit amet. " * 30).strip() for n in range(30)]
    paragraphs.insert(10, "```\n" + "code line\n" * 50 + "```")
    text = "\n\n".join(paragraphs)
    assert len(text) > 20_000
    tell(bot, text, "t1_ask")
    wait_for(lambda: len(fake_reddit.replies()) == 3, timeout=30)
    assert bot.runtime.wait_idle(timeout=10)
    chunks = fake_reddit.replies()
    assert all(len(c.text) <= 10_000 for c in chunks)
    assert "\n\n".join(c.text for c in chunks) == text  # cut only between paragraphs, Markdown kept
    # The first answers the item, each next one the chunk before it: one thread, in order.
    assert [c.thing_id for c in chunks] == ["t1_ask", chunks[0].fullname, chunks[1].fullname]


def test_a_blank_reply_is_asked_for_again_and_the_real_one_is_posted(
    fake_llm: FakeLLMServer, bot: Application, fake_reddit: FakeRedditServer
) -> None:
    # What a model emits for "nothing": spaces, a line break, a no-break and a zero-width space.
    fake_llm.script(FakeResponse(tool_calls=(("message_reddit", {"text": " \n\u00a0\u200b "}),)),
                    FakeResponse(tool_calls=(("message_reddit", {"text": "Hello, Ada."}),)))
    item = fake_reddit.push_message("hello", author="ada")
    until(fake_reddit, lambda: fake_reddit.replies(item))
    assert bot.runtime.wait_idle(timeout=10)
    assert [r.text for r in fake_reddit.replies()] == ["Hello, Ada."]  # nothing blank was posted
    [_, reask] = [r.messages for r in fake_llm.requests]
    assert reask[-1]["role"] == "tool" and "payload.text: the text is blank" in reask[-1]["content"]
    assert bot.runtime.dead_letters.letters() == []


@pytest.mark.parametrize("text", [" \n ", "\u200b\u3000\u3164"], ids=["spaces", "invisible"])
def test_a_reply_that_shows_nothing_is_a_dead_letter_never_a_silent_success(
    bot: Application, fake_reddit: FakeRedditServer, text: str
) -> None:
    tell(bot, text, "t1_a")  # past the action's own check (a bug, another path): still not "delivered"
    [letter] = wait_for(lambda: bot.runtime.dead_letters.letters())
    assert bot.runtime.wait_idle(timeout=10)
    assert letter.reason == "nothing to send" and "blank" in letter.detail
    assert fake_reddit.calls_to("api/comment") == []


def test_a_ratelimit_error_parks_only_that_reply(bot: Application, fake_reddit: FakeRedditServer) -> None:
    fake_reddit.fail_next("api/comment", error=RATELIMIT, thing_id="t1_a")
    tell(bot, "to A", "t1_a")
    wait_for(lambda: [c for c in fake_reddit.calls_to("api/comment") if not c.ok])
    tell(bot, "to B", "t4_b")
    wait_for(lambda: fake_reddit.replies("t4_b"))  # while A waits: no time has passed
    until(fake_reddit, lambda: fake_reddit.replies("t1_a"))
    assert bot.runtime.wait_idle(timeout=10)
    [refused] = [c for c in fake_reddit.calls_to("api/comment") if not c.ok]
    [to_a], [to_b] = fake_reddit.replies("t1_a"), fake_reddit.replies("t4_b")
    assert to_a.time - refused.time >= 2.0  # the wait Reddit named was kept ...
    assert to_b.time < to_a.time  # ... by that reply alone
    assert bot.runtime.dead_letters.letters() == []


def test_a_spent_rate_limit_budget_holds_back_the_next_request(
    fake_llm: FakeLLMServer, fake_reddit: FakeRedditServer, make_app: Callable[..., Application],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Real time: asyncprawcore honours X-Ratelimit-Reset by sleeping on its own clock, which
    the runtime's does not drive; so the bot and the fake run on real time here."""
    # The reply must be due only once the client has read the spent budget: told to send
    # earlier, it would rightly go out at once. The fake recording the answer is not enough
    # (the client reads it later, on its own loop), so watch the client's rate limiter.
    read_spent = threading.Event()
    update = RateLimiter.update

    def watched_update(limiter: RateLimiter, *, response_headers: Any) -> None:
        update(limiter, response_headers=response_headers)
        if limiter.remaining == 0:
            read_spent.set()

    monkeypatch.setattr(RateLimiter, "update", watched_update)
    fake_reddit.clock = Clock()
    bot = make_app(base_url=fake_llm.base_url, reddit=reddit_settings(fake_reddit, poll_interval=0.1))
    wait_for(lambda: polls(fake_reddit) >= 2)
    fake_reddit.spend_budget(reset=2)  # the next answer says: nothing left for 2 seconds
    spent = wait_for(lambda: [c for c in fake_reddit.calls if c.remaining == 0])[0]
    assert read_spent.wait(timeout=15), "the client never read the spent budget"
    tell(bot, "a reply while the budget is spent", "t1_a")
    [reply] = wait_for(lambda: fake_reddit.replies("t1_a"))
    calls = list(fake_reddit.calls)
    following = calls[calls.index(spent) + 1]
    assert following.time - spent.time >= 2.0  # X-Ratelimit-Reset was honoured ...
    assert reply.time - spent.time >= 2.0  # ... by the inbox poller and the sender alike


def test_a_rate_limit_reset_beyond_the_cap_holds_calls_back_only_as_long_as_the_cap(
    fake_llm: FakeLLMServer, fake_reddit: FakeRedditServer, make_app: Callable[..., Application],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Real time, as above. One answer says: budget spent, back in a day. Reddit's budget
    renews every ten minutes, so the wait is capped (``max_reset_wait``, one second here,
    ten minutes by default): the inbox is read and the reply posted after it, not a day later."""
    fake_reddit.clock = Clock()
    bot = make_app(base_url=fake_llm.base_url,
                   reddit=reddit_settings(fake_reddit, poll_interval=0.1, max_reset_wait=1.0))
    wait_for(lambda: polls(fake_reddit) >= 2)
    caplog.set_level(logging.WARNING, logger="autoresponse.reddit")
    fake_reddit.spend_budget(reset=86_400)
    spent = wait_for(lambda: [c for c in fake_reddit.calls if c.remaining == 0])[0]
    item = fake_reddit.push_message("run uptime", author="ada")
    [reply] = wait_for(lambda: fake_reddit.replies(item), timeout=20)
    calls = list(fake_reddit.calls)
    following = calls[calls.index(spent) + 1]
    assert 0.9 <= following.time - spent.time < 10  # held back for the cap, not for the day
    assert "`uptime` finished" in reply.text
    assert "rate limit resets in 86400s" in caplog.text and "waits 1s at most" in caplog.text
    assert snapshot(bot.runtime).healthy


def test_a_long_rate_limit_hold_shows_the_interface_failing_until_calls_flow_again(
    fake_llm: FakeLLMServer, fake_reddit: FakeRedditServer, make_app: Callable[..., Application],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Real time, as above. A spent budget holds every call back (no inbox read, no reply
    sent) for longer than the hold that is reported (a minute; one second here): the
    interface shows as failing, saying so, in the status /healthz reads; healthy again once
    calls flow."""
    monkeypatch.setattr(CappedRateLimiter, "report_after", 1.0)
    fake_reddit.clock = Clock()
    bot = make_app(base_url=fake_llm.base_url,
                   reddit=reddit_settings(fake_reddit, poll_interval=0.1, max_reset_wait=3.0))
    wait_for(lambda: polls(fake_reddit) >= 2)
    assert snapshot(bot.runtime, details=False).healthy
    fake_reddit.spend_budget(reset=86_400)
    failing = wait_for(lambda: snapshot(bot.runtime, details=False).failing.get(interface("reddit")))
    spent = [c for c in fake_reddit.calls if c.remaining == 0][0]
    assert failing.reason == ("Reddit's rate limit holds every call back for 3s (X-Ratelimit-Reset: "
                              "86400s, capped at 3s): no inbox is read, no reply sent")
    assert fake_reddit.calls[-1] == spent  # held: nothing went out since
    wait_for(lambda: snapshot(bot.runtime, details=False).healthy, timeout=15)  # the calls flow again
    following = wait_for(lambda: list(fake_reddit.calls)[fake_reddit.calls.index(spent) + 1:])[0]
    assert following.time - spent.time >= 2.9  # not before the hold was over
    item = fake_reddit.push_message("run uptime", author="ada")
    assert wait_for(lambda: fake_reddit.replies(item), timeout=20)
    assert snapshot(bot.runtime).healthy


def test_reddit_refusing_a_reply_makes_a_dead_letter_not_a_retry_loop(
    bot: Application, fake_reddit: FakeRedditServer
) -> None:
    fake_reddit.fail_next("api/comment", error=("DELETED_COMMENT", "that comment has been deleted", "parent"))
    tell(bot, "too late", "t1_gone")
    [letter] = wait_for(lambda: bot.runtime.dead_letters.letters())
    assert bot.runtime.wait_idle(timeout=10)
    assert letter.reason == "rejected by Reddit" and "DELETED_COMMENT" in letter.detail
    assert len(fake_reddit.calls_to("api/comment")) == 1


#: Inbox items whose one field is not what Reddit sends: each fails to parse.
MALFORMED = {
    "body": {"body": {"not": "text"}},
    "subject": {"subject": 42},
    "link_id": {"link_id": ["t3_a", "t3_b"]},
}


@pytest.mark.parametrize("field", sorted(MALFORMED))
def test_a_malformed_inbox_item_is_a_dead_letter_and_the_items_behind_it_are_answered(
    bot: Application, fake_reddit: FakeRedditServer, field: str
) -> None:
    # The fake stores what it is given, so a wrong type goes out as Reddit would never send it.
    push = fake_reddit.push_message if field == "subject" else fake_reddit.push_comment
    bad = push(**{"body": "run df -h", "author": "ada", **MALFORMED[field]})
    good = fake_reddit.push_message("run uptime", author="ada")
    [reply] = until(fake_reddit, lambda: fake_reddit.replies(good), timeout=30)
    assert bot.runtime.wait_idle(timeout=10)
    [letter] = bot.runtime.dead_letters.letters()
    assert letter.reason == "malformed item" and field in letter.detail  # says what was wrong
    assert bad in letter.record["body"]["raw"]  # and keeps the item, to look into
    assert fake_reddit.is_read(bad)  # acknowledged: it is not fetched again
    seen = polls(fake_reddit)
    until(fake_reddit, lambda: polls(fake_reddit) >= seen + 3)
    assert bot.runtime.wait_idle(timeout=10)
    assert len(bot.runtime.dead_letters.letters()) == 1 and fake_reddit.replies() == [reply]
    # The inbox was read on, never crashed: no restart, nothing down or failing.
    status = snapshot(bot.runtime)
    reader = status.find(interface("reddit"))
    assert status.healthy and reader is not None and reader.restarts == 0


def test_an_item_without_a_name_is_one_dead_letter_though_it_stays_unread(
    bot: Application, fake_reddit: FakeRedditServer
) -> None:
    """Reddit marks items read by fullname; one with no id at all is listed on every poll.
    It is dead-lettered the first time, not once a poll, and the inbox reads on."""
    nameless = fake_reddit.push_message("run df -h", author="ada")
    with fake_reddit._lock:
        data = fake_reddit._items[nameless].data
        del data["id"], data["name"]
    good = fake_reddit.push_message("run uptime", author="ada")
    until(fake_reddit, lambda: fake_reddit.replies(good), timeout=30)
    seen = polls(fake_reddit)
    until(fake_reddit, lambda: polls(fake_reddit) >= seen + 3)
    assert bot.runtime.wait_idle(timeout=10)
    assert not fake_reddit.is_read(nameless)  # nothing could mark it read
    [letter] = bot.runtime.dead_letters.letters()
    assert letter.reason == "malformed item" and "run df -h" in letter.record["body"]["raw"]
    assert '"author": "ada"' in letter.record["body"]["raw"]  # as Reddit sent it, not as asyncpraw made it


def test_an_item_with_an_id_but_no_name_is_answered_once_and_marked_read(
    bot: Application, fake_reddit: FakeRedditServer
) -> None:
    item = fake_reddit.push_message("run uptime", author="ada")
    with fake_reddit._lock:
        del fake_reddit._items[item].data["name"]  # asyncpraw names it by its kind and id
    [reply] = until(fake_reddit, lambda: fake_reddit.replies(item), timeout=30)
    seen = polls(fake_reddit)
    until(fake_reddit, lambda: polls(fake_reddit) >= seen + 3)
    assert bot.runtime.wait_idle(timeout=10)
    assert fake_reddit.is_read(item) and fake_reddit.replies() == [reply]


def test_an_error_in_place_of_an_item_is_a_dead_letter_and_the_items_beside_it_are_answered(
    bot: Application, fake_reddit: FakeRedditServer
) -> None:
    """asyncpraw raises its own exception for an error object, where an item should be."""
    good = fake_reddit.push_message("run uptime", author="ada")
    page = fake_reddit._unread(25)
    page["data"]["children"].insert(0, {"json": {"errors": [["SOMETHING_BROKE", "an error, not an item", ""]]}})
    fake_reddit.answer_next("message/unread", json.dumps(page).encode())
    until(fake_reddit, lambda: fake_reddit.replies(good), timeout=30)
    assert bot.runtime.wait_idle(timeout=10)
    [letter] = bot.runtime.dead_letters.letters()
    assert letter.reason == "malformed item" and "SOMETHING_BROKE" in letter.detail
    reader = snapshot(bot.runtime).find(interface("reddit"))
    assert reader is not None and reader.restarts == 0


def test_an_unreadable_page_of_the_inbox_is_a_failed_read_and_the_reader_goes_on(
    bot: Application, fake_reddit: FakeRedditServer
) -> None:
    for body in (b"not json at all", b"[" * 100_000, b'{"kind": "Listing", "data": {"children": "none"}}',
                 b'{"data": []}'):
        fake_reddit.answer_next("message/unread", body)
    good = fake_reddit.push_message("run uptime", author="ada")
    until(fake_reddit, lambda: fake_reddit.replies(good), timeout=30)
    assert polls(fake_reddit) >= 5  # the four bad pages were read, and the inbox read again
    reader = snapshot(bot.runtime).find(interface("reddit"))
    assert reader is not None and reader.restarts == 0  # backed off and read again, not crashed


def test_strangers_get_no_action_and_by_default_no_answer(
    bot: Application, fake_llm: FakeLLMServer, fake_reddit: FakeRedditServer
) -> None:
    with bot.runtime.probe(executor("terminal")) as ran:
        item = fake_reddit.push_message("run df -h", author="mallory")
        until(fake_reddit, lambda: fake_reddit.is_read(item))
        seen = polls(fake_reddit)
        until(fake_reddit, lambda: polls(fake_reddit) >= seen + 3)
        assert bot.runtime.wait_idle(timeout=10)
        assert ran.envelopes == []
    assert fake_llm.requests == [] and fake_reddit.replies() == []


def test_the_refusal_policy_can_answer_strangers_politely(
    fake_llm: FakeLLMServer, fake_reddit: FakeRedditServer, make_app: Callable[..., Application]
) -> None:
    app = make_app(base_url=fake_llm.base_url, reddit=reddit_settings(fake_reddit, strangers="refuse"),
                   clock=fake_reddit.clock)
    item = fake_reddit.push_comment("run df -h", author="mallory")
    [refusal] = until(fake_reddit, lambda: fake_reddit.replies())
    assert app.runtime.wait_idle(timeout=10)
    assert (refusal.thing_id, refusal.text) == (item, REFUSAL)
    assert fake_llm.requests == []


def closed(app: Application, *items: str) -> bool:
    """Whether each inbox item's work item is journaled and closed (it keeps its trace)."""
    assert app.journal is not None
    open_ = {item.correlation for item in app.journal.unfinished()}
    return all(f"reddit-{i}" not in open_ and app.journal.trace(f"reddit-{i}") is not None for i in items)


def test_a_stranger_is_refused_once_an_hour_however_often_they_ask(
    fake_llm: FakeLLMServer, fake_reddit: FakeRedditServer, make_app: Callable[..., Application],
    caplog: pytest.LogCaptureFixture
) -> None:
    """A refusal says the same every time: a stranger's five comments (a script, or another
    bot set to answer strangers) get one, and one more only once their window (an hour) is
    over. Each comment is read, journaled and closed all the same, and the log has two lines
    (the refusal, then the first left unanswered), not one a comment. Ada is answered every time."""
    caplog.set_level(logging.INFO, logger="autoresponse.inbound")
    app = make_app(base_url=fake_llm.base_url, reddit=reddit_settings(fake_reddit, strangers="refuse"),
                   clock=fake_reddit.clock)
    theirs = [fake_reddit.push_comment(f"still there? ({n})", author="mallory") for n in range(5)]
    hers = [fake_reddit.push_message(f"hello ({n})", author="ada") for n in range(3)]
    until(fake_reddit, lambda: all(fake_reddit.is_read(i) for i in theirs + hers) and len(fake_reddit.replies()) >= 4)
    assert app.runtime.wait_idle(timeout=10)
    seen = polls(fake_reddit)
    until(fake_reddit, lambda: polls(fake_reddit) >= seen + 3)
    refusals = [r for r in fake_reddit.replies() if r.text == REFUSAL]
    assert [r.thing_id for r in refusals] == [theirs[0]]
    assert sorted(r.thing_id for r in fake_reddit.replies() if r.text != REFUSAL) == sorted(hers)
    assert closed(app, *theirs, *hers)
    logged = [r.getMessage() for r in caplog.records if r.name == "autoresponse.inbound"]
    assert len(logged) == 2 and "refused a request from mallory" in logged[0]
    assert "left a request from mallory" in logged[1] and "window of 1 hour" in logged[1]

    fake_reddit.clock.advance(3600)  # the window is over
    again = fake_reddit.push_comment("and now?", author="mallory")
    until(fake_reddit, lambda: len(fake_reddit.replies()) == 5)
    assert [r.thing_id for r in fake_reddit.replies() if r.text == REFUSAL] == [theirs[0], again]


def test_a_bot_that_answers_every_reply_gets_a_bounded_number_of_turns_an_hour(
    fake_llm: FakeLLMServer, fake_reddit: FakeRedditServer, make_app: Callable[..., Application]
) -> None:
    """Two bots set to converse with strangers would answer each other without end: the
    other bot here answers every reply of ours at once. It gets ``stranger_turns`` turns
    (3 here), then its comments go unanswered (and no LLM call is made) until the window
    is over; Ada, meanwhile, is answered as ever."""
    app = make_app(base_url=fake_llm.base_url, clock=fake_reddit.clock,
                   reddit=reddit_settings(fake_reddit, strangers="converse", stranger_turns=3))
    theirs = [fake_reddit.push_comment("hello, fellow bot", author="chatty_bot", link_id="t3_thread")]
    for _ in range(12):  # each look at the inbox: the other bot has answered what we posted
        seen = polls(fake_reddit)
        until(fake_reddit, lambda: polls(fake_reddit) > seen)
        assert app.runtime.wait_idle(timeout=10)
        for reply in fake_reddit.replies()[len(theirs) - 1:]:
            theirs.append(fake_reddit.push_comment(f"re: {reply.text[:30]}", author="chatty_bot",
                                                   link_id="t3_thread", parent_id=reply.thing_id))
    assert len(fake_reddit.replies()) == 3 and len(fake_llm.requests) == 3
    assert len(theirs) == 4 and closed(app, *theirs)  # its fourth comment: read and closed, unanswered
    hers = fake_reddit.push_message("hello", author="ada")
    until(fake_reddit, lambda: fake_reddit.replies(hers))

    fake_reddit.clock.advance(3600)  # the window is over: it is answered again
    more = fake_reddit.push_comment("anyone?", author="chatty_bot", link_id="t3_thread")
    until(fake_reddit, lambda: fake_reddit.replies(more))
    assert len(fake_reddit.replies()) == 5


def test_a_cancel_sent_as_a_new_private_message_says_nothing_of_this_conversation_was_under_way(
    fake_llm: FakeLLMServer, fake_reddit: FakeRedditServer, make_app: Callable[..., Application]
) -> None:
    """Reddit's compose form makes "/cancel" a private message of its own, a conversation of
    its own: the request of the other one goes on, and the answer says so truly (not that the
    request had finished)."""
    fake_llm.script(FakeResponse(hang=True))  # the request runs on until the app stops
    app = make_app(base_url=fake_llm.base_url, reddit=reddit_settings(fake_reddit), clock=fake_reddit.clock,
                   llm={"read_timeout": 60})
    request = fake_reddit.push_message("run uptime", author="ada", subject="my server")
    until(fake_reddit, lambda: fake_llm.requests)
    cancel = fake_reddit.push_message("/cancel", author="ada", subject="cancel")
    [answer] = until(fake_reddit, lambda: fake_reddit.replies(cancel))
    assert answer.text == "Nothing to cancel in this conversation."
    assert app.journal is not None
    assert f"reddit-{request}" in {item.correlation for item in app.journal.unfinished()}  # still running


def test_wrong_credentials_stop_the_start_with_a_reason_and_no_secret(
    fake_reddit: FakeRedditServer, make_app: Callable[..., Application]
) -> None:
    wrong = "not-the-password-3f9a"
    with pytest.raises(StartError) as failed:
        make_app(reddit=reddit_settings(fake_reddit, password=wrong), clock=fake_reddit.clock)
    assert "cannot sign in to Reddit" in str(failed.value) and "invalid_grant" in str(failed.value)
    assert wrong not in str(failed.value)


def test_no_secret_appears_in_logs_status_or_dead_letters(
    fake_llm: FakeLLMServer, fake_reddit: FakeRedditServer, make_app: Callable[..., Application]
) -> None:
    settings = reddit_settings(fake_reddit)
    assert {CLIENT_SECRET, PASSWORD} <= set(Settings.load(reddit=settings).secrets())  # so redacted
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.addFilter(RedactSecrets(Settings.load(reddit=settings).secrets()))
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    try:
        app = make_app(base_url=fake_llm.base_url, reddit=settings, clock=fake_reddit.clock)
        fake_reddit.fail_next("api/comment", status=403)
        fake_reddit.push_message("run df -h", author="ada")
        until(fake_reddit, lambda: app.runtime.dead_letters.letters(), timeout=30)
        assert app.runtime.wait_idle(timeout=10)
        status = snapshot(app.runtime).model_dump_json()
        letters = json.dumps([d.summary() for d in app.runtime.dead_letters.letters()], default=str)
        app.stop()
    finally:
        root.removeHandler(handler)
        root.setLevel(level)
    log = out.getvalue()
    assert "message/unread" in log  # it did log its work
    access_tokens = [c.params.get("access_token") for c in fake_reddit.calls]  # never sent as a param
    assert access_tokens == [None] * len(access_tokens)
    for secret in (CLIENT_SECRET, PASSWORD, "fake-access-token-"):
        assert secret not in log and secret not in status and secret not in letters


@pytest.mark.skipif("reddit" not in autoresponse.interfaces.BUILTIN_PLATFORMS,
                    reason="the daemon knows Reddit only once it is a built-in platform")
def test_a_kill_9_before_the_reply_loses_neither_and_answers_neither_twice(tmp_path: Path) -> None:
    """Real time: the daemon is a real process, killed with SIGKILL and started again."""
    with FakeLLMServer(delay=1.0) as llm, FakeRedditServer(password=PASSWORD) as reddit:
        daemon = Daemon(
            tmp_path, AUTORESPONSE_LLM__BASE_URL=llm.base_url, AUTORESPONSE_CONSOLE__ENABLED="false",
            AUTORESPONSE_EVENTS__ENABLED="false", AUTORESPONSE_TERMINAL__ENABLED="true",
            AUTORESPONSE_TERMINAL__ALLOWED_COMMANDS='["df", "uptime"]',
            AUTORESPONSE_REDDIT__CLIENT_ID=CLIENT_ID, AUTORESPONSE_REDDIT__CLIENT_SECRET=CLIENT_SECRET,
            AUTORESPONSE_REDDIT__USERNAME="synth_bot", AUTORESPONSE_REDDIT__PASSWORD=PASSWORD,
            AUTORESPONSE_REDDIT__OAUTH_URL=reddit.base_url, AUTORESPONSE_REDDIT__REDDIT_URL=reddit.base_url,
            AUTORESPONSE_REDDIT__ALLOWED_USERS='["ada"]', AUTORESPONSE_REDDIT__POLL_INTERVAL="0.2",
        ).start()
        try:
            comment = reddit.push_comment("run df -h", author="ada")
            message = reddit.push_message("run uptime", author="ada")
            wait_for(lambda: reddit.is_read(comment) and reddit.is_read(message), timeout=30)
            assert reddit.replies() == []  # journaled and acknowledged, not yet answered
            daemon.kill()
            daemon.start()
            wait_for(lambda: len(reddit.replies()) >= 2, timeout=60)
            seen = polls(reddit)
            wait_for(lambda: polls(reddit) >= seen + 5, timeout=30)
        finally:
            code = daemon.stop()
    assert sorted(r.thing_id for r in reddit.replies()) == sorted([comment, message])
    assert code == 0
    log = daemon.log()
    assert CLIENT_SECRET not in log and PASSWORD not in log
