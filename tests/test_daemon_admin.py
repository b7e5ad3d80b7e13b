"""Operating a running daemon: status, inject, dead letters, root failure, secrets."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from autoresponse.actors.llm.fake_server import FakeLLMServer, FakeResponse
from autoresponse.interfaces.telegram.fake_server import FakeTelegramServer

API_KEY = "sk-live-do-not-print-0123456789"
TOKEN = "admin-secret-token-9876543210"
BOT_TOKEN = "987654:BOT-TOKEN-never-in-logs"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Daemon:
    def __init__(self, proc: subprocess.Popen[str], url: str) -> None:
        self.proc = proc
        self.url = url

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "autoresponse", *args, "--url", self.url, "--token", TOKEN],
                              capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)

    def status(self) -> dict:
        done = self.cli("status", "--json")
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)


def actors(status: dict) -> dict[str, dict]:
    def walk(nodes: list[dict]) -> list[dict]:
        return [x for n in nodes for x in [n, *walk(n["children"])]]
    return {n["name"]: n for n in walk(status["tree"])}


@contextlib.contextmanager
def daemon(tmp_path: Path, llm_url: str, **env: str) -> Iterator[Daemon]:
    port = free_port()
    environment = {k: v for k, v in os.environ.items() if not k.startswith("AUTORESPONSE_")}
    environment.update({
        "AUTORESPONSE_LLM__BASE_URL": llm_url, "AUTORESPONSE_LLM__API_KEY": API_KEY,
        "AUTORESPONSE_ADMIN__PORT": str(port), "AUTORESPONSE_ADMIN__TOKEN": TOKEN,
        "AUTORESPONSE_TERMINAL__ENABLED": "true", "AUTORESPONSE_TERMINAL__ALLOWED_COMMANDS": '["echo"]',
        "AUTORESPONSE_DATA_DIR": str(tmp_path), "AUTORESPONSE_LOG_LEVEL": "DEBUG", **env,
    })
    stderr = open(tmp_path / "stderr.log", "w+")  # noqa: SIM115 - read after the process ends
    proc = subprocess.Popen([sys.executable, "-m", "autoresponse", "run"], stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=stderr, text=True, env=environment)
    url = f"http://127.0.0.1:{port}"
    try:
        until = time.monotonic() + 30
        while True:
            request = urllib.request.Request(f"{url}/healthz", headers={"Authorization": f"Bearer {TOKEN}"})
            try:
                with urllib.request.urlopen(request, timeout=2):
                    break
            except OSError:
                assert proc.poll() is None, (tmp_path / "stderr.log").read_text()
                assert time.monotonic() < until, "the daemon did not come up"
                time.sleep(0.1)
        yield Daemon(proc, url)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        stderr.close()


def test_status_of_a_running_daemon_lists_every_actor_and_counts_injected_crashes(
    tmp_path: Path, fake_llm: FakeLLMServer
) -> None:
    with daemon(tmp_path, fake_llm.base_url) as d:
        names = set(actors(d.status()))
        assert {"root", "pipeline", "retry", "interfaces", "llm", "dispatcher", "builder",
                "executor.terminal", "sender.console", "interface.console", "retry.0"} <= names
        for actor, times in (("llm", 2), ("dispatcher", 1)):
            for _ in range(times):
                done = d.cli("inject", actor, '{"reason": "operator drill"}', "--type", "Crash")
                assert done.returncode == 0, done.stderr
        done = d.cli("inject", "interface.console", '{"text": "run echo after the drill"}')
        assert done.returncode == 0, done.stderr
        time.sleep(0.5)
        after = actors(d.status())
        assert after["llm"]["restarts"] == 2 and after["dispatcher"]["restarts"] == 1
        assert after["llm"]["last_failure"]["message"] == "operator drill"
        assert after["builder"]["restarts"] == 0
        assert after["sender.console"]["processed"] == 1  # the pipeline still delivers
        pretty = d.cli("status")
        assert pretty.returncode == 0 and "llm" in pretty.stdout and "operator drill" in pretty.stdout
        listing = d.cli("deadletters", "list", "--json")
        assert listing.returncode == 0 and json.loads(listing.stdout)["counts"] == {}
        d.proc.send_signal(signal.SIGTERM)
        assert d.proc.wait(30) == 0
    log = (tmp_path / "stderr.log").read_text()
    assert API_KEY not in log and TOKEN not in log
    assert API_KEY not in json.dumps(after)


def test_the_cli_reports_an_unreachable_or_refusing_endpoint(tmp_path: Path, fake_llm: FakeLLMServer) -> None:
    done = subprocess.run([sys.executable, "-m", "autoresponse", "status", "--url",
                           f"http://127.0.0.1:{free_port()}"], capture_output=True, text=True, timeout=30)
    assert done.returncode == 2 and "cannot reach the admin endpoint" in done.stderr
    with daemon(tmp_path, fake_llm.base_url) as d:
        refused = subprocess.run([sys.executable, "-m", "autoresponse", "status", "--url", d.url,
                                  "--token", "wrong"], capture_output=True, text=True, timeout=30)
        assert refused.returncode == 2 and "HTTP 401" in refused.stderr
        assert TOKEN not in refused.stderr


def test_the_root_giving_up_stops_the_daemon_with_one_clear_line(tmp_path: Path, fake_llm: FakeLLMServer) -> None:
    with daemon(tmp_path, fake_llm.base_url, AUTORESPONSE_SUPERVISION__MAX_RESTARTS="0") as d:
        done = d.cli("inject", "llm", '{"reason": "fatal drill"}', "--type", "Crash")
        assert done.returncode == 0, done.stderr
        assert d.proc.wait(30) == 1
    log = (tmp_path / "stderr.log").read_text()
    lines = [line for line in log.splitlines() if "root supervisor gave up" in line]
    assert len(lines) == 1
    assert "more than 0 restarts" in lines[0]


def test_a_bad_llm_in_a_daemon_leaves_a_dead_letter_that_can_be_replayed(
    tmp_path: Path, fake_llm: FakeLLMServer
) -> None:
    fake_llm.script(*[FakeResponse(content="not json") for _ in range(3)])
    with daemon(tmp_path, fake_llm.base_url, AUTORESPONSE_RETRY__BACKOFF_MIN="0.05") as d:
        d.cli("inject", "interface.console", '{"text": "hello"}')
        until = time.monotonic() + 20
        while not d.status()["dead_letters"]:
            assert time.monotonic() < until
            time.sleep(0.1)
        letters = json.loads(d.cli("deadletters", "list", "--json").stdout)["letters"]
        assert [(x["reason"], x["actor"]) for x in letters] == [("retries exhausted", "llm")]
        replay = d.cli("deadletters", "replay", str(letters[0]["id"]))
        assert replay.returncode == 0 and json.loads(replay.stdout)["attempt"] == 2
        until = time.monotonic() + 20
        while actors(d.status())["sender.console"]["processed"] < 2:  # the notice, then the reply
            assert time.monotonic() < until
            time.sleep(0.1)


def test_a_telegram_daemon_logs_no_bot_token_even_at_debug(tmp_path: Path, fake_llm: FakeLLMServer) -> None:
    with FakeTelegramServer() as telegram, daemon(
        tmp_path, fake_llm.base_url, AUTORESPONSE_TELEGRAM__TOKEN=BOT_TOKEN,
        AUTORESPONSE_TELEGRAM__BASE_URL=telegram.base_url, AUTORESPONSE_TELEGRAM__ALLOWED_USERS="[7]",
        AUTORESPONSE_TELEGRAM__POLL_TIMEOUT="1",
    ) as d:
        telegram.push_text("run echo hi", chat_id=5, user_id=7)
        until = time.monotonic() + 20
        while not telegram.sent(5):
            assert time.monotonic() < until
            time.sleep(0.1)
        status = json.dumps(d.status())
        d.proc.send_signal(signal.SIGTERM)
        assert d.proc.wait(30) == 0
    log = (tmp_path / "stderr.log").read_text()
    assert "getUpdates" in log or "sendMessage" in log or "polling Telegram" in log  # it did log its work
    for secret in (BOT_TOKEN, API_KEY, TOKEN):
        assert secret not in log and secret not in status
