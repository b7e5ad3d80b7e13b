"""Running it as a service: systemd's readiness protocol, ``config show``, JSON logs,
``--version``, and the systemd unit and Dockerfile an operator deploys with.

Real time: the daemon runs as a real subprocess (signals, sockets, its own clock), so
these tests wait on what it says and does, with generous timeouts."""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import Daemon, actors, environment, free_port, wait_for
from test_cli import recording_proxy  # noqa: F401 (a fixture)

import autoresponse
from autoresponse import Application
from autoresponse.actors.limits import CONVERSATION_POOL_SIZE, DRAIN_SECONDS
from autoresponse.testing.fake_llm import FakeLLMServer
from autoresponse.notify import STOP_MARGIN_SECONDS, Notifier

ROOT = Path(__file__).resolve().parent.parent


def autoresponse_cli(*args: str, env: dict[str, str] | None = None,
                     timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "autoresponse", *args], capture_output=True, text=True,
                          env=env or environment(), timeout=timeout, stdin=subprocess.DEVNULL)


# ---------------------------------------------------------------- sd_notify


def _fields(datagram: bytes) -> dict[str, str]:
    return dict(line.split("=", 1) for line in datagram.decode().splitlines())


def _until(sock: socket.socket, key: str) -> tuple[dict[str, str], list[dict[str, str]]]:
    """Datagrams until one carries ``key`` (bounded by the socket's timeout): it, and those before."""
    before = []
    while True:
        fields = _fields(sock.recv(4096))
        if key in fields:
            return fields, before
        before.append(fields)


def test_the_daemon_tells_systemd_it_is_ready_only_once_the_tree_is_up_then_that_it_stops(
        tmp_path: Path) -> None:
    address = tmp_path / "notify.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(str(address))
        sock.settimeout(30)
        daemon = Daemon(tmp_path, NOTIFY_SOCKET=str(address))
        daemon.runs = 1
        with open(tmp_path / "daemon-1.log", "wb") as log:
            daemon.proc = subprocess.Popen([sys.executable, "-m", "autoresponse", "run"], env=daemon.env,
                                           stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log)
        try:
            ready, before = _until(sock, "READY")
            # The moment READY=1 arrives, everything it promises already holds.
            with urllib.request.urlopen(f"{daemon.url}/healthz", timeout=5) as health:
                assert health.status == 200
            nodes = actors(daemon.status())
            assert {n["state"] for n in nodes.values()} == {"running"}
            expected = {"root", "pipeline", "dispatcher", "llm", "builder", "retry", "conversations",
                        "interfaces", "interface.console", "sender.console",
                        *(f"conversations.{n}" for n in range(CONVERSATION_POOL_SIZE))}
            assert expected <= set(nodes), sorted(expected - set(nodes))
            assert ready["READY"] == "1" and ready["STATUS"].startswith("serving: ")
            assert not any("STOPPING" in f for f in before)

            daemon.signal(signal.SIGTERM)
            stopping, _ = _until(sock, "STOPPING")
            assert stopping["STOPPING"] == "1"
            assert "draining" in stopping["STATUS"]
            assert int(stopping["EXTEND_TIMEOUT_USEC"]) == int((DRAIN_SECONDS + STOP_MARGIN_SECONDS) * 1e6)
            assert daemon.wait(30) == 0, daemon.log()
        finally:
            daemon.stop()


def test_notify_speaks_to_abstract_sockets_and_never_fails_the_daemon(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    name = f"autoresponse-test-{uuid.uuid4().hex}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)
        sock.settimeout(5)
        assert Notifier("@" + name).ready("up\nand running")
        assert sock.recv(4096) == b"READY=1\nSTATUS=up and running"
    assert not Notifier(None).ready("nobody listens")  # no NOTIFY_SOCKET: nothing to do
    with caplog.at_level(logging.WARNING, logger="autoresponse.notify"):
        assert not Notifier(str(tmp_path / "gone.sock")).stopping("bye", within=3)
    assert "cannot notify the service manager" in caplog.text


# ---------------------------------------------------------------- config show

SECRETS = {
    "AUTORESPONSE_LLM__API_KEY": "sk-live-0123456789abcdef",
    "AUTORESPONSE_TELEGRAM__TOKEN": "123456:AAbot-token-secret",
    "AUTORESPONSE_ADMIN__TOKEN": "admin-token-secret",
    "AUTORESPONSE_LLM__BASE_URL": "http://llmuser:llm-pass-secret@127.0.0.1:9/v1",
}


def test_config_show_names_every_source_and_never_a_secret(tmp_path: Path) -> None:
    config = tmp_path / "autoresponse.toml"
    config.write_text("[runtime]\nmax_hops = 7\n")
    env = environment(**SECRETS, AUTORESPONSE_ADMIN__PORT="9999")

    text = autoresponse_cli("config", "show", "--config", str(config), env=env)
    assert text.returncode == 0, text.stderr
    as_json = autoresponse_cli("config", "show", "--config", str(config), "--json", env=env)
    assert as_json.returncode == 0, as_json.stderr
    for output in (text.stdout + text.stderr, as_json.stdout + as_json.stderr):
        for secret in ("sk-live-0123456789abcdef", "AAbot-token-secret", "admin-token-secret",
                       "llm-pass-secret", "llmuser"):
            assert secret not in output
        for key in ("llm.api_key", "telegram.token", "admin.token", "llm.base_url"):
            assert key in output

    shown = json.loads(as_json.stdout)
    assert shown["llm.api_key"] == {"value": "[secret]", "source": "AUTORESPONSE_LLM__API_KEY"}
    assert shown["telegram.token"]["value"] == shown["admin.token"]["value"] == "[secret]"
    assert shown["llm.base_url"] == {"value": "http://[secret]@127.0.0.1:9/v1",
                                     "source": "AUTORESPONSE_LLM__BASE_URL"}
    assert shown["admin.port"] == {"value": 9999, "source": "AUTORESPONSE_ADMIN__PORT"}
    assert shown["runtime.max_hops"] == {"value": 7, "source": f"{config}: [runtime] max_hops"}
    assert shown["runtime.drain_seconds"] == {"value": DRAIN_SECONDS, "source": "built-in default"}
    assert shown["log.format"] == {"value": "text", "source": "built-in default"}

    lines = {line.split(" = ")[0].strip(): line for line in text.stdout.splitlines()}
    assert lines["runtime.max_hops"].endswith(f"= 7  # {config}: [runtime] max_hops")
    assert lines["llm.api_key"].endswith('= "[secret]"  # AUTORESPONSE_LLM__API_KEY')
    assert lines["runtime.drain_seconds"].endswith("# built-in default")


def test_config_show_names_a_commands_defaults_and_reports_a_mistake_in_one_line() -> None:
    shown = json.loads(autoresponse_cli("config", "show", "--demo", "--json").stdout)
    assert shown["terminal.enabled"] == {"value": True, "source": "autoresponse demo's defaults"}
    bad = autoresponse_cli("config", "show", env=environment(AUTORESPONSE_ADMIN__PORT="abc"))
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines() == [(
        "autoresponse: AUTORESPONSE_ADMIN__PORT is 'abc': should be a valid integer, "
        "unable to parse string as an integer")]


# ---------------------------------------------------------------- logs


def test_json_logs_are_one_object_a_line_with_the_requests_correlation_id(
        tmp_path: Path, fake_llm: FakeLLMServer) -> None:
    key = "sk-json-logs-0123456789"
    daemon = Daemon(tmp_path, AUTORESPONSE_LOG__FORMAT="json", AUTORESPONSE_LOG_LEVEL="DEBUG",
                    AUTORESPONSE_LLM__BASE_URL=fake_llm.base_url, AUTORESPONSE_LLM__API_KEY=key,
                    AUTORESPONSE_TERMINAL__ENABLED="true", AUTORESPONSE_TERMINAL__ALLOWED_COMMANDS='["echo"]',
                    AUTORESPONSE_EVENTS__ENABLED="false")
    with daemon:
        injected = daemon.cli("inject", "interface.console", '{"text": "run echo json-logs"}')
        assert injected.returncode == 0, injected.stderr
        correlation = json.loads(injected.stdout)["correlation_id"]
        # A chat turn, then the delivery turn with the command's output: two LLM calls.
        wait_for(lambda: daemon.log().count("the LLM answered") >= 2, timeout=30)
        assert daemon.stop() == 0, daemon.log()

    lines = [json.loads(line) for line in daemon.log().splitlines()]  # every line is JSON
    assert all({"time", "level", "logger", "message"} <= set(line) for line in lines)
    answered = [line for line in lines if line["message"].startswith("the LLM answered")]
    assert len(answered) >= 2
    # Logged on the event loop thread, in the I/O the LLM actor started for this request.
    assert all(line["correlation_id"] == correlation for line in answered), answered
    assert all(line.get("correlation_id") in (None, correlation)
               for line in lines if line["logger"].startswith("autoresponse.llm"))
    assert any(line["message"] == "stopped" and "correlation_id" not in line for line in lines)
    assert key not in daemon.log()


LOGGING_SCRIPT = """
import logging, sys
from autoresponse.actors.kernel.actor import current_correlation
from autoresponse.logs import configure
configure("DEBUG", format=sys.argv[1], secrets=["s3cr3t-token-value"])
log = logging.getLogger("autoresponse.test")
log.info("calling https://api.example/bots3cr3t-token-value/getMe")
token = current_correlation.set("corr-42")
try:
    raise RuntimeError("failed with s3cr3t-token-value")
except RuntimeError:
    log.exception("inside a handler")
current_correlation.reset(token)
log.warning("outside")
raise ValueError("uncaught with s3cr3t-token-value")
"""


@pytest.mark.parametrize("form", ["text", "json"])
def test_both_log_formats_redact_secrets_and_carry_the_correlation(form: str) -> None:
    done = subprocess.run([sys.executable, "-c", LOGGING_SCRIPT, form], capture_output=True, text=True,
                          env=environment(), timeout=60, stdin=subprocess.DEVNULL)
    assert done.returncode == 1
    assert "s3cr3t-token-value" not in done.stderr
    assert "https://api.example/bot[secret]/getMe" in done.stderr
    if form == "text":
        lines = done.stderr.splitlines()
        assert lines[0].endswith("autoresponse.test: calling https://api.example/bot[secret]/getMe")
        assert lines[1].endswith("autoresponse.test: inside a handler [corr=corr-42]")
        assert "RuntimeError: failed with [secret]" in done.stderr
        assert any(line.endswith("autoresponse.test: outside") for line in lines)
        assert "CRITICAL autoresponse: uncaught exception" in done.stderr
        assert "ValueError: uncaught with [secret]" in done.stderr
        return
    records = [json.loads(line) for line in done.stderr.splitlines()]
    inside = next(r for r in records if r["message"] == "inside a handler")
    assert inside["correlation_id"] == "corr-42" and inside["level"] == "ERROR"
    assert "RuntimeError: failed with [secret]" in inside["exception"]
    outside = next(r for r in records if r["message"] == "outside")
    assert "correlation_id" not in outside and outside["logger"] == "autoresponse.test"
    uncaught = records[-1]
    assert uncaught["level"] == "CRITICAL" and "ValueError: uncaught with [secret]" in uncaught["exception"]


# ---------------------------------------------------------------- --version


def test_version_prints_the_package_version() -> None:
    done = autoresponse_cli("--version")
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"autoresponse {autoresponse.__version__}\n"


# ---------------------------------------------------------------- the deploy files


SECRET_NAME = re.compile(r"TOKEN|KEY|SECRET|PASSWORD|CREDENTIAL", re.IGNORECASE)


def dockerfile_instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments), continuation lines joined, comments left out."""
    instructions: list[tuple[str, str]] = []
    pending = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line, pending = pending + line, ""
        word, _, rest = line.partition(" ")
        instructions.append((word.upper(), rest.strip()))
    return instructions


def test_the_dockerfile_runs_the_daemon_as_a_user_with_a_volume_and_a_healthcheck() -> None:
    steps = dockerfile_instructions(ROOT / "deploy" / "Dockerfile")
    stages = [i for i, (word, _) in enumerate(steps) if word == "FROM"]
    assert all(steps[i][1].split()[0] == "python:3.11-slim" for i in stages)
    build, final = steps[:stages[-1]], steps[stages[-1]:]

    # Every room of the package (setup.cfg's package_dir) and what setup.cfg reads is copied.
    copied = {arg.split()[0] for word, arg in build if word == "COPY"} | {
        name for word, arg in build if word == "COPY" for name in arg.split()[:-1]}
    package_dir = re.search(r"package_dir =\n((?:\s+.+\n)+)", (ROOT / "setup.cfg").read_text())
    assert package_dir is not None
    folders = {line.split("=")[1].strip() for line in package_dir.group(1).strip().splitlines()}
    assert folders | {"setup.cfg", "pyproject.toml", "README.md"} <= copied

    words = [word for word, _ in final]
    install = next(i for i, (word, arg) in enumerate(final) if word == "RUN" and "pip install" in arg)
    assert "[reddit,x,telethon]" in final[install][1]
    user = [arg for word, arg in final if word == "USER"]
    assert user and user[-1].split(":")[0] not in ("root", "0")
    assert words.index("USER") > install and "RUN" not in words[words.index("USER"):]

    env = dict(re.findall(r"(\w+)=(\S+)", " ".join(arg for word, arg in final if word == "ENV")))
    volumes = [json.loads(arg) for word, arg in final if word == "VOLUME"]
    assert [env["AUTORESPONSE_DATA_DIR"]] in volumes

    healthcheck = next(arg for word, arg in final if word == "HEALTHCHECK")
    command = json.loads(healthcheck.split(" CMD ", 1)[1])
    assert command[:2] == ["python", "-c"]
    compile(command[2], "healthcheck", "exec")
    assert "urllib" in command[2] and "127.0.0.1" in command[2] and "/healthz" in command[2]

    assert json.loads(next(arg for word, arg in final if word == "CMD")) == ["autoresponse", "run"]
    # No secrets baked in: no variable or build argument that names one, no env file copied.
    for word, arg in steps:
        if word in ("ENV", "ARG"):
            assert not SECRET_NAME.search(arg), arg
        if word in ("COPY", "ADD"):
            assert "env" not in Path(arg.split()[0]).name.lower().split("."), arg


def test_the_dockerfile_healthcheck_reaches_the_daemon_directly_never_through_a_proxy(
        make_app: Callable[..., Application], recording_proxy: tuple[dict[str, str], list[str]]) -> None:
    """With ``http_proxy`` set (a container's environment often has one), the healthcheck
    went to the proxy, the admin token in its Authorization header, and failed."""
    token = "admin-token-for-the-daemon-alone"
    app = make_app(admin={"enabled": True, "host": "127.0.0.1", "port": 0, "token": token})
    assert app.admin is not None
    steps = dockerfile_instructions(ROOT / "deploy" / "Dockerfile")
    healthcheck = next(arg for word, arg in steps if word == "HEALTHCHECK")
    _, flag, code = json.loads(healthcheck.split(" CMD ", 1)[1])
    env, seen = recording_proxy
    env.update(AUTORESPONSE_ADMIN__PORT=str(app.admin.port), AUTORESPONSE_ADMIN__TOKEN=token)
    done = subprocess.run([sys.executable, flag, code], capture_output=True, text=True, env=env, timeout=60,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr
    assert seen == []


def systemd_unit(path: Path) -> dict[str, list[tuple[str, str]]]:
    sections: dict[str, list[tuple[str, str]]] = {}
    current: list[tuple[str, str]] = []
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            current = sections.setdefault(line.strip("[]"), [])
        else:
            key, _, value = line.partition("=")
            current.append((key, value))
    return sections


def test_the_systemd_unit_waits_for_ready_and_gives_the_drain_its_time(tmp_path: Path) -> None:
    path = ROOT / "deploy" / "autoresponse.service"
    service = systemd_unit(path)["Service"]
    one = {key: value for key, value in service}
    assert one["Type"] == "notify" and one["NotifyAccess"] == "main"
    assert one["Restart"] == "on-failure"
    assert one.get("DynamicUser") == "yes" or one.get("User", "root") not in ("root", "0")
    assert one["StateDirectory"] == "autoresponse"
    assert ("Environment", "AUTORESPONSE_DATA_DIR=%S/autoresponse") in service
    assert ("EnvironmentFile", "-/etc/autoresponse/env") in service
    assert one["NoNewPrivileges"] == "yes" and one["ProtectSystem"] == "strict" and one["PrivateTmp"] == "yes"
    assert one["KillMode"] == "mixed"  # SIGTERM to the daemon alone: commands under way finish in the drain
    stop = float(one["TimeoutStopSec"].removesuffix("s"))
    assert stop >= DRAIN_SECONDS + STOP_MARGIN_SECONDS
    # The comment that says to raise it with the drain sits right above it.
    text = path.read_text()
    above = text[:text.index("TimeoutStopSec=")].rsplit("\n\n", 1)[-1]
    assert "AUTORESPONSE_RUNTIME__DRAIN_SECONDS" in above and "RAISE IT WITH THE DRAIN" in above
    assert not any(SECRET_NAME.search(value) for key, value in service if key == "Environment")

    if shutil.which("systemd-analyze") and os.path.exists(ROOT / ".venv" / "bin" / "autoresponse"):
        # The unit as systemd reads it (with an ExecStart that exists on this machine).
        unit = tmp_path / "autoresponse.service"
        unit.write_text(text.replace("/opt/autoresponse/bin/autoresponse", str(ROOT / ".venv/bin/autoresponse")))
        done = subprocess.run(["systemd-analyze", "verify", "--man=no", str(unit)], capture_output=True,
                              text=True, timeout=60)
        assert done.returncode == 0 and unit.name not in done.stderr, done.stderr


# ---------------------------------------------------------------- a job of a terminal


class _Terminal:
    """An interactive bash on a pseudo-terminal of its own, with job control, as a user
    types into it: what it prints is read all along (a full terminal would block its jobs)."""

    def __init__(self, env: dict[str, str]) -> None:
        import pty
        import termios
        import threading

        master, slave = pty.openpty()

        def controlling_terminal() -> None:  # in the child, after setsid: the pty is its terminal
            import fcntl
            fcntl.ioctl(0, termios.TIOCSCTTY, 0)

        self.shell = subprocess.Popen(["bash", "--norc", "--noprofile", "-i"], stdin=slave, stdout=slave,
                                      stderr=slave, start_new_session=True, preexec_fn=controlling_terminal,
                                      env={**env, "PS1": "$ ", "TERM": "dumb"})
        os.close(slave)
        self.master, self.output = master, b""
        self._reader = threading.Thread(target=self._read, name="terminal", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while True:
            try:
                chunk = os.read(self.master, 65536)
            except OSError:  # the shell is gone
                return
            if not chunk:
                return
            self.output += chunk

    def type(self, keys: str) -> None:
        os.write(self.master, keys.encode())

    def printed(self) -> str:
        return self.output.decode(errors="replace")

    def close(self) -> None:
        """The shell and every process of its session (a job it started), then the terminal."""
        if shutil.which("pkill"):
            subprocess.run(["pkill", "-KILL", "-s", str(self.shell.pid)], check=False)
        self.shell.kill()
        self.shell.wait(10)
        self._reader.join(10)  # it ends once nothing holds the terminal open: before its fd goes
        os.close(self.master)


@pytest.mark.skipif(shutil.which("bash") is None or not hasattr(os, "tcgetpgrp"), reason="needs bash and a pty")
def test_a_daemon_started_with_an_ampersand_keeps_serving_and_reads_once_in_the_foreground(tmp_path: Path) -> None:
    port = free_port()
    terminal = _Terminal(environment(AUTORESPONSE_ADMIN__PORT=str(port), AUTORESPONSE_DATA_DIR=str(tmp_path / "d"),
                                     HOME=str(tmp_path)))
    daemon_pid = None

    def healthy() -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1) as answer:
                return bool(answer.status == 200)
        except OSError:
            return False

    try:
        terminal.type(f"{sys.executable} -m autoresponse run &\n")
        daemon_pid = int(wait_for(lambda: re.search(r"\[1\] (\d+)", terminal.printed()), 30).group(1))
        wait_for(healthy, 30)
        # The user types ahead while the shell runs something: a line waits in the terminal,
        # and a daemon that read it would be stopped by it (SIGTTIN), its admin endpoint too.
        terminal.type("sleep 2; jobs -l\n")
        terminal.type(": typed ahead, for the shell\n")
        wait_for(lambda: re.search(rf"{daemon_pid} (Running|Stopped)", terminal.printed()), 30)
        assert re.search(rf"{daemon_pid} Running", terminal.printed()), terminal.printed()
        assert healthy()
        assert "the console waits" in terminal.printed()  # and the log says why it does not read
        # Brought to the foreground, it reads the terminal: a request gets its reply.
        terminal.type("fg\n")
        terminal.type("hello from the foreground\n")
        wait_for(lambda: "#1" in terminal.printed() and "↳#1" in terminal.printed(), 30)
        terminal.type("\x03")  # Ctrl-C: the daemon drains and exits
        wait_for(lambda: _gone(daemon_pid), 30)
        daemon_pid = None
    finally:
        if daemon_pid is not None and not _gone(daemon_pid):
            os.kill(daemon_pid, signal.SIGKILL)
        terminal.close()


def _gone(pid: int) -> bool:
    """``pid`` has exited (a child of the shell: once the shell reaps it, or kill finds none)."""
    try:
        os.kill(pid, 0)
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1].startswith("Z")
    except OSError:  # ProcessLookupError, or reaped between the two
        return True
