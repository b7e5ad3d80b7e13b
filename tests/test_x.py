"""X end to end: real, unpatched tweepy against a fake X API v2 on 127.0.0.1.

tweepy only knows https://api.twitter.com; our session resolves that name to the fake
and trusts the fake's test certificate authority, so the requests, their TLS and their
OAuth 1.0a signatures are the ones X would get (the fake checks the signatures).

The bot and the fake share a ManualClock: the mentions are read on a timer, and a 429 is
waited out on one, so a test fires the timers (``advance_until``) instead of waiting.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import logging
import random
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from conftest import Gate, system_messages, wait_for

from autoresponse import Application, Settings
from autoresponse.actors.kernel import ManualClock
from autoresponse.testing.fake_llm import FakeLLMServer, FakeResponse
from autoresponse.actors.conversation import CANCELLED, FORGOTTEN, NOTHING_TO_CANCEL
from autoresponse.actors.prompts import SILENCE_ALLOWED
from autoresponse.actors.routes import CONVERSATIONS, executor, interface, sender
from autoresponse.app import StartError
from autoresponse.cli import RedactSecrets
from autoresponse.interfaces.x import PLATFORM, REFUSAL
from autoresponse.interfaces.x.counting import split_post, weighted_length
from autoresponse.interfaces.x.settings import X_UNKNOWN_RESET_WAIT_SECONDS
from autoresponse.testing.fake_x import Call, FakeXServer
from autoresponse.messages import OriginalContext, OutboundMessage
from autoresponse.supervisors import registered
from autoresponse.supervisors.status import snapshot

ME, ADA, STRANGER = 1000, 7, 99
KEYS = ("x-consumer-key-0a1b2c", "x-consumer-secret-3d4e5f", "x-access-token-6a7b8c", "x-token-secret-9d0e1f")


@pytest.fixture(autouse=True, scope="module")
def x_platform() -> Iterator[None]:
    """Registered for these tests, unless it already is a built-in."""
    with registered(PLATFORM):
        yield


@pytest.fixture
def fake_x(manual_clock: ManualClock) -> Iterator[FakeXServer]:
    with FakeXServer(user_id=ME, username="synth", oauth1=KEYS, clock=manual_clock) as server:
        yield server


def x_settings(fake: FakeXServer, tmp_path: Path, **extra: Any) -> dict[str, Any]:
    consumer_key, consumer_secret, access_token, access_token_secret = KEYS
    return {"consumer_key": consumer_key, "consumer_secret": consumer_secret, "access_token": access_token,
            "access_token_secret": access_token_secret, "api_address": fake.api_address,
            "ca_file": str(fake.write_ca(tmp_path / "x-ca.pem")), "allowed_users": [ADA],
            "poll_interval": 60, **extra}


@pytest.fixture
def bot(fake_llm: FakeLLMServer, fake_x: FakeXServer, make_app: Callable[..., Application],
        tmp_path: Path) -> Application:
    # The servers come first so that they outlive the app: it stops before they do.
    return make_app(base_url=fake_llm.base_url, x=x_settings(fake_x, tmp_path), clock=fake_x.clock)


def until(fake: FakeXServer, condition: Callable[[], Any]) -> Any:
    """Fire the bot's timers (the mentions' polling, rate-limit waits) in turn until
    ``condition()`` holds; its value."""
    assert isinstance(fake.clock, ManualClock)
    assert fake.clock.advance_until(condition), "condition not met"
    return condition()


def actions(*items: dict[str, Any]) -> FakeResponse:
    return FakeResponse(content=json.dumps({"actions": list(items)}))


def tell(app: Application, text: str, post_id: str) -> None:
    """A reply for the sender, as the dispatcher would make it, to the post ``post_id``."""
    ctx = OriginalContext(chat_id=post_id, message_id=int(post_id), interface_name="x")
    app.runtime.send(sender("x"), OutboundMessage.reply(ctx, text))


def looks(fake: FakeXServer) -> int:
    return len(fake.calls_to("GET mentions"))


def test_a_mention_gets_one_threaded_reply_through_the_whole_loop(
    bot: Application, fake_llm: FakeLLMServer, fake_x: FakeXServer
) -> None:
    fake_llm.script(actions({"type": "terminal", "payload": {"command": "df -h"}}),
                    actions({"type": "message_x", "payload": {"text": "Your disks are fine."}}))
    mention = fake_x.push_mention("@synth run df -h", author_id=ADA, username="ada")
    [post] = until(fake_x, lambda: fake_x.posts())
    assert bot.runtime.wait_idle(timeout=10)
    seen = looks(fake_x)
    until(fake_x, lambda: looks(fake_x) >= seen + 5)  # later looks at the mentions change nothing
    assert fake_x.posts() == [post]
    assert (post.text, post.in_reply_to) == ("Your disks are fine.", mention)
    # The LLM got the request without the mention, and the command's real output.
    assert fake_llm.requests[0].messages[-1]["content"] == "run df -h"
    [delivery] = system_messages(fake_llm, "output")
    assert delivery["original_context"]["user_name"] == "ada"
    assert delivery["original_context"]["original_command"] == "@synth run df -h"
    assert str(delivery["original_context"]["post_id"]) == mention
    assert "Filesystem" in delivery["outputs"][0]["output"]
    # Every request was tweepy's own, signed for api.twitter.com.
    assert {c.auth for c in fake_x.calls} == {"oauth1"}


def test_a_600_character_reply_becomes_three_threaded_posts_in_order(
    bot: Application, fake_x: FakeXServer
) -> None:
    mention = fake_x.push_mention("@synth tell me a story", author_id=STRANGER, username="someone")
    words = [f"word{n:03d}" for n in range(75)]  # 75 words of 7 letters and spaces: 599 characters
    text = " ".join(words) + "!"
    assert len(text) == 600
    tell(bot, text, mention)
    posts = wait_for(lambda: len(fake_x.posts()) == 3 and fake_x.posts())
    assert bot.runtime.wait_idle(timeout=10)
    assert all(weighted_length(p.text) <= 280 for p in posts)
    assert " ".join(p.text for p in posts) == text  # cut between words, nothing lost, in order
    assert [p.in_reply_to for p in posts] == [mention, posts[0].id, posts[1].id]  # one thread


def test_links_cjk_and_emoji_are_counted_the_way_x_counts_them(
    bot: Application, fake_x: FakeXServer
) -> None:
    assert weighted_length("https://example.com/" + "a" * 200) == 23
    assert weighted_length("こんにちは") == 10 and weighted_length("👩‍💻 ok") == 5
    # A long link costs 23, so this fits in one post; 300 CJK characters need three.
    one = "Read https://example.com/" + "very-long-path/" * 20 + " before you upgrade."
    assert len(one) > 280
    assert split_post(one) == [one]
    three = "漢字" * 150
    assert [len(p) for p in split_post(three)] == [140, 140, 20]
    mention = fake_x.push_mention("@synth hi", author_id=STRANGER, username="someone")
    tell(bot, one, mention)
    [post] = wait_for(lambda: fake_x.posts(mention))
    assert post.text == one


#: Replies with links that end where CJK or emoji follow them, or that are no links to X
#: (.corp and .local are no TLDs: counted character by character), each with what
#: twitter-text 3.1.0 weighs every post split_post cuts it into.
LINKS_X_READS_ITS_WAY: dict[str, tuple[str, list[int]]] = {
    "ja_url_inline": ("詳細はhttps://example.com/docsを参照してください。" + "これはテストです。" * 30,
                      [279, 280, 30]),
    "url_then_cjk": ("https://example.com/" + "日本語" * 60, [279, 104]),
    "url_then_emoji": ("see https://example.com/" + "👍" * 150, [3, 279, 44]),
    "corp_tld": ("dashboard: https://grafana.corp/d/" + "a" * 300, [10, 280, 43]),
    "local_tld": ("see http://nas.local:8080/" + "b" * 300, [3, 280, 42]),
}
#: Texts with links of every kind, and what twitter-text 3.1.0 weighs each.
WEIGHED_BY_TWITTER_TEXT: dict[str, int] = {
    "詳細はhttps://example.com/docsを参照してください。": 49,
    "https://example.com/日本語": 29,
    "see https://example.com/👍👍": 31,
    "dashboard: https://grafana.corp/d/abc": 37,
    "see http://nas.local:8080/x and https://intranet.lan/wiki": 57,
    "(see https://en.wikipedia.org/wiki/Foo_(bar)).": 30,
    "mirror: example.com/path?q=1, docs.python.org and README.md": 84,  # .md is a TLD
    "http://a.co is short; abchttp://a.co is no link": 59,
    "https://t.co/abcdef/extra and 日本example.com/パス": 65,
    "https://日本.jp/パス and пример.рф/x": 43,
    "a.py👍пример.рф/x x.ai🇯🇵wordéпример.рф/": 77,
}


def test_a_reply_whose_host_never_ends_is_cut_in_bounded_time_and_never_too_heavy() -> None:
    """Searched for links from each of its characters, as twitter-text searches, a host
    such as "a-a-a-…" took a minute a reply (quadratic): the X sender was held that long.
    A run past the searched length weighs a link more for each top-level domain in it:
    never less than X counts (twitter-text 3.1.0's figures as literals)."""
    hostile = "https://" + "a-" * 15_990 + ".com"  # a model's 32,000 characters
    cut: list[list[str]] = []
    worker = threading.Thread(target=lambda: cut.append(split_post(hostile)), daemon=True)
    worker.start()
    worker.join(timeout=30)  # only to stop a hang: it takes well under a second
    assert cut, "the reply was not cut within 30 s"
    [posts] = cut
    assert "".join(posts) == hostile and all(weighted_length(p) <= 280 for p in posts)
    assert weighted_length("日本語" * 400 + "example.com") >= 2411
    assert weighted_length("https://" + "a-" * 200 + ".com/path") >= 417
    # Thirteen sites in a paragraph with no space: the weight of each domain's link sits on
    # its dot, never on a piece of no text (the reply began with an empty post X refused).
    sites = "、".join(["github.com", "gitlab.com", "qiita.com", "zenn.dev", "note.com", "hatena.ne.jp", "pypi.org",
                      "npmjs.com", "docker.com", "python.org", "rust-lang.org", "go.dev", "nodejs.org"])
    listed = "開発でよく使うサイトをまとめました。" + sites + "などです。" + "ドキュメントの充実度は重要です。" * 8
    posts = split_post(listed)
    assert all(p.strip() for p in posts) and "".join(posts) == listed
    assert all(weighted_length(p) <= 280 for p in posts)


def test_a_bracketed_part_after_punctuation_is_no_part_of_the_link() -> None:
    """twitter-text ends a path before "!(…)" or ".(…)": counted as one link of 23, a post
    X weighed at 299 went out and was refused (twitter-text 3.1.0's figures)."""
    assert weighted_length("example.com/!(a)") == 27
    assert weighted_length("https://example.com/2.4.(LTS-build)") == 23 + len(".(LTS-build)")


def test_a_link_ends_where_x_ends_it_and_no_post_is_too_heavy_for_x(
    bot: Application, fake_x: FakeXServer
) -> None:
    for name, (text, x_weighs) in LINKS_X_READS_ITS_WAY.items():
        posts = split_post(text)
        assert [weighted_length(p) for p in posts] == x_weighs, name  # X takes every one
        assert all(weight <= 280 for weight in x_weighs)
        assert "".join("".join(posts).split()) == "".join(text.split()), name  # nothing lost but spaces at cuts
    for text, x_weighs in WEIGHED_BY_TWITTER_TEXT.items():
        assert weighted_length(text) == x_weighs, text
    # The reply a user sees: all of it, in posts X takes, not one post X refuses.
    text, x_weighs = LINKS_X_READS_ITS_WAY["url_then_cjk"]
    mention = fake_x.push_mention("@synth links?", author_id=STRANGER, username="someone")
    tell(bot, text, mention)
    posts = wait_for(lambda: len(fake_x.posts()) == 2 and fake_x.posts())
    assert [weighted_length(p.text) for p in posts] == x_weighs
    assert "".join(p.text for p in posts) == text


#: The pieces of fuzz-like texts: words, links of every kind, CJK, emoji, punctuation.
PIECES = ["word", "日本語", "한국어", "👍", "👨‍👩‍👧", "🇯🇵", "é", "x.ai", "README.md", "v1.2.3", "example.com",
          "https://example.com/path?q=1", "https://grafana.corp/d/abc", "http://nas.local:8080/", "を参照", "。",
          ".", "/", "(", ")", "https://t.co/abcdef", "https://日本.jp/パス", "пример.рф", "a_b.example.com", "http://a.co"]
#: What twitter-text 3.1.0 weighs each of them, whole and in the posts split_post makes.
FUZZ_WEIGHED_BY_TWITTER_TEXT = [528, 752, 1460, 628, 1574, 532, 687, 1188]
FUZZ_POSTS_WEIGHED_BY_TWITTER_TEXT = [
    [272, 254], [270, 275, 204], [269, 257, 280, 267, 255, 126], [251, 245, 130],
    [268, 278, 270, 229, 256, 268], [277, 253], [277, 273, 134], [279, 277, 278, 274, 76]]


def test_fuzz_like_texts_are_cut_into_posts_x_takes() -> None:
    rng = random.Random(20261205)
    texts = ["".join(rng.choice(PIECES) + rng.choice(["", " ", "\n"]) for _ in range(rng.randint(40, 160)))
             for _ in range(8)]
    assert [weighted_length(t) for t in texts] == FUZZ_WEIGHED_BY_TWITTER_TEXT
    posts = [split_post(text) for text in texts]
    assert [[weighted_length(p) for p in each] for each in posts] == FUZZ_POSTS_WEIGHED_BY_TWITTER_TEXT
    for text, each in zip(texts, posts, strict=True):
        assert " ".join(" ".join(each).split()) == " ".join(text.split())  # cut between words, in order


def test_since_id_survives_a_restart_neither_repeating_nor_skipping(
    fake_llm: FakeLLMServer, fake_x: FakeXServer, make_app: Callable[..., Application], tmp_path: Path
) -> None:
    old = fake_x.push_mention("@synth hello from before", author_id=ADA, username="ada", ago=60)
    settings = x_settings(fake_x, tmp_path)
    first = make_app(base_url=fake_llm.base_url, x=settings, clock=fake_x.clock)
    one = fake_x.push_mention("@synth hello", author_id=ADA, username="ada")
    until(fake_x, lambda: fake_x.posts(one))
    assert first.runtime.wait_idle(timeout=10)
    first.stop()
    looked_before_restart = looks(fake_x)
    two = fake_x.push_mention("@synth hello again", author_id=ADA, username="ada")  # while it is down
    second = make_app(base_url=fake_llm.base_url, x=settings, clock=fake_x.clock)
    until(fake_x, lambda: fake_x.posts(two))
    assert second.runtime.wait_idle(timeout=10)
    seen = looks(fake_x)
    until(fake_x, lambda: looks(fake_x) >= seen + 5)
    assert [p.in_reply_to for p in fake_x.posts()] == [one, two]  # each once; none from before the start
    assert old not in {p.in_reply_to for p in fake_x.posts()}
    # After the restart X was asked only for what came after the last mention taken.
    [first_look_after, *_] = fake_x.calls_to("GET mentions")[looked_before_restart:]
    assert first_look_after.params["since_id"] == one


def test_a_429_on_a_reply_waits_for_x_rate_limit_reset(bot: Application, fake_x: FakeXServer) -> None:
    mention = fake_x.push_mention("@synth hi", author_id=STRANGER, username="someone")
    fake_x.fail_next("POST /2/tweets", 429, reset_in=3)
    tell(bot, "eventually", mention)
    [post] = until(fake_x, lambda: fake_x.posts())
    [refused, accepted] = fake_x.calls_to("POST /2/tweets")
    assert not refused.ok and accepted.ok
    assert accepted.time - refused.time >= 3.0  # not before the reset X named (on the clock)
    assert post.text == "eventually" and bot.runtime.dead_letters.letters() == []


def test_a_429_on_the_mentions_waits_for_x_rate_limit_reset(bot: Application, fake_x: FakeXServer) -> None:
    until(fake_x, lambda: looks(fake_x) >= 2)
    fake_x.fail_next("GET mentions", 429, reset_in=3)
    refused = until(fake_x, lambda: [c for c in fake_x.calls_to("GET mentions") if not c.ok])[0]
    after = until(fake_x, lambda: [c for c in fake_x.calls_to("GET mentions") if c.time > refused.time])[0]
    assert 3.0 <= after.time - refused.time < 60  # the reset X named, not the next poll


class UnreadableResetX(FakeXServer):
    """Answers the next posts with a 429 whose ``x-rate-limit-reset`` is no number."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.resets: list[str] = []

    async def _dispatch(self, request: web.BaseRequest) -> web.Response:
        if self.resets and self._call_name(request.method, request.path) == "POST /2/tweets":
            await request.read()
            with self._lock:
                self.calls.append(Call(self.clock.monotonic(), request.method, request.path, {},
                                       "oauth1", False))
            return self._problem(429, "Too Many Requests", {"x-rate-limit-reset": self.resets.pop(0)})
        return await super()._dispatch(request)


def test_a_429_whose_reset_is_no_number_is_waited_out_and_the_reply_goes_out_once(
    fake_llm: FakeLLMServer, manual_clock: ManualClock, make_app: Callable[..., Application], tmp_path: Path,
) -> None:
    with UnreadableResetX(user_id=ME, username="synth", oauth1=KEYS, clock=manual_clock) as x:
        app = make_app(base_url=fake_llm.base_url, x=x_settings(x, tmp_path), clock=x.clock)
        mention = x.push_mention("@synth hi", author_id=STRANGER, username="someone")
        x.resets.append("soon")
        tell(app, "eventually", mention)
        [post] = until(x, lambda: x.posts())
        assert app.runtime.wait_idle(timeout=10)
        [refused, accepted] = x.calls_to("POST /2/tweets")
        assert accepted.time - refused.time >= X_UNKNOWN_RESET_WAIT_SECONDS  # waited, on the clock
        assert post.text == "eventually" and app.runtime.dead_letters.letters() == []
        sender_x = snapshot(app.runtime).find(sender("x"))
        assert sender_x is not None and sender_x.restarts == 0
        app.stop()


@pytest.mark.parametrize("body", [b'{"data": null}', b'{"data": {"id": "1800'], ids=["no post", "cut short"])
def test_a_reply_answered_with_what_cannot_be_read_is_a_dead_letter_never_posted_again(
    bot: Application, fake_x: FakeXServer, body: bytes
) -> None:
    mention = fake_x.push_mention("@synth hi", author_id=STRANGER, username="someone")
    fake_x.answer_next("POST /2/tweets", body, status=201)  # X took it (maybe): its answer is garbled
    tell(bot, "just once", mention)
    [letter] = wait_for(lambda: bot.runtime.dead_letters.letters())
    assert bot.runtime.wait_idle(timeout=10)
    assert letter.reason == "unreadable answer"
    assert len(fake_x.calls_to("POST /2/tweets")) == 1
    sender_x = snapshot(bot.runtime).find(sender("x"))
    assert sender_x is not None and sender_x.restarts == 0


def test_429s_on_the_mentions_with_a_reset_already_past_back_off_and_show_failing(
    bot: Application, fake_x: FakeXServer
) -> None:
    until(fake_x, lambda: looks(fake_x) >= 1)
    fake_x.fail_next("GET mentions", 429, reset_in=-600, times=6)  # "the limit reset 10 minutes ago"

    def refused() -> list[Any]:
        return [c for c in fake_x.calls_to("GET mentions") if not c.ok]

    first, *_, last = until(fake_x, lambda: len(refused()) == 6 and refused())
    assert last.time - first.time >= 25  # backing off (1, 2, 4, 8, 16 s, less jitter), not a look a second
    status = snapshot(bot.runtime)
    failing = status.failing.get(interface("x"))
    assert not status.healthy and failing is not None and "rate-limits the mentions" in failing.reason
    until(fake_x, lambda: fake_x.calls_to("GET mentions")[-1].ok)  # X lets it read again
    assert snapshot(bot.runtime).healthy


def test_x_refusing_a_reply_makes_a_dead_letter_not_a_retry_loop(
    bot: Application, fake_x: FakeXServer
) -> None:
    fake_x.fail_next("POST /2/tweets", 403)
    tell(bot, "a duplicate, say", "1800000000000000777")
    [letter] = wait_for(lambda: bot.runtime.dead_letters.letters())
    assert bot.runtime.wait_idle(timeout=10)
    assert letter.reason == "rejected by X" and "403" in letter.detail
    assert len(fake_x.calls_to("POST /2/tweets")) == 1


class SlowAnswerX(FakeXServer):
    """Makes the next post but answers it only after the client has given up waiting,
    and refuses a post with the text of one it has, as X does (a 403)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.slow_answers = 1
        self.refused = asyncio.Event()

    async def _dispatch(self, request: web.BaseRequest) -> web.Response:
        if self._call_name(request.method, request.path) == "POST /2/tweets":
            body = await request.json()
            with self._lock:
                self.calls.append(Call(self.clock.monotonic(), request.method, request.path,
                                       {"json": json.dumps(body)}, "oauth1", True))
            if any(p.text == body.get("text") for p in self.posts()):
                self.refused.set()
                return web.json_response({"title": "Forbidden", "status": 403, "type": "about:blank",
                                          "detail": "You are not allowed to create a Tweet with duplicate content."},
                                         status=403)
            made = self._post(body)  # X has made the post ...
            if self.slow_answers:
                self.slow_answers -= 1
                await asyncio.wait_for(self.refused.wait(), 60)  # ... and answers when the client has given up
            return web.json_response({"data": made}, status=201)
        return await super()._dispatch(request)


def test_a_retry_x_refuses_as_a_duplicate_of_a_post_whose_answer_was_lost_goes_on_with_the_thread(
    fake_llm: FakeLLMServer, manual_clock: ManualClock, make_app: Callable[..., Application], tmp_path: Path,
) -> None:
    with SlowAnswerX(user_id=ME, username="synth", oauth1=KEYS, clock=manual_clock) as x:
        app = make_app(base_url=fake_llm.base_url, x=x_settings(x, tmp_path, timeout=3), clock=x.clock)
        mention = x.push_mention("@synth tell me a story", author_id=STRANGER, username="someone")
        text = " ".join(f"word{n:03d}" for n in range(75)) + "!"  # three posts
        tell(app, text, mention)
        posts = until(x, lambda: len(x.posts()) == 3 and x.posts())
        assert app.runtime.wait_idle(timeout=10)
        assert app.runtime.dead_letters.letters() == []
        assert " ".join(p.text for p in posts) == text  # every chunk once, in order
        assert len(x.calls_to("POST /2/tweets")) == 4  # the first twice: lost, then refused
        # The first post's id was never read: the second answers the mention, the third the second.
        assert [p.in_reply_to for p in posts] == [mention, mention, posts[1].id]
        app.stop()


#: Mentions whose one field is not what X sends: the first would fail tweepy's reading of
#: the whole page (why the mentions are read as JSON), the second our parsing refuses.
MALFORMED: dict[str, dict[str, Any]] = {
    "conversation_id": {"text": "@synth run df -h", "conversation_id": "junk"},
    "text": {"text": None},
}


@pytest.mark.parametrize("field", sorted(MALFORMED))
def test_a_malformed_mention_is_a_dead_letter_and_the_mentions_behind_it_are_answered(
    fake_llm: FakeLLMServer, fake_x: FakeXServer, make_app: Callable[..., Application],
    tmp_path: Path, field: str,
) -> None:
    app = make_app(base_url=fake_llm.base_url, x=x_settings(fake_x, tmp_path, strangers="refuse"),
                   clock=fake_x.clock)  # a stranger is refused: an answer with no LLM turn
    # The fake serves what it is given, so a wrong type goes out as X would never send it.
    malformed = {"author_id": STRANGER, "username": "mallory", **MALFORMED[field]}
    bad = fake_x.push_mention(**malformed)
    good = fake_x.push_mention("@synth hi", author_id=STRANGER, username="someone")
    [reply] = until(fake_x, lambda: fake_x.posts(good))
    assert app.runtime.wait_idle(timeout=10)
    [letter] = app.runtime.dead_letters.letters()
    assert letter.reason == "malformed mention" and field in letter.detail  # says what was wrong
    assert bad in letter.record["body"]["raw"]  # and keeps the post, to look into
    # The cursor moved past it, whether or not a good mention comes after.
    newest = fake_x.push_mention(**malformed)
    until(fake_x, lambda: len(app.runtime.dead_letters.letters()) == 2)
    until(fake_x, lambda: fake_x.calls_to("GET mentions")[-1].params.get("since_id") == newest)
    seen = looks(fake_x)
    until(fake_x, lambda: looks(fake_x) >= seen + 3)
    assert app.runtime.wait_idle(timeout=10)
    assert len(app.runtime.dead_letters.letters()) == 2  # neither fetched again
    assert fake_x.posts() == [reply]
    # The mentions were read on, never crashed: no restart, nothing down or failing.
    status = snapshot(app.runtime)
    reader = status.find(interface("x"))
    assert status.healthy and reader is not None and reader.restarts == 0


def test_an_unreadable_page_of_mentions_is_a_failed_look_and_the_reader_goes_on(
    fake_llm: FakeLLMServer, fake_x: FakeXServer, make_app: Callable[..., Application], tmp_path: Path,
) -> None:
    app = make_app(base_url=fake_llm.base_url, x=x_settings(fake_x, tmp_path, strangers="refuse"),
                   clock=fake_x.clock)
    for body in (b"not json at all", b"[" * 100_000, b'{"data": "not a list"}'):
        fake_x.answer_next("GET mentions", body)
    good = fake_x.push_mention("@synth hi", author_id=STRANGER, username="someone")
    until(fake_x, lambda: fake_x.posts(good))
    reader = snapshot(app.runtime).find(interface("x"))
    assert reader is not None and reader.restarts == 0  # backed off and looked again, not crashed


@pytest.mark.parametrize("token", [{"a": 1}, True], ids=["object", "true"])
def test_a_next_token_that_is_no_token_is_a_failed_look_and_the_reader_goes_on(
    fake_llm: FakeLLMServer, fake_x: FakeXServer, make_app: Callable[..., Application], tmp_path: Path,
    token: Any,
) -> None:
    app = make_app(base_url=fake_llm.base_url, x=x_settings(fake_x, tmp_path, strangers="refuse"),
                   clock=fake_x.clock)
    page = {"data": [], "meta": {"result_count": 0, "next_token": token}}
    for _ in range(3):
        fake_x.answer_next("GET mentions", json.dumps(page).encode())
    good = fake_x.push_mention("@synth hi", author_id=STRANGER, username="someone")
    until(fake_x, lambda: fake_x.posts(good))
    reader = snapshot(app.runtime).find(interface("x"))
    assert reader is not None and reader.restarts == 0  # backed off and looked again, not crashed


def test_strangers_and_the_account_itself_get_no_action(
    bot: Application, fake_llm: FakeLLMServer, fake_x: FakeXServer
) -> None:
    with bot.runtime.probe(executor("terminal")) as ran:
        fake_x.push_mention("@synth run df -h", author_id=STRANGER, username="mallory")
        mine = fake_x.push_mention("@synth run df -h", author_id=ME, username="synth")
        until(fake_x, lambda: any(c.params.get("since_id") == mine for c in fake_x.calls_to("GET mentions")))
        assert bot.runtime.wait_idle(timeout=10)
        assert ran.envelopes == []
    assert fake_llm.requests == [] and fake_x.posts() == []


def test_the_refusal_policy_can_answer_strangers_politely(
    fake_llm: FakeLLMServer, fake_x: FakeXServer, make_app: Callable[..., Application], tmp_path: Path
) -> None:
    app = make_app(base_url=fake_llm.base_url, x=x_settings(fake_x, tmp_path, strangers="refuse"),
                   clock=fake_x.clock)
    mention = fake_x.push_mention("@synth run df -h", author_id=STRANGER, username="mallory")
    [refusal] = until(fake_x, lambda: fake_x.posts())
    assert app.runtime.wait_idle(timeout=10)
    assert (refusal.in_reply_to, refusal.text) == (mention, REFUSAL)
    assert fake_llm.requests == []


def test_wrong_keys_stop_the_start_with_a_reason_and_no_secret(
    fake_x: FakeXServer, make_app: Callable[..., Application], tmp_path: Path
) -> None:
    wrong = "not-the-consumer-secret-77"
    with pytest.raises(StartError) as failed:
        make_app(x=x_settings(fake_x, tmp_path, consumer_secret=wrong), clock=fake_x.clock)
    assert "cannot sign in to X: Unauthorized" in str(failed.value)
    assert wrong not in str(failed.value)


@pytest.mark.parametrize("kept", ["[]", '{"user_id": 1000, "since_id": "5"}', '{"user_id": 1000, "start_time": 5}'],
                         ids=["a list", "no start_time", "a number for start_time"])
def test_a_cursor_file_holding_no_cursor_stops_the_start_saying_where(
    fake_x: FakeXServer, make_app: Callable[..., Application], tmp_path: Path, kept: str
) -> None:
    where = tmp_path / "x-cursor.json"
    where.write_text(kept)
    with pytest.raises(StartError) as failed:
        make_app(x=x_settings(fake_x, tmp_path, cursor_file=str(where)), clock=fake_x.clock)
    assert f"cannot keep X's since_id in {where}: it holds" in str(failed.value)


def test_no_secret_appears_in_logs_status_or_dead_letters(
    fake_llm: FakeLLMServer, fake_x: FakeXServer, make_app: Callable[..., Application], tmp_path: Path
) -> None:
    settings = x_settings(fake_x, tmp_path)
    assert set(KEYS) <= set(Settings.load(x=settings).secrets())  # so redacted
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.addFilter(RedactSecrets(Settings.load(x=settings).secrets()))
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)  # tweepy logs each request's headers at DEBUG
    try:
        app = make_app(base_url=fake_llm.base_url, x=settings, clock=fake_x.clock)
        fake_x.fail_next("POST /2/tweets", 403)
        fake_x.push_mention("@synth run df -h", author_id=ADA, username="ada")
        until(fake_x, lambda: app.runtime.dead_letters.letters())
        assert app.runtime.wait_idle(timeout=10)
        status = snapshot(app.runtime).model_dump_json()
        letters = json.dumps([d.summary() for d in app.runtime.dead_letters.letters()], default=str)
        app.stop()
    finally:
        root.removeHandler(handler)
        root.setLevel(level)
    log = out.getvalue()
    assert "Making API request" in log and "[secret]" in log  # tweepy logged, and was redacted
    for secret in KEYS:
        assert secret not in log and secret not in status and secret not in letters


# ---------------------------------------------------------------- strangers = "converse"
# A stranger who answers in an allowed user's public thread shares her chat (the X
# conversation): not her request, her rights, nor her memory.


def conversing(fake_llm: FakeLLMServer, fake_x: FakeXServer, make_app: Callable[..., Application],
               tmp_path: Path, **settings: Any) -> Application:
    return make_app(base_url=fake_llm.base_url, x=x_settings(fake_x, tmp_path, strangers="converse"),
                    clock=fake_x.clock, **settings)


def read(fake: FakeXServer, post: str) -> None:
    """Fire the polling until the bot has taken ``post`` (its next look starts after it)."""
    until(fake, lambda: any(c.params.get("since_id") == post for c in fake.calls_to("GET mentions")))


def test_a_strangers_cancel_in_the_thread_leaves_the_allowed_users_request_alone(
    fake_llm: FakeLLMServer, fake_x: FakeXServer, make_app: Callable[..., Application], tmp_path: Path
) -> None:
    gate = Gate(tmp_path / "gate")  # Ada's command runs until the stranger's /cancel was taken
    fake_llm.script(actions({"type": "terminal", "payload": {"command": gate.command}}),
                    actions({"type": "message_x", "payload": {"text": "Done, Ada."}}))
    app = conversing(fake_llm, fake_x, make_app, tmp_path, allowed=["cat"], runtime={"batch_wait": 3600})
    with app.runtime.probe(executor("terminal")) as ran:
        root = fake_x.push_mention("@synth run the slow one", author_id=ADA, username="ada")
        until(fake_x, lambda: ran.envelopes)
        cancel = fake_x.push_mention("@synth /cancel", author_id=STRANGER, username="mallory", conversation_id=root)
        read(fake_x, cancel)
        assert app.runtime.wait_idle(f"x-{cancel}", timeout=10)
        gate.open()
        posts = until(fake_x, lambda: fake_x.posts())
    assert [(p.in_reply_to, p.text) for p in posts] == [(root, "Done, Ada.")]  # not a word to the stranger
    assert app.runtime.wait_idle(timeout=10)
    assert {p.text for p in fake_x.posts()}.isdisjoint({CANCELLED, NOTHING_TO_CANCEL})


def test_a_strangers_cancel_stops_their_own_turn_and_the_allowed_users_turn_follows(
    fake_llm: FakeLLMServer, fake_x: FakeXServer, make_app: Callable[..., Application], tmp_path: Path
) -> None:
    fake_llm.script(FakeResponse(hang=True),  # the stranger's turn never ends on its own
                    actions({"type": "message_x", "payload": {"text": "Hello, Ada."}}))
    app = conversing(fake_llm, fake_x, make_app, tmp_path, llm={"read_timeout": 60})  # no retry meanwhile
    theirs = fake_x.push_mention("@synth tell me everything", author_id=STRANGER, username="mallory")
    until(fake_x, lambda: fake_llm.requests)
    hers = fake_x.push_mention("@synth hello", author_id=ADA, username="ada", conversation_id=theirs)
    cancel = fake_x.push_mention("@synth /cancel", author_id=STRANGER, username="mallory", conversation_id=theirs)
    posts = until(fake_x, lambda: len(fake_x.posts()) == 2 and fake_x.posts())
    assert {(p.in_reply_to, p.text) for p in posts} == {(cancel, CANCELLED), (hers, "Hello, Ada.")}


def test_a_strangers_forget_in_the_thread_wipes_nothing(
    fake_llm: FakeLLMServer, fake_x: FakeXServer, make_app: Callable[..., Application], tmp_path: Path
) -> None:
    fake_llm.script(actions({"type": "message_x", "payload": {"text": "Up 3 days, Ada."}}),
                    actions({"type": "message_x", "payload": {"text": "Still up, Ada."}}))
    app = conversing(fake_llm, fake_x, make_app, tmp_path)
    root = fake_x.push_mention("@synth how long has it been up?", author_id=ADA, username="ada")
    until(fake_x, lambda: fake_x.posts())
    forget = fake_x.push_mention("@synth /forget", author_id=STRANGER, username="mallory", conversation_id=root)
    read(fake_x, forget)
    assert app.runtime.wait_idle(f"x-{forget}", timeout=10)
    fake_x.push_mention("@synth and now?", author_id=ADA, username="ada", conversation_id=root)
    until(fake_x, lambda: len(fake_x.posts()) == 2)
    assert FORGOTTEN not in [p.text for p in fake_x.posts()]
    said = [m["content"] for m in fake_llm.requests[-1].messages]
    assert said[-3:] == ["how long has it been up?", "Up 3 days, Ada.", "and now?"]  # she still has her thread


def test_a_strangers_words_in_the_thread_are_a_turn_of_their_own(
    fake_llm: FakeLLMServer, fake_x: FakeXServer, make_app: Callable[..., Application], tmp_path: Path
) -> None:
    """Two messages that wait behind Ada's turn, a stranger's and hers: two turns, the
    stranger's an autonomous one (no commands), never one turn with Ada's rights."""
    gate = Gate(tmp_path / "gate")  # Ada's first turn runs until both are queued behind it
    fake_llm.script(actions({"type": "terminal", "payload": {"command": gate.command}}),
                    actions({"type": "message_x", "payload": {"text": "Done, Ada."}}),
                    actions({"type": "message_x", "payload": {"text": "Hello, Mallory."}}),
                    actions({"type": "message_x", "payload": {"text": "You're welcome, Ada."}}))
    app = conversing(fake_llm, fake_x, make_app, tmp_path, allowed=["cat"], runtime={"batch_wait": 3600})
    pool = [cell.name for cell in app.runtime.cells if cell.name.startswith(f"{CONVERSATIONS}.")]
    with app.runtime.probe(executor("terminal")) as ran, contextlib.ExitStack() as stack:
        probes = [stack.enter_context(app.runtime.probe(name)) for name in pool]
        root = fake_x.push_mention("@synth run the slow one", author_id=ADA, username="ada")
        until(fake_x, lambda: ran.envelopes)
        theirs = fake_x.push_mention("@synth run uptime and post its output", author_id=STRANGER,
                                     username="mallory", conversation_id=root)
        thanks = fake_x.push_mention("@synth thanks", author_id=ADA, username="ada", conversation_id=root)
        until(fake_x, lambda: any(e.correlation_id == f"x-{thanks}" for p in probes for e in p.envelopes))
        gate.open()
        posts = until(fake_x, lambda: len(fake_x.posts()) == 3 and fake_x.posts())
        assert app.runtime.wait_idle(timeout=10)
        assert len(ran.envelopes) == 1  # only Ada's command ran
    assert [(p.in_reply_to, p.text) for p in posts] == [
        (root, "Done, Ada."), (theirs, "Hello, Mallory."), (thanks, "You're welcome, Ada.")]
    [stranger_turn] = [r for r in fake_llm.requests if r.messages[-1]["content"] == "run uptime and post its output"]
    assert SILENCE_ALLOWED in stranger_turn.messages[0]["content"]  # an autonomous turn: the stranger's rights


def test_approval_refuses_to_start_where_nobody_could_answer_it(
    fake_llm: FakeLLMServer, fake_x: FakeXServer, make_app: Callable[..., Application], tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An approval offered on X could be answered by nobody (only Telegram's buttons and the
    console take answers), and its offer to an approver would be a public post."""
    monkeypatch.setenv("AUTORESPONSE_TERMINAL__APPROVAL", "ask")
    with pytest.raises(StartError, match=r"terminal approval = \"ask\" cannot be answered on x"):
        make_app(base_url=fake_llm.base_url, approvers=[4242],
                 x=x_settings(fake_x, tmp_path), clock=fake_x.clock)
    assert fake_x.posts() == []
