"""`autoresponse demo` keeps to itself: its memory lives in a `demo/` folder of the default
data dir (unless AUTORESPONSE_DATA_DIR says otherwise), apart from the daemon's chats, and
`--fresh` starts it with an empty memory. Real processes, with HOME in a temporary directory."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from conftest import environment

from autoresponse.testing.fake_llm import FakeLLMServer


def demo(home: Path, llm: FakeLLMServer, *args: str, **env: str) -> list[str]:
    """Run the demo as a user does; the messages of the first LLM request it made (its
    first turn, with whatever memory it was given), as JSON text."""
    before = len(llm.requests)
    done = subprocess.run([sys.executable, "-m", "autoresponse", "demo", *args], capture_output=True, text=True,
                          timeout=120, stdin=subprocess.DEVNULL,
                          env=environment(HOME=str(home), XDG_DATA_HOME=str(home / "xdg"),
                                          AUTORESPONSE_LLM__BASE_URL=llm.base_url, **env))
    assert done.returncode == 0, done.stderr
    return [json.dumps(m) for m in llm.requests[before].messages]


def said(messages: list[str], text: str) -> bool:
    return any(text in m for m in messages)


def test_the_demo_remembers_in_its_own_folder_and_fresh_forgets(tmp_path: Path, fake_llm: FakeLLMServer) -> None:
    home = tmp_path / "home"
    default = home / ".local/share/autoresponse"
    # The real bot's chats, in the default data dir.
    demo(home, fake_llm, "run echo a-chat-of-the-real-bot", AUTORESPONSE_DATA_DIR=str(default))

    first = demo(home, fake_llm, "run echo remember-the-walrus")
    assert not said(first, "a-chat-of-the-real-bot")  # the bot's chats do not steer the demo
    assert (default / "demo" / "memory.sqlite3").is_file()
    second = demo(home, fake_llm, "what did I ask you before?")
    assert said(second, "remember-the-walrus")  # a demo remembers the one before ...
    assert not said(second, "a-chat-of-the-real-bot")
    fresh = demo(home, fake_llm, "--fresh", "what did I ask you before?")
    assert not said(fresh, "remember-the-walrus")  # ... unless it starts afresh
    assert not said(fresh, "a-chat-of-the-real-bot")
    after = demo(home, fake_llm, "and now?")
    assert not said(after, "remember-the-walrus")  # forgotten for good: it was the demo's own memory
    # The demo never wrote into the daemon's data: its memory there holds only the bot's chat.
    mine = demo(home, fake_llm, "what do you remember?", AUTORESPONSE_DATA_DIR=str(default))
    assert said(mine, "a-chat-of-the-real-bot") and not said(mine, "walrus")


def test_a_data_dir_of_ones_own_is_used_and_never_emptied_by_fresh(tmp_path: Path, fake_llm: FakeLLMServer) -> None:
    home, data = tmp_path / "home", tmp_path / "mine"
    demo(home, fake_llm, "run echo kept-in-my-dir", AUTORESPONSE_DATA_DIR=str(data))
    assert (data / "memory.sqlite3").is_file() and not (home / ".local/share/autoresponse").exists()
    fresh = demo(home, fake_llm, "--fresh", "run echo only-in-a-scratch-memory", AUTORESPONSE_DATA_DIR=str(data))
    assert not said(fresh, "kept-in-my-dir")  # an empty memory for this run ...
    again = demo(home, fake_llm, "what did I ask you before?", AUTORESPONSE_DATA_DIR=str(data))
    assert said(again, "kept-in-my-dir")  # ... and the directory's own memory is still there,
    assert not said(again, "only-in-a-scratch-memory")  # without the fresh run's turns


def test_history_reads_the_demos_memory_with_demo_and_says_when_none_has_any(
    tmp_path: Path, fake_llm: FakeLLMServer
) -> None:
    home = tmp_path / "home"
    env = environment(HOME=str(home), XDG_DATA_HOME=str(home / "xdg"))

    def history(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "autoresponse", "history", *args], capture_output=True,
                              text=True, timeout=60, stdin=subprocess.DEVNULL, env=env)

    demo(home, fake_llm, "run echo what-the-demo-said")
    assert "console:console:" in history("--demo").stdout
    shown = json.loads(history("--demo", "console", "--json").stdout)
    assert shown[0]["content"] == "run echo what-the-demo-said"
    daemons = history()  # the daemon's own data dir: the demo never wrote there
    assert daemons.returncode == 0 and "console:console:" not in daemons.stdout
    # /forget is answered (by a notice: exit 0), and a memory that holds no chat says so,
    # rather than printing nothing.
    forget = subprocess.run([sys.executable, "-m", "autoresponse", "demo", "/forget"], capture_output=True,
                            text=True, timeout=120, stdin=subprocess.DEVNULL, env=env)
    assert forget.returncode == 0 and "forgotten" in forget.stdout, forget.stderr
    empty = history("--demo")
    assert empty.returncode == 0 and empty.stdout.startswith("no chat has memory at "), empty.stdout
