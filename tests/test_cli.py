"""The `autoresponse` command as a user runs it: real processes, real signals."""

from __future__ import annotations

import os
import queue
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from conftest import environment, free_port

from autoresponse.actors.llm.fake_server import FakeLLMServer


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


def _lines(stream) -> queue.Queue[str]:  # type: ignore[no-untyped-def]
    lines: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        for line in stream:
            lines.put(line)

    threading.Thread(target=pump, daemon=True).start()
    return lines


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_the_daemon_serves_until_signalled_then_exits_cleanly(signum: int, tmp_path: Path) -> None:
    env = environment(AUTORESPONSE_TERMINAL__ENABLED="true",
                      AUTORESPONSE_TERMINAL__ALLOWED_COMMANDS='["echo"]',
                      AUTORESPONSE_ADMIN__PORT=str(free_port()),
                      AUTORESPONSE_DATA_DIR=str(tmp_path))
    proc = subprocess.Popen([sys.executable, "-m", "autoresponse", "run"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
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
    errors = [line for line in done.stderr.splitlines() if "ERROR" in line]
    assert len(errors) == 1
    assert f"cannot start: the admin endpoint cannot listen on 127.0.0.1:{port}" in errors[0]


def test_the_daemon_refuses_an_admin_bind_outside_loopback_without_a_token() -> None:
    done = autoresponse("run", env=environment(AUTORESPONSE_ADMIN__HOST="0.0.0.0",
                                               AUTORESPONSE_ADMIN__PORT=str(free_port())), timeout=60)
    assert done.returncode == 1
    assert "cannot start: the admin endpoint may bind to '0.0.0.0' only with a token" in done.stderr


def test_an_actor_that_cannot_set_up_stops_the_start_and_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    from autoresponse.interfaces.console import Console, ConsoleInterface
    from autoresponse import Application, Settings
    from autoresponse.app import StartError

    def broken(self: ConsoleInterface) -> None:
        raise OSError("no terminal here")

    monkeypatch.setattr(ConsoleInterface, "setup", broken)
    settings = Settings.load(admin={"enabled": False}, events={"enabled": False}, journal={"enabled": False})
    with pytest.raises(StartError, match="interface.console: OSError: no terminal here"):
        Application(settings, console=Console(io.StringIO())).start()
