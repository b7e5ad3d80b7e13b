"""The console interface: lines from stdin (or injected) become user requests.

An action waiting for approval is offered at the console as a prompt that names its
answers: ``/approve`` or ``/deny`` (followed by the approval's id when several wait).
Such a line is an answer for the approvals desk, not a request.
"""

from __future__ import annotations

import getpass
import logging
import os
import re
import select
import sys
import threading
from typing import Any, TextIO

from autoresponse.actors.journal import JournalFailing
from autoresponse.actors.kernel import IntakeFull, Runtime, TypedActor, handles
from autoresponse.actors.approvals import APPROVALS
from autoresponse.actors.routes import CONVERSATIONS
from autoresponse.interfaces.console.console import Console, ConsoleInput
from autoresponse.messages import Envelope, OriginalContext, UserRequest
from autoresponse.messages.approval import ApprovalAnswer

log = logging.getLogger(__name__)

INTERFACE_NAME = "console"
#: A longer line is cut: the LLM would be asked to fix an overlong request anyway.
MAX_LINE_CHARS = 16_000
#: An answer to an approval prompt: ``/approve`` or ``/deny``, with the approval's id or not.
_ANSWER = re.compile(r"^/(approve|deny)(?:\s+(\S+))?$", re.IGNORECASE)


def in_background(fd: int) -> bool:
    """True when ``fd`` is a terminal that another process group has in the foreground:
    the daemon was started with ``&`` (or sent there with Ctrl-Z and ``bg``), and a read
    would stop it, admin endpoint and every platform with it, until brought back."""
    try:
        return os.isatty(fd) and os.tcgetpgrp(fd) != os.getpgrp()
    except OSError:  # a terminal, but not this session's: reading it stops nobody
        return False


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
        pending, told, dropping = b"", False, False
        while not self._stop.is_set():
            if in_background(fd):  # a read now would stop the whole daemon (SIGTTIN)
                if not told:
                    log.warning("the console waits: the daemon is a background job of this terminal, and reads "
                                "its requests once brought to the foreground (console.read_stdin = false "
                                "turns reading off)")
                    told = True
                self._stop.wait(0.2)
                continue
            ready, _, _ = select.select([fd], [], [], 0.2)
            if not ready or in_background(fd):  # again: sent there (Ctrl-Z, bg) while it waited
                continue
            chunk = os.read(fd, 4096)
            ended = not chunk
            pending += chunk or b"\n"  # at the end, a last line without its newline is a line too
            *lines, pending = pending.split(b"\n")
            if dropping:  # the rest of a line too long to take, up to its end
                if lines:
                    lines, dropping = lines[1:], False
                else:
                    pending = b""
            if not dropping and len(pending) > 4 * MAX_LINE_CHARS:  # no end yet: take what fits, drop the rest
                lines.append(pending)
                pending, dropping = b"", True
            for line in lines:
                text = line.decode("utf-8", errors="replace").strip()
                if text and not self._take(text):
                    return
            if ended:
                return

    def _take(self, text: str) -> bool:
        """Hand one line to the runtime; while it is full, or its journal cannot write, wait
        (the console blocks: the line is neither lost nor refused). False if stopped meanwhile."""
        while not self._stop.is_set():
            try:
                self._runtime.accept(self._to, ConsoleInput(text=text[:MAX_LINE_CHARS]), wait=0.5).result()
                return True
            except IntakeFull:
                continue
            except JournalFailing as exc:  # its disk full, say: the line waits, as when full
                self._stop.wait(exc.retry_after)
        return False


def origin(line: Any) -> OriginalContext | None:
    """Who typed ``line`` (``Mount.origin``): its chat (every console user is allowed), with
    no message id, since a line gets its number only as it is handled; None for an answer to
    an approval (it asked for nothing) and for a line that cannot be read."""
    try:
        if _ANSWER.match(line.text.strip()) is not None:
            return None
        return OriginalContext(chat_id=line.chat_id or Console.CHAT_ID, interface_name=INTERFACE_NAME,
                               original_command=line.text, user_name=line.user_name, chat_type="private")
    except Exception:  # a malformed input: nobody to tell
        return None


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
            chat_id=line.chat_id or Console.CHAT_ID,
            message_id=message_id,
            interface_name=INTERFACE_NAME,
            original_command=line.text,
            user_name=line.user_name or getpass.getuser(),
            chat_type="private",
        )
        self.console.write("you", f"#{message_id}", line.text)
        answer = _ANSWER.match(line.text.strip())
        if answer is not None and self.runtime.has(APPROVALS):
            self._answer(answer, context, env)
            return
        self.send(CONVERSATIONS, UserRequest(text=line.text, context=context), cause=env)

    def _answer(self, typed: re.Match[str], context: OriginalContext, env: Envelope) -> None:
        """``/approve [id]`` or ``/deny [id]``: an answer for the approvals desk. The console
        is local, and has no user ids: whoever types in the chat answers for it."""
        self.send(APPROVALS, ApprovalAnswer(approval_id=typed.group(2), approve=typed.group(1).lower() == "approve",
                                           context=context), cause=env)
