"""The conversation memory's store: its budget, its retention, a damaged file, text it is given."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from conftest import ask, environment, wait_for

from autoresponse import Application
from autoresponse.actors.memory import ConversationStore, estimate_tokens
from autoresponse.messages import OriginalContext
from autoresponse.testing.fake_llm import FakeLLMServer, RecordedRequest

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


# ---------------------------------------------------------------- text no UTF-8 can hold


def test_text_with_a_lone_surrogate_is_stored_with_it_replaced(store: ConversationStore) -> None:
    store.append(CHAT, "user", "hello \ud800 bad")
    assert [t.content for t in store.recent(CHAT)] == ["hello ? bad"]
    store.seen(OriginalContext(chat_id=42, interface_name="telegram", chat_title="ops \udc80 room"))
    [known] = store.find_chats("telegram", "ops ? room")
    assert known.chat_id == "42"
