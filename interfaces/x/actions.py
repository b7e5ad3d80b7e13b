"""The ``message_x`` action, and the interface name X's requests carry."""

from __future__ import annotations

from typing import ClassVar, Literal

from autoresponse.messages import MessageAction

INTERFACE_NAME = "x"


class MessageXAction(MessageAction):
    """Reply on X, in the thread of the post that mentioned the account."""

    interface: ClassVar[str | None] = INTERFACE_NAME

    type: Literal["message_x"]
