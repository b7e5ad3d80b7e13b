"""The console both sides write to: one stream, one lock, one message counter."""

from __future__ import annotations

import itertools
import sys
import threading
from typing import TextIO

from pydantic import BaseModel, ConfigDict


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

    def next_message_id(self) -> int:
        return next(self._ids)

    def write(self, who: str, tag: str, text: str) -> None:
        """``who  tag │ text``, continuation lines under the gutter."""
        head = f"{who:<4} {tag:>5} │ "
        pad = " " * (len(head) - 2) + "│ "
        lines = text.splitlines() or [""]
        block = head + lines[0] + "".join(f"\n{pad}{line}" for line in lines[1:])
        with self._lock:
            self.out.write(block + "\n")
            self.out.flush()
