"""The status page at GET /, in a real headless Chromium: live over SSE, dead letters
replayed from it, traces drawn as waterfalls; and its token and cross-site rules.

Chromium is Debian's (``apt-get install -y chromium``), driven by Playwright's Python
package; Playwright's own browser downloads are never used.

Real time: the page is a real browser process pushed to over SSE at the page's own
interval; the tests wait on what it shows, with generous timeouts, never on a runtime timer.

To refresh the README's screenshot::

    STATUS_PAGE_SCREENSHOT=docs/status-page.png .venv/bin/pytest tests/test_page.py -k screenshot
"""

from __future__ import annotations

import contextlib
import http.client
import http.server
import json
import os
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from email.message import Message
from pathlib import Path

import pytest
from conftest import ask, console_text, wait_for

from autoresponse import Application
from autoresponse.actors.kernel.deadletters import DeadLetter
from autoresponse.testing.fake_llm import FakeLLMServer, FakeResponse
from autoresponse.actors.routes import interface
from autoresponse.interfaces.console import ConsoleInput
from autoresponse.page import Rates, render_dead_letters
from autoresponse.supervisors.status import ActorStatus, Status

try:
    from playwright.sync_api import Browser, Page, sync_playwright
except ImportError:  # the fixture fails, saying how to install it
    sync_playwright = None  # type: ignore[assignment]

MakeApp = Callable[..., Application]
ADMIN = {"enabled": True, "host": "127.0.0.1", "port": 0}
TOKEN = "page-token-that-stays-secret"
CHROMIUM = "/usr/bin/chromium"
# Connections outside are refused on the test machines; these flags keep Chromium from trying.
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    """One Chromium for the module. A missing piece fails the tests, never skips them."""
    if sync_playwright is None:
        pytest.fail("the browser tests need Playwright's Python package: pip install playwright "
                    "(the test extra has it; never run `playwright install`)")
    if not Path(CHROMIUM).exists():
        pytest.fail(f"the browser tests need Chromium at {CHROMIUM}: apt-get install -y chromium")
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    """A tab in a fresh context (no cookies). It may raise no error and break no CSP rule."""
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    tab = context.new_page()
    problems: list[str] = []
    tab.on("pageerror", lambda error: problems.append(str(error)))
    tab.on("console", lambda message: problems.append(message.text) if message.type == "error" else None)
    yield tab
    context.close()
    # A 401 or 403 that a test asks for is logged as "Failed to load resource".
    assert [p for p in problems if not p.startswith("Failed to load resource")] == []


def admin_url(app: Application) -> str:
    assert app.admin is not None
    return app.admin.url


def call(url: str, method: str = "GET", headers: dict[str, str] | None = None,
         body: object = None) -> tuple[int, Message, str]:
    """Status, headers and body; redirects are not followed."""
    split = urllib.parse.urlsplit(url)
    connection = http.client.HTTPConnection(split.hostname or "", split.port, timeout=10)
    try:
        data = b"" if body is None else json.dumps(body).encode()
        connection.request(method, split.path + (f"?{split.query}" if split.query else ""),
                           body=data if method == "POST" else None, headers=headers or {})
        response = connection.getresponse()
        return response.status, response.headers, response.read().decode()
    finally:
        connection.close()


def dead_letter(app: Application) -> str:
    """Make one dead letter ("no handler"); the URL that replays it."""
    app.runtime.send("dispatcher", "junk")
    assert app.runtime.wait_idle(timeout=10)
    [letter] = app.runtime.dead_letters.letters()
    return f"{admin_url(app)}/deadletters/{letter.id}/replay"


def open_live(page: Page, url: str) -> None:
    """Open the page and wait until its event stream has pushed once."""
    page.goto(url)
    page.wait_for_function("() => document.getElementById('live').textContent.startsWith('live')",
                           timeout=10_000)


# ---------------------------------------------------------------- in the browser


def test_an_injected_crash_shows_as_a_restart_on_the_open_page(make_app: MakeApp, page: Page) -> None:
    app = make_app(admin=ADMIN)
    url = admin_url(app)
    fetched: list[str] = []
    page.on("request", lambda r: fetched.append(r.url))
    open_live(page, url)
    llm = 'tr[data-actor="llm"]'
    assert page.inner_text(f"{llm} .restarts") == "0"
    assert page.inner_text(f"{llm} .state") == "running"
    # A mark on this document: a reload would wipe it, so it still being there proves the
    # restart reached the page that was already open.
    page.evaluate("() => { window.openedBeforeTheCrash = true; }")

    status, _, body = call(f"{url}/inject/llm?type=Crash", "POST", body={"reason": "drill"})
    assert status == 202, body
    # The page updates by itself (no reload, no click). A generous wait, so a loaded machine
    # is only slower; how fast SSE and the browser redraw are is not what this proves.
    page.wait_for_function(f"() => document.querySelector('{llm} .restarts').textContent === '1'",
                           timeout=15_000)
    assert page.evaluate("() => window.openedBeforeTheCrash === true")
    assert "CrashRequested: drill" in page.inner_text(f"{llm} .failure")
    page.goto(f"{url}/#trace/{json.loads(body)['correlation_id']}")
    assert page.inner_text("#waterfall .hop.bad").startswith("llm · Crash")
    # It works offline: everything the page loaded came from the admin endpoint itself.
    assert fetched and all(u.startswith(url + "/") for u in fetched), fetched


def test_a_dead_letter_shows_and_its_replay_button_sends_it_again(
    make_app: MakeApp, fake_llm: FakeLLMServer, page: Page
) -> None:
    fake_llm.script(*[FakeResponse(content="not {json") for _ in range(3)])
    app = make_app(base_url=fake_llm.base_url, admin=ADMIN, retry={"backoff_min": 0.01})
    open_live(page, admin_url(app))
    assert page.inner_text("#deadletters") == "No dead letters."

    envelope = ask(app, "hello")
    row = page.locator("#deadletters tr[data-letter]")
    row.wait_for(timeout=10_000)  # it appears by itself
    assert "retries exhausted" in row.inner_text() and "llm" in row.inner_text()
    notices = app.runtime.cell("sender.console").processed  # the user was told

    row.locator("button[data-replay]").click()
    page.wait_for_function("() => document.getElementById('flash').textContent.includes('as attempt 2')",
                           timeout=10_000)
    # Delivered: the LLM answers this time, and the console gets the reply.
    wait_for(lambda: app.runtime.cell("sender.console").processed > notices)
    assert app.runtime.wait_idle(timeout=10)
    assert app.runtime.dead_letters.counts() == {"retries exhausted": 1}
    lines = console_text(app).splitlines()  # the request, the notice, then the reply
    assert lines[1].startswith("note ") and lines[2].startswith("bot ")

    # Its request links to its trace, replay included.
    row.locator("a.id").click()
    assert page.url.endswith(f"#trace/{envelope.correlation_id}")
    page.wait_for_selector("#waterfall .hop.ok", timeout=10_000)
    assert "llm · LLMRequest (attempt 2)" in page.inner_text("#waterfall")


def test_the_search_box_draws_a_requests_waterfall(make_app: MakeApp, page: Page) -> None:
    app = make_app(admin=ADMIN)
    correlation = ask(app, "run date").correlation_id
    open_live(page, admin_url(app))
    page.wait_for_selector(f'#requests a[href="#trace/{correlation}"]')  # listed among the recent

    page.fill("#correlation", correlation)
    page.press("#correlation", "Enter")
    page.wait_for_selector("#waterfall .hop.ok", timeout=10_000)
    hops = app.runtime.trace(correlation)
    rows = page.locator("#waterfall .hop").all_inner_texts()
    assert len(rows) == 1 + len(hops)  # the axis, then one row per hop
    assert any("executor.terminal · ActionRequest" in r for r in rows)
    assert any("sender.console · OutboundMessage" in r for r in rows)
    # One time axis: each hop's wait bar ends where its work bar begins, inside the track,
    # and the first hop starts at zero.
    bars = page.evaluate("""[...document.querySelectorAll('#waterfall .track')].map(track => {
        const t = track.getBoundingClientRect();
        return [...track.children].map(b => { const r = b.getBoundingClientRect();
                                              return [r.left - t.left, r.right - t.left, t.width]; });
    })""")
    assert len(bars) == len(hops) and bars[0][0][0] == pytest.approx(0, abs=1)
    for (wait_from, wait_to, width), (work_from, work_to, _) in bars:
        assert 0 <= wait_from <= wait_to == pytest.approx(work_from, abs=1.5) and work_to <= width + 1

    page.fill("#correlation", "no-such-request")
    page.press("#correlation", "Enter")
    page.wait_for_function("() => document.getElementById('trace-note').textContent.includes('no trace of')")
    assert page.locator("#waterfall .hop").count() == 0


def test_with_a_token_the_page_takes_it_once_and_keeps_a_cookie(make_app: MakeApp, page: Page) -> None:
    app = make_app(admin={**ADMIN, "token": TOKEN})
    url = admin_url(app)
    response = page.goto(url)
    assert response is not None and response.status == 401 and TOKEN not in page.content()

    response = page.goto(f"{url}/?token={TOKEN}")
    assert response is not None and response.status == 200
    assert page.url == f"{url}/"  # the token left the address bar
    page.wait_for_function("() => document.getElementById('live').textContent.startsWith('live')")
    [cookie] = page.context.cookies()
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict" and TOKEN not in cookie["value"]
    assert page.evaluate("document.cookie") == ""  # out of the page script's reach

    dead_letter(app)
    page.locator("#deadletters button[data-replay]").click(timeout=10_000)
    page.wait_for_function("() => document.getElementById('flash').textContent.includes('as attempt 2')")


@contextlib.contextmanager
def serving(html: str) -> Iterator[str]:
    """Another site: ``html`` at http://localhost:<port>/ (a loopback address, so that
    Chromium lets its page reach 127.0.0.1 at all), on a thread stopped on exit."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.end_headers()
            self.wfile.write(html.encode())

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, name="other-site")
    thread.start()
    try:
        yield f"http://localhost:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def test_a_page_on_another_site_cannot_make_the_browser_replay(make_app: MakeApp, page: Page) -> None:
    """The loopback default, no token: the threat is any page the operator's browser opens."""
    app = make_app(admin=ADMIN)
    replay = dead_letter(app)
    answers: list[int] = []
    page.on("response", lambda r: answers.append(r.status) if r.url == replay else None)
    attack = (f"<script>fetch({json.dumps(replay)}, {{method: 'POST', mode: 'no-cors'}})"
              ".finally(() => document.title = 'done')</script>")
    with serving(attack) as evil:
        page.goto(evil)
        page.wait_for_function("() => document.title === 'done'")
    assert answers == [403]  # it reached the endpoint, which refused it
    assert app.runtime.wait_idle(timeout=10)
    assert app.runtime.dead_letters.counts() == {"no handler": 1}  # nothing was sent again


def test_a_screenshot_of_a_busy_page(make_app: MakeApp, fake_llm: FakeLLMServer, page: Page,
                                     tmp_path: Path) -> None:
    """A restart, a dead letter, requests done and one in flight, a trace open. Saved where
    STATUS_PAGE_SCREENSHOT says (the README's is docs/status-page.png)."""
    fake_llm.script(*[FakeResponse(content="not {json") for _ in range(3)])
    app = make_app(base_url=fake_llm.base_url, admin=ADMIN, retry={"backoff_min": 0.01},
                   runtime={"drain_seconds": 0.2})
    url = admin_url(app)
    ask(app, "hello")
    shown = ask(app, "run date").correlation_id
    ask(app, "run uptime")
    call(f"{url}/inject/llm?type=Crash", "POST", body={"reason": "drill"})
    fake_llm.script(FakeResponse(hang=True))
    app.runtime.send(interface("console"), ConsoleInput(text="run df -h"))
    wait_for(lambda: app.runtime.inflight.count())
    open_live(page, f"{url}/#trace/{shown}")
    page.wait_for_selector("#waterfall .hop.ok")
    page.wait_for_function("() => document.querySelector('tr[data-actor=llm] .restarts').textContent === '1'",
                           timeout=10_000)
    # Rates need two snapshots: the page's first push has none.
    page.wait_for_function("() => document.querySelector('tr[data-actor=llm] .rate').textContent !== ''",
                           timeout=10_000)
    # As bytes: given a path, Playwright writes the file from a thread of its own that outlives the test.
    png = page.screenshot(full_page=True)
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
    wanted = os.environ.get("STATUS_PAGE_SCREENSHOT")
    if wanted:
        (REPO / wanted).write_bytes(png)


# ---------------------------------------------------------------- over plain HTTP


def test_the_token_rules(make_app: MakeApp) -> None:
    app = make_app(admin={**ADMIN, "token": TOKEN})
    url = admin_url(app)
    for path in ("/", "/events", f"/?token={TOKEN}x", "/status"):
        status, _, body = call(url + path)
        assert status == 401 and TOKEN not in body, path

    status, headers, _ = call(f"{url}/?token={TOKEN}")
    assert status == 303 and headers["Location"] == "/"
    cookie = headers["Set-Cookie"]
    assert {"HttpOnly", "SameSite=Strict", "Path=/"} <= {part.strip() for part in cookie.split(";")}
    assert TOKEN not in cookie
    session = {"Cookie": cookie.split(";")[0]}
    assert call(f"{url}/", headers=session)[0] == 200
    assert call(f"{url}/status", headers=session)[0] == 200
    name = cookie.split("=")[0]
    assert call(f"{url}/status", headers={"Cookie": f"{name}={TOKEN}"})[0] == 401

    # A replay from another site is refused, whatever credentials it carries.
    replay = dead_letter(app)
    for auth in (session, {"Authorization": f"Bearer {TOKEN}"}):
        for foreign in ({"Origin": "http://evil.example"}, {"Origin": "null"},
                        {"Sec-Fetch-Site": "cross-site"}, {"Sec-Fetch-Site": "same-site"}):
            status, _, body = call(replay, "POST", {**auth, **foreign})
            assert status == 403 and "cross-site" in body, foreign
    assert app.runtime.dead_letters.counts() == {"no handler": 1}
    # From the page's own origin it goes; so does the CLI's, which sends no Origin.
    own = {"Origin": url, "Sec-Fetch-Site": "same-origin"}
    assert call(replay, "POST", {**session, **own})[0] == 202
    assert call(replay, "POST", {"Authorization": f"Bearer {TOKEN}"})[0] == 202


def test_without_a_token_cross_site_posts_and_foreign_hosts_are_refused(make_app: MakeApp) -> None:
    app = make_app(admin=ADMIN)
    url = admin_url(app)
    port = urllib.parse.urlsplit(url).port
    assert call(f"{url}/")[0] == 200
    replay = dead_letter(app)
    assert call(replay, "POST", {"Origin": "http://evil.example"})[0] == 403
    # DNS rebinding: evil.example made to point at 127.0.0.1 is same-origin with itself.
    rebound = {"Host": f"evil.example:{port}", "Origin": f"http://evil.example:{port}"}
    assert call(f"{url}/status", headers=rebound)[0] == 403
    assert call(replay, "POST", rebound)[0] == 403
    assert app.runtime.dead_letters.counts() == {"no handler": 1}
    assert call(f"{url}/status", headers={"Host": f"localhost:{port}"})[0] == 200
    # A token given where none is set is dropped from the address bar; there is no cookie.
    status, headers, _ = call(f"{url}/?token=anything")
    assert status == 303 and headers["Location"] == "/" and "Set-Cookie" not in headers


def test_pages_that_never_read_cannot_lock_a_new_one_out(make_app: MakeApp,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Past MAX_STREAMS, the oldest stream ends (a browser's page reconnects by itself)."""
    monkeypatch.setattr("autoresponse.page.MAX_STREAMS", 2)
    app = make_app(admin=ADMIN)
    assert app.admin is not None
    split = urllib.parse.urlsplit(app.admin.url)
    opened = []
    for _ in range(3):
        connection = http.client.HTTPConnection(split.hostname or "", split.port, timeout=10)
        connection.request("GET", "/events")
        response = connection.getresponse()
        assert response.status == 200  # the newest is always let in
        opened.append((connection, response))
    oldest = opened[0][1]
    oldest.read()  # its stream has ended: read() returns instead of waiting
    wait_for(lambda: app.admin.page.listening == 2)  # type: ignore[union-attr]
    for connection, _ in opened:
        connection.close()


def test_an_event_stream_ends_with_its_client_and_with_the_server(make_app: MakeApp) -> None:
    app = make_app(admin=ADMIN)
    assert app.admin is not None
    split = urllib.parse.urlsplit(app.admin.url)

    def listen() -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
        connection = http.client.HTTPConnection(split.hostname or "", split.port, timeout=10)
        connection.request("GET", "/events")
        response = connection.getresponse()
        assert response.status == 200 and response.headers["Content-Type"] == "text/event-stream"
        return connection, response

    def push(response: http.client.HTTPResponse) -> dict[str, str]:
        while not (line := response.readline()).startswith(b"data: "):
            assert line, "the stream ended"
        return json.loads(line.removeprefix(b"data: "))

    gone, response = listen()
    assert set(push(response)) == {"summary", "tree", "requests", "deadletters"}  # all of it first
    stays, response = listen()
    push(response)
    wait_for(lambda: app.admin.page.listening == 2)  # type: ignore[union-attr]
    gone.close()
    wait_for(lambda: app.admin.page.listening == 1, timeout=5)  # type: ignore[union-attr]
    started = time.monotonic()
    push(response)  # then only what changed: the tree's rates, say
    app.stop()
    assert time.monotonic() - started < 5, "the stop waited on an open event stream"
    response.read()  # the stream has ended: read() returns instead of waiting
    stays.close()


# ---------------------------------------------------------------- the parts


def test_processed_per_second_comes_from_successive_snapshots() -> None:
    def status(at: float, processed: int) -> Status:
        llm = ActorStatus(name="llm", kind="worker", state="running", restarts=0, last_failure=None,
                          mailbox=0, processed=processed)
        return Status(time=at, tree=[llm], in_flight=0, dead_letters={}, dead_letters_total=0)

    rates = Rates(window=3)
    assert rates.update(status(10.0, 5)) == {}
    assert rates.update(status(10.5, 6)) == {"llm": 2.0}
    assert rates.update(status(11.0, 10)) == {"llm": 5.0}
    assert rates.update(status(11.5, 10)) == {"llm": 4.0}  # over the last three snapshots


def test_what_the_page_shows_is_escaped() -> None:
    letter = DeadLetter(id=7, time=0, reason="<b>bold</b>", detail="<script>alert(1)</script>", actor="llm",
                        error=None, correlation_id='"><img src=x onerror=alert(1)>', record={})
    shown = render_dead_letters([letter], {"<b>bold</b>": 1})
    assert "<script>" not in shown and "<img" not in shown and "<b>" not in shown
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in shown
