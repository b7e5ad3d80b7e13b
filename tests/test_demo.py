"""`autoresponse demo` keeps to itself: its memory lives in a `demo/` folder of the default
data dir (unless AUTORESPONSE_DATA_DIR says otherwise), apart from the daemon's chats, and
`--fresh` starts it with an empty memory. Real processes, with HOME in a temporary directory."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import default_signals, environment, wait_for

from autoresponse.testing.fake_llm import FakeLLMServer, FakeResponse


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


@pytest.mark.parametrize(("signum", "signals"), [(signal.SIGINT, 1), (signal.SIGINT, 2), (signal.SIGINT, 3),
                                                 (signal.SIGTERM, 1)],
                         ids=["one Ctrl-C", "two Ctrl-C", "three Ctrl-C", "SIGTERM"])
def test_a_ctrl_c_cancels_the_request_under_way_and_a_second_never_hangs_the_demo(
    signum: int, signals: int, tmp_path: Path
) -> None:
    """A Ctrl-C while the LLM holds the request once took the whole drain (10 s by default:
    the stop waited for the request); a second one 0.3 s later left the demo hanging for good
    (a KeyboardInterrupt inside the stop, and the actors' threads waited for at exit), a third
    ended it with a traceback. The first cancels the request and ends the demo, a later one
    stops it at once: never the drain's minute here."""
    with FakeLLMServer() as llm:
        llm.script(FakeResponse(hang=True))  # the first request is held until the server stops
        proc = subprocess.Popen(
            [sys.executable, "-m", "autoresponse", "demo", "run uptime", "run date"],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env=environment(HOME=str(tmp_path / "home"), AUTORESPONSE_DATA_DIR=str(tmp_path / "data"),
                            AUTORESPONSE_LLM__BASE_URL=llm.base_url, AUTORESPONSE_RUNTIME__DRAIN_SECONDS="60"),
            preexec_fn=default_signals)
        try:
            wait_for(lambda: llm.requests or proc.poll() is not None, timeout=60)
            assert proc.poll() is None, proc.communicate()
            sent = time.monotonic()
            for n in range(signals):
                if n:
                    time.sleep(0.1)  # while the first one's stop is under way
                if proc.poll() is None:
                    proc.send_signal(signum)
            out, err = proc.communicate(timeout=30)
            took = time.monotonic() - sent
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        assert len(llm.requests) == 1  # "run date" was never asked
    assert proc.returncode == 128 + signum, err
    assert "Traceback" not in err, err
    assert "threads still alive" not in err, err
    assert took < 20, f"{took:.1f}s"  # generous: it takes a fraction of a second
    again = "Ctrl-C again" if signum == signal.SIGINT else "a second signal"
    said = f"autoresponse: interrupted: cancelling the request ({again} stops at once)"
    assert err.splitlines()[0] == said, err
    if signals == 1:
        assert err.splitlines() == [said]
        assert "Cancelled: I stopped working on your request." in out  # the /cancel it typed was answered
    assert "run date" not in out


def test_a_request_with_bytes_that_are_no_utf_8_is_read_with_them_replaced_and_answered(tmp_path: Path) -> None:
    """Python keeps undecodable bytes of an argument as lone surrogates, which the memory
    cannot store: the conversation crashed three times, and the request was never answered."""
    done = subprocess.run([sys.executable, "-m", "autoresponse", "demo", b"run echo caf\xe9 \xff\xfe"],
                          capture_output=True, timeout=120, stdin=subprocess.DEVNULL,
                          env=environment(HOME=str(tmp_path / "home"), AUTORESPONSE_DATA_DIR=str(tmp_path / "data")))
    out, err = done.stdout.decode(errors="replace"), done.stderr.decode(errors="replace")
    assert done.returncode == 0, err
    assert "Traceback" not in err and "dead letter" not in err, err
    assert "you     #1 │ run echo caf\ufffd \ufffd\ufffd" in out
    assert "`echo caf\ufffd \ufffd\ufffd` finished" in out
    history = subprocess.run([sys.executable, "-m", "autoresponse", "history", "--demo", "console", "--json"],
                             capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
                             env=environment(HOME=str(tmp_path / "home"), AUTORESPONSE_DATA_DIR=str(tmp_path / "data")))
    assert json.loads(history.stdout)[0]["content"] == "run echo caf\ufffd \ufffd\ufffd"  # and remembered so
