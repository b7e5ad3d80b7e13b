"""The `autoresponse` command as a user runs it: real processes, real signals."""

from __future__ import annotations

import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import urllib.parse
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from conftest import ask, console_text, default_signals, environment, free_port, wait_for

from autoresponse import Application
from autoresponse.messages import Envelope, OriginalContext, OutboundMessage
from autoresponse.testing.fake_llm import FakeLLMServer
from autoresponse.testing.fake_telegram import FakeTelegramServer


def autoresponse(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "autoresponse", *args], capture_output=True,
                          text=True, env=env or environment(), timeout=timeout, stdin=subprocess.DEVNULL)


def test_demo_answers_each_argument_in_turn() -> None:
    done = autoresponse("demo", "run uptime", "run date")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "you     #1 │ run uptime"
    assert any(line.startswith("bot    ↳#1 │ `uptime` finished") for line in lines)
    assert any(line.startswith("bot    ↳#2 │ `date` finished") for line in lines)
    # In turn: the first reply comes before the second request.
    first_reply = next(i for i, line in enumerate(lines) if "↳#1" in line)
    assert first_reply < lines.index("you     #2 │ run date")


def test_demo_without_arguments_runs_a_scripted_conversation() -> None:
    done = autoresponse("demo")
    assert done.returncode == 0, done.stderr
    assert "`df -h` finished" in done.stdout
    assert "I did not run `rm -rf /tmp/precious`: 'rm' is not on the allowlist" in done.stdout
    assert done.stdout.count("bot    ↳#") == 4


def test_demo_talks_to_any_openai_compatible_server(fake_llm: FakeLLMServer) -> None:
    env = environment(AUTORESPONSE_LLM__BASE_URL=fake_llm.base_url,
                      AUTORESPONSE_LLM__MODEL="my-model", AUTORESPONSE_LLM__API_KEY="sk-abc")
    done = autoresponse("demo", "run date", env=env)
    assert done.returncode == 0, done.stderr
    assert [r.body["model"] for r in fake_llm.requests] == ["my-model", "my-model"]
    assert fake_llm.requests[0].headers["Authorization"] == "Bearer sk-abc"
    assert "`date` finished" in done.stdout


def test_demo_fails_clearly_when_the_llm_is_unreachable() -> None:
    port = free_port()
    env = environment(AUTORESPONSE_LLM__BASE_URL=f"http://127.0.0.1:{port}/v1",
                      AUTORESPONSE_LLM__MAX_ATTEMPTS="1", AUTORESPONSE_LLM__API_KEY="sk-secret-key")
    done = autoresponse("demo", "hello", env=env)
    assert done.returncode == 1
    assert "no reply to 'hello': llm unavailable: cannot reach the LLM" in done.stderr
    assert "could not reach the language model" in done.stdout
    assert "sk-secret-key" not in done.stdout + done.stderr


def test_a_config_file_sets_the_allowlist(tmp_path: Path) -> None:
    config = tmp_path / "autoresponse.toml"
    config.write_text('[terminal]\nenabled = true\nallowed_commands = ["echo"]\n')
    done = autoresponse("demo", "--config", str(config), "run uname", "run echo from-toml")
    assert done.returncode == 0, done.stderr
    assert "I did not run `uname`: 'uname' is not on the allowlist (allowed: echo)." in done.stdout
    assert "from-toml" in done.stdout


def test_a_missing_config_file_is_a_clear_error(tmp_path: Path) -> None:
    done = autoresponse("demo", "--config", str(tmp_path / "nope.toml"))
    assert done.returncode == 2
    assert "config file not found" in done.stderr


def test_a_line_with_no_end_at_the_console_is_one_request_cut_short_and_the_last_line_counts(tmp_path: Path) -> None:
    proc = _echo_daemon(tmp_path, stderr=subprocess.DEVNULL)
    try:
        out = _lines(proc.stdout)
        assert proc.stdin is not None
        proc.stdin.write("x" * 1_000_000)  # a megabyte with no newline: once it was 15 requests
        proc.stdin.write("\nrun echo after-the-long-line\nrun echo with-no-newline-at-the-end")
        proc.stdin.close()  # the end of input: its last line counts, newline or not
        seen: list[str] = []
        # Answered apart, or together when the second came during the first's turn (a burst).
        while not all(any(word in line and not line.startswith("you") for line in seen)
                      for word in ("after-the-long-line", "with-no-newline-at-the-end")):
            seen.append(out.get(timeout=60))
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    asked = [line.split("│", 1)[0].split()[1] for line in seen if line.startswith("you")]
    assert asked == ["#1", "#2", "#3"], asked  # the long line cut to one request, then each next line


def _echo_daemon(tmp_path: Path, *, stderr: int) -> subprocess.Popen[str]:
    """``autoresponse run`` with ``echo`` allowed: requests on its stdin, replies on its stdout."""
    env = environment(AUTORESPONSE_TERMINAL__ENABLED="true", AUTORESPONSE_TERMINAL__ALLOWED_COMMANDS='["echo"]',
                      AUTORESPONSE_ADMIN__PORT=str(free_port()), AUTORESPONSE_DATA_DIR=str(tmp_path))
    return subprocess.Popen([sys.executable, "-m", "autoresponse", "run"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=stderr, text=True, env=env, preexec_fn=default_signals)


def _lines(stream) -> queue.Queue[str]:  # type: ignore[no-untyped-def]
    lines: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        for line in stream:
            lines.put(line)

    threading.Thread(target=pump, daemon=True).start()
    return lines


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_the_daemon_serves_until_signalled_then_exits_cleanly(signum: int, tmp_path: Path) -> None:
    proc = _echo_daemon(tmp_path, stderr=subprocess.PIPE)
    try:
        out = _lines(proc.stdout)
        assert proc.stdin is not None
        proc.stdin.write("run echo daemon-alive\n")
        proc.stdin.flush()
        seen = []
        while not any("↳#1" in line and "`echo daemon-alive` finished" in line for line in seen):
            seen.append(out.get(timeout=30))
        proc.send_signal(signum)
        code = proc.wait(timeout=30)
        stderr = proc.stderr.read() if proc.stderr else ""
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert code == 0, stderr
    assert "stopping: draining in-flight work" in stderr
    assert "threads still alive" not in stderr
    assert stderr.rstrip().endswith("autoresponse: stopped")


def test_the_daemon_exits_with_one_clear_line_when_it_cannot_start() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        done = autoresponse("run", env=environment(AUTORESPONSE_ADMIN__PORT=str(port)), timeout=60)
    assert done.returncode == 1
    errors = [line for line in done.stderr.splitlines() if "ERROR" in line or "WARNING" in line]
    assert len(errors) == 1, done.stderr  # nothing about the actors it stopped on its way out
    assert f"cannot start: the admin endpoint cannot listen on 127.0.0.1:{port}" in errors[0]


def test_a_telegram_token_refused_at_start_is_one_clear_line(tmp_path: Path) -> None:
    """Not "cannot reach": Telegram answered, and refused the token (which is never shown);
    and nothing the start opened is left open to be complained of on the way out."""
    token = "123456:REVOKED-s3cr3t"
    with FakeTelegramServer() as telegram:
        telegram.revoke(token)
        done = autoresponse("run", env=environment(
            AUTORESPONSE_TELEGRAM__TOKEN=token, AUTORESPONSE_TELEGRAM__BASE_URL=telegram.base_url,
            AUTORESPONSE_TELEGRAM__ALLOWED_USERS="[7]", AUTORESPONSE_CONSOLE__ENABLED="false",
            AUTORESPONSE_ADMIN__PORT="0", AUTORESPONSE_DATA_DIR=str(tmp_path)), timeout=60)
    assert done.returncode == 1
    errors = [line for line in done.stderr.splitlines() if "ERROR" in line or "WARNING" in line]
    assert len(errors) == 1, done.stderr
    assert "cannot start: Telegram refuses the bot token (getMe: Unauthorized)" in errors[0]
    assert "s3cr3t" not in done.stderr and "Unclosed" not in done.stderr


@pytest.mark.parametrize("token", [None, "", "  "])
def test_the_daemon_refuses_an_admin_bind_outside_loopback_without_a_token(token: str | None,
                                                                          tmp_path: Path) -> None:
    # A configuration error, refused before anything starts; an empty token is no token.
    env = environment(AUTORESPONSE_ADMIN__HOST="0.0.0.0", AUTORESPONSE_ADMIN__PORT=str(free_port()),
                      AUTORESPONSE_DATA_DIR=str(tmp_path / "data"),
                      **({} if token is None else {"AUTORESPONSE_ADMIN__TOKEN": token}))
    line = one_line_error(autoresponse("run", env=env))
    assert line == ("autoresponse: the admin endpoint may bind to '0.0.0.0' only with a token: "
                    "set AUTORESPONSE_ADMIN__TOKEN, or bind to 127.0.0.1")


def test_an_actor_that_cannot_set_up_stops_the_start_and_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    from autoresponse import Application, Settings
    from autoresponse.app import StartError
    from autoresponse.interfaces.console import Console, ConsoleInterface

    def broken(self: ConsoleInterface) -> None:
        raise OSError("no terminal here")

    monkeypatch.setattr(ConsoleInterface, "setup", broken)
    settings = Settings.load(admin={"enabled": False}, events={"enabled": False}, journal={"enabled": False})
    with pytest.raises(StartError, match="interface.console: OSError: no terminal here"):
        Application(settings, console=Console(io.StringIO())).start()


# ---------------------------------------------------------------- an operator's mistakes


def one_line_error(done: subprocess.CompletedProcess[str]) -> str:
    """The one line an operator's mistake ends in: exit 2, ``autoresponse: ...``, no traceback."""
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2, done.stderr
    assert len(lines) == 1 and lines[0].startswith("autoresponse: "), done.stderr
    return lines[0]


JUNK = b"this is not a journal, " * 100


def _mistake(case: str, tmp_path: Path) -> tuple[list[str], dict[str, str], list[str]]:
    """The arguments and environment of one mistake, and what its line must say."""
    config = tmp_path / "autoresponse.toml"
    data = tmp_path / "data"
    env: dict[str, str] = {}
    args: list[str] = []
    if case == "toml does not parse":
        config.write_text('[terminal]\nenabled = true\nallowed_commands = ["df" "uptime"]\n')
        args, expected = ["--config", str(config)], [str(config), "not valid TOML", "(at line 3, column 26)"]
    elif case == "list variable not json":
        env["AUTORESPONSE_TERMINAL__ALLOWED_COMMANDS"] = "notjson"
        expected = ["AUTORESPONSE_TERMINAL__ALLOWED_COMMANDS: expected a JSON list"]
    elif case == "variable not an integer":
        env["AUTORESPONSE_ADMIN__PORT"] = "abc"
        expected = ["AUTORESPONSE_ADMIN__PORT is 'abc': should be a valid integer"]
    elif case == "file value not an integer":
        config.write_text('[runtime]\nmax_hops = "many"\n')
        args = ["--config", str(config)]
        expected = [f"{config}: [runtime] max_hops is 'many': should be a valid integer"]
    elif case == "core not a number":
        config.write_text('[runtime]\ncpu_core = "first"\n')
        args = ["--config", str(config)]
        expected = [f"{config}: [runtime] cpu_core is 'first': should be auto, off or the number of a core"]
    elif case == "log level no one knows":
        env["AUTORESPONSE_LOG_LEVEL"] = "verbose"
        expected = ["AUTORESPONSE_LOG_LEVEL is 'verbose': should be 'DEBUG', 'INFO', 'WARNING', 'ERROR' "
                    "or 'CRITICAL'"]
    elif case == "unknown variable":
        env["AUTORESPONSE_TERMINAL__ENABELD"] = "true"
        expected = ["is not a setting (did you mean AUTORESPONSE_TERMINAL__ENABLED?)"]
    elif case == "unknown key in the file":
        config.write_text("[terminal]\nenabeld = true\n")
        args, expected = ["--config", str(config)], ["unknown key [terminal] enabeld (did you mean enabled?)"]
    elif case == "unknown section in the file":
        config.write_text('[telegarm]\ntoken = "123:abc"\n')
        args, expected = ["--config", str(config)], ["unknown section [telegarm] (did you mean [telegram]?)"]
    elif case == "data dir is a file":
        data.write_text("")
        expected = [f"the data directory {data}", "cannot be used: it is a file"]
    elif case == "corrupt journal":
        data.mkdir()
        (data / "journal.sqlite3").write_bytes(JUNK)
        journal = data / "journal.sqlite3"
        expected = [f"the journal {journal} cannot be read (file is not a database)",
                    "Check it with `autoresponse journal check`",
                    f"move it aside: mv {journal} {journal}.corrupt"]
    else:
        raise AssertionError(case)
    env.setdefault("AUTORESPONSE_ADMIN__PORT", str(free_port()))
    env["AUTORESPONSE_DATA_DIR"] = str(data)
    return args, environment(**env), expected


MISTAKES = ["toml does not parse", "list variable not json", "variable not an integer",
            "file value not an integer", "core not a number", "log level no one knows", "unknown variable",
            "unknown key in the file", "unknown section in the file", "data dir is a file", "corrupt journal"]


@pytest.mark.parametrize("command", ["run", "demo"])
@pytest.mark.parametrize("case", MISTAKES)
def test_an_operators_mistake_is_one_line_and_exit_2(command: str, case: str, tmp_path: Path) -> None:
    args, env, expected = _mistake(case, tmp_path)
    line = one_line_error(autoresponse(command, *args, env=env))
    for fragment in expected:
        assert fragment in line
    if case == "corrupt journal":  # kept as it was, never replaced
        assert (tmp_path / "data" / "journal.sqlite3").read_bytes() == JUNK


def test_the_admin_commands_report_bad_settings_in_one_line() -> None:
    env = environment(AUTORESPONSE_ADMIN__PROT="9000")
    line = one_line_error(autoresponse("status", env=env))
    assert "AUTORESPONSE_ADMIN__PROT is not a setting (did you mean AUTORESPONSE_ADMIN__PORT?)" in line


@pytest.fixture
def not_the_admin() -> Iterator[tuple[str, list[str]]]:
    """A server on 127.0.0.1 that is not the admin endpoint: HTML for /status, JSON of
    another shape for the rest; and the paths asked for, as sent."""
    import http.server

    asked: list[str] = []

    class Answer(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            asked.append(self.path)
            body = b"<html>\nnot the admin endpoint\n</html>" if self.path == "/status" else b'{"ok": true}'
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_POST = do_GET

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Answer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", asked
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize(("command", "expected"), [
    (["status"], "/status: the answer is not JSON; is this the admin endpoint?"),
    (["deadletters", "list"], "the answer to GET /deadletters is not what the admin endpoint sends"),
    (["trace", "some-id"], "the answer to GET /trace/some-id is not what the admin endpoint sends"),
], ids=["status", "deadletters", "trace"])
def test_an_answer_that_is_not_the_admin_endpoints_is_one_line(not_the_admin: tuple[str, list[str]],
                                                               command: list[str], expected: str) -> None:
    url, _ = not_the_admin
    line = one_line_error(autoresponse(*command, "--url", url))
    assert expected in line


def test_what_the_daemon_reports_is_printed_as_text_never_as_markup(make_app: Callable[..., Application]) -> None:
    """A dead letter's detail quoting "[/tmp/report]" (a path, a user's words) crashed Rich's
    markup reader; one quoting "[red]" lost that text."""
    app = make_app(admin={"enabled": True, "host": "127.0.0.1", "port": 0})
    assert app.admin is not None
    message = OutboundMessage.reply(OriginalContext(chat_id=1, interface_name="console"), "hi")
    app.runtime.dead_letters.post(Envelope("m1", "c-1", message), "bad request", actor="sender.console",
                                  detail="cannot open [/tmp/report] for [red]you[/red]")
    done = autoresponse("deadletters", "list", "--url", app.admin.url)
    assert done.returncode == 0, done.stderr
    assert "[/tmp/report]" in done.stdout and "[red]you" in done.stdout


def test_inject_sends_the_actor_and_the_type_as_given(not_the_admin: tuple[str, list[str]]) -> None:
    url, asked = not_the_admin
    done = autoresponse("inject", "interface console", '{"text": "x"}', "--type", "A&b=c#d", "--url", url)
    assert done.returncode == 0, done.stderr
    [path] = asked
    parts = urllib.parse.urlsplit(path)
    assert urllib.parse.unquote(parts.path) == "/inject/interface console"
    assert urllib.parse.parse_qs(parts.query) == {"type": ["A&b=c#d"]}


def test_the_admin_commands_read_bytes_that_are_no_utf_8_as_text(not_the_admin: tuple[str, list[str]]) -> None:
    """Python keeps an argument's undecodable bytes as lone surrogates, which no URL can hold:
    ``trace`` and ``inject`` ended with a UnicodeEncodeError's traceback."""
    url, asked = not_the_admin
    traced = subprocess.run([sys.executable, "-m", "autoresponse", "trace", b"c-\xff", "--url", url],
                            capture_output=True, timeout=60, stdin=subprocess.DEVNULL, env=environment())
    err = traced.stderr.decode(errors="replace")
    assert "Traceback" not in err, err
    assert err.splitlines() == ["autoresponse: the answer to GET /trace/c-\ufffd is not what the admin endpoint "
                                "sends (KeyError: 'hops'); is this the admin endpoint?"]
    injected = subprocess.run([sys.executable, "-m", "autoresponse", "inject", b"interface.console\xff",
                               b'{"text": "caf\xe9"}', "--type", b"Console\xfeInput", "--url", url],
                              capture_output=True, timeout=60, stdin=subprocess.DEVNULL, env=environment())
    assert injected.returncode == 0, injected.stderr.decode(errors="replace")
    assert asked == ["/trace/c-%EF%BF%BD", "/inject/interface.console%EF%BF%BD?type=Console%EF%BF%BDInput"]


def test_inject_reads_a_message_with_bytes_that_are_no_utf_8_as_text(make_app: Callable[..., Application]) -> None:
    """The daemon refused such a message (its journal cannot store lone surrogates): it is
    taken, with each undecodable byte read as U+FFFD, as the console reads a line."""
    app = make_app(admin={"enabled": True, "host": "127.0.0.1", "port": 0})
    assert app.admin is not None
    done = subprocess.run([sys.executable, "-m", "autoresponse", "inject", "interface.console",
                           b'{"text": "run echo caf\xe9"}', "--url", app.admin.url],
                          capture_output=True, timeout=60, stdin=subprocess.DEVNULL, env=environment())
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    wait_for(lambda: "`echo caf\ufffd` finished" in console_text(app))


@pytest.mark.parametrize("message", ["[" * 1_000 + "]" * 1_000, "[" * 100_000], ids=["closed", "unclosed"])
def test_inject_of_a_message_nested_past_the_parser_is_one_line(message: str) -> None:
    line = one_line_error(autoresponse("inject", "interface.console", message,
                                       "--url", f"http://127.0.0.1:{free_port()}"))
    assert line == "autoresponse: the message nests lists or objects too deeply to be read as JSON"


@pytest.mark.parametrize("command", [["status"], ["inject", "interface.console", "{}"]])
def test_an_admin_url_that_does_not_parse_is_one_line(command: list[str]) -> None:
    line = one_line_error(autoresponse(*command, "--url", "http://[::1"))
    assert line.startswith("autoresponse: cannot reach the admin endpoint at http://[::1/")
    assert line.endswith(": Invalid IPv6 URL")


@pytest.fixture
def recording_proxy() -> Iterator[tuple[dict[str, str], list[str]]]:
    """An HTTP proxy on 127.0.0.1 that answers everything 502 and keeps what reaches it
    (each request line and its headers); and the environment that sends requests through it."""
    import http.server

    seen: list[str] = []

    class Proxy(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(f"{self.requestline} {dict(self.headers)}")
            self.send_response(502)
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_POST = do_CONNECT = do_GET

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Proxy)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield environment(http_proxy=url, HTTP_PROXY=url, no_proxy="", NO_PROXY=""), seen
    finally:
        server.shutdown()
        server.server_close()


def test_the_admin_commands_never_go_through_a_proxy(make_app: Callable[..., Application],
                                                     recording_proxy: tuple[dict[str, str], list[str]]) -> None:
    """With ``http_proxy`` set, every admin command went to the proxy, the admin token in its
    Authorization header, and failed with "HTTP 502:"."""
    token = "admin-token-for-the-daemon-alone"
    app = make_app(admin={"enabled": True, "host": "127.0.0.1", "port": 0, "token": token})
    assert app.admin is not None
    env, seen = recording_proxy
    done = autoresponse("status", "--url", app.admin.url, "--token", token, env=env)
    assert done.returncode == 0, done.stderr
    assert "interface.console" in done.stdout
    injected = autoresponse("inject", "interface.console", '{"text": "run echo direct"}', "--url", app.admin.url,
                            "--token", token, env=env)
    assert injected.returncode == 0, injected.stderr
    wait_for(lambda: "`echo direct` finished" in console_text(app))
    assert seen == []


def test_an_admin_url_without_a_scheme_is_taken_as_http(make_app: Callable[..., Application]) -> None:
    app = make_app(admin={"enabled": True, "host": "127.0.0.1", "port": 0})
    assert app.admin is not None
    done = autoresponse("status", "--url", f"127.0.0.1:{app.admin.port}")  # once "unknown url type"
    assert done.returncode == 0, done.stderr
    assert "interface.console" in done.stdout


def test_a_secret_is_never_printed_in_an_error(tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text("[telegram]\ntoken = 123456789\n")
    line = one_line_error(autoresponse("demo", "--config", str(config)))
    assert "[telegram] token (a secret, not shown)" in line and "123456789" not in line


@pytest.mark.parametrize("key", ["MODEL", "API_KEY"])
def test_a_variable_for_one_item_of_a_list_says_the_list_is_set_whole(key: str,
                                                                      tmp_path: Path) -> None:
    """Not "the setting llm.fallbacks: should be a valid list": the variable the operator set,
    and how a list is set; never its value, which may be the fallback's key."""
    value = "sk-fallback-s3cr3t"
    env = environment(**{f"AUTORESPONSE_LLM__FALLBACKS__0__{key}": value},
                      AUTORESPONSE_DATA_DIR=str(tmp_path / "data"),
                      AUTORESPONSE_ADMIN__PORT=str(free_port()))
    done = autoresponse("run", env=env)
    assert one_line_error(done) == (
        f"autoresponse: AUTORESPONSE_LLM__FALLBACKS__0__{key} is not a setting: a list is set "
        "whole, as JSON, in AUTORESPONSE_LLM__FALLBACKS (or [llm] fallbacks in the TOML file)")
    assert value not in done.stderr + done.stdout


_NO_TOKEN = ("Telegram needs a bot token too: set AUTORESPONSE_TELEGRAM__TOKEN ([telegram] token) "
             "to the token @BotFather gave the bot")


@pytest.mark.parametrize("token", ["", "   "], ids=["empty", "spaces"])
def test_a_bot_token_of_spaces_is_no_token_as_an_empty_one_is(token: str, tmp_path: Path) -> None:
    """With whom the bot answers set, a blank token is the settings error naming the token's
    variable, before anything starts: not a bot started with it, which Telegram refuses."""
    with FakeTelegramServer() as telegram:
        telegram.revoke(token)  # as Telegram refuses a token that is no token
        done = autoresponse("run", env=environment(
            AUTORESPONSE_TELEGRAM__TOKEN=token, AUTORESPONSE_TELEGRAM__BASE_URL=telegram.base_url,
            AUTORESPONSE_TELEGRAM__ALLOWED_USERS="[7]", AUTORESPONSE_CONSOLE__ENABLED="false",
            AUTORESPONSE_ADMIN__PORT=str(free_port()),
            AUTORESPONSE_DATA_DIR=str(tmp_path / "data")))
        line = one_line_error(done)
        assert line == f"autoresponse: AUTORESPONSE_TELEGRAM__ALLOWED_USERS: {_NO_TOKEN}"
        assert telegram.calls == []  # Telegram was never asked


def test_a_webhook_set_without_a_token_is_a_settings_error(tmp_path: Path) -> None:
    """Not a daemon that starts healthy with Telegram quietly off: one line naming the missing
    token as a variable and a file key, and never the webhook's secret."""
    secret = "webhook-s3cr3t-0123456789"
    env = environment(AUTORESPONSE_TELEGRAM__WEBHOOK_URL="https://bot.example.com/telegram",
                      AUTORESPONSE_TELEGRAM__WEBHOOK_SECRET=secret,
                      AUTORESPONSE_CONSOLE__ENABLED="false",
                      AUTORESPONSE_ADMIN__PORT=str(free_port()),
                      AUTORESPONSE_DATA_DIR=str(tmp_path / "data"))
    done = autoresponse("config", "show", env=env)
    assert one_line_error(done) == ("autoresponse: AUTORESPONSE_TELEGRAM__WEBHOOK_URL is "
                                    f"'https://bot.example.com/telegram': {_NO_TOKEN}")
    assert secret not in done.stderr
    config = tmp_path / "autoresponse.toml"
    config.write_text(f'[telegram]\nwebhook_secret = "{secret}"\n')  # the secret alone, in the file
    done = autoresponse("run", "--config", str(config), env=environment(
        AUTORESPONSE_CONSOLE__ENABLED="false", AUTORESPONSE_ADMIN__PORT=str(free_port()),
        AUTORESPONSE_DATA_DIR=str(tmp_path / "data")))
    assert one_line_error(done) == f"autoresponse: {config}: [telegram] webhook_secret: {_NO_TOKEN}"
    assert secret not in done.stderr


def test_journal_check(tmp_path: Path) -> None:
    from autoresponse.actors.journal import SqliteJournal

    journal = tmp_path / "data" / "journal.sqlite3"
    env = environment(AUTORESPONSE_DATA_DIR=str(tmp_path / "data"))
    done = autoresponse("journal", "check", env=env)
    assert (done.returncode, done.stdout) == (0, f"no journal at {journal}\n"), done.stderr

    SqliteJournal(journal).close()
    done = autoresponse("journal", "check", env=env)
    assert (done.returncode, done.stdout) == (0, f"ok: {journal}\n"), done.stderr

    journal.write_bytes(JUNK)
    done = autoresponse("journal", "check", env=env)
    assert done.returncode == 1, done.stderr
    assert f"{journal}: file is not a database" in done.stdout
    assert f"move it aside: mv {journal} {journal}.corrupt" in done.stdout
    assert journal.read_bytes() == JUNK


def test_journal_check_of_a_journal_the_storage_fails_never_says_move_it_aside(tmp_path: Path) -> None:
    """The check cannot read the journal for a reason of the storage's (here: a directory
    where its write-ahead log should be; a full disk, an I/O error alike): it says so, and
    does not advise moving it aside, which would abandon every request it holds. A journal
    that is a directory is named so, as ``run`` names it."""
    from autoresponse.actors.journal import SqliteJournal

    journal = tmp_path / "data" / "journal.sqlite3"
    env = environment(AUTORESPONSE_DATA_DIR=str(tmp_path / "data"))
    SqliteJournal(journal).close()
    Path(f"{journal}-wal").mkdir()
    done = autoresponse("journal", "check", env=env)
    assert done.returncode == 1, done.stderr
    assert done.stdout.startswith(f"the journal {journal} cannot be used (checking it): SQLITE_"), done.stdout
    assert "it is not corrupt" in done.stdout and "aside" not in done.stdout

    elsewhere = tmp_path / "elsewhere" / "journal.sqlite3"
    elsewhere.mkdir(parents=True)
    done = autoresponse("journal", "check", env=environment(AUTORESPONSE_DATA_DIR=str(tmp_path / "elsewhere")))
    assert one_line_error(done) == f"autoresponse: the journal {elsewhere} cannot be used: it is a directory"


def test_journal_check_reads_the_path_from_the_config_file(tmp_path: Path) -> None:
    journal = tmp_path / "elsewhere" / "j.sqlite3"
    config = tmp_path / "c.toml"
    config.write_text(f'[journal]\npath = "{journal}"\n')
    done = autoresponse("journal", "check", "--config", str(config))
    assert (done.returncode, done.stdout) == (0, f"no journal at {journal}\n"), done.stderr


# ---------------------------------------------------------------- settings no one can mean, stores that cannot be read


@pytest.mark.parametrize(("variable", "value", "expected"), [
    ("AUTORESPONSE_RUNTIME__DRAIN_SECONDS", "inf", "is inf: should be a finite number"),
    ("AUTORESPONSE_RUNTIME__DRAIN_SECONDS", "1e300", "is 1e+300: should be less than or equal to "),
    ("AUTORESPONSE_EVENTS__CHECK_SECONDS", "inf", "is inf: should be a finite number"),
    ("AUTORESPONSE_RETRY__BACKOFF_MAX", "inf", "is inf: should be a finite number"),
    ("AUTORESPONSE_LLM__TEMPERATURE", "nan", "is nan: should be a finite number"),
    ("AUTORESPONSE_EVENTS__RETRY_MIN", "nan", "should be greater than or equal to 0"),
    ("AUTORESPONSE_MEMORY__MAX_TOKENS", "0", "is '0': should be greater than or equal to 1"),
    ("AUTORESPONSE_RETRY__POOL_SIZE", "65", "is '65': should be less than or equal to 64"),
])
def test_a_number_no_one_can_mean_is_refused_before_the_start(variable: str, value: str, expected: str,
                                                              tmp_path: Path) -> None:
    env = environment(**{variable: value}, AUTORESPONSE_ADMIN__PORT=str(free_port()),
                      AUTORESPONSE_DATA_DIR=str(tmp_path / "data"))
    line = one_line_error(autoresponse("run", env=env))
    assert line.startswith(f"autoresponse: {variable} ") and expected in line
    assert not (tmp_path / "data" / "journal.sqlite3").exists()  # refused before anything started


@pytest.mark.parametrize("command", ["run", "demo"])
def test_an_llm_base_url_that_is_no_url_is_a_settings_error(command: str) -> None:
    env = environment(AUTORESPONSE_LLM__BASE_URL="not a url", AUTORESPONSE_ADMIN__PORT=str(free_port()))
    line = one_line_error(autoresponse(command, env=env))
    assert line == ("autoresponse: AUTORESPONSE_LLM__BASE_URL is 'not a url': should be an http:// or "
                    "https:// URL with a host, e.g. http://127.0.0.1:11434/v1")


def test_an_llm_base_url_with_a_query_is_refused_without_showing_it(tmp_path: Path) -> None:
    env = environment(AUTORESPONSE_LLM__BASE_URL="http://127.0.0.1:1/v1?api-version=1&key=QUERYSECRET",
                      AUTORESPONSE_ADMIN__PORT=str(free_port()), AUTORESPONSE_DATA_DIR=str(tmp_path / "data"))
    done = autoresponse("run", env=env)
    line = one_line_error(done)
    assert line == ("autoresponse: AUTORESPONSE_LLM__BASE_URL is 'http://127.0.0.1:1/v1?...': should have no "
                    "query or fragment (? or #): the API's path is added to its end (a key goes in an "
                    "api_key setting)")
    assert "QUERYSECRET" not in done.stdout + done.stderr
    assert not (tmp_path / "data" / "journal.sqlite3").exists()  # refused before anything started


def test_an_llm_base_url_that_does_not_parse_never_shows_its_password() -> None:
    env = environment(AUTORESPONSE_LLM__BASE_URL="http://admin:hunter22@[::1",
                      AUTORESPONSE_ADMIN__PORT=str(free_port()))
    done = autoresponse("run", env=env)
    line = one_line_error(done)
    assert line.startswith("autoresponse: AUTORESPONSE_LLM__BASE_URL is 'http://[secret]@[::1': "
                           "should be an http")
    assert "hunter22" not in done.stdout + done.stderr


def test_a_directory_given_as_the_config_file_is_named_as_one(tmp_path: Path) -> None:
    line = one_line_error(autoresponse("run", "--config", str(tmp_path)))
    assert line == f"autoresponse: the config file {tmp_path} is a directory; give a TOML file"


def test_an_empty_data_dir_is_refused_not_the_current_directory(tmp_path: Path) -> None:
    env = environment(AUTORESPONSE_DATA_DIR="", AUTORESPONSE_ADMIN__PORT=str(free_port()))
    done = subprocess.run([sys.executable, "-m", "autoresponse", "run"], capture_output=True, text=True,
                          env=env, cwd=tmp_path, timeout=60, stdin=subprocess.DEVNULL, check=False)
    line = one_line_error(done)
    assert line == ("autoresponse: AUTORESPONSE_DATA_DIR is '': should be a path, not empty (that would be "
                    "the current directory)")
    assert list(tmp_path.iterdir()) == []  # no database written where the command was started


STORES = {"memory": "conversation memory", "events": "reminder store"}


@pytest.mark.parametrize(("command", "store"), [("run", "memory"), ("run", "events"), ("demo", "memory"),
                                              ("demo", "events"), ("history", "memory")])
@pytest.mark.parametrize("damage", ["corrupt", "a directory"])
def test_a_store_that_cannot_be_read_is_one_line_that_says_how_to_move_it_aside(
    command: str, store: str, damage: str, tmp_path: Path
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    path = data / f"{store}.sqlite3"
    if damage == "corrupt":
        path.write_bytes(JUNK)
    else:
        path.mkdir()
    env = environment(AUTORESPONSE_DATA_DIR=str(data), AUTORESPONSE_ADMIN__PORT=str(free_port()))
    line = one_line_error(autoresponse(command, env=env))
    why = "file is not a database" if damage == "corrupt" else "it is a directory"
    assert line == (f"autoresponse: the {STORES[store]} {path} cannot be read ({why}); it was left as it is. "
                    f"To start with an empty {STORES[store]}, move it aside: mv {path} {path}.corrupt")
    if damage == "corrupt":  # kept as it was, never replaced
        assert path.read_bytes() == JUNK


@pytest.mark.parametrize("command", ["run", "demo"])
def test_a_directory_where_the_journal_goes_is_one_line(command: str, tmp_path: Path) -> None:
    journal = tmp_path / "data" / "journal.sqlite3"
    journal.mkdir(parents=True)
    env = environment(AUTORESPONSE_DATA_DIR=str(tmp_path / "data"),
                      AUTORESPONSE_ADMIN__PORT=str(free_port()))
    line = one_line_error(autoresponse(command, env=env))
    assert line == f"autoresponse: the journal {journal} cannot be used: it is a directory"


def _has_loaded(pid: int, library: str) -> bool:
    try:
        return library in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


#: A Ctrl-C that lands inside a weakref's callback while the command loads (Python calls an
#: import lock's, say): what the handler raises there is dropped by Python, not passed on.
_CTRL_C_IN_A_CALLBACK = """
import os, signal, sys, weakref

class Dropped:
    pass

def callback(_: object) -> None:
    os.kill(os.getpid(), signal.SIGINT)
    for _ in range(10_000):  # the handler runs among these
        pass

class WhileLoading:
    def find_spec(self, name, path=None, target=None):
        if name == "argparse":  # the first import after the command's handler is in place
            sys.meta_path.remove(self)
            dropped = Dropped()
            ref = weakref.ref(dropped, callback)
            del dropped
        return None

sys.meta_path.insert(0, WhileLoading())
sys.argv = ["autoresponse", "config", "show"]
from autoresponse.cli import main
sys.exit(main())
"""


def test_a_ctrl_c_python_drops_while_the_command_loads_still_ends_it_with_one_line(tmp_path: Path) -> None:
    """In CI a Ctrl-C 0.2 s into loading once landed in such a callback: the daemon went on
    to start and serve, under a traceback, and the test's Ctrl-C was never obeyed."""
    done = subprocess.run([sys.executable, "-c", _CTRL_C_IN_A_CALLBACK], capture_output=True, text=True,
                          timeout=60, env=environment(AUTORESPONSE_DATA_DIR=str(tmp_path)),
                          preexec_fn=default_signals)
    assert done.returncode == 130, done.stderr
    assert done.stderr.splitlines() == ["autoresponse: interrupted"]
    assert done.stdout == ""  # the command never ran


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="needs /proc to see how far the start got")
@pytest.mark.parametrize("later", [0.0, 0.2, 0.5])
def test_a_ctrl_c_while_the_daemon_starts_stops_it_without_a_traceback(later: float, tmp_path: Path) -> None:
    import time

    env = environment(AUTORESPONSE_ADMIN__PORT=str(free_port()), AUTORESPONSE_DATA_DIR=str(tmp_path))
    proc = subprocess.Popen([sys.executable, "-m", "autoresponse", "run"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            preexec_fn=default_signals)
    try:
        # pydantic's core is loaded early in the modules' loading, which takes most of the first second.
        until = time.monotonic() + 30
        while not _has_loaded(proc.pid, "_pydantic_core") and time.monotonic() < until:
            time.sleep(0.002)
        time.sleep(later)
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "Traceback" not in stderr, stderr
    assert proc.returncode in (0, 130), stderr
    if proc.returncode == 130:  # before the daemon handles signals itself: one line
        assert stderr.splitlines() == ["autoresponse: interrupted"]
    else:  # after: the usual clean stop
        assert stderr.rstrip().endswith("autoresponse: stopped")


def test_output_to_a_reader_that_left_ends_quietly() -> None:
    """``autoresponse config show --json | head -c 10``: the reader is gone before the rest is
    written; the command ends with the shell's code for it, not a traceback."""
    read, write = os.pipe()
    os.close(read)  # the reader left before a byte was written: every write fails
    try:
        done = subprocess.run([sys.executable, "-m", "autoresponse", "config", "show", "--json"],
                              stdout=write, stderr=subprocess.PIPE, env=environment(), timeout=60)
    finally:
        os.close(write)
    assert b"Traceback" not in done.stderr and b"Exception ignored" not in done.stderr, done.stderr
    assert done.returncode == 141


def test_history_json_without_a_chat_lists_the_chats_as_json(tmp_path: Path) -> None:
    env = environment(AUTORESPONSE_DATA_DIR=str(tmp_path / "data"))
    done = autoresponse("history", "--demo", "--json", env=env)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == []  # no memory yet: still JSON
    assert autoresponse("demo", "run date", env=env).returncode == 0
    done = autoresponse("history", "--demo", "--json", env=env)  # once plain text
    assert done.returncode == 0, done.stderr
    [chat] = json.loads(done.stdout)
    assert chat["chat"].startswith("console:") and chat["entries"] > 0


@pytest.mark.parametrize("command", [["demo", "run date"], ["replay", "session.jsonl"]])
@pytest.mark.parametrize("timeout", ["0", "-1", "nan"])
def test_a_timeout_of_no_time_is_refused_before_anything_runs(command: list[str], timeout: str) -> None:
    # `demo --timeout -1` answered the request, then said it had no answer "within -1s".
    done = autoresponse(*command, "--timeout", timeout)
    assert done.returncode == 2 and done.stdout == "", done.stdout
    assert done.stderr.splitlines()[-1] == (f"autoresponse {command[0]}: error: argument --timeout: "
                                            f"must be a finite number of seconds above 0, not {timeout}")


def _column(table: str, index: int) -> list[str]:
    """One column of a Rich table as printed, each row's cell whole again (a cell folded
    onto more lines joined): rows start where the first column has something."""
    rows: list[str] = []
    for line in table.splitlines():
        cells = line.split("│")[1:-1]
        if len(cells) < 7:
            continue  # the title, the rules, the header
        if cells[0].strip():
            rows.append("")
        rows[-1] += cells[index].strip()
    return rows


def test_trace_at_80_columns_folds_the_names_never_cuts_them(make_app: Callable[..., Application]) -> None:
    app = make_app(admin={"enabled": True, "host": "127.0.0.1", "port": 0})
    assert app.admin is not None
    correlation = ask(app, "run date").correlation_id
    narrow = environment(COLUMNS="80")
    hops = json.loads(autoresponse("trace", correlation, "--json", "--url", app.admin.url, env=narrow).stdout)["hops"]
    done = autoresponse("trace", correlation, "--url", app.admin.url, env=narrow)
    assert done.returncode == 0, done.stderr
    assert max(len(line) for line in done.stdout.splitlines()) <= 80
    assert "…" not in done.stdout  # "conversati…" for both conversations and conversations.3
    assert _column(done.stdout, 1) == [hop["actor"] for hop in hops]
    assert _column(done.stdout, 2) == [hop["type"] for hop in hops]
    assert {"conversations", "interface.console"} <= {hop["actor"] for hop in hops}
    assert any(hop["actor"].startswith("conversations.") for hop in hops)


def test_help_names_every_command_in_plain_text() -> None:
    done = autoresponse("--help")
    assert done.returncode == 0, done.stderr
    summary = done.stdout.split("\n\n")[1]  # after the usage, before the arguments
    assert "``" not in summary  # reST's literal marks, once shown as they are
    for command in ("run", "record", "replay", "demo", "history", "journal check", "config show", "status",
                    "inject", "trace", "deadletters"):
        assert command in " ".join(summary.split()), command
    run = autoresponse("run", "--help")
    assert "Serve until SIGTERM or SIGINT" in run.stdout  # once the usage and the options alone
