"""The delivery journal: nothing accepted is lost, even across kill -9."""

from __future__ import annotations

import json
import random
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from conftest import Daemon

from autoresponse.actors.llm.fake_server import FakeLLMServer
from autoresponse.interfaces.telegram.fake_server import FakeTelegramServer
from autoresponse.actors.journal import SqliteJournal
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
        daemon = Daemon(
            tmp_path, AUTORESPONSE_LLM__BASE_URL=llm.base_url,
            AUTORESPONSE_TELEGRAM__TOKEN="1:TOKEN", AUTORESPONSE_TELEGRAM__BASE_URL=telegram.base_url,
            AUTORESPONSE_TELEGRAM__POLL_TIMEOUT="1", AUTORESPONSE_CONSOLE__ENABLED="false",
            AUTORESPONSE_TELEGRAM__ALLOWED_USERS="[7]", AUTORESPONSE_EVENTS__ENABLED="false",
        ).start()
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
