"""The ``message_reddit`` action, and the interface name Reddit's requests carry."""

from __future__ import annotations

from typing import ClassVar, Literal

from autoresponse.messages import MessageAction

INTERFACE_NAME = "reddit"


class MessageRedditAction(MessageAction):
    """Reply on Reddit, under the comment or private message that asked (Markdown)."""

    interface: ClassVar[str | None] = INTERFACE_NAME

    type: Literal["message_reddit"]
