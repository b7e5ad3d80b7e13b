from __future__ import annotations

import io
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from autoresponse.actors.llm.fake_server import FakeLLMServer
from autoresponse.actors.routes import interface
from autoresponse.interfaces.console import Console, ConsoleInput
from autoresponse.interfaces.terminal import DEMO_COMMANDS
from autoresponse.messages import Envelope
from autoresponse.supervisors import Application, Settings


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests see only the settings they set."""
    for key in list(os.environ):
        if key.startswith("AUTORESPONSE_"):
            monkeypatch.delenv(key)


@pytest.fixture(autouse=True)
def no_leaked_threads() -> Iterator[None]:
    """Every thread a test starts is stopped by its owner before the test ends."""
    before = set(threading.enumerate())
    yield
    until = time.monotonic() + 5
    while True:
        leaked = [t for t in threading.enumerate() if t not in before and t.is_alive()]
        if not leaked or time.monotonic() > until:
            break
        time.sleep(0.05)
    assert not leaked, f"threads left running: {[t.name for t in leaked]}"


@pytest.fixture
def fake_llm() -> Iterator[FakeLLMServer]:
    with FakeLLMServer() as server:
        yield server


@pytest.fixture
def make_app(tmp_path: Path) -> Iterator[Callable[..., Application]]:
    """Start an Application on a captured console; every one is stopped after the test."""
    apps: list[Application] = []

    def make(*, base_url: str | None = None, terminal: bool = True,
             allowed: tuple[str, ...] | list[str] = DEMO_COMMANDS, **settings: Any) -> Application:
        settings.setdefault("admin", {"enabled": False})
        settings.setdefault("events", {"enabled": False})
        settings.setdefault("data_dir", tmp_path / "data")
        llm = {"base_url": base_url, "read_timeout": 5, "max_attempts": 2, **settings.pop("llm", {})}
        config = Settings.load(
            llm=llm,
            terminal={"enabled": terminal, "allowed_commands": list(allowed),
                      **settings.pop("terminal", {})},
            **settings,
        )
        app = Application(config, console=Console(io.StringIO()), read_stdin=False).start()
        apps.append(app)
        return app

    yield make
    for app in apps:
        app.stop()


def ask(app: Application, text: str, timeout: float = 15.0) -> Envelope:
    """Type ``text`` at the console and wait until everything it caused has finished."""
    envelope = app.runtime.send(interface("console"), ConsoleInput(text=text))
    assert envelope is not None
    assert app.runtime.wait_idle(envelope.correlation_id, timeout), f"{text!r} did not finish"
    return envelope


def console_text(app: Application) -> str:
    out = app.console.out
    assert isinstance(out, io.StringIO)
    return out.getvalue()


def wait_for(condition: Callable[[], Any], timeout: float = 15.0) -> Any:
    """Poll ``condition`` until it is truthy (returning it), or fail after ``timeout``."""
    until = time.monotonic() + timeout
    while not (result := condition()):
        assert time.monotonic() < until, "condition not met in time"
        time.sleep(0.01)
    return result
