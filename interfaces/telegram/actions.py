"""The ``message_telegram_bot`` action."""

from __future__ import annotations

from typing import ClassVar, Literal

from autoresponse.messages import MessageAction


class MessageTelegramBotAction(MessageAction):
    """Reply in a Telegram chat through the bot."""

    interface: ClassVar[str | None] = "telegram"

    type: Literal["message_telegram_bot"]
