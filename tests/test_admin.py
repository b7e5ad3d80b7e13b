"""Status inspection: the snapshot, the admin endpoint, metrics, and its security."""

from __future__ import annotations

import contextlib
import http.client
import json
import logging
import socket
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

import pytest
from conftest import ask, console_text, wait_for
from prometheus_client.parser import text_string_to_metric_families

from autoresponse import Application
from autoresponse.actors.kernel import ManualClock, Runtime
from autoresponse.admin import MAX_BODY_DEPTH, AdminServer
from autoresponse.app import names_in
from autoresponse.config import AdminSettings
from autoresponse.supervisors import snapshot

MakeApp = Callable[..., Application]
ADMIN = {"enabled": True, "host": "127.0.0.1", "port": 0}


def call(url: str, method: str = "GET", body: Any = None, token: str | None = None) -> tuple[int, str]:
    request = urllib.request.Request(url, method=method,
                                     data=None if body is None else json.dumps(body).encode())
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def admin_url(app: Application) -> str:
    assert app.admin is not None
    return app.admin.url


def _port(app: Application) -> int:
    assert app.admin is not None
    return app.admin.port


def test_the_snapshot_lists_every_actor_in_its_tree(make_app: MakeApp) -> None:
    app = make_app()
    status = snapshot(app.runtime)
    [root] = status.tree
    assert root.name == "root" and root.kind == "supervisor"
    assert [c.name for c in root.children] == ["pipeline", "retry", "conversations", "interfaces"]
    listed = [n.name for n in root.walk()]
    assert sorted(listed) == sorted(names_in(app.tree()))
    llm = status.find("llm")
    assert llm is not None and (llm.kind, llm.state, llm.restarts) == ("worker", "running", 0)


def test_status_counts_restarts_caused_through_inject(make_app: MakeApp) -> None:
    app = make_app(admin=ADMIN)
    url = admin_url(app)
    for n in range(2):
        code, body = call(f"{url}/inject/llm?type=Crash", "POST", {"reason": f"drill {n}"})
        assert code == 202, body
    ask(app, "run echo still-serving")
    assert "still-serving" in console_text(app)
    code, body = call(f"{url}/status")
    llm = next(n for n in _walk(json.loads(body)["tree"]) if n["name"] == "llm")
    assert llm["restarts"] == 2
    assert llm["last_failure"]["type"] == "CrashRequested"
    assert llm["last_failure"]["message"] == "drill 1"


def _walk(nodes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [x for n in nodes for x in [n, *_walk(n["children"])]]


def test_inject_validates_against_the_actors_messages(make_app: MakeApp) -> None:
    app = make_app(admin=ADMIN)
    url = admin_url(app)
    code, body = call(f"{url}/inject/interface.console", "POST", {"text": "run echo injected"})
    assert code == 202 and json.loads(body)["type"] == "ConsoleInput"
    assert app.runtime.wait_idle(json.loads(body)["correlation_id"], timeout=10)
    assert "injected" in console_text(app)

    code, body = call(f"{url}/inject/interface.console", "POST", {"txt": "typo"})
    assert code == 422
    assert "text: Field required" in json.loads(body)["problems"]["ConsoleInput"]
    code, body = call(f"{url}/inject/nobody", "POST", {})
    assert code == 404 and "no actor named 'nobody'" in body
    code, body = call(f"{url}/inject/llm?type=Nonsense", "POST", {})
    assert code == 400 and "UserRequest" in json.loads(body)["accepts"]


@pytest.mark.parametrize(("actor", "query", "body"), [
    ("root", "", {}),
    ("root", "", {"text": "hello"}),
    ("retry", "", {"text": "run uptime"}),
    ("pipeline", "?type=Exit", {"name": "llm", "abnormal": True}),
    ("root", "?type=StartChild", {}),
    ("root", "?type=RestartDue", {"names": ["pipeline"]}),
])
def test_the_supervision_protocol_cannot_be_injected(make_app: MakeApp, actor: str, query: str,
                                                     body: dict[str, Any]) -> None:
    # Any object fit StartChild (its fields have defaults, extra keys were ignored) and
    # stopped the root; a forged Exit left a running actor counted as down for good.
    app = make_app(admin=ADMIN)
    url = admin_url(app)
    code, answer = call(f"{url}/inject/{actor}{query}", "POST", body)
    assert code == 400, answer
    # Nothing supervises the root: not even a Crash drill is offered there.
    assert json.loads(answer)["accepts"] == ([] if actor == "root" else ["Crash"])
    assert json.loads(answer)["error"].startswith(f"{actor} ")
    assert app.runtime.wait_idle(timeout=10)
    assert not app.failed.is_set()
    code, health = call(f"{url}/healthz")
    assert (code, json.loads(health)) == (200, {"status": "ok"})
    ask(app, "run echo still-serving")
    assert "still-serving" in console_text(app)


def test_a_crash_drill_at_the_root_is_refused_and_the_daemon_keeps_serving(make_app: MakeApp) -> None:
    # The root has no supervisor to restart it: a Crash there stopped the daemon (exit 1).
    app = make_app(admin=ADMIN)
    url = admin_url(app)
    code, answer = call(f"{url}/inject/root?type=Crash", "POST", {"reason": "drill"})
    assert code == 400, answer
    refusal = json.loads(answer)
    assert refusal["error"].startswith("root has no supervisor to restart it")
    assert "root" not in refusal["targets"] and {"llm", "pipeline", "interfaces"} <= set(refusal["targets"])
    code, answer = call(f"{url}/inject/pipeline?type=Crash", "POST", {"reason": "drill"})
    assert code == 202, answer  # any other actor, supervisors too, still takes a drill
    wait_for(lambda: snapshot(app.runtime).find("pipeline").restarts == 1)  # type: ignore[union-attr]
    assert not app.failed.is_set()
    ask(app, "run echo still-serving")
    assert "still-serving" in console_text(app)


def test_a_body_with_a_key_its_message_does_not_have_fits_no_message(make_app: MakeApp) -> None:
    app = make_app(admin=ADMIN)
    url = admin_url(app)
    code, body = call(f"{url}/inject/interface.console", "POST", {"text": "run echo fits", "txt": "typo"})
    assert code == 422, body
    assert json.loads(body)["problems"]["ConsoleInput"] == ["txt: Extra inputs are not permitted"]
    assert "ConsoleInput" in json.loads(body)["accepts"]
    code, body = call(f"{url}/inject/llm?type=Crash", "POST", {"reason": "drill", "why": "typo"})
    assert code == 422, body
    assert app.runtime.wait_idle(timeout=10)
    assert app.runtime.cell("llm").restarts == 0


def test_metrics_parse_and_count_what_happened(make_app: MakeApp) -> None:
    app = make_app(admin=ADMIN)
    url = admin_url(app)
    ask(app, "run echo measured")
    app.runtime.send("dispatcher", "not a reply")  # one dead letter
    assert app.runtime.wait_idle(timeout=10)
    call(f"{url}/inject/builder?type=Crash", "POST", {})
    assert app.runtime.wait_idle(timeout=10)
    code, text = call(f"{url}/metrics")
    assert code == 200
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families(text) for s in family.samples}
    assert samples[("autoresponse_messages_processed_total", (("actor", "llm"),))] >= 2
    assert samples[("autoresponse_deliveries_total", (("interface", "console"),))] == 1
    assert samples[("autoresponse_dead_letters_total", (("reason", "no handler"),))] == 1
    assert samples[("autoresponse_restarts_total", (("actor", "builder"),))] == 1
    assert ("autoresponse_in_flight", ()) in samples


def test_dead_letters_are_listed_and_replayed(make_app: MakeApp) -> None:
    app = make_app(admin=ADMIN)
    url = admin_url(app)
    app.runtime.send("dispatcher", "junk")
    assert app.runtime.wait_idle(timeout=10)
    code, body = call(f"{url}/deadletters")
    data = json.loads(body)
    assert data["counts"] == {"no handler": 1}
    [letter] = data["letters"]
    code, body = call(f"{url}/deadletters/{letter['id']}/replay", "POST", {})
    assert code == 202 and json.loads(body)["attempt"] == 2
    assert app.runtime.wait_idle(timeout=10)
    assert app.runtime.dead_letters.counts() == {"no handler": 2}
    code, _ = call(f"{url}/deadletters/999/replay", "POST", {})
    assert code == 404


def test_what_a_client_sends_gets_a_json_answer_never_a_500(make_app: MakeApp) -> None:
    app = make_app(admin=ADMIN)
    url = admin_url(app)
    code, body = call(f"{url}/deadletters/{'9' * 25}/replay", "POST", {})  # past SQLite's integers
    assert code == 404 and "no replayable dead letter" in json.loads(body)["error"]
    request = urllib.request.Request(f"{url}/inject/interface.console", method="POST", data=b'{"text": "hi"}',
                                     headers={"Origin": "http://[::1", "Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as refused:  # an Origin that does not parse is not ours
        urllib.request.urlopen(request, timeout=10)
    assert refused.value.code == 403
    assert json.loads(refused.value.read())["error"] == "refused: a cross-site request"
    for undecodable in ("%ff", "%fe"):  # both would read as U+FFFD: the second never ran
        code, answer = post_raw(f"{url}/inject/interface.console?correlation={undecodable}", b'{"text": "hi"}')
        assert code == 400 and "not UTF-8" in answer["error"]
    code, answer = post_raw(f"{url}/inject/interface.console", b"[" + b" " * (2 << 20) + b"]")
    assert code == 413 and "Maximum request body size" in answer["error"]


def test_a_damaged_dead_letter_or_trace_in_the_journal_is_left_out(make_app: MakeApp, tmp_path: Any) -> None:
    import sqlite3

    app = make_app(admin=ADMIN, data_dir=tmp_path / "data")
    for junk in ("one", "two"):
        app.runtime.send("dispatcher", junk)  # no handler: two dead letters, kept in the journal
    traced = ask(app, "hello").correlation_id
    assert app.runtime.wait_idle(timeout=10)
    [_, correlation] = [letter.correlation_id for letter in app.runtime.dead_letters.letters()]
    app.stop()
    with sqlite3.connect(tmp_path / "data" / "journal.sqlite3") as db:
        first = db.execute("SELECT MIN(id) FROM dead_letters").fetchone()[0]
        db.execute("UPDATE dead_letters SET summary = ? WHERE id = ?", ("[" * 100_000, first))
        assert db.execute("UPDATE traces SET hops = 'not json' WHERE correlation = ?", (traced,)).rowcount == 1
    again = make_app(admin=ADMIN, data_dir=tmp_path / "data")
    url = admin_url(again)
    code, body = call(f"{url}/deadletters")
    assert code == 200 and [d["envelope"]["correlation_id"] for d in json.loads(body)["letters"]] == [correlation]
    assert call(f"{url}/deadletters/{first}/replay", "POST", {})[0] == 404
    assert call(f"{url}/")[0] == 200  # the status page lists the rest
    code, body = call(f"{url}/trace/{traced}")
    assert code == 404 and "no trace of" in json.loads(body)["error"], body  # nothing to show, said as ever


def test_a_client_that_never_finishes_its_request_is_let_go(make_app: MakeApp,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    import socket

    import autoresponse.admin

    monkeypatch.setattr(autoresponse.admin, "HTTP_IDLE_SECONDS", 1.0)  # read as the server starts
    app = make_app(admin=ADMIN)
    port = int(admin_url(app).rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=30) as slow:
        slow.sendall(b"GET /status HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # and never the blank line
        assert slow.recv(1024) == b""  # closed by the server (else the 30 s guard raises)
    assert call(f"{admin_url(app)}/healthz")[0] == 200


def _send_part_of_a_body(port: int) -> socket.socket:
    """A POST whose headers promise 100 bytes of body, and the first few of them."""
    client = socket.create_connection(("127.0.0.1", port), timeout=30)
    client.sendall(b"POST /inject/interface.console HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                   b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"te")
    return client


def test_a_body_dribbled_a_byte_at_a_time_is_cut_off_with_a_408(make_app: MakeApp,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    import time

    import autoresponse.admin

    monkeypatch.setattr(autoresponse.admin, "HTTP_IDLE_SECONDS", 1.0)
    app = make_app(admin=ADMIN)
    with _send_part_of_a_body(_port(app)) as slow:
        slow.settimeout(0.2)
        until, answer = time.monotonic() + 30, b""
        while not answer.endswith(b"}") and time.monotonic() < until:
            with contextlib.suppress(TimeoutError):
                slow.sendall(b" ")  # never idle
                answer += slow.recv(4096)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408 "), answer
    assert json.loads(body) == {"error": "the body did not arrive whole within 1s"}
    assert call(f"{admin_url(app)}/healthz")[0] == 200


def test_past_the_bodies_read_at_once_a_request_is_told_to_come_back(make_app: MakeApp,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from conftest import wait_for

    import autoresponse.admin

    monkeypatch.setattr(autoresponse.admin, "ADMIN_MAX_BODIES_READ", 2)
    app = make_app(admin=ADMIN)
    url = f"{admin_url(app)}/inject/interface.console"
    slow = [_send_part_of_a_body(_port(app)) for _ in range(2)]
    try:
        # Until both are being read, the probe is read and refused as no message (422).
        code, answer = wait_for(lambda: (r := post_raw(url, b"{}"))[0] == 503 and r)
        assert answer["error"] == "busy: 2 requests are sending their bodies; try again"
        assert call(f"{admin_url(app)}/healthz")[0] == 200  # what sends no body is served
    finally:
        for client in slow:
            client.close()
    wait_for(lambda: post_raw(url, b"{}")[0] == 422)  # their places are given back


def test_a_client_that_hangs_up_mid_body_logs_no_error(make_app: MakeApp,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    from conftest import wait_for

    caplog.set_level(logging.DEBUG, logger="autoresponse.admin")
    app = make_app(admin=ADMIN)
    for _ in range(3):
        _send_part_of_a_body(_port(app)).close()
    # Each hang-up is logged once, somewhere: wait for all three, then look at how.
    wait_for(lambda: len([r for r in caplog.records if r.name in ("autoresponse.admin", "aiohttp.server")]) >= 3)
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
    assert call(f"{admin_url(app)}/healthz")[0] == 200


#: Requests that are not HTTP: a byte no URL has, a TLS hello, a header too long.
NOT_HTTP = [b"GET /\xff HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
            b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nX: " + b"a" * 10_000 + b"\r\n\r\n"]


def test_requests_that_are_not_http_are_one_warning_not_an_error_each(make_app: MakeApp,
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    # aiohttp logged each as an ERROR with a traceback: 500 of them in a second, from anyone.
    caplog.set_level(logging.DEBUG)
    app = make_app(admin=ADMIN)
    for n in range(60):
        with socket.create_connection(("127.0.0.1", _port(app)), timeout=30) as client:
            client.sendall(NOT_HTTP[n % len(NOT_HTTP)])
            assert client.recv(1024).split(b" ", 2)[1] == b"400"
    assert call(f"{admin_url(app)}/healthz")[0] == 200
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
    [line] = [r.getMessage() for r in caplog.records if r.name == "aiohttp.server"]
    assert line.startswith("answered 1 request(s) that are not HTTP with a 400 (the last: ")


def test_calls_to_the_telegram_webhook_that_are_not_http_are_one_warning_not_an_error_each(
    caplog: pytest.LogCaptureFixture
) -> None:
    # The other HTTP server a daemon may run, open to the internet behind its TLS proxy.
    import asyncio

    from conftest import free_port
    from pydantic import SecretStr

    from autoresponse.interfaces.telegram.webhook import WebhookServer

    async def status(port: int, request: bytes) -> bytes:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(request)
        line = await asyncio.wait_for(reader.readline(), 30)
        writer.close()
        return line.split(b" ", 2)[1]

    async def serve() -> tuple[list[bytes], bytes]:
        async def receive(update: Any) -> None:
            pass

        port = free_port()
        server = WebhookServer(("127.0.0.1", port), "https://bot.example/hook", SecretStr("s3cret"),
                               receive=receive, malformed=lambda raw, why: None)
        await server.start()
        try:
            answers = [await status(port, NOT_HTTP[n % len(NOT_HTTP)]) for n in range(60)]
            return answers, await status(port, b"POST /hook HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                                               b"Content-Length: 0\r\n\r\n")
        finally:
            await server.close()

    caplog.set_level(logging.DEBUG)
    answers, unauthorized = asyncio.run(serve())
    assert set(answers) == {b"400"} and unauthorized == b"401"  # it still serves
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
    [line] = [r.getMessage() for r in caplog.records if r.name == "aiohttp.server"]
    assert line.startswith("answered 1 Telegram webhook call(s) that are not HTTP with a 400 (the last: ")


def test_an_error_in_a_handler_is_still_logged_in_full(make_app: MakeApp, monkeypatch: pytest.MonkeyPatch,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    async def broken(self: AdminServer, request: Any) -> Any:
        raise RuntimeError("a bug in a handler")

    monkeypatch.setattr(AdminServer, "_requests", broken)
    app = make_app(admin=ADMIN)
    assert call(f"{admin_url(app)}/requests")[0] == 500
    [error] = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert error.name == "aiohttp.server" and error.exc_info is not None
    assert str(error.exc_info[1]) == "a bug in a handler"


@pytest.mark.parametrize("correlation", ["ok%0Aautoresponse%3A%20forged", "a%0Db", "a%09b", "a%1B%5B31m",
                                         "a%E2%80%AEb"])
def test_a_correlation_with_control_characters_is_a_400(make_app: MakeApp, correlation: str) -> None:
    app = make_app(admin=ADMIN)
    url = f"{admin_url(app)}/inject/interface.console"
    code, answer = post_raw(f"{url}?correlation={correlation}", b'{"text": "run echo forged"}')
    assert code == 400 and answer["error"] == "the correlation must be printable: no newline or other control character"
    assert post_raw(f"{url}?correlation=a%20plain%20one", b'{"text": "run echo fine"}')[0] == 202


def test_a_request_that_is_stuck_does_not_hold_up_the_stop(make_app: MakeApp, monkeypatch: pytest.MonkeyPatch,
                                                            caplog: pytest.LogCaptureFixture) -> None:
    from conftest import wait_for

    import autoresponse.admin

    monkeypatch.setattr(autoresponse.admin, "ADMIN_MAX_BODIES_READ", 1)
    app = make_app(admin=ADMIN)
    url = f"{admin_url(app)}/inject/interface.console"
    with _send_part_of_a_body(_port(app)):
        # Its body is read, and would be for HTTP_IDLE_SECONDS: another request is refused.
        wait_for(lambda: post_raw(url, b"{}")[0] == 503)
        app.stop()
    assert "event loop did not shut down cleanly" not in caplog.text


def test_binding_outside_loopback_needs_a_token() -> None:
    rt = Runtime().start()
    try:
        with pytest.raises(ValueError, match="only with a token"):
            AdminServer(rt, AdminSettings(host="0.0.0.0", port=0))
    finally:
        rt.stop()


def test_with_a_token_every_request_must_carry_it() -> None:
    token = "admin-token-that-must-stay-secret"
    rt = Runtime().start()
    try:
        server = AdminServer(rt, AdminSettings(host="0.0.0.0", port=0, token=token))
        server.start()
        url = f"http://127.0.0.1:{server.port}"
        for path in ("/status", "/metrics", "/deadletters", "/healthz"):
            code, body = call(url + path)
            assert code == 401 and token not in body
            assert call(url + path, token="wrong")[0] == 401
            assert call(url + path, token=token)[0] == 200
        assert call(f"{url}/inject/x", "POST", {}, token="wrong")[0] == 401
    finally:
        rt.stop()


@pytest.mark.parametrize("token", ["", "   "])
def test_an_empty_token_is_no_token(token: str) -> None:
    rt = Runtime().start()
    try:
        with pytest.raises(ValueError, match="only with a token"):
            AdminServer(rt, AdminSettings(host="0.0.0.0", port=0, token=token))
    finally:
        rt.stop()


def post_raw(url: str, body: bytes) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(url, method="POST", data=body,
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


@pytest.mark.parametrize(("body", "reason"), [
    (b'{"text": "caf\xe9"}', "the body is not UTF-8"),
    (b"[" * 100_000, f"the body nests deeper than {MAX_BODY_DEPTH} levels"),
    (b'{"text": ' + b"[" * 500 + b"]" * 500 + b"}", f"the body nests deeper than {MAX_BODY_DEPTH} levels"),
    (b"9" * 5000, "the body is not JSON"),
    (b"{nope", "the body is not JSON"),
])
def test_a_body_that_is_not_json_is_a_400(make_app: MakeApp, body: bytes, reason: str) -> None:
    app = make_app(admin=ADMIN)
    code, answer = post_raw(f"{admin_url(app)}/inject/interface.console", body)
    assert code == 400 and answer["error"].startswith(reason)
    # Still serving.
    code, answer = post_raw(f"{admin_url(app)}/inject/interface.console", b'{"text": "run echo fine"}')
    assert code == 202


def test_text_that_is_not_unicode_is_a_400_and_gives_its_place_back(make_app: MakeApp) -> None:
    # A lone surrogate parses as JSON but cannot be journaled; it once took a place for good.
    app = make_app(admin=ADMIN, runtime={"max_open": 1})
    for _ in range(3):
        code, answer = post_raw(f"{admin_url(app)}/inject/interface.console", b'{"text": "run echo \\ud800"}')
        assert code == 400 and answer["error"].startswith("the message cannot be stored")
    code, answer = post_raw(f"{admin_url(app)}/inject/interface.console", b'{"text": "run echo fine"}')
    assert code == 202


def test_an_authorization_header_that_is_not_utf8_is_a_401() -> None:
    rt = Runtime().start()
    try:
        server = AdminServer(rt, AdminSettings(host="127.0.0.1", port=0, token="the-token"))
        server.start()
        connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
        try:
            connection.putrequest("GET", "/status")
            connection.putheader("Authorization", b"Bearer \xff\xfe")
            connection.endheaders()
            assert connection.getresponse().status == 401
        finally:
            connection.close()
    finally:
        rt.stop()


def test_a_flood_is_backpressure_not_loss(make_app: MakeApp, fake_llm: Any) -> None:
    """Ten times the mailbox capacity, injected at once: the endpoint says 503 with
    Retry-After while the runtime is full, the client tries again, and every request is
    answered. No work is accepted and then dropped."""
    import threading
    import time as clock

    from autoresponse.testing.fake_llm import FakeResponse

    fake_llm.responder = lambda body: FakeResponse(delay=0.05, content=json.dumps(
        {"actions": [{"type": "message_console", "payload": {"text": "ok"}}]}))
    app = make_app(base_url=fake_llm.base_url, admin=ADMIN,
                   runtime={"mailbox_capacity": 5, "max_open": 10}, llm={"max_in_flight": 4})
    url = admin_url(app)
    busy: list[str] = []

    def push(n: int) -> None:
        body = {"text": f"request {n}", "user_name": "flood", "chat_id": f"flood-{n}"}
        for _ in range(600):
            status, text = call(f"{url}/inject/interface.console?correlation=flood-{n}", "POST", body)
            if status == 202:
                return
            assert status == 503 and "busy" in text, (status, text)
            busy.append(text)
            clock.sleep(0.05)
        raise AssertionError(f"request {n} was never taken")

    threads = [threading.Thread(target=push, args=(n,)) for n in range(50)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert app.runtime.wait_idle(timeout=60)
    assert busy, "the runtime was never full: the flood did not test backpressure"
    assert console_text(app).count("bot ") == 50
    assert app.runtime.dead_letters.letters() == []


def test_the_busy_answer_carries_retry_after(make_app: MakeApp, fake_llm: Any) -> None:
    from autoresponse.testing.fake_llm import FakeResponse

    fake_llm.script(FakeResponse(delay=3))  # the first request holds the only place a while
    app = make_app(base_url=fake_llm.base_url, admin=ADMIN, runtime={"max_open": 1})
    assert call(f"{admin_url(app)}/inject/interface.console", "POST", {"text": "first"})[0] == 202
    request = urllib.request.Request(f"{admin_url(app)}/inject/interface.console", method="POST",
                                     data=json.dumps({"text": "second"}).encode())
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(request, timeout=10)
    assert caught.value.code == 503 and caught.value.headers["Retry-After"] == "2"


def test_healthz_is_not_ok_while_an_inbound_actor_is_down(make_app: MakeApp, manual_clock: ManualClock) -> None:
    from conftest import wait_for

    app = make_app(admin=ADMIN, supervision={"backoff_min": 2.0, "backoff_max": 2.0, "backoff_jitter": 0},
                   clock=manual_clock)
    url = admin_url(app)
    assert call(f"{url}/healthz") == (200, '{"status": "ok"}')
    call(f"{url}/inject/interface.console?type=Crash", "POST", {"reason": "its loop died"})
    status, text = wait_for(lambda: (r := call(f"{url}/healthz"))[0] == 503 and r)
    assert json.loads(text) == {"status": "degraded", "down": ["interface.console"]}
    wait_for(lambda: 2.0 in manual_clock.pending())  # the restart waits out its backoff ...
    assert call(f"{url}/healthz")[0] == 503
    manual_clock.advance(2.0)  # ... on the runtime's clock
    wait_for(lambda: call(f"{url}/healthz")[0] == 200, timeout=10)


def test_credentials_in_a_configured_url_never_show(make_app: MakeApp, caplog: pytest.LogCaptureFixture) -> None:
    from conftest import free_port

    app = make_app(base_url=f"http://synth:pa55w0rd-xyz@127.0.0.1:{free_port()}/v1", admin=ADMIN,
                   llm={"max_attempts": 1})
    ask(app, "hello")
    status, text = call(f"{admin_url(app)}/deadletters")
    assert status == 200 and "llm unavailable" in text
    assert "pa55w0rd-xyz" not in text
    assert "pa55w0rd-xyz" not in call(f"{admin_url(app)}/status")[1]
    assert "pa55w0rd-xyz" in app.settings.secrets()  # it is known as a secret, so logs redact it too


def test_a_crash_that_quotes_a_secret_shows_it_redacted_in_the_status(make_app: MakeApp) -> None:
    key = "sk-live-SECRET-0123456789"
    app = make_app(admin=ADMIN, llm={"api_key": key})
    url = admin_url(app)
    code, body = call(f"{url}/inject/builder?type=Crash", "POST", {"reason": f"upstream said: bad key {key}"})
    assert code == 202, body
    assert app.runtime.wait_idle(timeout=10)
    code, body = call(f"{url}/status")
    builder = next(n for n in _walk(json.loads(body)["tree"]) if n["name"] == "builder")
    assert builder["last_failure"]["message"] == "upstream said: bad key [secret]"
    assert key not in call(f"{url}/")[1]  # the status page


def test_a_status_that_waits_holds_up_neither_health_nor_deliveries(make_app: MakeApp) -> None:
    """/status may wait on what it reports (the cluster's figures from a NATS server that is
    away, up to its timeout): it waits in a thread of its own, so /healthz answers and a
    request is delivered meanwhile, on the event loop that /status would otherwise hold."""
    import threading

    app = make_app(admin=ADMIN)
    url = admin_url(app)
    asked, answer = threading.Event(), threading.Event()

    def slow_report() -> dict[str, str]:
        asked.set()
        assert answer.wait(30)
        return {"state": "slow"}

    app.runtime.reports["slow"] = slow_report
    status: list[tuple[int, str]] = []
    reader = threading.Thread(target=lambda: status.append(call(f"{url}/status")))
    reader.start()
    try:
        assert asked.wait(10)
        assert call(f"{url}/healthz")[0] == 200
        ask(app, "run echo delivered-meanwhile")
        assert "delivered-meanwhile" in console_text(app)
        assert not status  # still waiting for its report
    finally:
        answer.set()
        reader.join(10)
    [(code, body)] = status
    assert code == 200 and json.loads(body)["reports"]["slow"] == {"state": "slow"}


def test_model_names_a_server_reports_keep_the_metrics_bounded(make_app: MakeApp, fake_llm: Any) -> None:
    """The LLM server decides the ``model`` its replies name: replies each naming another
    long model (one that tries to write a metric of its own) give at most
    LLM_MODELS_COUNTED models of short names in /metrics, the rest counted under "other",
    and every token is still counted."""
    from autoresponse.actors.limits import LLM_MODEL_NAME_CHARS, LLM_MODELS_COUNTED
    from autoresponse.testing.fake_llm import FakeResponse, completion

    answer = json.dumps({"actions": [{"type": "message_console", "payload": {"text": "ok"}}]})
    asked = [0]

    def odd_model(body: dict[str, Any]) -> FakeResponse:
        asked[0] += 1
        model = f'evil"}}\nautoresponse_fake{{x="1"}} 1\n# {asked[0]} ' + "M" * 5000
        usage = {"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13}
        return FakeResponse(raw=json.dumps(completion(answer, model=model, usage=usage)).encode())

    fake_llm.responder = odd_model
    app = make_app(base_url=fake_llm.base_url, admin=ADMIN, llm={"stream": False})
    for n in range(LLM_MODELS_COUNTED + 8):
        ask(app, f"hello {n}")
    code, text = call(f"{admin_url(app)}/metrics")
    assert code == 200
    families = {family.name: family for family in text_string_to_metric_families(text)}
    assert "autoresponse_fake" not in families  # the name is a label's value, escaped
    tokens = [s for s in families["autoresponse_llm_tokens"].samples if s.name.endswith("_total")]
    models = {s.labels["model"] for s in tokens}
    assert len(models) <= LLM_MODELS_COUNTED + 1 and "other" in models
    assert max(len(model) for model in models) <= LLM_MODEL_NAME_CHARS
    counted = {direction: sum(s.value for s in tokens if s.labels["direction"] == direction)
               for direction in ("prompt", "completion")}
    assert counted == {"prompt": 10 * asked[0], "completion": 3 * asked[0]}
