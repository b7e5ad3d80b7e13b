"""The conversation memory's store: its budget, its retention, a damaged file, a failing
disk, text it is given."""

from __future__ import annotations

import json
import resource
import signal
import sqlite3
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from conftest import Daemon, NatsServer, ask, environment, wait_for

from autoresponse import Application
from autoresponse.actors.journal.jetstream import JetStreamJournal
from autoresponse.actors.journal.shared_memory import SharedConversationStore
from autoresponse.actors.memory import ConversationStore, estimate_tokens
from autoresponse.messages import OriginalContext
from autoresponse.testing.fake_llm import FakeLLMServer, FakeResponse, RecordedRequest
from autoresponse.testing.fake_telegram import FakeTelegramServer

CHAT = "telegram:42:"


@pytest.fixture
def store(tmp_path: Path) -> Iterator[ConversationStore]:
    opened = ConversationStore(tmp_path / "memory.sqlite3", max_tokens=2000)
    yield opened
    opened.close()


# ---------------------------------------------------------------- one entry longer than the budget


@pytest.mark.parametrize("length", [7_985, 8_000, 20_000])
def test_a_message_longer_than_the_budget_is_remembered_cut_to_fit(store: ConversationStore, length: int) -> None:
    store.append(CHAT, "user", "earlier: my server is web-3")
    store.append(CHAT, "assistant", "noted", kind="reply")
    store.append(CHAT, "user", "L" * length)
    [kept] = store.recent(CHAT)  # it fills the whole budget: nothing older fits beside it
    assert kept.content == "L" * ((2000 - 4) * 4)
    assert estimate_tokens(kept.content) == 2000


def test_older_memory_stays_beside_a_long_message_as_far_as_it_fits(store: ConversationStore) -> None:
    store.append(CHAT, "user", "earlier: my server is web-3")  # 11 tokens
    store.append(CHAT, "assistant", "noted", kind="reply")  # 6 tokens
    store.append(CHAT, "user", "L" * (1_985 * 4))  # 1,989 tokens: room for the reply only
    assert [t.content for t in store.recent(CHAT)] == ["noted", "L" * (1_985 * 4)]


def test_a_budget_below_the_framing_still_keeps_the_newest_entry(tmp_path: Path) -> None:
    tiny = ConversationStore(tmp_path / "memory.sqlite3", max_tokens=2)
    try:
        tiny.append(CHAT, "user", "first")
        tiny.append(CHAT, "user", "second")
        assert tiny.chats_with_memory() == [(CHAT, 1)]  # the newest is kept, even over the budget
    finally:
        tiny.close()


# ---------------------------------------------------------------- retention while the daemon runs


def test_memory_past_its_retention_is_never_read_back_and_compaction_deletes_it(tmp_path: Path) -> None:
    short = ConversationStore(tmp_path / "memory.sqlite3", retention_seconds=1)
    try:
        short.append(CHAT, "user", "my password is hunter2")
        assert [t.content for t in short.recent(CHAT)] == ["my password is hunter2"]
        wait_for(lambda: short.recent(CHAT) == [], timeout=20)  # a real second goes by
        short.append(CHAT, "user", "what did I tell you?")
        assert [t.content for t in short.recent(CHAT)] == ["what did I tell you?"]
        assert [e.content for e in short.history(CHAT)] == ["what did I tell you?"]
        assert short.compact() == 1  # the password, and only it
        assert short.chats_with_memory() == [(CHAT, 1)]
    finally:
        short.close()


def test_a_daemon_that_stays_up_leaves_expired_memory_out_of_the_prompt(
    make_app: Callable[..., Application], fake_llm: FakeLLMServer
) -> None:
    app = make_app(base_url=fake_llm.base_url, memory={"retention_seconds": 1})
    ask(app, "my password is hunter2")
    memory = app.memory
    assert memory is not None
    [(chat, _)] = memory.chats_with_memory()
    wait_for(lambda: memory.recent(chat) == [], timeout=20)
    ask(app, "what did I tell you?")
    def says(request: RecordedRequest, text: str) -> bool:
        return any(text in str(m.get("content")) for m in request.messages)

    first, *_, last = [r for r in fake_llm.requests if says(r, "hunter2") or says(r, "what did I tell you?")]
    assert says(first, "hunter2")  # the first turn's request had it
    assert says(last, "what did I tell you?") and not says(last, "hunter2")


# ---------------------------------------------------------------- a damaged file


def damaged_memory(data: Path) -> Path:
    """A memory file with a good first page whose pages further in are overwritten."""
    path = data / "memory.sqlite3"
    made = ConversationStore(path, max_tokens=10**9)
    for n in range(3000):
        made.append("console:console:", "user", f"old message {n} " + "y" * 200)
    made.close()
    size = path.stat().st_size
    with open(path, "r+b") as f:
        for offset in range(4096 * 3, size - 4096, 4096 * 5):
            f.seek(offset)
            f.write(b"\xff" * 4096)
    return path


@pytest.mark.parametrize("command", ["run", "history"])
def test_a_damaged_memory_file_is_one_line_that_says_how_to_move_it_aside(command: str, tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    path = damaged_memory(data)
    damaged = path.read_bytes()
    env = environment(AUTORESPONSE_DATA_DIR=str(data), AUTORESPONSE_ADMIN__ENABLED="false",
                      AUTORESPONSE_EVENTS__ENABLED="false", AUTORESPONSE_CONSOLE__READ_STDIN="false")
    done = subprocess.run([sys.executable, "-m", "autoresponse", command], capture_output=True, text=True,
                          env=env, timeout=60, stdin=subprocess.DEVNULL)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == 2, done.stderr
    assert lines == [f"autoresponse: the conversation memory {path} cannot be read (database disk image is "
                     f"malformed); it was left as it is. To start with an empty conversation memory, move it "
                     f"aside: mv {path} {path}.corrupt"], done.stderr
    assert path.read_bytes() == damaged  # left as it was, never replaced


# ---------------------------------------------------------------- a failing disk


def full_disk_at_start() -> None:
    """In the daemon's process, before it starts: no file may grow past 16 bytes (a full
    disk: a write past it fails with EFBIG instead of killing the process)."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (16, resource.RLIM_INFINITY))


def test_a_full_disk_at_start_names_the_disk_and_never_says_to_move_the_memory_aside(tmp_path: Path) -> None:
    """The disk is full as the daemon starts: it says in one line that the disk failed the
    memory and that the memory was left intact; the advice to move it aside (losing every
    chat's memory) is for a damaged file only."""
    data = tmp_path / "data"
    kept = ConversationStore(data / "memory.sqlite3")
    kept.append(CHAT, "user", "my server is web-3")
    kept.close()
    env = environment(AUTORESPONSE_DATA_DIR=str(data), AUTORESPONSE_ADMIN__ENABLED="false",
                      AUTORESPONSE_EVENTS__ENABLED="false", AUTORESPONSE_JOURNAL__ENABLED="false",
                      AUTORESPONSE_CONSOLE__READ_STDIN="false")
    done = subprocess.run([sys.executable, "-m", "autoresponse", "run"], capture_output=True, text=True,
                          env=env, timeout=60, stdin=subprocess.DEVNULL, preexec_fn=full_disk_at_start)
    assert done.returncode == 1, done.stderr
    assert f"cannot start: the conversation memory {data / 'memory.sqlite3'} cannot be used" in done.stderr
    assert "SQLITE_IOERR" in done.stderr and "it is not damaged, and it was left intact" in done.stderr
    assert "move it aside" not in done.stderr and "Traceback" not in done.stderr
    again = ConversationStore(data / "memory.sqlite3")
    try:
        assert [t.content for t in again.recent(CHAT)] == ["my server is web-3"]
    finally:
        again.close()


def test_history_on_a_full_disk_names_the_disk_in_one_line(tmp_path: Path) -> None:
    """``autoresponse history`` where the disk fails the memory: one line that says so, no
    traceback and no advice to move the memory aside."""
    data = tmp_path / "data"
    kept = ConversationStore(data / "memory.sqlite3")
    kept.append(CHAT, "user", "my server is web-3")
    kept.close()
    done = subprocess.run([sys.executable, "-m", "autoresponse", "history"], capture_output=True, text=True,
                          env=environment(AUTORESPONSE_DATA_DIR=str(data)), timeout=60, stdin=subprocess.DEVNULL,
                          preexec_fn=full_disk_at_start)
    assert done.returncode == 1, done.stderr
    assert "it is not damaged, and it was left intact" in done.stderr
    assert "move it aside" not in done.stderr and "Traceback" not in done.stderr


@contextmanager
def efbig_not_fatal() -> Iterator[None]:
    """A process started meanwhile ignores SIGXFSZ (the disposition is inherited): a write
    past its file size limit then fails (EFBIG), as on a full disk, instead of killing it."""
    before = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGXFSZ, before)


def healthz(daemon: Daemon) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(f"{daemon.url}/healthz", timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_a_memory_whose_disk_fills_while_running_is_failing_and_replies_still_go_out(tmp_path: Path) -> None:
    """The memory's disk fills while the daemon runs: replies still go out, to a message
    and to a command's output, not remembered; /healthz and `autoresponse status` say the
    memory is failing, and why; it is logged once as it starts and once as writes work
    again, and the mark goes with the first write that commits."""
    chat = 42

    def replies() -> list[str]:
        return [c.params["text"] for c in telegram.sent(chat_id=chat)]

    def say(text: str) -> str:
        count = len(replies())
        telegram.push_text(text, chat_id=chat, user_id=7)
        return wait_for(lambda: replies()[count:], timeout=30)[0]  # type: ignore[no-any-return]

    with FakeLLMServer() as llm, FakeTelegramServer() as telegram:
        daemon = Daemon(tmp_path, AUTORESPONSE_LLM__BASE_URL=llm.base_url, AUTORESPONSE_LOG_LEVEL="WARNING",
                        AUTORESPONSE_TELEGRAM__TOKEN="1:TOKEN", AUTORESPONSE_TELEGRAM__BASE_URL=telegram.base_url,
                        AUTORESPONSE_TELEGRAM__POLL_TIMEOUT="1", AUTORESPONSE_TELEGRAM__ALLOWED_USERS="[7]",
                        AUTORESPONSE_TERMINAL__ENABLED="true", AUTORESPONSE_TERMINAL__ALLOWED_COMMANDS='["uptime"]',
                        AUTORESPONSE_CONSOLE__ENABLED="false", AUTORESPONSE_EVENTS__ENABLED="false",
                        AUTORESPONSE_JOURNAL__ENABLED="false")  # the memory alone meets the full disk
        with efbig_not_fatal():
            daemon.start()
        try:
            assert daemon.proc is not None
            say("my server is web-3")
            assert healthz(daemon) == (200, {"status": "ok"})
            wal = tmp_path / "data" / "memory.sqlite3-wal"
            room = wal.stat().st_size  # it grows with every write: none fits any more
            assert len(daemon.log()) < room / 2, daemon.log()  # its log still has room
            resource.prlimit(daemon.proc.pid, resource.RLIMIT_FSIZE, (room, resource.RLIM_INFINITY))

            assert "offline engine" in say("what is my server?")  # its answer goes out
            assert "uptime" in say("run uptime")  # a command's output goes out too
            code, health = healthz(daemon)
            assert code == 503 and "memory failing" in health["reason"], health
            assert health["failing"]["memory"]["reason"].startswith("its writes fail: "), health
            shown = daemon.cli("status")
            assert shown.returncode == 0 and "memory is failing" in shown.stdout, shown.stdout + shown.stderr

            resource.prlimit(daemon.proc.pid, resource.RLIMIT_FSIZE,
                             (resource.RLIM_INFINITY, resource.RLIM_INFINITY))  # room again
            say("I moved it to web-4")
            assert healthz(daemon) == (200, {"status": "ok"})
        finally:
            assert daemon.stop() == 0
    log = daemon.log()
    said = [line for line in log.splitlines() if "memory" in line]
    assert len(said) == 2, log  # not a line for every message it could not remember
    assert " ERROR " in said[0] and "writes fail (" in said[0], log
    assert "writes again" in said[1], log
    assert "Traceback" not in log, log
    memory = ConversationStore(tmp_path / "data" / "memory.sqlite3")
    try:
        remembered = [e.content for e in memory.history(f"telegram:{chat}:")]
    finally:
        memory.close()
    assert "my server is web-3" in remembered and "I moved it to web-4" in remembered
    assert "what is my server?" not in remembered  # said while the disk was full


# ---------------------------------------------------------------- text no UTF-8 can hold


def test_text_with_a_lone_surrogate_is_stored_with_it_replaced(store: ConversationStore) -> None:
    store.append(CHAT, "user", "hello \ud800 bad")
    assert [t.content for t in store.recent(CHAT)] == ["hello ? bad"]
    store.seen(OriginalContext(chat_id=42, interface_name="telegram", chat_title="ops \udc80 room"))
    [known] = store.find_chats("telegram", "ops ? room")
    assert known.chat_id == "42"


def test_a_memory_that_fits_short_writes_but_not_a_message_stays_failing(tmp_path: Path) -> None:
    """Nearly full (no page left): a chat's names (updated in place) and short replies
    still fit, the user's messages do not. The memory is failing until a message as long
    as one it could not store is stored, not cleared by every short write in between."""
    store = ConversationStore(tmp_path / "memory.sqlite3", max_tokens=100_000)
    try:
        for _ in range(50):
            store.append(CHAT, "user", "hello " * 50)
        pages = store._db.execute("PRAGMA page_count").fetchone()[0]
        store._db.execute(f"PRAGMA max_page_count = {pages}")  # a quota: as a full disk, for new pages
        for turn in range(3):
            assert store.append(CHAT, "user", f"question {turn} " * 200) is None  # too long to fit
            store.append(CHAT, "assistant", "ok", kind="reply")  # fits
            assert store.failing is not None, f"turn {turn}: a short write cleared the mark"
        store._db.execute("PRAGMA max_page_count = 1000000")  # room again
        assert store.append(CHAT, "user", "question 4 " * 200) is not None
        assert store.failing is None
    finally:
        store.close()


# ---------------------------------------------------------------- a turn resumed from the journal


def test_a_turn_resumed_after_a_kill_holds_its_message_once(tmp_path: Path) -> None:
    """The daemon is killed while the LLM holds a turn; the next start resumes it from the
    journal and answers it. The chat's memory holds the message once, and the resumed
    request carries it once."""
    chat = 42
    with FakeLLMServer() as llm, FakeTelegramServer() as telegram:
        daemon = Daemon(tmp_path, AUTORESPONSE_LLM__BASE_URL=llm.base_url, AUTORESPONSE_LOG_LEVEL="WARNING",
                        AUTORESPONSE_TELEGRAM__TOKEN="1:TOKEN", AUTORESPONSE_TELEGRAM__BASE_URL=telegram.base_url,
                        AUTORESPONSE_TELEGRAM__POLL_TIMEOUT="1", AUTORESPONSE_TELEGRAM__ALLOWED_USERS="[7]",
                        AUTORESPONSE_CONSOLE__ENABLED="false", AUTORESPONSE_EVENTS__ENABLED="false")
        llm.script(FakeResponse(hang=True))  # the first run never hears back
        daemon.start()
        try:
            telegram.push_text("tell me a story", chat_id=chat, user_id=7)
            wait_for(lambda: llm.requests, timeout=30)
            daemon.kill()
            daemon.start()
            wait_for(lambda: telegram.sent(chat_id=chat), timeout=30)  # the resumed turn's answer
        finally:
            assert daemon.stop() == 0
    asked = [r for r in llm.requests if r.messages[-1]["content"] == "tell me a story"]
    assert len(asked) == 2, daemon.log()  # the first run's, and the resumed one
    assert [m["content"] for m in asked[-1].messages].count("tell me a story") == 1
    memory = ConversationStore(tmp_path / "data" / "memory.sqlite3")
    try:
        said = [e.content for e in memory.history(f"telegram:{chat}:") if e.role == "user"]
    finally:
        memory.close()
    assert said == ["tell me a story"]


def test_a_memory_file_of_an_older_version_keeps_its_entries_and_learns_turns(tmp_path: Path) -> None:
    """A file written before entries named their turn: it opens with its entries, and
    a message stored since is found by its turn."""
    path = tmp_path / "memory.sqlite3"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE memory (id INTEGER PRIMARY KEY AUTOINCREMENT, chat TEXT NOT NULL, "
                   "role TEXT NOT NULL, kind TEXT NOT NULL, content TEXT NOT NULL, tokens INTEGER NOT NULL, "
                   "time REAL NOT NULL)")
        db.execute("INSERT INTO memory (chat, role, kind, content, tokens, time) VALUES (?, ?, ?, ?, ?, ?)",
                   ("telegram:42:", "user", "message", "my server is web-3", 9, time.time()))
    db.close()
    store = ConversationStore(path)
    try:
        first = store.append("telegram:42:", "user", "run df -h", correlation="turn-2")
        assert store.stored_for("telegram:42:", "turn-2") == first
        assert store.stored_for("telegram:42:", "turn-3") is None
        assert [e.content for e in store.history("telegram:42:")] == ["my server is web-3", "run df -h"]
    finally:
        store.close()


def test_the_shared_memory_finds_a_message_by_its_turn(nats_server: NatsServer) -> None:
    """As the SQLite store: a turn resumed on any daemon of a cluster finds its message."""
    journal = JetStreamJournal(nats_server.url, node="one")
    try:
        store = SharedConversationStore(journal, max_tokens=200)
        store.append("telegram:1:", "user", "my server is web-3")
        first = store.append("telegram:1:", "user", "run df -h", correlation="turn-2")
        store.append("telegram:1:", "assistant", "72% full", kind="reply")
        assert first is not None and store.stored_for("telegram:1:", "turn-2") == first
        assert store.stored_for("telegram:1:", "turn-3") is None
        assert store.stored_for("telegram:9:", "turn-2") is None
    finally:
        journal.close()
