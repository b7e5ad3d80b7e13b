"""The ``message_console`` action."""

from __future__ import annotations

from typing import ClassVar, Literal

from autoresponse.messages import MessageAction


class MessageConsoleAction(MessageAction):
    """Reply on the console."""

    interface: ClassVar[str | None] = "console"

    type: Literal["message_console"]
