"""The ``message_telethon`` action, and the interface name the userbot's requests carry."""

from __future__ import annotations

from typing import ClassVar, Literal

from autoresponse.messages import MessageAction

INTERFACE_NAME = "telethon"


class MessageTelethonAction(MessageAction):
    """Reply in a Telegram chat as the user account (the userbot)."""

    interface: ClassVar[str | None] = INTERFACE_NAME

    type: Literal["message_telethon"]
