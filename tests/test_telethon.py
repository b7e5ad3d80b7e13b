"""The Telegram userbot end to end, behind our adapter boundary.

MTProto cannot be served on 127.0.0.1, so the platform is handed a stand-in for
``UserbotClient`` (``provided={USERBOT: ...}``): it builds each update from Telethon's
own TL types (``UpdateNewMessage``, ``Message``, ``User``, ``Channel``), finishes the
``NewMessage.Event`` the way Telethon's dispatch does (on a Telethon client that never
connects), and records what is sent. Everything behind the boundary runs for real:
the interface, the journal, the LLM turns, the command, the delivery and the sender.

The application and the stand-in share a ManualClock: a flood wait is waited out on a
timer of the runtime's clock, which the test fires (no real waiting).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import io
import itertools
import json
import logging
import os
import threading
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from conftest import free_port, system_messages, wait_for
from telethon import TelegramClient, errors, events, utils
from telethon.crypto import AuthKey
from telethon.sessions import StringSession
from telethon.tl import types

from autoresponse import Application, Settings
from autoresponse.actors.kernel import Clock, ManualClock
from autoresponse.testing.fake_llm import FakeLLMServer
from autoresponse.actors.routes import executor, interface, sender
from autoresponse.app import StartError
from autoresponse.cli import RedactSecrets
from autoresponse.interfaces.console import Console
from autoresponse.interfaces.telegram import split_message, utf16_len
from autoresponse.interfaces.telethon import PLATFORM, REFUSAL, USERBOT
from autoresponse.interfaces.terminal import DEMO_COMMANDS
from autoresponse.messages import OriginalContext, OutboundMessage
from autoresponse.supervisors import registered
from autoresponse.supervisors.status import snapshot

ME, ADA, MALLORY = 500, 7, 66
GROUP = 1234  # a supergroup: its chat id is -1001234
API_HASH = "0123456789abcdef0123456789abcdef"
SESSION = "1" + "telethon-session-string-that-is-the-accounts-key" * 4


@pytest.fixture(autouse=True, scope="module")
def telethon_platform() -> Iterator[None]:
    """Registered for these tests, unless it already is a built-in."""
    with registered(PLATFORM):
        yield


@dataclass(frozen=True)
class Sent:
    time: float
    chat: int
    text: str
    reply_to: int | None
    id: int | None  # None when the attempt failed
    parse_mode: Any = None  # as handed to Telethon's send_message


def user(user_id: int, username: str) -> types.User:
    return types.User(id=user_id, access_hash=user_id * 31, first_name=username.title(), username=username,
                      is_self=user_id == ME)


def supergroup(channel_id: int, title: str) -> types.Channel:
    return types.Channel(id=channel_id, title=title, photo=types.ChatPhotoEmpty(), date=None,
                         access_hash=channel_id * 17, megagroup=True)


def message(message_id: int, text: str, *, chat: types.TypePeer, sender: int, out: bool = False,
            reply_to: types.MessageReplyHeader | None = None) -> types.Message:
    return types.Message(id=message_id, peer_id=chat, date=dt.datetime.now(dt.UTC), message=text,
                         out=out, from_id=types.PeerUser(sender), reply_to=reply_to)


class StandInUserbot:
    """``UserbotClient`` without MTProto: Telethon's TL types in, what was sent out."""

    def __init__(self, me: types.User, clock: Clock | None = None) -> None:
        self.me = me
        #: The application's clock too (see ``make_userbot``): it times what is sent.
        self.clock = clock if clock is not None else Clock()
        # Never connected: it finishes events (entities, sender, chat, "out") as Telethon's
        # dispatch does for a real client, which is all it is used for.
        self._telethon = TelegramClient(StringSession(), 1, API_HASH)
        self._telethon._mb_entity_cache.set_self_user(me.id, False, me.access_hash)
        self._queue: asyncio.Queue[Any] = asyncio.Queue()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ids = itertools.count(9000)
        self._failures: dict[int, deque[Exception]] = {}
        self._lock = threading.Lock()
        self.sent: list[Sent] = []

    # ---------------------------------------------------------------- the boundary

    async def get_me(self) -> types.User:
        return self.me

    async def send_message(self, entity: int, message: str, *, reply_to: int | None = None,
                           parse_mode: Any = ()) -> types.Message:
        with self._lock:
            queue = self._failures.get(entity)
            failure = queue.popleft() if queue else None
            self.sent.append(Sent(self.clock.monotonic(), entity, message, reply_to,
                                  None if failure else next(self._ids), parse_mode))
            sent = self.sent[-1]
        if failure is not None:
            raise failure
        return types.Message(id=sent.id, peer_id=utils.get_peer(entity), date=dt.datetime.now(dt.UTC),
                             message=message, out=True,
                             reply_to=types.MessageReplyHeader(reply_to_msg_id=reply_to) if reply_to else None)

    async def new_messages(self) -> AsyncIterator[Any]:
        self._loop = asyncio.get_running_loop()
        while True:
            yield await self._queue.get()

    # ---------------------------------------------------------------- scripting

    def receive(self, msg: types.Message, *entities: Any) -> types.Message:
        """Telegram delivers ``msg`` (with the users and chats it names) to the account."""
        wait_for(lambda: self._loop is not None)
        update = types.UpdateNewMessage(message=msg, pts=msg.id, pts_count=1)
        event = events.NewMessage.build(update, None, self.me.id)
        event.original_update = update
        event._entities = {utils.get_peer_id(e): e for e in (self.me, *entities)}
        event._set_client(self._telethon)
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self._queue.put_nowait, event)
        return msg

    def fail_next(self, chat: int, error: Exception) -> None:
        with self._lock:
            self._failures.setdefault(chat, deque()).append(error)

    def delivered(self, chat: int | None = None) -> list[Sent]:
        with self._lock:
            return [s for s in self.sent if s.id is not None and (chat is None or s.chat == chat)]


@pytest.fixture
def standin(manual_clock: ManualClock) -> StandInUserbot:
    return StandInUserbot(user(ME, "me_myself"), clock=manual_clock)


def telethon_settings(**extra: Any) -> dict[str, Any]:
    return {"api_id": 12345, "api_hash": API_HASH, "session": SESSION, "allowed_users": [ADA], **extra}


@pytest.fixture
def make_userbot(tmp_path: Path) -> Iterator[Callable[..., Application]]:
    """An Application with the userbot platform on the stand-in; each is stopped after the test."""
    apps: list[Application] = []

    def make(llm: FakeLLMServer, userbot: Any, **telethon: Any) -> Application:
        settings = Settings.load(
            llm={"base_url": llm.base_url, "read_timeout": 5, "max_attempts": 2},
            terminal={"enabled": True, "allowed_commands": list(DEMO_COMMANDS)},
            telethon=telethon_settings(**telethon), admin={"enabled": False}, events={"enabled": False},
            data_dir=tmp_path / "data")
        app = Application(settings, console=Console(io.StringIO()), provided={USERBOT: userbot},
                          clock=getattr(userbot, "clock", None)).start()
        apps.append(app)
        return app

    yield make
    for app in apps:
        app.stop()


@pytest.fixture
def userbot(fake_llm: FakeLLMServer, standin: StandInUserbot,
            make_userbot: Callable[..., Application]) -> Application:
    return make_userbot(fake_llm, standin)


def tell(app: Application, text: str, chat: int, message_id: int) -> None:
    """A reply for the sender, as the dispatcher would make it, to ``message_id`` in ``chat``."""
    ctx = OriginalContext(chat_id=chat, message_id=message_id, interface_name="telethon")
    app.runtime.send(sender("telethon"), OutboundMessage.reply(ctx, text))


def test_a_message_from_an_allowed_user_gets_one_reply_with_reply_to(
    userbot: Application, fake_llm: FakeLLMServer, standin: StandInUserbot
) -> None:
    asked = standin.receive(message(11, "run uptime", chat=types.PeerUser(ADA), sender=ADA), user(ADA, "ada"))
    [reply] = wait_for(lambda: standin.delivered())
    assert userbot.runtime.wait_idle(timeout=10)
    assert (reply.chat, reply.reply_to) == (ADA, asked.id)
    assert "`uptime` finished" in reply.text
    [delivery] = system_messages(fake_llm, "output")  # a chat turn, the command, a delivery turn
    assert delivery["original_context"]["user_name"] == "ada"
    assert delivery["original_context"]["original_command"] == "run uptime"
    assert "message_telethon" in delivery["full_json_instructions"]
    assert len(standin.sent) == 1


def test_a_stranger_runs_nothing_and_by_default_hears_nothing(
    userbot: Application, fake_llm: FakeLLMServer, standin: StandInUserbot
) -> None:
    with userbot.runtime.probe(executor("terminal")) as ran:
        standin.receive(message(20, "run df -h", chat=types.PeerUser(MALLORY), sender=MALLORY),
                        user(MALLORY, "mallory"))
        # Then Ada asks: answered, and by then the message before it was handled.
        standin.receive(message(21, "hello", chat=types.PeerUser(ADA), sender=ADA), user(ADA, "ada"))
        [reply] = wait_for(lambda: standin.delivered())
        assert userbot.runtime.wait_idle(timeout=10)
        assert ran.envelopes == []
    assert reply.reply_to == 21
    assert [r.messages[-1]["content"] for r in fake_llm.requests] == ["hello"]
    assert len(standin.sent) == 1


def test_the_accounts_own_messages_run_nothing_even_where_it_is_allowed(
    fake_llm: FakeLLMServer, standin: StandInUserbot, make_userbot: Callable[..., Application]
) -> None:
    group = supergroup(GROUP, "ops room")
    app = make_userbot(fake_llm, standin, allowed_users=[ADA, ME],
                       allowed_chats=[utils.get_peer_id(types.PeerChannel(GROUP))])
    with app.runtime.probe(executor("terminal")) as ran:
        # The account writes "run df -h" (from another device, or as its own reply) to Ada,
        # in the allowed group, and to itself (Saved Messages).
        standin.receive(message(31, "run df -h", chat=types.PeerUser(ADA), sender=ME, out=True),
                        user(ADA, "ada"))
        standin.receive(message(32, "run df -h", chat=types.PeerChannel(GROUP), sender=ME, out=True), group)
        standin.receive(message(33, "run df -h", chat=types.PeerUser(ME), sender=ME))
        standin.receive(message(34, "hello", chat=types.PeerUser(ADA), sender=ADA), user(ADA, "ada"))
        [reply] = wait_for(lambda: standin.delivered())
        assert app.runtime.wait_idle(timeout=10)
        assert ran.envelopes == []
    assert reply.reply_to == 34
    assert [r.messages[-1]["content"] for r in fake_llm.requests] == ["hello"]


def test_in_an_allowed_chat_anyone_may_ask(
    fake_llm: FakeLLMServer, standin: StandInUserbot, make_userbot: Callable[..., Application]
) -> None:
    chat_id = utils.get_peer_id(types.PeerChannel(GROUP))
    app = make_userbot(fake_llm, standin, allowed_chats=[chat_id])
    asked = standin.receive(message(31, "hello", chat=types.PeerChannel(GROUP), sender=MALLORY),
                            user(MALLORY, "mallory"), supergroup(GROUP, "ops room"))
    [reply] = wait_for(lambda: standin.delivered())
    assert app.runtime.wait_idle(timeout=10)
    assert (reply.chat, reply.reply_to) == (chat_id, asked.id)
    assert fake_llm.requests[0].messages[-1]["content"] == "hello"


def test_a_long_reply_is_cut_as_the_bot_cuts_and_stays_threaded(
    userbot: Application, standin: StandInUserbot
) -> None:
    text = "Intro 👋\n\n" + "Lorem ipsum 😀 dolor sit amet. " * 200 + "\n\n```\n" + "code\n" * 300 + "```"
    tell(userbot, text, ADA, 41)
    expected = split_message(text)  # the bot's own chunking, not a copy of it
    assert len(expected) >= 3
    sent = wait_for(lambda: len(standin.delivered()) == len(expected) and standin.delivered(), timeout=30)
    assert userbot.runtime.wait_idle(timeout=10)
    assert [s.text for s in sent] == expected
    assert all(utf16_len(s.text) <= 4096 for s in sent)
    assert [s.reply_to for s in sent] == [41] + [s.id for s in sent[:-1]]  # a thread, in order


def test_a_flood_wait_holds_back_only_its_own_chat(userbot: Application, standin: StandInUserbot) -> None:
    standin.fail_next(ADA, errors.FloodWaitError(request=None, capture=2))
    tell(userbot, "to Ada", ADA, 51)
    wait_for(lambda: standin.sent)
    tell(userbot, "to Mallory", MALLORY, 52)
    wait_for(lambda: standin.delivered(MALLORY))  # while Ada's chat waits: no time has passed
    assert isinstance(standin.clock, ManualClock)
    wait_for(lambda: standin.clock.pending() == [2.0])  # the flood wait, on the runtime's clock
    standin.clock.advance(2)
    wait_for(lambda: standin.delivered(ADA))
    assert userbot.runtime.wait_idle(timeout=10)
    [refused] = [s for s in standin.sent if s.id is None]
    [to_ada], [to_mallory] = standin.delivered(ADA), standin.delivered(MALLORY)
    assert to_ada.time - refused.time >= 2.0  # Telegram's wait was kept ...
    assert to_mallory.time < to_ada.time  # ... by that chat alone


def test_a_chat_that_blocked_the_account_is_a_dead_letter_not_a_retry_loop(
    userbot: Application, standin: StandInUserbot
) -> None:
    standin.fail_next(ADA, errors.UserIsBlockedError(request=None))
    tell(userbot, "hello?", ADA, 61)
    [letter] = wait_for(lambda: userbot.runtime.dead_letters.letters())
    assert userbot.runtime.wait_idle(timeout=10)
    assert letter.reason == "chat unreachable" and "UserIsBlockedError" in letter.detail
    assert len(standin.sent) == 1


def test_a_chat_telethon_cannot_find_is_a_dead_letter_not_a_sender_crash(
    userbot: Application, standin: StandInUserbot
) -> None:
    # What Telethon raises for a peer its session has not met (since a restart, say).
    standin.fail_next(ADA, ValueError(f"Could not find the input entity for PeerUser(user_id={ADA}) "
                                      "(PeerUser). Please read https://docs.telethon.dev/..."))
    tell(userbot, "hello after a restart", ADA, 61)
    [letter] = wait_for(lambda: userbot.runtime.dead_letters.letters())
    assert userbot.runtime.wait_idle(timeout=10)
    assert letter.reason == "chat unreachable" and "Could not find the input entity" in letter.detail
    assert len(standin.sent) == 1
    telethon_sender = snapshot(userbot.runtime).find(sender("telethon"))
    assert telethon_sender is not None and telethon_sender.restarts == 0


class HeldStandIn(StandInUserbot):
    """Telegram takes what is sent to Mallory at once, but answers only once ``release``d."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.release = threading.Event()

    async def send_message(self, entity: int, message: str, *, reply_to: int | None = None,
                           parse_mode: Any = ()) -> types.Message:
        sent = await super().send_message(entity, message, reply_to=reply_to, parse_mode=parse_mode)
        if entity == MALLORY:
            await asyncio.to_thread(self.release.wait, 15)
        return sent


def test_an_unforeseen_error_is_its_replys_dead_letter_and_other_replies_go_out_once(
    fake_llm: FakeLLMServer, manual_clock: ManualClock, make_userbot: Callable[..., Application]
) -> None:
    standin = HeldStandIn(user(ME, "me_myself"), clock=manual_clock)
    app = make_userbot(fake_llm, standin)
    try:
        tell(app, "to Mallory", MALLORY, 70)
        wait_for(lambda: standin.delivered(MALLORY))  # Telegram has it; its answer is on the way
        standin.fail_next(ADA, ValueError("Request was unsuccessful 5 time(s)"))  # Telethon's own
        tell(app, "to Ada", ADA, 71)
        [letter] = wait_for(lambda: app.runtime.dead_letters.letters())
    finally:
        standin.release.set()
    assert app.runtime.wait_idle(timeout=10)
    assert letter.reason == "delivery failed" and "Request was unsuccessful" in letter.detail
    assert [s.text for s in standin.delivered(MALLORY)] == ["to Mallory"]  # never sent twice
    telethon_sender = snapshot(app.runtime).find(sender("telethon"))
    assert telethon_sender is not None and telethon_sender.restarts == 0


def test_the_refusal_policy_can_answer_strangers_politely(
    fake_llm: FakeLLMServer, standin: StandInUserbot, make_userbot: Callable[..., Application]
) -> None:
    app = make_userbot(fake_llm, standin, strangers="refuse")
    asked = standin.receive(message(71, "run df -h", chat=types.PeerUser(MALLORY), sender=MALLORY),
                            user(MALLORY, "mallory"))
    [refusal] = wait_for(lambda: standin.delivered())
    assert app.runtime.wait_idle(timeout=10)
    assert (refusal.chat, refusal.reply_to, refusal.text) == (MALLORY, asked.id, REFUSAL)
    assert fake_llm.requests == []


def test_an_unreachable_telegram_stops_the_start_with_a_reason_and_no_secret(tmp_path: Path) -> None:
    """The real client (no stand-in), pointed by its session at a closed port on 127.0.0.1."""
    session = StringSession()
    session.set_dc(2, "127.0.0.1", free_port())
    session.auth_key = AuthKey(os.urandom(256))
    key = session.save()
    settings = Settings.load(telethon=telethon_settings(session=key, connect_retries=0),
                             admin={"enabled": False}, events={"enabled": False},
                             console={"read_stdin": False}, data_dir=tmp_path)
    assert {API_HASH, key} <= set(settings.secrets())  # so redacted from every log line
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.addFilter(RedactSecrets(settings.secrets()))
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    try:
        with pytest.raises(StartError) as failed:
            Application(settings, console=Console(io.StringIO())).start()
    finally:
        root.removeHandler(handler)
        root.setLevel(level)
    assert "cannot sign in to Telegram as the userbot: ConnectionError" in str(failed.value)
    for secret in (API_HASH, key):
        assert secret not in str(failed.value) and secret not in out.getvalue()


def test_no_secret_appears_in_logs_status_or_dead_letters(
    fake_llm: FakeLLMServer, standin: StandInUserbot, make_userbot: Callable[..., Application]
) -> None:
    assert {API_HASH, SESSION} <= set(Settings.load(telethon=telethon_settings()).secrets())
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.addFilter(RedactSecrets(Settings.load(telethon=telethon_settings()).secrets()))
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    try:
        app = make_userbot(fake_llm, standin)
        standin.fail_next(ADA, errors.ChatWriteForbiddenError(request=None))
        standin.receive(message(81, "run uptime", chat=types.PeerUser(ADA), sender=ADA), user(ADA, "ada"))
        wait_for(lambda: app.runtime.dead_letters.letters(), timeout=30)
        assert app.runtime.wait_idle(timeout=10)
        status = snapshot(app.runtime).model_dump_json()
        letters = json.dumps([d.summary() for d in app.runtime.dead_letters.letters()], default=str)
    finally:
        root.removeHandler(handler)
        root.setLevel(level)
    log = out.getvalue()
    assert "listening as the Telegram user me_myself" in log
    for secret in (API_HASH, SESSION):
        assert secret not in log and secret not in status and secret not in letters


def test_a_reply_about_code_reaches_the_user_with_its_words_whole(
    userbot: Application, standin: StandInUserbot
) -> None:
    """Telethon's own Markdown read ``__`` as italic: "__init__.py" arrived as "init.py"."""
    tell(userbot, "Removed **all** of `build/` and __pycache__, kept __init__.py and ~~nothing~~ else", ADA, 45)
    [sent] = wait_for(lambda: standin.delivered())
    shown, entities = utils.sanitize_parse_mode(sent.parse_mode).parse(sent.text)  # as Telethon sends it
    assert shown == "Removed all of build/ and __pycache__, kept __init__.py and ~~nothing~~ else"
    assert {type(e).__name__ for e in entities} == {"MessageEntityBold", "MessageEntityCode"}


def test_a_message_of_a_shape_the_userbot_cannot_read_is_a_dead_letter_and_the_reader_goes_on(
    userbot: Application, fake_llm: FakeLLMServer, standin: StandInUserbot
) -> None:
    now = dt.datetime.now(dt.UTC)
    ada = (types.PeerUser(ADA), types.PeerUser(ADA))
    # A venue with no point (GeoPointEmpty, as the TL schema allows): still read, and answered.
    standin.receive(types.Message(id=50, peer_id=ada[0], from_id=ada[1], date=now, message="",
                                  media=types.MessageMediaVenue(geo=types.GeoPointEmpty(), title="Office",
                                                                address="Main St 1", provider="", venue_id="",
                                                                venue_type="")), user(ADA, "ada"))
    # A poll with no answers list: a shape the reader does not take apart.
    poll = types.Poll(id=1, question=types.TextWithEntities(text="Lunch?", entities=[]), answers=None, hash=0)
    standin.receive(types.Message(id=51, peer_id=ada[0], from_id=ada[1], date=now, message="",
                                  media=types.MessageMediaPoll(poll=poll, results=types.PollResults())),
                    user(ADA, "ada"))
    standin.receive(message(52, "hello", chat=ada[0], sender=ADA), user(ADA, "ada"))
    replies = wait_for(lambda: len(standin.delivered()) >= 2 and standin.delivered())
    assert userbot.runtime.wait_idle(timeout=10)
    assert sorted(r.reply_to for r in replies) == [50, 52]
    assert any('"Office", Main St 1 (no coordinates)' in str(r.messages) for r in fake_llm.requests)
    [letter] = userbot.runtime.dead_letters.letters()
    assert letter.reason == "malformed message" and "TypeError" in (letter.detail or "")
    reader = snapshot(userbot.runtime).find(interface("telethon"))
    assert reader is not None and reader.restarts == 0


def test_a_message_taken_as_a_reader_is_cancelled_goes_to_the_next_reader() -> None:
    """An incarnation of the interface cancelled while it waits (a crash, a restart) left a
    ``get`` behind on Telethon's queue: it took the next message, and nobody read it."""
    from autoresponse.interfaces.telethon.client import TelethonUserbot

    class Connected:  # what TelethonUserbot uses of a TelegramClient
        def __init__(self) -> None:
            self.handler: Any = None
            self.disconnected = asyncio.get_running_loop().create_future()

        def add_event_handler(self, handler: Any, _: Any) -> None:
            self.handler = handler

        def is_connected(self) -> bool:
            return True

    async def main() -> list[tuple[int, str]]:
        client = Connected()
        userbot = TelethonUserbot(client)  # type: ignore[arg-type]
        got: list[tuple[int, str]] = []

        async def read(incarnation: int) -> None:
            async for event in userbot.new_messages():
                got.append((incarnation, event))

        first = asyncio.create_task(read(1))
        await asyncio.sleep(0.05)
        first.cancel()
        await asyncio.gather(first, return_exceptions=True)
        second = asyncio.create_task(read(2))
        for n in (1, 2):
            await client.handler(f"message {n}")
        for _ in range(100):
            if len(got) == 2:
                break
            await asyncio.sleep(0.01)
        second.cancel()
        await asyncio.gather(second, return_exceptions=True)
        return got

    assert asyncio.run(asyncio.wait_for(main(), 10)) == [(2, "message 1"), (2, "message 2")]
