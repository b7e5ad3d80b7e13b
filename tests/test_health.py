"""Health tells the truth: an interface its platform refuses (a revoked token), or an LLM
that fails every request (a revoked key, a server away, its circuit open), shows as
failing, with the reason and since when, in /healthz (503), /status, the status page,
the metrics and `autoresponse status`, while /readyz still says the daemon started; once
the platform or the LLM takes it again, health comes back.

The bot and the fakes share a ManualClock: the polling backoff after each refusal is a
timer of the runtime's clock, which the tests fire instead of waiting.
"""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import ask, console_text, environment, wait_for
from prometheus_client.parser import text_string_to_metric_families

from autoresponse import Application
from autoresponse.actors.kernel import ManualClock
from autoresponse.actors.llm.chain import THINKING_NOTICE
from autoresponse.actors.llm.client import TOO_LONG_NOTICE, UNREACHABLE_NOTICE
from autoresponse.supervisors.status import snapshot
from autoresponse.testing.fake_llm import FakeLLMServer, FakeResponse
from autoresponse.testing.fake_telegram import FakeTelegramServer

MakeApp = Callable[..., Application]
ADMIN = {"enabled": True, "host": "127.0.0.1", "port": 0}
TOKEN = "123456:TEST-TOKEN-s3cr3t"
TELEGRAM = "interface.telegram"
REVOKED = "Telegram refuses the bot token (getUpdates: Unauthorized): is it revoked? Ask @BotFather"


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def get_json(url: str) -> tuple[int, dict[str, Any]]:
    code, text = get(url)
    return code, json.loads(text)


def metrics(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of GET /metrics, by name and labels."""
    code, text = get(f"{url}/metrics")
    assert code == 200
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def hhmmss(t: float) -> str:
    return dt.datetime.fromtimestamp(t).strftime("%H:%M:%S")


@pytest.fixture
def fake_telegram(manual_clock: ManualClock) -> Iterator[FakeTelegramServer]:
    with FakeTelegramServer(clock=manual_clock) as server:
        yield server


@pytest.fixture
def bot(fake_llm: FakeLLMServer, fake_telegram: FakeTelegramServer, make_app: MakeApp) -> Application:
    # The servers come first so that they outlive the app: it stops before they do.
    return make_app(base_url=fake_llm.base_url, admin=ADMIN, clock=fake_telegram.clock, telegram={
        "token": TOKEN, "base_url": fake_telegram.base_url, "allowed_users": [7], "poll_timeout": 1})


def test_a_revoked_telegram_token_fails_health_with_its_reason_until_it_works_again(
    bot: Application, fake_telegram: FakeTelegramServer, manual_clock: ManualClock
) -> None:
    assert bot.admin is not None
    url = bot.admin.url
    wait_for(lambda: [c for c in fake_telegram.calls_to("getUpdates") if c.ok])
    assert get_json(f"{url}/healthz") == (200, {"status": "ok"})

    fake_telegram.revoke(TOKEN)  # @BotFather's /revoke: every getUpdates is a 401 from now on
    failing = wait_for(lambda: snapshot(bot.runtime).failing.get(TELEGRAM))
    since = manual_clock.time()  # the clock has not moved since the first refusal
    assert (failing.reason, failing.since) == (REVOKED, since)
    start = manual_clock.monotonic()
    assert manual_clock.advance_until(lambda: manual_clock.monotonic() - start >= 25)  # the backoff fires
    refused = [c for c in fake_telegram.calls_to("getUpdates") if not c.ok]
    assert len(refused) >= 5 and all(c.time >= start for c in refused)  # it kept asking, backing off
    elapsed = manual_clock.time() - since

    # /healthz: 503, with one line saying who fails, since when, and why.
    code, health = get_json(f"{url}/healthz")
    line = f"{TELEGRAM} failing for {elapsed:.0f}s (since {hhmmss(since)}): {REVOKED}"
    assert (code, health["status"], health["reason"]) == (503, "failing", line)
    assert health["failing"] == {TELEGRAM: {"reason": REVOKED, "since": since}}
    # /readyz: the daemon has started (it answers what reaches it); it is not healthy.
    assert get_json(f"{url}/readyz") == (200, {"status": "started", "ready": True, "healthy": False,
                                                "reason": line})
    # /status: the actor runs (it is not down), and its node says it fails, why and since when.
    code, status = get_json(f"{url}/status")
    node = next(n for n in _walk(status["tree"]) if n["name"] == TELEGRAM)
    assert (node["state"], node["failing"]) == ("running", {"reason": REVOKED, "since": since})
    assert status["down"] == [] and list(status["failing"]) == [TELEGRAM]
    # The metrics: unhealthy, since when, and why.
    samples = metrics(url)
    assert samples[("autoresponse_interface_healthy", (("interface", "telegram"),))] == 0
    assert samples[("autoresponse_interface_failing_since_seconds",
                    (("interface", "telegram"), ("reason", REVOKED)))] == since
    assert samples[("autoresponse_interface_healthy", (("interface", "console"),))] == 1
    # The status page: a red badge, and the reason in the tree.
    code, page = get(f"{url}/")
    assert 'class="badge bad"' in page and "failing: interface.telegram" in page
    row = page[page.index(f'data-actor="{TELEGRAM}"'):]
    row = row[:row.index("</tr>")]
    assert '<span class="state failing">failing</span>' in row
    assert "Telegram refuses the bot token" in row and f"since {hhmmss(since)}" in row
    # `autoresponse status`: the failing interface in red, with its reason and since when.
    shown = subprocess.run([sys.executable, "-m", "autoresponse", "status", "--url", url],
                           capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL,
                           env=environment(FORCE_COLOR="1", COLUMNS="400", TERM="xterm"))
    assert shown.returncode == 0, shown.stderr
    [headline] = [x for x in shown.stdout.splitlines() if f"{TELEGRAM} is failing" in x]
    assert "\x1b[1;31m" in headline  # bold red
    assert f"since {hhmmss(since)}" in headline and "Telegram refuses the bot token" in headline
    # No secret anywhere an operator looks.
    for path in ("/healthz", "/readyz", "/status", "/metrics", "/"):
        assert "s3cr3t" not in get(f"{url}{path}")[1], path
    assert "s3cr3t" not in shown.stdout

    fake_telegram.revoke(TOKEN, False)  # a new token works (the same, for the fake)
    assert manual_clock.advance_until(lambda: get(f"{url}/healthz")[0] == 200)
    assert get_json(f"{url}/healthz") == (200, {"status": "ok"})
    assert get_json(f"{url}/readyz") == (200, {"status": "started", "ready": True, "healthy": True})
    assert snapshot(bot.runtime).find(TELEGRAM).failing is None  # type: ignore[union-attr]
    assert metrics(url)[("autoresponse_interface_healthy", (("interface", "telegram"),))] == 1
    assert not any(name == "autoresponse_interface_failing_since_seconds" for name, _ in metrics(url))


def _walk(nodes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [x for n in nodes for x in [n, *_walk(n["children"])]]


# ---------------------------------------------------------------- X: the same, shorter

X_KEYS = ("x-consumer-key-0a1b2c", "x-consumer-secret-3d4e5f", "x-access-token-6a7b8c", "x-token-secret-9d0e1f")


@pytest.fixture
def x_platform() -> Iterator[None]:
    from autoresponse.interfaces.x import PLATFORM
    from autoresponse.supervisors import registered

    with registered(PLATFORM):
        yield


def test_x_refusing_the_credentials_fails_health_until_they_work_again(
    x_platform: None, fake_llm: FakeLLMServer, make_app: MakeApp, manual_clock: ManualClock, tmp_path: Path
) -> None:
    from autoresponse.testing.fake_x import FakeXServer

    with FakeXServer(user_id=1000, username="synth", oauth1=X_KEYS, clock=manual_clock) as fake_x:
        consumer_key, consumer_secret, access_token, access_token_secret = X_KEYS
        app = make_app(base_url=fake_llm.base_url, admin=ADMIN, clock=manual_clock, x={
            "consumer_key": consumer_key, "consumer_secret": consumer_secret, "access_token": access_token,
            "access_token_secret": access_token_secret, "api_address": fake_x.api_address,
            "ca_file": str(fake_x.write_ca(tmp_path / "x-ca.pem")), "allowed_users": [7],
            "poll_interval": 60})
        assert app.admin is not None
        url = app.admin.url
        wait_for(lambda: fake_x.calls_to("GET mentions"))
        assert get(f"{url}/healthz")[0] == 200
        fake_x.revoke()
        since = manual_clock.time()
        assert manual_clock.advance_until(lambda: "interface.x" in snapshot(app.runtime).failing)
        code, health = get_json(f"{url}/healthz")
        reason = health["failing"]["interface.x"]["reason"]
        assert code == 503 and reason.startswith("X refuses the account's credentials (reading the mentions: "
                                                 "401 Unauthorized")
        assert health["failing"]["interface.x"]["since"] >= since
        assert health["reason"].startswith("interface.x failing for ") and reason in health["reason"]
        assert get_json(f"{url}/readyz")[1]["ready"] is True
        assert metrics(url)[("autoresponse_interface_healthy", (("interface", "x"),))] == 0
        assert not any(key in get(f"{url}/status")[1] for key in X_KEYS)

        fake_x.revoke(False)
        assert manual_clock.advance_until(lambda: get(f"{url}/healthz")[0] == 200)
        assert metrics(url)[("autoresponse_interface_healthy", (("interface", "x"),))] == 1
        app.stop()  # before its fake goes


# ---------------------------------------------------------------- Reddit: the same, shorter


def test_reddit_refusing_the_account_fails_health_until_it_works_again(
    fake_llm: FakeLLMServer, make_app: MakeApp, manual_clock: ManualClock
) -> None:
    """asyncprawcore retries a 401 once after up to 2 s of real time (its own clock)."""
    from autoresponse.interfaces.reddit import PLATFORM
    from autoresponse.supervisors import registered
    from autoresponse.testing.fake_reddit import FakeRedditServer

    password = "reddit-password-5e7d0b"
    with registered(PLATFORM), FakeRedditServer(username="synth_bot", client_id="reddit-app-id",
                                                client_secret="reddit-app-secret-91c2", password=password,
                                                clock=manual_clock) as fake_reddit:
        app = make_app(base_url=fake_llm.base_url, admin=ADMIN, clock=manual_clock, reddit={
            "client_id": "reddit-app-id", "client_secret": "reddit-app-secret-91c2", "username": "synth_bot",
            "password": password, "oauth_url": fake_reddit.base_url, "reddit_url": fake_reddit.base_url,
            "allowed_users": ["Ada"], "poll_interval": 60})
        assert app.admin is not None
        url = app.admin.url
        wait_for(lambda: fake_reddit.calls_to("message/unread"))
        assert get(f"{url}/healthz")[0] == 200
        fake_reddit.revoke()
        assert manual_clock.advance_until(lambda: "interface.reddit" in snapshot(app.runtime).failing, 30)
        code, health = get_json(f"{url}/healthz")
        assert (code, health["failing"]["interface.reddit"]["reason"]) == (
            503, "Reddit refuses the account (reading the inbox: OAuthException: invalid_grant error "
                 "processing request)")
        assert metrics(url)[("autoresponse_interface_healthy", (("interface", "reddit"),))] == 0
        assert password not in get(f"{url}/status")[1] and "reddit-app-secret-91c2" not in health["reason"]

        fake_reddit.revoke(False)
        assert manual_clock.advance_until(lambda: get(f"{url}/healthz")[0] == 200, 30)
        app.stop()  # before its fake goes


# ---------------------------------------------------------------- Telegram webhooks


def test_a_dead_webhook_and_a_revoked_token_show_in_webhook_mode(
    fake_llm: FakeLLMServer, fake_telegram: FakeTelegramServer, make_app: MakeApp, manual_clock: ManualClock
) -> None:
    """Nobody calls a webhook that Telegram cannot reach: the interface asks Telegram
    (getWebhookInfo, every minute of the runtime's clock) how delivering to it goes."""
    from conftest import free_port

    from autoresponse.interfaces.telegram.interface import WEBHOOK_CHECK_SECONDS
    from autoresponse.testing.fake_telegram import post_update

    secret, port = "test-webhook-secret_0123456789", free_port()
    app = make_app(base_url=fake_llm.base_url, admin=ADMIN, clock=manual_clock, telegram={
        "token": TOKEN, "base_url": fake_telegram.base_url, "allowed_users": [7],
        "webhook_url": "https://bot.example.com/telegram/hook", "webhook_listen": f"127.0.0.1:{port}",
        "webhook_secret": secret})
    assert app.admin is not None
    url = app.admin.url

    def failing() -> str | None:
        found = snapshot(app.runtime).failing.get(TELEGRAM)
        return None if found is None else found.reason

    fake_telegram.push_text("run uptime", chat_id=42, user_id=7)  # waits at Telegram: the proxy is down
    fake_telegram.webhook_failed("Connection refused")
    assert manual_clock.advance_until(lambda: failing() is not None)
    assert failing() == "Telegram cannot deliver to the webhook: Connection refused"
    code, health = get_json(f"{url}/healthz")
    assert code == 503 and health["reason"].endswith(": Telegram cannot deliver to the webhook: Connection refused")
    assert get_json(f"{url}/readyz")[0] == 200

    # The proxy is back: Telegram's calls arrive, and the next check finds the webhook alive.
    update = fake_telegram.text_update("hello", chat_id=42, user_id=7)
    assert post_update(f"http://127.0.0.1:{port}/telegram/hook", update, secret_token=secret) == 200
    manual_clock.advance(WEBHOOK_CHECK_SECONDS)
    wait_for(lambda: failing() is None)
    assert get(f"{url}/healthz")[0] == 200
    assert manual_clock.advance_until(lambda: fake_telegram.sent(42))  # and what it carried is answered
    [reply] = fake_telegram.sent(42)
    assert reply.params["reply_parameters"]["message_id"] == update["message"]["message_id"]

    fake_telegram.revoke(TOKEN)  # nobody would notice otherwise: Telegram simply stops calling
    checks = len(fake_telegram.calls_to("getWebhookInfo"))
    assert manual_clock.advance_until(lambda: len(fake_telegram.calls_to("getWebhookInfo")) > checks)
    wait_for(lambda: failing() is not None)
    assert failing() == "Telegram refuses the bot token (getWebhookInfo: Unauthorized): is it revoked? Ask @BotFather"
    assert "s3cr3t" not in get(f"{url}/healthz")[1]


# ---------------------------------------------------------------- a poller lease on NATS


def test_a_poller_lease_that_cannot_be_renewed_fails_health_until_nats_is_back(
    fake_llm: FakeLLMServer, make_app: MakeApp, nats_server: Any
) -> None:
    """Leases renew on real time (the NATS journal's own loop), so this test keeps real time."""
    with FakeTelegramServer() as telegram:
        app = make_app(base_url=fake_llm.base_url, admin=ADMIN, journal={"backend": "nats"},
                       nats={"url": nats_server.url, "node": "a", "lease_seconds": 2}, telegram={
                           "token": TOKEN, "base_url": telegram.base_url, "allowed_users": [7], "poll_timeout": 1})
        assert app.admin is not None
        url = app.admin.url
        wait_for(lambda: [c for c in telegram.calls_to("getUpdates") if c.ok])  # it holds the lease
        assert snapshot(app.runtime).failing == {}

        nats_server.stop()
        failing = wait_for(lambda: snapshot(app.runtime).failing.get(TELEGRAM), timeout=30)
        assert failing.reason.startswith("the poller lease of telegram-1000: cannot renew it (it lapses 2s "
                                         "after the last renewal): ")
        code, health = get_json(f"{url}/healthz")
        assert code == 503 and "the poller lease of telegram-1000: cannot renew it" in health["reason"]

        nats_server.start()  # the lease lapsed meanwhile: the poller stops, takes it again, polls on
        wait_for(lambda: get(f"{url}/healthz")[0] == 200, timeout=60)
        assert snapshot(app.runtime).failing == {}
        polled = len(telegram.calls_to("getUpdates"))
        wait_for(lambda: len([c for c in telegram.calls_to("getUpdates") if c.ok]) > polled)
        app.stop()  # before its fake goes


# ---------------------------------------------------------------- the LLM

LLM = "llm"
LLM_KEY = "sk-test-revoked-0123456789-s3cr3t"
#: OpenAI's answer to a revoked key: its body quotes part of the key.
KEY_REFUSED = FakeResponse(status=401, body=json.dumps({"error": {
    "message": "Incorrect API key provided: sk-test-****cr3t. You can find your API key at "
               "https://platform.openai.com/account/api-keys.",
    "type": "invalid_request_error", "code": "invalid_api_key"}}))


def test_an_llm_refusing_the_key_fails_health_until_it_answers_again(
    fake_llm: FakeLLMServer, make_app: MakeApp
) -> None:
    """Every message gets "could not reach the language model": /healthz says why, though
    the actor runs; the next answer clears it. A request too long for the model is that
    request's own failure: the LLM stays healthy."""
    app = make_app(base_url=fake_llm.base_url, admin=ADMIN, llm={"api_key": LLM_KEY})
    assert app.admin is not None
    url = app.admin.url
    ask(app, "hello")
    assert get_json(f"{url}/healthz") == (200, {"status": "ok"})

    fake_llm.responder = lambda body: KEY_REFUSED  # the key is revoked
    ask(app, "hello again")
    assert console_text(app).endswith(UNREACHABLE_NOTICE + "\n")
    refused = "the LLM server refuses the key: HTTP 401"
    code, health = get_json(f"{url}/healthz")
    assert (code, health["status"]) == (503, "failing"), health
    assert health["failing"][LLM]["reason"] == refused
    assert health["reason"].startswith(f"{LLM} failing for ") and health["reason"].endswith(f": {refused}")
    assert get_json(f"{url}/readyz")[1] | {"reason": ""} == {"status": "started", "ready": True,
                                                             "healthy": False, "reason": ""}
    # Degraded, not down: the actor runs, and nothing restarted it.
    code, status = get_json(f"{url}/status")
    node = next(n for n in _walk(status["tree"]) if n["name"] == LLM)
    assert (node["state"], node["restarts"], node["failing"]["reason"]) == ("running", 0, refused)
    assert status["down"] == [] and list(status["failing"]) == [LLM]
    assert metrics(url)[("autoresponse_interface_healthy", (("interface", LLM),))] == 0
    shown = subprocess.run([sys.executable, "-m", "autoresponse", "status", "--url", url],
                           capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL,
                           env=environment(COLUMNS="400"))
    assert shown.returncode == 0, shown.stderr
    [headline] = [x for x in shown.stdout.splitlines() if f"{LLM} is failing" in x]
    assert headline.endswith(refused)
    for path in ("/healthz", "/readyz", "/metrics"):  # not even the part of the key the LLM quoted
        assert "cr3t" not in get(f"{url}{path}")[1], path
    assert "cr3t" not in headline

    fake_llm.responder = None  # a new key
    ask(app, "hello at last")
    assert get_json(f"{url}/healthz") == (200, {"status": "ok"})
    assert metrics(url)[("autoresponse_interface_healthy", (("interface", LLM),))] == 1

    fake_llm.context = 2_000  # llama.cpp's 400: the request exceeds the context window
    ask(app, "a question too long for this model: " + "x" * 20_000)
    assert console_text(app).endswith(TOO_LONG_NOTICE + "\n")
    assert get_json(f"{url}/healthz") == (200, {"status": "ok"})
    assert snapshot(app.runtime).failing == {}


def test_an_llm_server_away_fails_health_until_it_is_back(make_app: MakeApp) -> None:
    from conftest import free_port

    port = free_port()  # nothing listens there yet
    app = make_app(base_url=f"http://127.0.0.1:{port}/v1", admin=ADMIN)
    assert app.admin is not None
    url = app.admin.url
    ask(app, "hello")
    assert console_text(app).endswith(UNREACHABLE_NOTICE + "\n")
    code, health = get_json(f"{url}/healthz")
    assert (code, health["status"]) == (503, "failing"), health
    assert health["failing"][LLM]["reason"] == f"cannot reach the LLM server at 127.0.0.1:{port}: connection refused"

    with FakeLLMServer(port=port):  # the server is started again
        ask(app, "hello again")
        assert get_json(f"{url}/healthz") == (200, {"status": "ok"})
        app.stop()  # before its fake goes


def test_an_open_circuit_fails_health_though_a_fallback_stands_in_until_a_probe_answers(
    fake_llm: FakeLLMServer, make_app: MakeApp, manual_clock: ManualClock
) -> None:
    fake_llm.responder = lambda body: FakeResponse(status=503)
    app = make_app(base_url=fake_llm.base_url, admin=ADMIN, clock=manual_clock, llm={
        "max_attempts": 1, "breaker_failures": 2, "breaker_cooldown": 60,
        "fallbacks": [{"base_url": "offline"}]})
    assert app.admin is not None
    url = app.admin.url

    def failing() -> str | None:
        found = snapshot(app.runtime).failing.get(LLM)
        return None if found is None else found.reason

    ask(app, "hello", clock=manual_clock)
    assert failing() == "main: the LLM server fails: HTTP 503"
    ask(app, "hello again", clock=manual_clock)
    assert console_text(app).endswith(THINKING_NOTICE + "\n")  # the offline notice stands in
    assert failing() == "main: circuit open after 2 failures in a row (the LLM server fails: HTTP 503)"
    asked = len(fake_llm.requests)
    ask(app, "and again", clock=manual_clock)
    assert len(fake_llm.requests) == asked  # skipped: still failing
    assert get_json(f"{url}/healthz")[1]["failing"][LLM]["reason"] == failing()

    fake_llm.responder = None
    manual_clock.advance(61)  # cooled down: the next call probes the main engine
    ask(app, "hello at last", clock=manual_clock)
    assert failing() is None
    assert get_json(f"{url}/healthz") == (200, {"status": "ok"})


def test_a_journal_that_cannot_write_fails_health_and_takes_no_work_until_it_writes_again(
    fake_llm: FakeLLMServer, make_app: MakeApp, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture
) -> None:
    """The journal's database fails its writes (here another process holds its write lock,
    as a full disk fails them): /healthz says so and why, an inject is told 503 and to come
    back, a Telegram update waits unacknowledged; the log says it once, with no traceback.
    Once it writes again, health comes back and the update is answered, once."""
    import logging
    import sqlite3

    from autoresponse.actors.journal import journal as journal_module

    monkeypatch.setattr(journal_module, "BUSY_TIMEOUT_MS", 100)  # how long a write waits for the lock
    caplog.set_level(logging.INFO)
    with FakeTelegramServer() as telegram:
        app = make_app(base_url=fake_llm.base_url, admin=ADMIN, telegram={
            "token": TOKEN, "base_url": telegram.base_url, "allowed_users": [7], "poll_timeout": 1})
        assert app.admin is not None
        url = app.admin.url
        wait_for(lambda: [c for c in telegram.calls_to("getUpdates") if c.ok])
        holder = sqlite3.connect(tmp_path / "data" / "journal.sqlite3", isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")
        try:
            telegram.push_text("hello", chat_id=7, user_id=7, message_id=1)
            wait_for(lambda: snapshot(app.runtime).failing.get("journal"))
            code, health = get_json(f"{url}/healthz")
            assert (code, health["status"], list(health["failing"])) == (503, "failing", ["journal"]), health
            assert health["reason"].endswith("its writes fail: database is locked")
            for _ in range(3):
                request = urllib.request.Request(f"{url}/inject/interface.console", method="POST",
                                                 data=json.dumps({"text": "hello"}).encode())
                with pytest.raises(urllib.error.HTTPError) as refused:
                    urllib.request.urlopen(request, timeout=10)
                assert refused.value.code == 503 and refused.value.headers["Retry-After"] == "2"
                assert json.loads(refused.value.read())["error"] == (
                    "the journal cannot store new work now (database is locked); try again in 2s")
            assert telegram.sent() == [] and snapshot(app.runtime).down == []  # waiting, not crashed
        finally:
            holder.execute("ROLLBACK")
            holder.close()
        wait_for(lambda: telegram.sent(7), timeout=30)  # the update was tried again, and taken
        assert get_json(f"{url}/healthz") == (200, {"status": "ok"})
        app.stop()
        assert [c.params["reply_parameters"]["message_id"] for c in telegram.sent(7)] == [1]
    journal_logs = [r for r in caplog.records if r.name == "autoresponse.actors.journal"]
    assert [r.levelname for r in journal_logs if r.levelno >= logging.WARNING] == ["WARNING", "ERROR", "WARNING"]
    assert "writes again" in journal_logs[-1].getMessage()
    assert not [r for r in caplog.records if r.exc_info]  # no traceback, from anyone


def test_a_journal_that_writes_again_is_healthy_again_with_no_new_work(
    make_app: MakeApp, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The only writes that failed were accepts the journal refused (an inject told 503,
    whose client gave up): nothing is left to commit, yet once the journal can write
    again, /healthz says so, without waiting for new work (it stayed at 503 for good)."""
    import sqlite3

    from autoresponse.actors.journal import journal as journal_module

    monkeypatch.setattr(journal_module, "BUSY_TIMEOUT_MS", 100)  # how long a write waits for the lock
    monkeypatch.setattr(journal_module, "WRITE_RETRY_MAX_SECONDS", 0.2)  # how often it tries again
    app = make_app(admin=ADMIN)
    assert app.admin is not None
    url = app.admin.url
    holder = sqlite3.connect(tmp_path / "data" / "journal.sqlite3", isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        request = urllib.request.Request(f"{url}/inject/interface.console", method="POST",
                                         data=json.dumps({"text": "hello"}).encode())
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=10)
        assert refused.value.code == 503
        assert get_json(f"{url}/healthz")[0] == 503
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert wait_for(lambda: get_json(f"{url}/healthz") == (200, {"status": "ok"}), timeout=10)
