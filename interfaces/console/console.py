r"""The console both sides write to: one stream, one lock, one message counter.

What it prints comes from the LLM and from whoever typed or injected it, so control
characters are shown, not obeyed: an escape sequence would clear the screen, rewrite a
line above (a forged approval) or set the clipboard, and a bidi override would reorder
what the operator reads::

    >>> Console.printable("a\x1b[2Jb\u202ec")
    'a\\x1b[2Jb\\u202ec'
"""

from __future__ import annotations

import itertools
import sys
import threading
from typing import TextIO

from pydantic import BaseModel, ConfigDict

#: Every control character but the line's end and tab (C0, DEL, C1), and the bidi controls,
#: to the escape that names it.
_SHOWN = {c: f"\\x{c:02x}" for c in (*range(0x20), 0x7F, *range(0x80, 0xA0)) if chr(c) not in "\n\t"} | {
    c: f"\\u{c:04x}" for c in (*range(0x202A, 0x202F), *range(0x2066, 0x206A), 0x200E, 0x200F, 0x061C)}

#: Printed under a reply the console showed and that will not be the reply (withdrawn, or
#: replaced by another text): what is printed stays, so it is marked as void.
TAKEN_BACK = "(the reply above was taken back)"


class ConsoleInput(BaseModel):
    """A line typed (or injected) at the console."""

    model_config = ConfigDict(frozen=True)

    text: str
    user_name: str | None = None
    #: The console is one chat; an injected line may name another, as a second console
    #: session would (each chat has its own turns and memory).
    chat_id: str | None = None


class Console:
    """Shared by the console interface and sender, and outliving their restarts."""

    CHAT_ID = "console"

    def __init__(self, out: TextIO | None = None) -> None:
        self.out = out or sys.stdout
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._streaming: tuple[str, str] | None = None  # the reply being printed as it grows

    def next_message_id(self) -> int:
        return next(self._ids)

    def write(self, who: str, tag: str, text: str) -> None:
        """``who  tag │ text``, continuation lines under the gutter."""
        block = self._block(who, tag, text)
        with self._lock:
            self._end_stream()
            self.out.write(block)
            self.out.flush()

    def stream(self, key: str, who: str, tag: str, text: str, *, final: bool) -> None:
        """Print ``text`` as it grows: what is new since the last call for ``key``, and the
        line's end once ``final``. Anything else printed meanwhile ends the line first. A text
        that does not continue the one printed (an answer asked again) starts a line of its
        own, under the mark that the one above was taken back."""
        head, pad = self._gutter(who, tag)
        text = text.replace("\r\n", "\n")
        if not final and text.endswith("\r"):  # maybe half a line end: shown with the rest
            text = text[:-1]
        with self._lock:
            if self._streaming is not None and self._streaming[0] != key:
                self._end_stream()
            shown = self._streaming[1] if self._streaming is not None else None
            if shown is None or not text.startswith(shown):
                if shown is not None:  # not the rest of the text printed: that one is void
                    self._end_stream()
                    self.out.write(self._block("note", tag, TAKEN_BACK))
                self.out.write(head)
                shown = ""
            self.out.write(self.printable(text[len(shown):]).replace("\n", f"\n{pad}"))
            self._streaming = (key, text)
            if final:
                self._end_stream()
            self.out.flush()

    @staticmethod
    def printable(text: str) -> str:
        """``text`` with its control characters escaped (each one to the same escape, so a
        prefix of the text stays a prefix of what is printed)."""
        return text.translate(_SHOWN)

    def _block(self, who: str, tag: str, text: str) -> str:
        """``text`` as ``write`` prints it, its line's end included."""
        head, pad = self._gutter(who, tag)
        lines = self.printable(text.replace("\r\n", "\n")).splitlines() or [""]
        return head + lines[0] + "".join(f"\n{pad}{line}" for line in lines[1:]) + "\n"

    def _end_stream(self) -> None:
        if self._streaming is not None:
            self.out.write("\n")
            self._streaming = None

    @staticmethod
    def _gutter(who: str, tag: str) -> tuple[str, str]:
        head = f"{who:<4} {tag:>5} │ "
        return head, " " * (len(head) - 2) + "│ "
