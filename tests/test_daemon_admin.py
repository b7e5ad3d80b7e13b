"""Operating a running daemon: status, inject, dead letters, root failure, secrets.

Real time: the daemon runs as a real subprocess, reached over its admin endpoint, so these
tests poll what it reports, with generous timeouts; no ManualClock can reach into it."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from conftest import Daemon, actors, free_port

from autoresponse.testing.fake_llm import FakeLLMServer, FakeResponse
from autoresponse.testing.fake_telegram import FakeTelegramServer

API_KEY = "sk-live-do-not-print-0123456789"
TOKEN = "admin-secret-token-9876543210"
BOT_TOKEN = "987654:BOT-TOKEN-never-in-logs"


def daemon(tmp_path: Path, llm_url: str, **env: str) -> Daemon:
    """A daemon at DEBUG with an API key, an admin token and an echo allowlist."""
    return Daemon(tmp_path, token=TOKEN, AUTORESPONSE_LLM__BASE_URL=llm_url, AUTORESPONSE_LLM__API_KEY=API_KEY,
                  AUTORESPONSE_TERMINAL__ENABLED="true", AUTORESPONSE_TERMINAL__ALLOWED_COMMANDS='["echo"]',
                  AUTORESPONSE_LOG_LEVEL="DEBUG", **env)


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
        until = time.monotonic() + 20  # the request goes through the whole pipeline first
        while actors(d.status())["sender.console"]["processed"] < 1:
            assert time.monotonic() < until, "the injected request was not delivered"
            time.sleep(0.1)
        after = actors(d.status())
        assert after["llm"]["restarts"] == 2 and after["dispatcher"]["restarts"] == 1
        assert after["llm"]["last_failure"]["message"] == "operator drill"
        assert after["builder"]["restarts"] == 0
        assert after["sender.console"]["processed"] == 1  # the pipeline still delivers
        pretty = d.cli("status")
        assert pretty.returncode == 0 and "llm" in pretty.stdout and "operator drill" in pretty.stdout
        listing = d.cli("deadletters", "list", "--json")
        assert listing.returncode == 0 and json.loads(listing.stdout)["counts"] == {}
        assert d.stop() == 0
    log = d.log()
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


def test_an_inject_to_a_supervisor_is_refused_and_the_daemon_serves_on(tmp_path: Path,
                                                                       fake_llm: FakeLLMServer) -> None:
    # `inject root '{}'` fit StartChild and stopped the whole daemon; a forged Exit left
    # /healthz at 503 for good.
    with daemon(tmp_path, fake_llm.base_url) as d:
        for args in (("root", "{}"), ("root", '{"text": "hello"}'),
                     ("pipeline", '{"name": "llm", "abnormal": true}', "--type", "Exit")):
            done = d.cli("inject", *args)
            assert done.returncode == 2, done.stdout
            assert "HTTP 400" in done.stderr and "Crash" in done.stderr
        time.sleep(1)  # what a refused inject would have set off
        assert d.proc is not None and d.proc.poll() is None, d.log()
        healthz = urllib.request.Request(f"{d.url}/healthz", headers={"Authorization": f"Bearer {TOKEN}"})
        with urllib.request.urlopen(healthz, timeout=10) as answer:  # a 503 raises
            assert json.loads(answer.read()) == {"status": "ok"}
        done = d.cli("inject", "interface.console", '{"text": "run echo still serving"}')
        assert done.returncode == 0, done.stderr
        assert d.stop() == 0


def test_the_root_giving_up_stops_the_daemon_with_one_clear_line(tmp_path: Path, fake_llm: FakeLLMServer) -> None:
    with daemon(tmp_path, fake_llm.base_url, AUTORESPONSE_SUPERVISION__MAX_RESTARTS="0") as d:
        done = d.cli("inject", "llm", '{"reason": "fatal drill"}', "--type", "Crash")
        assert done.returncode == 0, done.stderr
        assert d.wait(30) == 1
    log = d.log()
    lines = [line for line in log.splitlines() if "root supervisor gave up" in line]
    assert len(lines) == 1
    assert "more than 0 restarts" in lines[0]


def test_a_bad_llm_in_a_daemon_leaves_a_dead_letter_that_can_be_replayed(
    tmp_path: Path, fake_llm: FakeLLMServer
) -> None:
    fake_llm.script(*[FakeResponse(content="not {json") for _ in range(3)])
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
        assert d.stop() == 0
    log = d.log()
    assert "getUpdates" in log or "sendMessage" in log or "polling Telegram" in log  # it did log its work
    for secret in (BOT_TOKEN, API_KEY, TOKEN):
        assert secret not in log and secret not in status


def test_a_second_daemon_on_the_same_data_directory_exits_with_one_line(
    tmp_path: Path, fake_llm: FakeLLMServer
) -> None:
    # It would resume the first one's unfinished work as its own, and answer it twice.
    (tmp_path / "second").mkdir()
    with daemon(tmp_path, fake_llm.base_url) as first:
        second = daemon(tmp_path / "second", fake_llm.base_url, AUTORESPONSE_DATA_DIR=str(tmp_path / "data"))
        with pytest.raises(AssertionError):
            second.start()
        assert second.wait(30) == 1
        [line] = [line for line in second.log().splitlines() if line.strip()]
        assert f"process {first.proc.pid} has the journal {tmp_path / 'data' / 'journal.sqlite3'} open" in line
        assert "AUTORESPONSE_DATA_DIR" in line
        done = first.cli("inject", "interface.console", '{"text": "run echo still here"}')
        assert done.returncode == 0, done.stderr  # the first serves on
        assert first.stop() == 0
    assert second.start().stop() == 0  # once the first has stopped, the directory is free
