"""Telegram webhook mode end to end: the real Application with python-telegram-bot against
the fake Bot API, updates posted over real HTTP to the bot's webhook on 127.0.0.1.

The bot and the fake share a ManualClock: a chat's pacing is a timer of the runtime's
clock, fired by the test (``advance_until``) rather than waited for."""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import logging
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from conftest import environment, free_port, wait_for

from autoresponse import Application, Settings, StartError
from autoresponse.actors.kernel import ManualClock
from autoresponse.testing.fake_llm import FakeLLMServer, FakeResponse
from autoresponse.config import ConfigError
from autoresponse.testing.fake_telegram import (
    BOT_USER,
    FakeTelegramServer,
    Webhook,
    post_update,
)
from autoresponse.interfaces.telegram.settings import TELEGRAM_WEBHOOK_MAX_BYTES
from autoresponse.messages import Crash

ALLOWED = 7
CHAT = 42
SECRET = "test-webhook-secret_0123456789"
PUBLIC_URL = "https://bot.example.com/telegram/hook"


@dataclass(frozen=True)
class WebhookBot:
    app: Application
    port: int

    @property
    def hook(self) -> str:
        """Where the TLS proxy would forward Telegram's calls: PUBLIC_URL's path, on our port."""
        return f"http://127.0.0.1:{self.port}/telegram/hook"


@pytest.fixture
def fake_telegram(manual_clock: ManualClock) -> Iterator[FakeTelegramServer]:
    with FakeTelegramServer(clock=manual_clock) as server:
        yield server


def start_bot(fake_llm: FakeLLMServer, fake_telegram: FakeTelegramServer,
              make_app: Callable[..., Application]) -> WebhookBot:
    port = free_port()
    app = make_app(base_url=fake_llm.base_url, telegram={
        "token": "123456:TEST-TOKEN", "base_url": fake_telegram.base_url, "allowed_users": [ALLOWED],
        "poll_timeout": 1, "webhook_url": PUBLIC_URL, "webhook_listen": f"127.0.0.1:{port}",
        "webhook_secret": SECRET,
    }, clock=fake_telegram.clock)
    return WebhookBot(app, port)


@pytest.fixture
def bot(fake_llm: FakeLLMServer, fake_telegram: FakeTelegramServer, make_app: Callable[..., Application],
        caplog: pytest.LogCaptureFixture) -> WebhookBot:
    caplog.set_level(logging.INFO, logger="autoresponse")
    # The servers come first so that they outlive the app: it stops before they do.
    return start_bot(fake_llm, fake_telegram, make_app)


def text(fake_telegram: FakeTelegramServer, words: str, chat_id: int = CHAT) -> dict[str, Any]:
    return fake_telegram.text_update(words, chat_id=chat_id, user_id=ALLOWED)


def asked(fake_llm: FakeLLMServer, words: str) -> int:
    """How many chat turns the LLM was asked with ``words`` as the user's message."""
    return sum(r.messages[-1]["content"] == words for r in fake_llm.requests)


def reply_to(call: Any) -> Any:
    return call.params["reply_parameters"]["message_id"]


# ---------------------------------------------------------------- registering


def test_the_bot_registers_its_webhook_with_the_secret_and_never_polls(
    bot: WebhookBot, fake_telegram: FakeTelegramServer, caplog: pytest.LogCaptureFixture
) -> None:
    [registered] = fake_telegram.calls_to("setWebhook")
    assert registered.params["url"] == PUBLIC_URL
    assert registered.params["secret_token"] == SECRET
    assert registered.params["allowed_updates"] == ["message"]
    assert fake_telegram.webhook == Webhook(PUBLIC_URL, SECRET, ["message"])

    update = text(fake_telegram, "run echo through the webhook")
    assert post_update(bot.hook, update, secret_token=SECRET) == 200
    [sent] = wait_for(lambda: fake_telegram.sent(CHAT))
    assert "through the webhook" in sent.params["text"]
    assert reply_to(sent) == update["message"]["message_id"]
    assert bot.app.runtime.wait_idle(timeout=10)

    # Webhooks only: no long poll (Telegram would answer it 409), and the webhook stays set.
    assert fake_telegram.calls_to("getUpdates") == []
    assert fake_telegram.calls_to("deleteWebhook") == []
    # The operator reads where it listens; the secret is in no log line.
    lines = [r.getMessage() for r in caplog.get_records("setup") + caplog.get_records("call")]
    assert f"receiving Telegram webhooks on {bot.hook} (for {PUBLIC_URL}) as @synth_bot" in lines
    assert not any(SECRET in line for line in lines)


def test_a_stop_keeps_the_webhook_registered_and_closes_the_port(
    bot: WebhookBot, fake_telegram: FakeTelegramServer
) -> None:
    bot.app.stop()
    # Another daemon behind the same balancer may still serve it.
    assert fake_telegram.calls_to("deleteWebhook") == [] and fake_telegram.webhook is not None
    with pytest.raises(urllib.error.URLError):
        post_update(bot.hook, text(fake_telegram, "run echo anyone?"), secret_token=SECRET, timeout=5)


def test_a_crashed_interface_serves_its_webhook_again_on_the_same_port(
    bot: WebhookBot, fake_telegram: FakeTelegramServer
) -> None:
    bot.app.runtime.send("interface.telegram", Crash(reason="drill"))
    assert isinstance(fake_telegram.clock, ManualClock)  # the restart's backoff fires when advanced
    assert fake_telegram.clock.advance_until(lambda: len(fake_telegram.calls_to("setWebhook")) == 2)
    assert bot.app.runtime.cell("interface.telegram").restarts == 1
    assert post_update(bot.hook, text(fake_telegram, "run echo after the crash"), secret_token=SECRET) == 200
    [sent] = wait_for(lambda: fake_telegram.sent(CHAT))
    assert "after the crash" in sent.params["text"]


def test_a_listen_port_in_use_stops_the_start_saying_where(
    fake_llm: FakeLLMServer, fake_telegram: FakeTelegramServer, make_app: Callable[..., Application]
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(StartError, match=rf"cannot listen for Telegram webhooks on "
                                             rf"http://127\.0\.0\.1:{port}/telegram/hook: .*in use"):
            make_app(base_url=fake_llm.base_url, telegram={
                "token": "123456:TEST-TOKEN", "base_url": fake_telegram.base_url, "allowed_users": [ALLOWED],
                "webhook_url": PUBLIC_URL, "webhook_listen": f"127.0.0.1:{port}", "webhook_secret": SECRET})
    assert fake_telegram.calls_to("setWebhook") == []  # Telegram is not sent to a port that is not ours


# ---------------------------------------------------------------- the secret


def test_calls_without_the_right_secret_are_refused_and_change_nothing(
    bot: WebhookBot, fake_llm: FakeLLMServer, fake_telegram: FakeTelegramServer
) -> None:
    update = text(fake_telegram, "run echo intruder")
    for wrong in (None, "", "wrong-secret", SECRET[:-1], SECRET + "0", SECRET.upper()):
        assert post_update(bot.hook, update, secret_token=wrong) == 401, wrong
    time.sleep(0.5)
    assert bot.app.runtime.wait_idle(timeout=10)
    assert fake_telegram.sent() == [] and fake_llm.requests == []
    assert bot.app.runtime.dead_letters.letters() == []
    # Nothing was journaled either: the same update, with the secret, is new and answered.
    assert post_update(bot.hook, update, secret_token=SECRET) == 200
    [sent] = wait_for(lambda: fake_telegram.sent(CHAT))
    assert "intruder" in sent.params["text"]


def test_other_paths_and_methods_are_not_served(bot: WebhookBot, fake_telegram: FakeTelegramServer) -> None:
    update = text(fake_telegram, "run echo elsewhere")
    assert post_update(f"http://127.0.0.1:{bot.port}/", update, secret_token=SECRET) == 404
    assert post_update(f"{bot.hook}/more", update, secret_token=SECRET) == 404
    request = urllib.request.Request(bot.hook, method="GET")
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.build_opener(urllib.request.ProxyHandler({})).open(request, timeout=10)
    caught.value.close()
    assert caught.value.code == 405
    time.sleep(0.5)
    assert fake_telegram.sent() == []


# ---------------------------------------------------------------- journaled, once


def test_the_200_comes_only_once_the_update_is_journaled(
    bot: WebhookBot, fake_llm: FakeLLMServer, fake_telegram: FakeTelegramServer
) -> None:
    fake_llm.script(FakeResponse(delay=3, content=json.dumps(
        {"actions": [{"type": "message_telegram_bot", "payload": {"text": "slowly"}}]})))
    update = text(fake_telegram, "take your time")
    assert post_update(bot.hook, update, secret_token=SECRET) == 200
    # Stored before the answer, while its work has hardly begun: a kill now loses nothing.
    assert bot.app.journal is not None
    open_items = [item.correlation for item in bot.app.journal.unfinished()]
    assert f"telegram-{BOT_USER['id']}-{update['update_id']}" in open_items
    assert fake_telegram.sent() == []
    wait_for(lambda: fake_telegram.sent(CHAT))


def test_an_update_telegram_sends_again_is_answered_once(
    bot: WebhookBot, fake_llm: FakeLLMServer, fake_telegram: FakeTelegramServer
) -> None:
    update = text(fake_telegram, "run echo only once")
    assert post_update(bot.hook, update, secret_token=SECRET) == 200
    assert post_update(bot.hook, update, secret_token=SECRET) == 200  # a retry while it runs
    [sent] = wait_for(lambda: fake_telegram.sent(CHAT))
    assert bot.app.runtime.wait_idle(timeout=10)
    assert post_update(bot.hook, update, secret_token=SECRET) == 200  # and one after the answer
    # A second reply to the chat would wait a second after the first: fire that timer, if any.
    assert isinstance(fake_telegram.clock, ManualClock)
    assert fake_telegram.clock.advance_until(lambda: bot.app.runtime.inflight.count() == 0)
    assert bot.app.runtime.wait_idle(timeout=10)
    assert fake_telegram.sent(CHAT) == [sent]
    assert asked(fake_llm, "run echo only once") == 1


# ---------------------------------------------------------------- hostile bodies


def _nested(levels: int) -> str:
    return "[" * levels + "]" * levels


@pytest.mark.parametrize(("body", "reason", "detail", "raw"), [
    (b"this is not json", "malformed update", "the body is not JSON", "this is not json"),
    (b'{"update_id": 5, "message": {"text": "caf\xe9"}}', "malformed update", "the body is not UTF-8",
     "caf\\\\xe9"),
    (b"[" * 100_000, "malformed update", "nests deeper than 32 levels", "[[[["),
    (f'{{"update_id": 6, "message": {_nested(40)}}}'.encode(), "malformed update",
     "nests deeper than 32 levels", '\\"update_id\\": 6'),
    (b'[{"update_id": 8}]', "malformed update", "it has no update_id", '[{"update_id": 8}]'),
    (b'{"update_id": 9, "message": {"message_id": "notanint", "chat": "garbage"}}', "malformed update",
     "", '"notanint"'),
], ids=["not-json", "not-utf8", "brackets-100000", "nested-40", "no-update-id", "bad-fields"])
def test_a_malformed_call_is_a_dead_letter_answered_200_and_the_next_update_flows(
    bot: WebhookBot, fake_llm: FakeLLMServer, fake_telegram: FakeTelegramServer,
    body: bytes, reason: str, detail: str, raw: str | None,
) -> None:
    assert post_update(bot.hook, body, secret_token=SECRET) == 200
    [letter] = wait_for(lambda: bot.app.runtime.dead_letters.letters())
    assert (letter.reason, letter.actor) == (reason, "interface.telegram")
    assert detail in letter.detail
    if raw is not None:
        assert raw in letter.record["body"]["raw"]
    assert post_update(bot.hook, text(fake_telegram, "run echo after the poison"), secret_token=SECRET) == 200
    [sent] = wait_for(lambda: fake_telegram.sent(CHAT))
    assert "after the poison" in sent.params["text"]
    assert bot.app.runtime.wait_idle(timeout=10)
    assert len(bot.app.runtime.dead_letters.letters()) == 1
    assert bot.app.runtime.cell("interface.telegram").restarts == 0


def test_a_call_with_a_lone_surrogate_is_answered_with_it_read_as_a_replacement_character(
    bot: WebhookBot, fake_llm: FakeLLMServer, fake_telegram: FakeTelegramServer
) -> None:
    """Valid JSON whose "\\ud800" no UTF-8 holds: it was refused at the intake's door as a
    dead letter; it is journaled and answered with U+FFFD in its place."""
    body = json.dumps({"update_id": 10, "message": {
        "message_id": 9, "date": 0, "text": "run echo \ud800", "chat": {"id": CHAT, "type": "private"},
        "from": {"id": ALLOWED, "is_bot": False, "first_name": "A"}}}).encode()
    assert post_update(bot.hook, body, secret_token=SECRET) == 200
    [sent] = wait_for(lambda: fake_telegram.sent(CHAT))
    assert bot.app.runtime.wait_idle(timeout=10)
    assert asked(fake_llm, "run echo \ufffd") == 1
    assert bot.app.runtime.dead_letters.letters() == []


def test_an_oversized_call_is_refused_413_and_the_next_update_flows(
    bot: WebhookBot, fake_llm: FakeLLMServer, fake_telegram: FakeTelegramServer
) -> None:
    huge = text(fake_telegram, "run echo " + "x" * TELEGRAM_WEBHOOK_MAX_BYTES)
    assert post_update(bot.hook, huge, secret_token=SECRET) == 413
    # Without a Content-Length (chunked), the server stops reading at the limit.
    chunk = b" " * 65_536
    connection = http.client.HTTPConnection("127.0.0.1", bot.port, timeout=30)
    try:
        connection.request("POST", "/telegram/hook",
                           body=iter([b'{"update_id": 99, "pad": "'] + [chunk] * 17 + [b'"}']),
                           headers={"X-Telegram-Bot-Api-Secret-Token": SECRET,
                                    "Content-Type": "application/json"}, encode_chunked=True)
        assert connection.getresponse().status == 413
    finally:
        connection.close()
    assert post_update(bot.hook, text(fake_telegram, "run echo after the flood"), secret_token=SECRET) == 200
    [sent] = wait_for(lambda: fake_telegram.sent(CHAT))
    assert "after the flood" in sent.params["text"]
    assert bot.app.runtime.wait_idle(timeout=10)
    assert fake_llm.requests and not any("xxxx" in r.messages[-1]["content"] for r in fake_llm.requests)
    assert bot.app.runtime.cell("interface.telegram").restarts == 0


def test_a_caller_that_never_finishes_its_call_is_let_go(
    fake_llm: FakeLLMServer, fake_telegram: FakeTelegramServer, make_app: Callable[..., Application],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import socket

    import autoresponse.interfaces.telegram.webhook as webhook

    monkeypatch.setattr(webhook, "HTTP_IDLE_SECONDS", 1.0)  # read as the server starts
    port = free_port()
    make_app(base_url=fake_llm.base_url, telegram={
        "token": "123456:TEST-TOKEN", "base_url": fake_telegram.base_url, "allowed_users": [ALLOWED],
        "webhook_url": PUBLIC_URL, "webhook_listen": f"127.0.0.1:{port}", "webhook_secret": SECRET,
    }, clock=fake_telegram.clock)
    with socket.create_connection(("127.0.0.1", port), timeout=30) as slow:
        slow.sendall(b"POST /telegram/hook HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # and never the rest
        assert slow.recv(1024) == b""  # closed by the server (else the 30 s guard raises)


Stream = tuple[asyncio.StreamReader, asyncio.StreamWriter]


async def open_call(port: int) -> Stream:
    """A call with the right secret whose headers promise 10,000 bytes of body, and the first few."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"POST /telegram/hook HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 f"X-Telegram-Bot-Api-Secret-Token: {SECRET}\r\nContent-Length: 10000\r\n\r\n"
                 '{"update_id": 1, "pad": "'.encode())
    await writer.drain()
    return reader, writer


async def status_line(call: Stream, within: float, *, dribble: bool = False) -> bytes:
    """The status line the webhook answers ``call`` with, b"" if none within ``within``
    seconds; while it waits, with ``dribble``, a byte of body every tenth of a second."""
    reader, writer = call
    until = time.monotonic() + within
    while time.monotonic() < until:
        if dribble:
            with contextlib.suppress(ConnectionError):  # answered, and closed, in between
                writer.write(b"x")
                await writer.drain()
        with contextlib.suppress(TimeoutError):
            return await asyncio.wait_for(reader.readline(), 0.1)
    return b""


def test_a_call_whose_body_is_dribbled_is_cut_off_with_a_408_and_the_next_update_flows(
    fake_llm: FakeLLMServer, fake_telegram: FakeTelegramServer, make_app: Callable[..., Application],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import autoresponse.interfaces.telegram.webhook as webhook

    monkeypatch.setattr(webhook, "HTTP_IDLE_SECONDS", 1.0)  # read as the server is made
    bot = start_bot(fake_llm, fake_telegram, make_app)

    async def dribble() -> bytes:
        call = await open_call(bot.port)
        try:
            return await status_line(call, 15, dribble=True)  # never idle: only a deadline ends it
        finally:
            call[1].close()

    assert asyncio.run(dribble()).startswith(b"HTTP/1.1 408 ")
    # Nothing was journaled (Telegram sends it again); the next update is served as ever.
    assert post_update(bot.hook, text(fake_telegram, "run echo after the dribble"), secret_token=SECRET) == 200
    [sent] = wait_for(lambda: fake_telegram.sent(CHAT))
    assert "after the dribble" in sent.params["text"]
    assert bot.app.runtime.wait_idle(timeout=10)
    assert bot.app.runtime.dead_letters.letters() == []
    assert bot.app.runtime.cell("interface.telegram").restarts == 0


def test_past_the_bodies_read_at_once_a_call_is_told_to_come_back_and_is_served_when_it_does(
    fake_llm: FakeLLMServer, fake_telegram: FakeTelegramServer, make_app: Callable[..., Application],
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    import autoresponse.interfaces.telegram.webhook as webhook

    monkeypatch.setattr(webhook, "TELEGRAM_WEBHOOK_MAX_BODIES_READ", 2)
    bot = start_bot(fake_llm, fake_telegram, make_app)

    async def one_too_many() -> bytes:
        calls = []
        try:
            for _ in range(2):  # being read: no answer while their bodies arrive
                calls.append(await open_call(bot.port))
                assert await status_line(calls[-1], 0.3) == b""
            calls.append(await open_call(bot.port))
            return await status_line(calls[-1], 15)  # answered at once, its body unread
        finally:
            for _, writer in calls:
                writer.close()

    assert asyncio.run(one_too_many()).startswith(b"HTTP/1.1 503 ")
    # Their places are given back as they hang up; Telegram's next try of an update gets in.
    update = text(fake_telegram, "run echo once there is room")
    wait_for(lambda: post_update(bot.hook, update, secret_token=SECRET) == 200)
    [sent] = wait_for(lambda: fake_telegram.sent(CHAT))
    assert "once there is room" in sent.params["text"]
    assert bot.app.runtime.wait_idle(timeout=10)
    assert asked(fake_llm, "run echo once there is room") == 1
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []  # the hang-ups


# ---------------------------------------------------------------- settings


def test_a_webhook_url_without_a_secret_is_a_settings_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AUTORESPONSE_TELEGRAM__TOKEN", "123456:TEST-TOKEN")
    monkeypatch.setenv("AUTORESPONSE_TELEGRAM__WEBHOOK_URL", PUBLIC_URL)
    for missing in (None, "", "  "):
        if missing is not None:
            monkeypatch.setenv("AUTORESPONSE_TELEGRAM__WEBHOOK_SECRET", missing)
        with pytest.raises(ConfigError) as caught:
            Settings.load()
        assert str(caught.value) == (
            f"AUTORESPONSE_TELEGRAM__WEBHOOK_URL is '{PUBLIC_URL}': webhook mode needs a secret too: "
            "set AUTORESPONSE_TELEGRAM__WEBHOOK_SECRET ([telegram] webhook_secret) to 1 to 256 "
            "characters of A-Z, a-z, 0-9, _ and -")


def test_the_daemon_refuses_to_start_a_webhook_without_a_secret(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "autoresponse", "run"], check=False, capture_output=True,
                          text=True, timeout=60, stdin=subprocess.DEVNULL, env=environment(
                              AUTORESPONSE_TELEGRAM__TOKEN="123456:TEST-TOKEN",
                              AUTORESPONSE_TELEGRAM__WEBHOOK_URL=PUBLIC_URL,
                              AUTORESPONSE_DATA_DIR=str(tmp_path / "data")))
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1
    assert done.stderr.startswith("autoresponse: AUTORESPONSE_TELEGRAM__WEBHOOK_URL is ")
    assert "needs a secret too: set AUTORESPONSE_TELEGRAM__WEBHOOK_SECRET" in done.stderr


@pytest.mark.parametrize("listen", ["localhost", "127.0.0.1", "127.0.0.1:", ":8443", "127.0.0.1:0",
                                    "127.0.0.1:65536", "127.0.0.1:https", "::1:8443", "[localhost]:8443",
                                    "999.1.1.1:8443", "bot host:8443", " 127.0.0.1:8443", ""])
def test_a_bad_listen_address_is_a_settings_error(monkeypatch: pytest.MonkeyPatch, listen: str) -> None:
    monkeypatch.setenv("AUTORESPONSE_TELEGRAM__WEBHOOK_LISTEN", listen)
    with pytest.raises(ConfigError) as caught:
        Settings.load()
    assert str(caught.value) == (f"AUTORESPONSE_TELEGRAM__WEBHOOK_LISTEN is {listen!r}: should be host:port "
                                 "with a port from 1 to 65535, e.g. 127.0.0.1:8443 or [::1]:8443")


@pytest.mark.parametrize("listen", ["127.0.0.1:8443", "[::1]:8443", "0.0.0.0:80", "localhost:8443",
                                    "bot-host.internal:65535"])
def test_a_listen_address_is_host_and_port(listen: str) -> None:
    assert Settings.load(telegram={"webhook_listen": listen}).telegram.webhook_listen == listen


def test_the_webhook_listens_on_loopback_by_default() -> None:
    assert Settings.load().telegram.webhook_listen == "127.0.0.1:8443"


@pytest.mark.parametrize("secret", ["has space", "x" * 257, "émigré", "semi;colon"])
def test_a_secret_telegram_would_refuse_is_a_settings_error_that_does_not_show_it(
    monkeypatch: pytest.MonkeyPatch, secret: str
) -> None:
    monkeypatch.setenv("AUTORESPONSE_TELEGRAM__WEBHOOK_URL", PUBLIC_URL)
    monkeypatch.setenv("AUTORESPONSE_TELEGRAM__WEBHOOK_SECRET", secret)
    with pytest.raises(ConfigError) as caught:
        Settings.load()
    assert str(caught.value) == ("AUTORESPONSE_TELEGRAM__WEBHOOK_SECRET (a secret, not shown): should be 1 "
                                 "to 256 characters of A-Z, a-z, 0-9, _ and -, as Telegram requires")
    assert secret not in str(caught.value)


@pytest.mark.parametrize("url", ["http://bot.example.com/hook", "bot.example.com/hook", "https:///hook",
                                 "https://bot.example.com:port/hook", "https://bot example.com/hook"])
def test_a_webhook_url_that_is_not_https_is_a_settings_error(monkeypatch: pytest.MonkeyPatch, url: str) -> None:
    monkeypatch.setenv("AUTORESPONSE_TELEGRAM__WEBHOOK_URL", url)
    monkeypatch.setenv("AUTORESPONSE_TELEGRAM__WEBHOOK_SECRET", SECRET)
    with pytest.raises(ConfigError) as caught:
        Settings.load()
    assert str(caught.value) == (f"AUTORESPONSE_TELEGRAM__WEBHOOK_URL is {url!r}: should be an https:// URL "
                                 "with a host, e.g. https://bot.example.com/telegram")


def test_the_secret_is_redacted_like_every_secret(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("AUTORESPONSE_TELEGRAM__TOKEN", "123456:TEST-TOKEN")
    monkeypatch.setenv("AUTORESPONSE_TELEGRAM__WEBHOOK_URL", PUBLIC_URL)
    monkeypatch.setenv("AUTORESPONSE_TELEGRAM__WEBHOOK_SECRET", SECRET)
    settings = Settings.load()
    assert SECRET in settings.secrets()  # what log lines, dead letters and errors are cleaned of
    assert SECRET not in repr(settings) and SECRET not in str(settings.model_dump())
    shown = subprocess.run([sys.executable, "-m", "autoresponse", "config", "show"], check=False,
                           capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL, env=environment(
                               AUTORESPONSE_TELEGRAM__TOKEN="123456:TEST-TOKEN",
                               AUTORESPONSE_TELEGRAM__WEBHOOK_URL=PUBLIC_URL,
                               AUTORESPONSE_TELEGRAM__WEBHOOK_SECRET=SECRET,
                               AUTORESPONSE_DATA_DIR=str(tmp_path / "data")))
    assert shown.returncode == 0, shown.stderr
    assert SECRET not in shown.stdout + shown.stderr
    [line] = [x for x in shown.stdout.splitlines() if x.startswith("telegram.webhook_secret")]
    assert '"[secret]"' in line
