"""The console interface: lines from stdin (or injected) become user requests."""

from __future__ import annotations

import getpass
import os
import select
import sys
import threading
from typing import TextIO

from autoresponse.actors import Runtime, TypedActor, handles
from autoresponse.actors.routes import LLM
from autoresponse.interfaces.console.console import Console, ConsoleInput
from autoresponse.messages import Envelope, OriginalContext, UserRequest

INTERFACE_NAME = "console"


class StdinReader:
    """A thread that feeds stdin's lines to the console interface until stopped or EOF.

    It polls with a short timeout so that ``stop`` ends it promptly.
    """

    def __init__(self, runtime: Runtime, to: str, stream: TextIO | None = None) -> None:
        self._runtime = runtime
        self._to = to
        self._stream = stream or sys.stdin
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="console-stdin", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(2)

    def _run(self) -> None:
        try:
            fd = self._stream.fileno()
        except (AttributeError, OSError, ValueError):
            return
        pending = b""
        while not self._stop.is_set():
            ready, _, _ = select.select([fd], [], [], 0.2)
            if not ready:
                continue
            chunk = os.read(fd, 4096)
            if not chunk:
                break
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                text = line.decode("utf-8", errors="replace").strip()
                if text:
                    self._runtime.accept(self._to, ConsoleInput(text=text)).result(timeout=30)


class ConsoleInterface(TypedActor):
    """Console users are local, so every one of them is allowed."""

    def __init__(self, console: Console, *, read_stdin: bool = False) -> None:
        super().__init__()
        self.console = console
        self.read_stdin = read_stdin
        self._reader: StdinReader | None = None

    def setup(self) -> None:
        if self.read_stdin:
            self._reader = StdinReader(self.runtime, self.name)
            self._reader.start()

    def teardown(self) -> None:
        if self._reader is not None:
            self._reader.stop()
            self._reader = None

    @handles
    def on_input(self, line: ConsoleInput, env: Envelope) -> None:
        message_id = self.console.next_message_id()
        context = OriginalContext(
            chat_id=Console.CHAT_ID,
            message_id=message_id,
            interface_name=INTERFACE_NAME,
            original_command=line.text,
            user_name=line.user_name or getpass.getuser(),
            chat_type="private",
        )
        self.console.write("you", f"#{message_id}", line.text)
        self.send(LLM, UserRequest(text=line.text, context=context), cause=env)
