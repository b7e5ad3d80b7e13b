"""The delivery journal: nothing accepted is lost, even across kill -9."""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from autoresponse.actors.llm.fake_server import FakeLLMServer
from autoresponse.interfaces.telegram.fake_server import FakeTelegramServer
from autoresponse.journal import SqliteJournal
from autoresponse.messages import Envelope, OriginalContext, UserRequest

CTX = OriginalContext(chat_id=1, message_id=1, interface_name="telegram")


def request(n: int) -> UserRequest:
    return UserRequest(text=f"hello {n}", context=CTX)


def test_accepted_work_stays_open_until_finished_and_then_compacts(tmp_path: Path) -> None:
    journal = SqliteJournal(tmp_path / "j.sqlite3")
    try:
        first = Envelope.new(request(1), correlation_id="c1")
        assert journal.accept(first, actor="llm").result(5) is True
        assert journal.accept(first, actor="llm").result(5) is False  # a retry of the same work
        journal.accept(Envelope.new(request(2), correlation_id="c2"), actor="llm").result(5)
        assert [i.correlation for i in journal.unfinished()] == ["c1", "c2"]
        journal.finish("c1")
        journal.mark_sent("c2:chat#0").result(5)
        assert [i.correlation for i in journal.unfinished()] == ["c2"]
        assert journal.was_sent("c2:chat#0") and not journal.was_sent("c2:chat#1")
        assert UserRequest.model_validate_json(journal.unfinished()[0].payload).text == "hello 2"
        assert journal.compact(older_than=time.time() + 1) == 1  # only the finished one
        assert [i.correlation for i in journal.unfinished()] == ["c2"]
    finally:
        journal.close()
    reopened = SqliteJournal(tmp_path / "j.sqlite3")
    try:
        assert [i.correlation for i in reopened.unfinished()] == ["c2"]
    finally:
        reopened.close()


def test_writes_are_group_committed(tmp_path: Path) -> None:
    journal = SqliteJournal(tmp_path / "j.sqlite3")
    try:
        futures = []
        threads = [threading.Thread(target=lambda k=k: futures.extend(
            journal.accept(Envelope.new(request(n), correlation_id=f"{k}-{n}"), actor="llm")
            for n in range(50))) for k in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert all(f.result(10) for f in futures)
        assert len(journal.unfinished()) == 400
        assert journal.commits < 400  # many writes shared each commit
    finally:
        journal.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Daemon:
    """`autoresponse run` as a real process that the test kills."""

    def __init__(self, tmp_path: Path, env: dict[str, str]) -> None:
        self.tmp_path = tmp_path
        self.env = env
        self.port = int(env["AUTORESPONSE_ADMIN__PORT"])
        self.proc: subprocess.Popen[bytes] | None = None
        self.runs = 0

    def start(self) -> None:
        self.runs += 1
        log = open(self.tmp_path / f"daemon-{self.runs}.log", "wb")  # noqa: SIM115 - the process owns it
        self.proc = subprocess.Popen([sys.executable, "-m", "autoresponse", "run"], env=self.env,
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log)
        log.close()
        until = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/healthz", timeout=1):
                    return
            except OSError:
                assert self.proc.poll() is None, (self.tmp_path / f"daemon-{self.runs}.log").read_text()
                assert time.monotonic() < until, "the daemon did not come up"
                time.sleep(0.05)

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def push(port: int, n: int, deadline: float) -> None:
    """Inject request n until the daemon acknowledges it (it may be down, or killed mid-way)."""
    body = {"text": f"hello {n}", "context": {"chat_id": 10_000 + n, "message_id": n,
                                              "interface_name": "telegram", "chat_type": "private"}}
    url = f"http://127.0.0.1:{port}/inject/llm?type=UserRequest&correlation=req-{n}"
    while time.monotonic() < deadline:
        try:
            post = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST")
            with urllib.request.urlopen(post, timeout=5) as response:
                if response.status == 202:
                    return
        except (OSError, urllib.error.HTTPError):
            time.sleep(0.05)
    raise AssertionError(f"request {n} was never acknowledged")


@pytest.mark.parametrize("inbound", ["inject", "telegram"])
def test_nothing_is_lost_across_kill_9(tmp_path: Path, inbound: str) -> None:
    requests, kills = 500, 3
    rng = random.Random(9)
    with FakeLLMServer(delay=0.2) as llm, FakeTelegramServer() as telegram:
        env = {k: v for k, v in os.environ.items() if not k.startswith("AUTORESPONSE_")}
        env.update({
            "AUTORESPONSE_LLM__BASE_URL": llm.base_url,
            "AUTORESPONSE_TELEGRAM__TOKEN": "1:TOKEN", "AUTORESPONSE_TELEGRAM__BASE_URL": telegram.base_url,
            "AUTORESPONSE_TELEGRAM__POLL_TIMEOUT": "1", "AUTORESPONSE_CONSOLE__ENABLED": "false",
            "AUTORESPONSE_TELEGRAM__ALLOWED_USERS": "[7]",
            "AUTORESPONSE_ADMIN__PORT": str(free_port()), "AUTORESPONSE_DATA_DIR": str(tmp_path / "data"),
            "AUTORESPONSE_EVENTS__ENABLED": "false",
        })
        daemon = Daemon(tmp_path, env)
        daemon.start()
        deadline = time.monotonic() + 240
        if inbound == "inject":
            pusher = threading.Thread(target=lambda: [push(daemon.port, n, deadline) for n in range(requests)])
        else:  # updates wait at the fake Bot API until an offset acknowledges them
            pusher = threading.Thread(target=lambda: [
                telegram.push_text(f"hello {n}", chat_id=10_000 + n, user_id=7, message_id=n)
                for n in range(requests)])
        pusher.start()
        try:
            for _ in range(kills):
                time.sleep(rng.uniform(0.5, 3.0))
                daemon.kill()
                daemon.start()
            pusher.join(240)
            assert not pusher.is_alive()

            def replied() -> set[int]:
                return {int(c.params["chat_id"]) for c in telegram.sent()}

            until = time.monotonic() + 180
            while len(replied()) < requests and time.monotonic() < until:
                time.sleep(0.2)
        finally:
            code = daemon.stop()
    chats = [int(c.params["chat_id"]) - 10_000 for c in telegram.sent()]
    per_request = {n: chats.count(n) for n in range(requests)}
    lost = [n for n, count in per_request.items() if count == 0]
    duplicates = sum(count - 1 for count in per_request.values() if count > 1)
    print(f"\nkill -9 x{kills} ({inbound}): {requests} requests, {len(lost)} lost, "
          f"{duplicates} duplicate replies")
    assert lost == []
    # A duplicate is a send the kill caught before its confirmation was written: at most
    # one per chat and kill.
    assert max(per_request.values()) <= 1 + kills
    assert code == 0
